//! How the reading thread hands batches to a single worker on two cores: the worker spins
//! briefly (and does the reader's spare work) rather than sleeping between batches, and the
//! reading thread interns a batch's group keys ahead while the worker is busy, in batch order.

use std::sync::mpsc::Receiver;

use crate::connectors::SpareWork;

/// How far the reading thread and a single worker have got, so that the reading thread interns
/// a batch's keys ahead only while the worker is busy (it has the time to spare) and only after
/// every earlier batch is interned (each key's id then depends on the input alone, not on which
/// thread interned it).
#[derive(Default)]
pub(super) struct InternProgress {
    counts: std::sync::Mutex<InternCounts>,
    changed: std::sync::Condvar,
}

/// Batches counted from the first of this run.
#[derive(Default)]
struct InternCounts {
    /// Batches whose keys are interned.
    interned: u64,
    /// Batches the worker has finished (`u64::MAX` once it stopped).
    handled: u64,
}

impl InternProgress {
    fn lock(&self) -> std::sync::MutexGuard<'_, InternCounts> {
        self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the reading thread should intern batch `n`: yes while the worker is busy with an
    /// earlier batch, once it has interned every earlier one (the reading thread waits for
    /// that: it is the faster side then).
    pub(super) fn ahead(&self, n: u64) -> bool {
        let mut counts = self.lock();
        while counts.interned < n && counts.handled < n {
            counts = self.changed.wait(counts).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        counts.interned == n && counts.handled < n
    }

    /// Batch `n` is interned (the worker also calls this for batches interned ahead).
    pub(super) fn interned(&self, n: u64) {
        let mut counts = self.lock();
        counts.interned = counts.interned.max(n + 1);
        self.changed.notify_all();
    }

    pub(super) fn handled(&self, n: u64) {
        self.lock().handled = n + 1;
        self.changed.notify_all();
    }
}

/// Marks the worker stopped when dropped (also on an error or a panic), so the reading thread
/// never waits for it in vain.
pub(super) struct WorkerStopped<'a>(pub(super) &'a InternProgress);

impl Drop for WorkerStopped<'_> {
    fn drop(&mut self) {
        self.0.handled(u64::MAX - 1);
    }
}

/// The batches a single worker receives from the reading thread. When the reading thread is
/// the slower side, the worker waits before most batches; asleep, it has to be woken for each,
/// and on a virtual machine a wake-up costs the reading thread tens of microseconds (W1's
/// shared plan waited before 65 to 131 of its 153 batches). So the worker first does what it
/// can of the reader's work ahead of it (a Parquet reader's second column set), then spins a
/// while for the next batch, on a core it has to itself, and only then sleeps.
pub(super) struct Batches<T> {
    receiver: Receiver<T>,
    /// How long to spin before sleeping: zero on a single core, where spinning would take the
    /// reading thread's time.
    spin: std::time::Duration,
    /// The reader's work the worker does while it waits (after `SPARE_AFTER`).
    spare: Option<SpareWork>,
}

impl<T> Batches<T> {
    /// Longer than the reading thread takes to decode a batch of a few numeric columns.
    const SPIN: std::time::Duration = std::time::Duration::from_millis(1);
    /// How long the worker waits for a batch before it takes on the reader's work (at once
    /// where it does not spin, on a single core): a shorter wait is mostly a batch on its way,
    /// and decoding ahead then delays the worker's own work where the worker is the busier side
    /// (W1's chosen plan, its key column read as a dictionary: 41.8 ms against 45.5 taking the
    /// work on at once; on a file the reader is slower on, plain-encoded, within the noise).
    const SPARE_AFTER: std::time::Duration = std::time::Duration::from_micros(200);

    /// Batches from `receiver`; with `spins`, the receiving worker spins a while before it
    /// sleeps (only where it has a core to itself).
    pub(super) fn new(receiver: Receiver<T>, spare: Option<SpareWork>, spins: bool) -> Self {
        let spin = if spins && super::cores() > 1 { Self::SPIN } else { std::time::Duration::ZERO };
        Batches { receiver, spin, spare }
    }
}

impl<T> Iterator for Batches<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        use std::sync::mpsc::TryRecvError;
        let mut started = std::time::Instant::now();
        loop {
            match self.receiver.try_recv() {
                Ok(batch) => return Some(batch),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty)
                    if started.elapsed() >= Self::SPARE_AFTER.min(self.spin)
                        && self.spare.as_mut().is_some_and(|work| work()) =>
                {
                    started = std::time::Instant::now();
                }
                Err(TryRecvError::Empty) if started.elapsed() < self.spin => std::hint::spin_loop(),
                Err(TryRecvError::Empty) => return self.receiver.recv().ok(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::{Batches, InternProgress};
    use crate::connectors::SpareWork;

    #[test]
    fn a_spinning_worker_gets_every_batch_in_order_and_stops_when_the_reader_does() {
        let (zero, spinning) = (std::time::Duration::ZERO, std::time::Duration::from_millis(1));
        for (spin, with_spare_work) in [(zero, false), (spinning, false), (spinning, true), (zero, true)] {
            // 20 pieces of spare work, done while waiting (a spinning worker after waiting a
            // while: at least 13 ms in all here).
            let done = Arc::new(std::sync::atomic::AtomicU32::new(0));
            let counter = Arc::clone(&done);
            let work: SpareWork = Box::new(move || counter.fetch_add(1, Ordering::Relaxed) < 20);
            let spare = with_spare_work.then_some(work);
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let sender = std::thread::spawn(move || {
                for n in 0..20u32 {
                    // Some batches come at once, some after the spin is over.
                    std::thread::sleep(std::time::Duration::from_micros(u64::from(n % 3) * 700));
                    tx.send(n).unwrap();
                }
            });
            let received: Vec<u32> = Batches { receiver: rx, spin, spare }.collect();
            sender.join().unwrap();
            assert_eq!(received, (0..20).collect::<Vec<_>>(), "spinning {spin:?}, spare work {with_spare_work}");
            let asked = done.load(Ordering::Relaxed);
            assert_eq!(asked > 20, with_spare_work, "all spare work done, and asked for more: {asked} times");
        }
    }

    #[test]
    fn reading_thread_interns_ahead_only_in_order_and_while_the_worker_is_busy() {
        let progress = InternProgress::default();
        // The worker has finished every batch sent so far: it interns the next one itself.
        assert!(!progress.ahead(0));
        // The worker interned batch 0 and is busy with it.
        progress.interned(0);
        assert!(progress.ahead(1));
        progress.interned(1);
        // It interns batch 1 again (ahead already): the count never goes back.
        progress.interned(0);
        assert!(progress.ahead(2));
        progress.interned(2);
        progress.handled(2);
        assert!(!progress.ahead(3), "the worker caught up");
        // Batch 4 waits for batch 3 to be interned by the worker, which then is busy with it.
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| progress.ahead(4));
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!waiting.is_finished(), "interning batch 4 before batch 3 would change the ids");
            progress.interned(3);
            assert!(waiting.join().unwrap());
        });
        // A worker that stops releases a waiting reading thread.
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| progress.ahead(9));
            drop(super::WorkerStopped(&progress));
            assert!(!waiting.join().unwrap());
        });
    }
}
