//! Checkpoints: a run with a state directory saves, every `interval`, a consistent cut of
//! itself — the operators' state and interned keys (a binary snapshot), how many input batches
//! the operators consumed and where the reader stood after them, the source's largest event
//! time (the watermark), the byte length of every output file, and the counters so far — and a
//! run that finds a checkpoint resumes from it: outputs are cut back to the saved lengths, the
//! reader seeks to the saved position (or, if it cannot, reads the saved number of batches
//! again), and the operators continue from their saved state, so every result row is written
//! once.
//!
//! The directory holds `MANIFEST` (JSON), the snapshot it names and the state store
//! (`store/`), where the operators saved their changed tables and new interned keys and made
//! them durable before the snapshot was written (the snapshot names the table versions it
//! needs; see the key groups in [`crate::exec`]). A checkpoint writes the new snapshot, syncs
//! it, then replaces the manifest atomically (write, sync, rename, sync the directory), then
//! deletes older snapshots: a crash at any point leaves the previous checkpoint or the new one,
//! never a mix. The manifest carries its format and a fingerprint of the plan; a checkpoint
//! in another format, or of another plan (another script, settings or tessera version), is
//! refused with a message.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TesseraError};
use crate::exec::pipeline::SourceRun;

const MANIFEST: &str = "MANIFEST";
/// The format of the manifest and snapshot. Format 1 held every operator's whole state in
/// the snapshot; format 2 holds their progress, the tables being in the state store; format 3
/// has the rows and late rows of each query counted by the runtime, no longer by operators;
/// format 4 has synopses keep their latest on-time instant, and funnels' counter chains;
/// format 5 has synopses keep their partitions in groups, a table of the store each.
const FORMAT: u32 = 5;

/// What one checkpoint wrote: the snapshot (progress, interned keys, rows waiting), the
/// state tables it wrote to the store, the tables written since the previous checkpoint
/// (evictions included), and every table the store holds after it (the whole state, encoded,
/// which a checkpoint writing everything would have written).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub sequence: u64,
    pub snapshot_bytes: u64,
    pub tables_written: u64,
    pub tables_changed: u64,
    pub tables_stored: u64,
}

/// Where and how often to checkpoint.
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    pub dir: PathBuf,
    pub interval: Duration,
}

/// Where the source being read stands at a checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SourcePosition {
    /// Index of the source in run order.
    pub source: usize,
    /// Input batches the operators consumed.
    pub batches: u64,
    /// Where the reader stood after the last of them (its progress), for it to seek there.
    #[serde(default)]
    pub read: Option<u64>,
    /// The malformed rows skipped up to there and their bytes in the dead-letter file, for the
    /// reader to count on from there under `--on-error skip`.
    #[serde(default)]
    pub skipped: Option<crate::connectors::Skipped>,
    /// The largest event time read so far (the watermark follows from it).
    pub max_event_time: i64,
    pub events_in: u64,
    pub query_rows: Vec<crate::exec::QueryRows>,
    pub state_bytes_peak: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub tessera_version: String,
    pub fingerprint: String,
    pub sequence: u64,
    /// The run reached the end of every source.
    pub complete: bool,
    /// Sources read to the end, in run order.
    pub finished: Vec<SourceRun>,
    /// The source in progress.
    pub position: Option<SourcePosition>,
    /// The snapshot file of the operators of the source in progress, its length and checksum.
    pub snapshot: Option<(String, u64, String)>,
    /// Length of every output of the sink at the checkpoint.
    pub sink: Vec<u64>,
}

/// A checkpoint to resume from.
pub struct Resume {
    pub manifest: Manifest,
    pub snapshot: Vec<u8>,
}

pub struct Checkpointer {
    config: CheckpointConfig,
    fingerprint: String,
    sequence: u64,
    finished: Vec<SourceRun>,
}

/// FNV-1a, 64 bits: a stable hash for fingerprints and checksums.
pub fn fnv64(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

fn io(context: &str, path: &Path) -> impl FnOnce(std::io::Error) -> TesseraError {
    let context = format!("{context} {}", path.display());
    move |e| TesseraError::io(context, e)
}

/// Writes `bytes` to `path` and syncs the file.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = File::create(path).map_err(io("cannot create", path))?;
    file.write_all(bytes).map_err(io("cannot write", path))?;
    file.sync_all().map_err(io("cannot sync", path))
}

