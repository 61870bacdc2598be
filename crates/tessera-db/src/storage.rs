//! A database folder: immutable data files under `data/` (Parquet, see [`crate::datafile`];
//! databases of format 2 hold Arrow IPC files, read as they are) and one `MANIFEST` (JSON) that
//! names the files every table consists of. A statement writes its new files and syncs them,
//! then replaces the manifest atomically (writes `MANIFEST.tmp`, syncs it, keeps the manifest it
//! replaces as `MANIFEST.prev`, renames the new one over `MANIFEST`, syncs the folder): killed
//! at any point, the folder holds the manifest from before the statement or the one after it.
//! Files that neither manifest names (a statement killed before its rename, or files replaced
//! two statements ago) are deleted by the writer when it opens the folder and after each
//! statement.
//!
//! Every file carries checksums (XXH64): a data file's are part of its name and its footer, the
//! manifest's is stored beside its text; a file whose bytes do not match is an error that names it, never rows
//! read wrong. A damaged newest manifest can be replaced by the previous one (`recover`).
//!
//! One process writes a folder at a time: it holds an exclusive lock on `LOCK` (released by the
//! kernel when the process ends, however it ends) from its first change to its end, and writes
//! who it is into the file. Other processes read the last committed manifest; their changes are
//! refused with the holder named. A folder that holds something else, or a database of another
//! format, is refused with a message.
//!
//! A reading process registers the state it reads (a snapshot): a file under `readers/`
//! holding the manifest it read, locked by the reader for as long as it reads that state. The
//! writer keeps every data file a registered manifest names, and removes the registrations of
//! readers that have ended (their lock free). A reader registers a manifest and then checks it
//! is still the newest: the writer removes a manifest's files only two statements later, after
//! the registration is in place.
//!
//! Without a folder the database lives in memory: the same manifest and batches, no files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileReader;
use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::datafile::{self, checksum};
use tessera::error::{Result, TesseraError};

const MANIFEST: &str = "MANIFEST";
/// The manifest the last statement replaced, kept to recover from a damaged `MANIFEST`.
const PREVIOUS: &str = "MANIFEST.prev";
const LOCK: &str = "LOCK";
const DATA: &str = "data";
/// The folder statements spill into beyond their memory limit.
const SPILL: &str = "tmp";
/// The folder of readers' registrations.
const READERS: &str = "readers";
/// The manifest's format; a folder in another is refused. Format 2 added checksums, format 3
/// Parquet data files (a folder of format 2 is read, and written in format 3 from its next
/// statement on).
const FORMAT: u32 = 3;
const READ_FORMATS: [u32; 2] = [2, FORMAT];
/// What the manifest says it is, so that a `MANIFEST` of something else is told apart.
const KIND: &str = "tessera database";

/// What the database holds, as the manifest records it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub kind: String,
    pub format: u32,
    pub tessera_version: String,
    /// The sequence number of the last statement that changed the database.
    pub sequence: u64,
    /// The number the next data file gets.
    pub next_file: u64,
    pub tables: BTreeMap<String, TableEntry>,
    /// Materialized views by lower-case name.
    #[serde(default)]
    pub views: BTreeMap<String, ViewEntry>,
}

/// A materialized view: its query, its contents as of its last refresh, and the sequence
/// number of the last statement that refresh saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ViewEntry {
    pub query: String,
    pub contents: TableEntry,
    pub refreshed_at: u64,
    #[serde(default)]
    pub sample: Option<SampleEntry>,
}

/// A view's sample (`WITH (sample = m)`): its ratio and seed, its outlier index, its rows, and the sequence number
/// of the last statement they are clean as of.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SampleEntry {
    pub ratio: f64,
    pub seed: Option<i32>,
    pub contents: TableEntry,
    pub cleaned_at: u64,
    /// Its outlier index (`WITH (outlier_index = ...)`), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outliers: Option<crate::sample::OutlierOptions>,
    /// The outlier index's rows picked at the view's refresh, if it has an index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_base: Option<OutlierBaseEntry>,
}

