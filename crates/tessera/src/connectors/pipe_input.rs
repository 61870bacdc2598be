//! Input from a pipe (stdin, a FIFO), read on a thread of its own so that a reader can wait for
//! it with a timeout: `tail -f log | tessera run q.sql` hands the rows it has to the queries
//! after a bounded delay instead of waiting for a full batch.

use std::io::Read;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::time::Instant;

/// Bytes a reader decodes: a file's, read when asked, or a pipe's, arriving when they do.
pub(crate) enum TextInput {
    File(Box<dyn Read + Send>),
    Pipe(PipeInput),
}

impl TextInput {
    /// Whether bytes (or the end of the input) are at hand by `deadline`, waiting until then
    /// at most; a file's always are.
    pub(crate) fn ready_by(&mut self, deadline: Instant) -> bool {
        match self {
            TextInput::File(_) => true,
            TextInput::Pipe(pipe) => pipe.ready_by(deadline),
        }
    }
}

impl Read for TextInput {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            TextInput::File(file) => file.read(buf),
            TextInput::Pipe(pipe) => pipe.read(buf),
        }
    }
}

/// A pipe read by a thread that hands over whole lines (a record's bytes arrive together,
/// so a reader that has some need not wait for the rest of its line), a few pieces ahead at
/// most.
pub(crate) struct PipeInput {
    pieces: Receiver<std::io::Result<Vec<u8>>>,
    piece: Vec<u8>,
    offset: usize,
    /// The thread's read failure, handed out by the next read.
    failed: Option<std::io::Error>,
    /// The thread sent everything it read.
    ended: bool,
}

/// Bytes the pipe's thread asks for at once.
const READ_SIZE: usize = 1 << 16;
/// Pieces in flight: the reading thread waits when the reader is this far behind.
const PIECES_AHEAD: usize = 16;

impl PipeInput {
    /// Starts reading `input` on a thread of its own (named after `name`).
    pub(crate) fn spawn(name: &str, mut input: Box<dyn Read + Send>) -> std::io::Result<Self> {
        let (send, pieces) = sync_channel(PIECES_AHEAD);
        std::thread::Builder::new().name(format!("tessera-pipe {name}")).spawn(move || {
            // Bytes after the last newline wait for the rest of their line.
            let mut partial = Vec::new();
            loop {
                let start = partial.len();
                partial.resize(start + READ_SIZE, 0);
                let read = input.read(&mut partial[start..]);
                partial.truncate(start + *read.as_ref().unwrap_or(&0));
                let piece = match read {
                    // The end: a last line without a newline, then nothing (the channel closes).
                    Ok(0) if partial.is_empty() => return,
                    Ok(0) => Ok(std::mem::take(&mut partial)),
                    Ok(_) => match partial[start..].iter().rposition(|&b| b == b'\n') {
                        Some(end) => {
                            let rest = partial.split_off(start + end + 1);
                            Ok(std::mem::replace(&mut partial, rest))
                        }
                        None => continue,
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let _ = send.send(Err(e));
                        return;
                    }
                };
                if send.send(piece).is_err() {
                    return;
                }
            }
        })?;
        Ok(PipeInput { pieces, piece: Vec::new(), offset: 0, failed: None, ended: false })
    }

    /// Takes the next piece, waiting until `deadline` at most (`None`: as long as it takes);
    /// false when none came by then.
    fn take_piece(&mut self, deadline: Option<Instant>) -> bool {
        let received = match deadline {
            Some(deadline) => match self.pieces.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Err(RecvTimeoutError::Timeout) => return false,
                Err(RecvTimeoutError::Disconnected) => None,
                Ok(piece) => Some(piece),
            },
            None => self.pieces.recv().ok(),
        };
        match received {
            Some(Ok(piece)) => (self.piece, self.offset) = (piece, 0),
            Some(Err(e)) => self.failed = Some(e),
            None => self.ended = true,
        }
        true
    }

    fn ready_by(&mut self, deadline: Instant) -> bool {
        self.offset < self.piece.len() || self.failed.is_some() || self.ended || self.take_piece(Some(deadline))
    }
}

impl Read for PipeInput {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.offset == self.piece.len() && self.failed.is_none() && !self.ended {
            self.take_piece(None);
        }
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let n = buf.len().min(self.piece.len() - self.offset);
        buf[..n].copy_from_slice(&self.piece[self.offset..self.offset + n]);
        self.offset += n;
        Ok(n)
    }
}