impl Checkpointer {
    /// Opens (creating) the state directory; returns the checkpoint to resume from, if any.
    /// `fingerprint` identifies the plan the run executes.
    pub fn open(config: CheckpointConfig, fingerprint: String) -> Result<(Checkpointer, Option<Resume>)> {
        fs::create_dir_all(&config.dir).map_err(io("cannot create the state directory", &config.dir))?;
        let manifest_path = config.dir.join(MANIFEST);
        let resume = match fs::read(&manifest_path) {
            Ok(text) => Some(Self::load(&config.dir, &text, &fingerprint)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io("cannot read", &manifest_path)(e)),
        };
        let (sequence, finished) =
            resume.as_ref().map_or((0, Vec::new()), |r| (r.manifest.sequence, r.manifest.finished.clone()));
        Ok((Checkpointer { config, fingerprint, sequence, finished }, resume))
    }

    fn load(dir: &Path, text: &[u8], fingerprint: &str) -> Result<Resume> {
        let manifest: Manifest = serde_json::from_slice(text).map_err(|e| {
            TesseraError::Checkpoint(format!(
                "{} is not a tessera checkpoint manifest: {e}",
                dir.join(MANIFEST).display()
            ))
        })?;
        if manifest.format != FORMAT {
            return Err(TesseraError::Checkpoint(format!(
                "the checkpoint in {} is in format {} (tessera {}); this tessera ({}) reads format {FORMAT}: \
                 resume it with the tessera that wrote it, or give another --state-dir",
                dir.display(),
                manifest.format,
                manifest.tessera_version,
                env!("CARGO_PKG_VERSION"),
            )));
        }
        if manifest.fingerprint != fingerprint {
            return Err(TesseraError::Checkpoint(format!(
                "the checkpoint in {} was written for another plan or input (tessera {}, plan {}; this run: tessera {}, plan {fingerprint}): \
                 resume it with the same script, settings and input files, or give another --state-dir",
                dir.display(),
                manifest.tessera_version,
                manifest.fingerprint,
                env!("CARGO_PKG_VERSION"),
            )));
        }
        let snapshot = match &manifest.snapshot {
            None => Vec::new(),
            Some((name, len, checksum)) => {
                let path = dir.join(name);
                let bytes = fs::read(&path).map_err(io("cannot read the checkpoint snapshot", &path))?;
                if bytes.len() as u64 != *len || fnv64(&bytes) != *checksum {
                    return Err(TesseraError::Checkpoint(format!("the snapshot {} is damaged", path.display())));
                }
                bytes
            }
        };
        Ok(Resume { manifest, snapshot })
    }

    pub fn interval(&self) -> Duration {
        self.config.interval
    }

    /// Saves a checkpoint of the source in progress (the operators made their tables in the
    /// state store durable before); returns its sequence number.
    pub fn write(&mut self, position: SourcePosition, snapshot: &[u8], sink: Vec<u64>) -> Result<u64> {
        let name = format!("snapshot-{:08}.bin", self.sequence + 1);
        write_synced(&self.config.dir.join(&name), snapshot)?;
        let file = (name, snapshot.len() as u64, fnv64(snapshot));
        self.commit(false, Some(position), Some(file), sink)?;
        Ok(self.sequence)
    }

    /// The folder of the durable state store beside the manifest.
    pub fn store_dir(&self) -> PathBuf {
        self.config.dir.join("store")
    }

    /// A source was read to the end.
    pub fn source_finished(&mut self, run: SourceRun) {
        self.finished.push(run);
    }

    /// The run ended: every source was read and every result written.
    pub fn complete(&mut self, sink: Vec<u64>) -> Result<()> {
        self.commit(true, None, None, sink)
    }

    fn commit(
        &mut self,
        complete: bool,
        position: Option<SourcePosition>,
        snapshot: Option<(String, u64, String)>,
        sink: Vec<u64>,
    ) -> Result<()> {
        self.sequence += 1;
        let manifest = Manifest {
            format: FORMAT,
            tessera_version: env!("CARGO_PKG_VERSION").to_string(),
            fingerprint: self.fingerprint.clone(),
            sequence: self.sequence,
            complete,
            finished: self.finished.clone(),
            position,
            snapshot: snapshot.clone(),
            sink,
        };
        let text = serde_json::to_vec_pretty(&manifest).map_err(|e| TesseraError::Internal(e.to_string()))?;
        let dir = &self.config.dir;
        let temporary = dir.join(format!("{MANIFEST}.tmp"));
        write_synced(&temporary, &text)?;
        fs::rename(&temporary, dir.join(MANIFEST)).map_err(io("cannot replace the manifest in", dir))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(io("cannot sync", dir))?;
        // Older snapshots are unreachable now.
        let keep = snapshot.map(|(name, _, _)| name);
        for entry in fs::read_dir(dir).map_err(io("cannot list", dir))?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with("snapshot-") && Some(&name) != keep.as_ref() {
                fs::remove_file(entry.path()).map_err(io("cannot remove", &entry.path()))?;
            }
        }
        Ok(())
    }
}