/// The rows an outlier index picked at a view's refresh: the refresh's sequence number, the
/// value rows changed since must reach, and a file of their keys' hashes (one Int64 column).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OutlierBaseEntry {
    pub refreshed_at: u64,
    pub at_least: Option<f64>,
    pub file: String,
}

/// A table: its columns, its key, and the files of its rows.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TableEntry {
    /// The name as declared (the manifest's key is the lower-case name).
    pub name: String,
    /// Columns as `(name, Arrow type, nullable)`; the hidden row id comes last where the
    /// table has no declared primary key.
    pub columns: Vec<(String, String, bool)>,
    /// The key columns by name (the hidden row id where none was declared).
    pub key: Vec<String>,
    pub hidden_row_id: bool,
    /// The row id the next inserted row gets (tables with a hidden row id).
    pub next_row_id: u64,
    /// What a number given for a TIMESTAMP column counts (`s`, `ms`, `us`, `ns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_unit: Option<String>,
    /// The most characters of each text column declared with a length.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub max_lengths: std::collections::BTreeMap<String, u64>,
    pub segments: Vec<SegmentEntry>,
    /// What each statement changed, oldest first (see [`super::table::ChangeSet`]).
    pub changes: Vec<ChangeEntry>,
}

/// Rows inserted together, and which of them were deleted since.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SegmentEntry {
    pub file: String,
    pub rows: u64,
    /// A file of the deleted rows' positions (one UInt32 column), if any were deleted.
    pub deleted: Option<String>,
}

/// The rows one statement inserted into and deleted from a table.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ChangeEntry {
    pub sequence: u64,
    pub inserted: Option<String>,
    /// How many rows `inserted` holds (absent in manifests written before it was kept: the
    /// file is then read at open where no segment shares it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inserted_rows: Option<u64>,
    pub deleted: Option<String>,
    /// How many rows `deleted` holds (absent in manifests written before it was kept: the
    /// file is then read at open to count them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_rows: Option<u64>,
}

/// Where the database is kept.
pub enum Storage {
    Memory { next_file: u64, files: BTreeMap<String, RecordBatch> },
    Folder { dir: PathBuf, lock: WriterLock, snapshot: Option<Snapshot> },
}

impl Storage {
    pub fn memory() -> Self {
        Storage::Memory { next_file: 0, files: BTreeMap::new() }
    }

    /// Opens (or creates) the database folder `dir`; its manifest. The folder is locked for
    /// writing if no other process holds it (and then files no manifest names are deleted);
    /// otherwise it is opened for reading, and [`lock_for_writing`](Self::lock_for_writing)
    /// says who writes it.
    pub fn open_folder(dir: &Path) -> Result<(Self, Manifest)> {
        let io = |what: &str| {
            let what = format!("{what} {}", dir.display());
            move |e| TesseraError::io(what, e)
        };
        fs::create_dir_all(dir).map_err(io("cannot create the database folder"))?;
        let manifest_path = dir.join(MANIFEST);
        if !manifest_path.exists() {
            let others = fs::read_dir(dir)
                .map_err(io("cannot read"))?
                .flatten()
                .any(|entry| ![LOCK, DATA, SPILL, READERS].contains(&entry.file_name().to_string_lossy().as_ref()));
            if others {
                let previous = dir.join(PREVIOUS);
                return Err(match previous.exists() {
                    true => TesseraError::Database(format!(
                        "the manifest {} is missing{}",
                        manifest_path.display(),
                        recovery_hint(dir)
                    )),
                    false => TesseraError::Option(format!(
                        "{} is not a tessera database (it has files but no {MANIFEST}): give an empty or new folder",
                        dir.display()
                    )),
                });
            }
            // A new database: whoever creates it writes it.
            let mut storage = Storage::folder(dir)?;
            storage.lock_for_writing(std::time::Duration::ZERO)?;
            fs::create_dir_all(dir.join(DATA)).map_err(io("cannot create"))?;
            let manifest = new_manifest();
            storage.write_manifest(&manifest)?;
            return Ok((storage, manifest));
        }
        let mut storage = Storage::folder(dir)?;
        if let Storage::Folder { lock, .. } = &mut storage {
            lock.try_acquire()?;
        }
        let manifest = storage.read_state()?;
        if storage.writes() {
            storage.remove_leftovers(&manifest)?;
        }
        Ok((storage, manifest))
    }

    fn folder(dir: &Path) -> Result<Self> {
        Ok(Storage::Folder { dir: dir.to_path_buf(), lock: WriterLock::open(dir)?, snapshot: None })
    }

    /// The manifest as the folder holds it now, registered as the state this process reads
    /// if it only reads (see the module's doc): its files stay until the process reads
    /// another state or ends.
    pub fn read_state(&mut self) -> Result<Manifest> {
        for _ in 0..1000 {
            let manifest = self.read_manifest()?;
            if !self.register(&manifest)? || self.read_manifest()?.sequence == manifest.sequence {
                return Ok(manifest);
            }
        }
        Err(TesseraError::Database("the database changed a thousand times while it was being opened".into()))
    }

    /// Registers `manifest` as the state this process reads, if it only reads; whether it did
    /// (a folder this process may not write in is read without a registration).
    pub fn register(&mut self, manifest: &Manifest) -> Result<bool> {
        let Storage::Folder { dir, lock, snapshot } = self else { return Ok(false) };
        if lock.held {
            return Ok(false);
        }
        let text = seal(manifest)?;
        match snapshot {
            Some(snapshot) => snapshot.hold(&text)?,
            None => match Snapshot::register(dir, &text) {
                Some(registered) => *snapshot = Some(registered),
                None => return Ok(false),
            },
        }
        Ok(true)
    }

    /// Whether this process may write: it holds the folder's lock, or the database is in memory.
    pub fn writes(&self) -> bool {
        match self {
            Storage::Memory { .. } => true,
            Storage::Folder { lock, .. } => lock.held,
        }
    }

    /// Takes the folder's lock for writing, kept until the process ends; refused with the
    /// holder named if another process has it. Whether it was taken now (the manifest may have
    /// changed since it was read).
    pub fn lock_for_writing(&mut self, wait: std::time::Duration) -> Result<bool> {
        let Storage::Folder { dir, lock, snapshot } = self else { return Ok(false) };
        if lock.held {
            return Ok(false);
        }
        let until = std::time::Instant::now() + wait;
        loop {
            if lock.try_acquire()? {
                // The writer reads the newest state, which it keeps.
                *snapshot = None;
                return Ok(true);
            }
            if std::time::Instant::now() >= until {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let waited = match wait.is_zero() {
            true => String::new(),
            false => format!(" (waited {} ms: SET lock_wait_ms)", wait.as_millis()),
        };
        Err(TesseraError::Database(format!(
            "the database in {} is being written by another process ({}){waited}: one process writes a database \
             at a time, and this one can read it until that one ends",
            dir.display(),
            lock.holder()
        )))
    }

    /// The manifest as the folder holds it now (the one in memory, in memory).
    pub fn read_manifest(&self) -> Result<Manifest> {
        let Storage::Folder { dir, .. } = self else {
            return Err(TesseraError::Internal("an in-memory database has no manifest file".into()));
        };
        let path = dir.join(MANIFEST);
        let bytes = fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                TesseraError::Database(format!("the manifest {} is missing{}", path.display(), recovery_hint(dir)))
            }
            _ => TesseraError::io(format!("cannot read {}", path.display()), e),
        })?;
        parse_manifest(&bytes).map_err(|unusable| match unusable {
            Unusable::Damaged(reason) => TesseraError::Database(format!(
                "the manifest {} is damaged ({reason}){}",
                path.display(),
                recovery_hint(dir)
            )),
            Unusable::Foreign => {
                TesseraError::Option(format!("{} is not a tessera database: its {MANIFEST} is not one", dir.display()))
            }
            Unusable::Format { format, version } => TesseraError::Option(format!(
                "the database in {} is in format {format} (tessera {version}); this tessera ({}) reads formats {READ_FORMATS:?}",
                dir.display(),
                env!("CARGO_PKG_VERSION")
            )),
        })
    }

    /// Writes `batch` to a new file; its name. The file is durable once the manifest naming it
    /// is committed.
    pub fn write(&mut self, manifest: &mut Manifest, batch: &RecordBatch) -> Result<String> {
        Ok(self.write_batches(manifest, &batch.schema(), [Ok(batch.clone())])?.0)
    }

    /// Writes `batches` (of `schema`, taken one at a time: a folder holds one row group at a
    /// time) to a new file; its name and number of rows.
    pub fn write_batches(
        &mut self,
        manifest: &mut Manifest,
        schema: &SchemaRef,
        batches: impl IntoIterator<Item = Result<RecordBatch>>,
    ) -> Result<(String, usize)> {
        let number = manifest.next_file;
        manifest.next_file += 1;
        match self {
            Storage::Memory { files, next_file } => {
                let name = format!("{number:08}.arrow");
                *next_file = manifest.next_file;
                let batches = batches.into_iter().collect::<Result<Vec<_>>>()?;
                let batch = arrow::compute::concat_batches(schema, &batches)?;
                let rows = batch.num_rows();
                files.insert(name.clone(), batch);
                Ok((name, rows))
            }
            Storage::Folder { dir, lock, .. } => {
                lock.ensure_held()?;
                datafile::write(&dir.join(DATA), number, schema, batches)
            }
        }
    }

    /// The rows of file `name`, as `schema` says they are.
    pub fn read(&self, name: &str, schema: &SchemaRef) -> Result<RecordBatch> {
        match self {
            Storage::Memory { files, .. } => {
                let batch = files.get(name).cloned();
                holding(name, batch.ok_or_else(|| TesseraError::Internal(format!("no database file {name}")))?, schema)
            }
            Storage::Folder { dir, .. } => FolderReader { dir: Arc::new(dir.clone()) }.read(name, schema),
        }
    }

    /// Where statements spill what does not fit their memory limit: the folder's `tmp/` (`None`
    /// in memory).
    pub fn spill_folder(&self) -> Option<PathBuf> {
        match self {
            Storage::Memory { .. } => None,
            Storage::Folder { dir, .. } => Some(dir.join(SPILL)),
        }
    }

    /// What reads the folder's data files later, when rows are first needed (`None` in
    /// memory, where every file is held).
    pub fn reader(&self) -> Option<FolderReader> {
        match self {
            Storage::Memory { .. } => None,
            Storage::Folder { dir, .. } => Some(FolderReader { dir: Arc::new(dir.clone()) }),
        }
    }

    /// Replaces the manifest `previous` by `manifest` (atomically in a folder, `previous` kept
    /// as the one to recover to), then deletes the files neither names.
    pub fn commit(&mut self, previous: &Manifest, manifest: &Manifest) -> Result<()> {
        if let Storage::Folder { dir, lock, .. } = self {
            lock.ensure_held()?;
            // The new files' names are durable before a manifest names them.
            let data = dir.join(DATA);
            File::open(&data)
                .and_then(|d| d.sync_all())
                .map_err(|e| TesseraError::io(format!("cannot sync {}", data.display()), e))?;
        }
        self.write_manifest(manifest)?;
        self.remove_unnamed(&[previous, manifest])
    }

    fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        let Storage::Folder { dir, .. } = self else { return Ok(()) };
        let text = seal(manifest)?;
        let tmp = dir.join("MANIFEST.tmp");
        let error = |e| TesseraError::io(format!("cannot write {}", tmp.display()), e);
        let mut file = File::create(&tmp).map_err(error)?;
        file.write_all(text.as_bytes()).map_err(error)?;
        file.sync_all().map_err(error)?;
        let current = dir.join(MANIFEST);
        if current.exists() {
            // The manifest being replaced becomes the previous one, in one rename.
            let previous_tmp = dir.join("MANIFEST.prev.tmp");
            let _ = fs::remove_file(&previous_tmp);
            fs::hard_link(&current, &previous_tmp)
                .or_else(|_| fs::copy(&current, &previous_tmp).map(|_| ()))
                .and_then(|()| fs::rename(&previous_tmp, dir.join(PREVIOUS)))
                .map_err(|e| TesseraError::io(format!("cannot keep the previous manifest in {}", dir.display()), e))?;
        }
        fs::rename(&tmp, &current).map_err(error)?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(error)
    }

    /// What a writer finds left by a statement killed midway: the new manifest it had not put
    /// in place, files no manifest names.
    fn remove_leftovers(&mut self, manifest: &Manifest) -> Result<()> {
        let Storage::Folder { dir, .. } = self else { return Ok(()) };
        for leftover in ["MANIFEST.tmp", "MANIFEST.prev.tmp"] {
            let _ = fs::remove_file(dir.join(leftover));
        }
        let previous = fs::read(dir.join(PREVIOUS)).ok().and_then(|bytes| parse_manifest(&bytes).ok());
        let mut keep = vec![manifest];
        keep.extend(previous.as_ref());
        self.remove_unnamed(&keep)
    }

    /// Deletes the data files none of `manifests` names, nor the manifest of a state a reader
    /// reads.
    fn remove_unnamed(&mut self, manifests: &[&Manifest]) -> Result<()> {
        let mut named: BTreeSet<String> = manifests.iter().flat_map(|m| named_files(m)).map(String::from).collect();
        match self {
            Storage::Memory { files, .. } => files.retain(|name, _| named.contains(name.as_str())),
            Storage::Folder { dir, .. } => {
                // A registration being written: nothing is removed this time.
                let Some(read) = read_states(dir) else { return Ok(()) };
                named.extend(read.iter().flat_map(named_files).map(String::from));
                let data = dir.join(DATA);
                let entries =
                    fs::read_dir(&data).map_err(|e| TesseraError::io(format!("cannot read {}", data.display()), e))?;
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if !named.contains(name.as_str()) {
                        fs::remove_file(entry.path())
                            .map_err(|e| TesseraError::io(format!("cannot remove {}", entry.path().display()), e))?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Makes the previous manifest of the database in `dir` its manifest again, when the newest
/// one is damaged or missing and the previous one and every file it names are intact: the
/// database as it was before its last statement. The damaged manifest is kept beside it. What
/// was done, in a sentence.
pub fn recover(dir: &Path) -> Result<String> {
    if !dir.join(MANIFEST).exists() && !dir.join(PREVIOUS).exists() {
        return Err(TesseraError::Option(format!("{} holds no tessera database", dir.display())));
    }
    let mut storage = Storage::folder(dir)?;
    storage.lock_for_writing(std::time::Duration::ZERO)?;
    let problem = match storage.read_manifest() {
        Ok(manifest) => {
            return Ok(format!(
                "the manifest of {} is intact (sequence {}): nothing to recover",
                dir.display(),
                manifest.sequence
            ))
        }
        Err(TesseraError::Database(problem)) => problem,
        Err(other) => return Err(other),
    };
    let previous_path = dir.join(PREVIOUS);
    let previous = fs::read(&previous_path).ok().and_then(|bytes| parse_manifest(&bytes).ok()).ok_or_else(|| {
        TesseraError::Database(format!("{problem}; and {} is not intact either", previous_path.display()))
    })?;
    for name in named_files(&previous) {
        let path = dir.join(DATA).join(name);
        read_file(&path).map_err(|e| {
            TesseraError::Database(format!("{problem}; the previous manifest names a file that is not intact: {e}"))
        })?;
    }
    let current = dir.join(MANIFEST);
    if current.exists() {
        let kept = dir.join(format!("MANIFEST.damaged-{}", previous.sequence + 1));
        fs::rename(&current, &kept).map_err(|e| TesseraError::io(format!("cannot move {}", current.display()), e))?;
    }
    // With the damaged one moved aside, it does not become the previous manifest.
    storage.write_manifest(&previous)?;
    Ok(format!(
        "{problem}.\nRecovered: the database in {} is back at sequence {}, as before its last statement (the damaged \
         manifest is kept as MANIFEST.damaged-{})",
        dir.display(),
        previous.sequence,
        previous.sequence + 1
    ))
}

/// How the recovery command helps with a damaged or missing manifest of the database in `dir`,
/// if the previous one is intact.
fn recovery_hint(dir: &Path) -> String {
    match fs::read(dir.join(PREVIOUS)).ok().and_then(|bytes| parse_manifest(&bytes).ok()) {
        Some(previous) => format!(
            "; the previous manifest (sequence {}, before the last statement) is intact: `tessera recover --db {}` \
             goes back to it",
            previous.sequence,
            dir.display()
        ),
        None => String::new(),
    }
}

/// The folder's `LOCK` file and whether this process holds its exclusive lock.
pub struct WriterLock {
    file: File,
    held: bool,
}

impl WriterLock {
    fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            // A folder this process may only read: it reads.
            .or_else(|_| File::open(&path))
            .map_err(|e| TesseraError::io(format!("cannot open {}", path.display()), e))?;
        Ok(WriterLock { file, held: false })
    }

    /// Takes the lock if no other process has it, writing who holds it into the file; whether
    /// it was taken.
    fn try_acquire(&mut self) -> Result<bool> {
        match self.file.try_lock() {
            Ok(()) => {
                self.held = true;
                let mut command = std::env::args().collect::<Vec<_>>().join(" ");
                if command.chars().count() > 120 {
                    command = command.chars().take(117).collect::<String>() + "...";
                }
                let since = chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC");
                let holder = format!("process {}, `{command}`, since {since}\n", std::process::id());
                // Who holds it is information for the refused: failing to write it is no reason
                // to give the lock up.
                let _ = self.file.set_len(0);
                let _ = self.file.rewind().and_then(|()| self.file.write_all(holder.as_bytes()));
                Ok(true)
            }
            Err(std::fs::TryLockError::WouldBlock) => Ok(false),
            Err(std::fs::TryLockError::Error(e)) => Err(TesseraError::io("cannot lock the database folder", e)),
        }
    }

    /// Who holds the lock, as the holder wrote it.
    fn holder(&mut self) -> String {
        let mut text = String::new();
        let _ = self.file.rewind().and_then(|()| self.file.read_to_string(&mut text));
        match text.trim() {
            "" => "a process that has not said which".into(),
            holder => holder.to_string(),
        }
    }

    fn ensure_held(&self) -> Result<()> {
        match self.held {
            true => Ok(()),
            false => Err(TesseraError::Internal("a statement wrote the database without its lock".into())),
        }
    }
}

/// A reader's registration of the state it reads: the file `readers/<pid>-<n>`, holding that
/// state's manifest and locked while the registration stands; removed when it is dropped.
pub struct Snapshot {
    file: File,
    path: PathBuf,
}

impl Snapshot {
    /// A new registration of manifest `text` in folder `dir`, or `None` where the folder cannot
    /// take one. It is written under a hidden name, locked, and then given its name, so that the
    /// writer never finds it unlocked while this process lives.
    fn register(dir: &Path, text: &str) -> Option<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let readers = dir.join(READERS);
        fs::create_dir_all(&readers).ok()?;
        let name = format!("{}-{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let hidden = readers.join(format!(".{name}"));
        let mut file = File::options().read(true).write(true).create_new(true).open(&hidden).ok()?;
        // The writer may have taken the hidden file for a dead reader's and removed it: then the
        // rename fails and no registration is made.
        file.try_lock().ok()?;
        file.write_all(text.as_bytes()).ok()?;
        let path = readers.join(name);
        fs::rename(&hidden, &path).ok()?;
        Some(Snapshot { file, path })
    }

    /// Makes the registration hold manifest `text` instead.
    fn hold(&mut self, text: &str) -> Result<()> {
        let error = |e| TesseraError::io(format!("cannot write {}", self.path.display()), e);
        self.file.set_len(0).map_err(error)?;
        self.file.rewind().map_err(error)?;
        self.file.write_all(text.as_bytes()).map_err(error)
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The manifests the readers of folder `dir` have registered, after removing the registrations
/// of readers that have ended; `None` if one is being written (or cannot be read) now.
fn read_states(dir: &Path) -> Option<Vec<Manifest>> {
    let Ok(entries) = fs::read_dir(dir.join(READERS)) else { return Some(Vec::new()) };
    let mut states = Vec::new();
    for entry in entries.flatten() {
        let Ok(mut file) = File::open(entry.path()) else { continue };
        match file.try_lock() {
            // Its reader has ended.
            Ok(()) => {
                let _ = fs::remove_file(entry.path());
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).ok()?;
                states.push(parse_manifest(&bytes).ok()?);
            }
            Err(std::fs::TryLockError::Error(_)) => return None,
        }
    }
    Some(states)
}

/// The bytes of Arrow IPC data file `path` (format 2), checked against the checksum in its name.
fn verified_bytes(path: &Path) -> Result<Vec<u8>> {
    let damaged = |reason: String| TesseraError::Database(format!("the database file {} is {reason}", path.display()));
    let bytes = fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => damaged("missing".into()),
        _ => damaged(format!("unreadable: {e}")),
    })?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let expected = name.strip_suffix(".arrow").and_then(|stem| stem.split_once('-')).map(|(_, sum)| sum);
    match expected {
        Some(expected) if format!("{:016x}", checksum(&bytes)) == expected => Ok(bytes),
        Some(_) => Err(damaged("damaged: its contents do not match its checksum".into())),
        None => Err(damaged("damaged: its name carries no checksum".into())),
    }
}

/// Reads the data files of a database folder: what a table reads a segment's rows with the
/// first time a statement needs them. Cheap to clone.
#[derive(Debug, Clone)]
pub struct FolderReader {
    dir: Arc<PathBuf>,
}

impl FolderReader {
    /// The folder of the data files.
    pub fn data(&self) -> PathBuf {
        self.dir.join(DATA)
    }

    /// The rows of data file `name`, checked against its checksum and `schema`.
    pub fn read(&self, name: &str, schema: &SchemaRef) -> Result<RecordBatch> {
        holding(name, read_file(&self.dir.join(DATA).join(name))?, schema)
    }

    /// The rows of data file `name` in batches of at most `batch_size` rows, read as they are
    /// taken from a Parquet file (a format-2 file is read whole), checked against its checksums
    /// and `schema`.
    pub fn read_batches(
        &self,
        name: &str,
        schema: &SchemaRef,
        batch_size: usize,
    ) -> Result<Box<dyn Iterator<Item = Result<RecordBatch>>>> {
        let path = self.dir.join(DATA).join(name);
        if path.extension().is_none_or(|e| e != "parquet") {
            return Ok(Box::new(std::iter::once(self.read(name, schema))));
        }
        let (read, batches) = datafile::read_batches(&path, batch_size)?;
        holding(name, RecordBatch::new_empty(read), schema)?;
        Ok(Box::new(batches))
    }
}

/// `batch`, read from file `name`, if it has the columns of `schema`.
fn holding(name: &str, batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    if batch.schema().fields() != schema.fields() {
        return Err(TesseraError::Database(format!(
            "the database file {name} does not hold the columns its table has"
        )));
    }
    Ok(batch)
}

/// The rows of data file `path`, every byte checked: Parquet, or Arrow IPC in a database of
/// format 2.
fn read_file(path: &Path) -> Result<RecordBatch> {
    if path.extension().is_some_and(|e| e == "parquet") {
        return datafile::read(path);
    }
    let bytes = verified_bytes(path)?;
    let damaged =
        |reason: String| TesseraError::Database(format!("the database file {} is damaged: {reason}", path.display()));
    let reader = FileReader::try_new(std::io::Cursor::new(bytes), None).map_err(|e| damaged(e.to_string()))?;
    let schema = reader.schema();
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| damaged(e.to_string()))?;
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// The manifest as kept on disk: its JSON text inside an object that also holds the text's
/// checksum.
#[derive(Deserialize)]
struct Sealed<'a> {
    checksum: String,
    #[serde(borrow)]
    manifest: &'a serde_json::value::RawValue,
}

fn seal(manifest: &Manifest) -> Result<String> {
    // Written in this tessera's format, whichever it was read in.
    let manifest = Manifest { format: FORMAT, ..manifest.clone() };
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| TesseraError::Internal(e.to_string()))?;
    Ok(format!("{{\n\"checksum\": \"{:016x}\",\n\"manifest\": {text}\n}}\n", checksum(text.as_bytes())))
}

/// Why a manifest file cannot be used.
enum Unusable {
    Damaged(String),
    /// It is not a tessera database's.
    Foreign,
    /// A tessera database's in another format.
    Format {
        format: u32,
        version: String,
    },
}

fn parse_manifest(bytes: &[u8]) -> std::result::Result<Manifest, Unusable> {
    #[derive(Deserialize)]
    struct Unsealed {
        kind: Option<String>,
        format: Option<u32>,
        tessera_version: Option<String>,
    }
    let manifest = match serde_json::from_slice::<Sealed>(bytes) {
        Ok(sealed) => {
            let text = sealed.manifest.get();
            if format!("{:016x}", checksum(text.as_bytes())) != sealed.checksum {
                return Err(Unusable::Damaged("its contents do not match its checksum".into()));
            }
            serde_json::from_str::<Manifest>(text).map_err(|e| Unusable::Damaged(e.to_string()))?
        }
        Err(error) => {
            return Err(match serde_json::from_slice::<Unsealed>(bytes) {
                // Format 1 was not sealed.
                Ok(Unsealed { kind: Some(kind), format: Some(format), tessera_version }) if kind == KIND => {
                    Unusable::Format { format, version: tessera_version.unwrap_or_default() }
                }
                Ok(_) => Unusable::Foreign,
                Err(_) if [KIND, "\"checksum\""].iter().any(|mark| contains(bytes, mark.as_bytes())) => {
                    Unusable::Damaged(error.to_string())
                }
                Err(_) => Unusable::Foreign,
            });
        }
    };
    match (manifest.kind == KIND, READ_FORMATS.contains(&manifest.format)) {
        (false, _) => Err(Unusable::Foreign),
        (true, false) => Err(Unusable::Format { format: manifest.format, version: manifest.tessera_version }),
        (true, true) => Ok(manifest),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

pub fn new_manifest() -> Manifest {
    Manifest {
        kind: KIND.into(),
        format: FORMAT,
        tessera_version: env!("CARGO_PKG_VERSION").into(),
        ..Manifest::default()
    }
}

fn named_files(manifest: &Manifest) -> BTreeSet<&str> {
    let mut named = BTreeSet::new();
    let views = manifest
        .views
        .values()
        .flat_map(|v| std::iter::once(&v.contents).chain(v.sample.as_ref().map(|s| &s.contents)));
    for table in manifest.tables.values().chain(views) {
        for segment in &table.segments {
            named.insert(segment.file.as_str());
            named.extend(segment.deleted.as_deref());
        }
        for change in &table.changes {
            named.extend(change.inserted.as_deref());
            named.extend(change.deleted.as_deref());
        }
    }
    let bases = manifest.views.values().filter_map(|v| v.sample.as_ref()?.outlier_base.as_ref());
    named.extend(bases.map(|b| b.file.as_str()));
    named
}
