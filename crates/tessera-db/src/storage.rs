//! A database folder: immutable Arrow IPC files under `data/` and one `MANIFEST` (JSON) that
//! names the files every table consists of. A statement writes its new files and syncs them,
//! then replaces the manifest atomically (writes `MANIFEST.tmp`, syncs it, renames it over
//! `MANIFEST`, syncs the folder): killed at any point, the folder holds the manifest from
//! before the statement or the one after it. Files that no manifest names (a statement killed
//! before its rename, or files an applied statement replaced) are deleted when the folder is
//! opened and after each statement. A folder that holds something else, or a database of
//! another format, is refused with a message.
//!
//! Without a folder the database lives in memory: the same manifest and batches, no files.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;
use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use tessera::error::{Result, TesseraError};

const MANIFEST: &str = "MANIFEST";
const DATA: &str = "data";
/// The manifest's format; a folder in another is refused.
const FORMAT: u32 = 1;
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
    pub deleted: Option<String>,
}

/// Where the database is kept.
pub enum Storage {
    Memory { next_file: u64, files: BTreeMap<String, RecordBatch> },
    Folder { dir: PathBuf },
}

impl Storage {
    pub fn memory() -> Self {
        Storage::Memory { next_file: 0, files: BTreeMap::new() }
    }

    /// Opens (or creates) the database folder `dir`; its manifest, with files no manifest
    /// names deleted.
    pub fn open_folder(dir: &Path) -> Result<(Self, Manifest)> {
        let io = |what: &str| {
            let what = format!("{what} {}", dir.display());
            move |e| TesseraError::io(what, e)
        };
        if !dir.exists() {
            fs::create_dir_all(dir.join(DATA)).map_err(io("cannot create the database folder"))?;
            let storage = Storage::Folder { dir: dir.to_path_buf() };
            let manifest = new_manifest();
            storage.write_manifest(&manifest)?;
            return Ok((storage, manifest));
        }
        let path = dir.join(MANIFEST);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let empty = fs::read_dir(dir).map_err(io("cannot read"))?.next().is_none();
                if !empty {
                    return Err(TesseraError::Option(format!(
                        "{} is not a tessera database (it has files but no {MANIFEST}): give an empty or new folder",
                        dir.display()
                    )));
                }
                fs::create_dir_all(dir.join(DATA)).map_err(io("cannot create"))?;
                let storage = Storage::Folder { dir: dir.to_path_buf() };
                let manifest = new_manifest();
                storage.write_manifest(&manifest)?;
                return Ok((storage, manifest));
            }
            Err(e) => return Err(TesseraError::io(format!("cannot read {}", path.display()), e)),
        };
        let manifest: Manifest =
            serde_json::from_slice(&text).ok().filter(|m: &Manifest| m.kind == KIND).ok_or_else(|| {
                TesseraError::Option(format!("{} is not a tessera database: its {MANIFEST} is not one", dir.display()))
            })?;
        if manifest.format != FORMAT {
            return Err(TesseraError::Option(format!(
                "the database in {} is in format {} (tessera {}); this tessera ({}) reads format {FORMAT}",
                dir.display(),
                manifest.format,
                manifest.tessera_version,
                env!("CARGO_PKG_VERSION")
            )));
        }
        let mut storage = Storage::Folder { dir: dir.to_path_buf() };
        storage.remove_unnamed(&manifest)?;
        Ok((storage, manifest))
    }

    /// Writes `batch` to a new file; its name. The file is durable before this returns.
    pub fn write(&mut self, manifest: &mut Manifest, batch: &RecordBatch) -> Result<String> {
        let name = format!("{:08}.arrow", manifest.next_file);
        manifest.next_file += 1;
        match self {
            Storage::Memory { files, next_file } => {
                *next_file = manifest.next_file;
                files.insert(name.clone(), batch.clone());
            }
            Storage::Folder { dir } => {
                let path = dir.join(DATA).join(&name);
                let error = |e| TesseraError::io(format!("cannot write {}", path.display()), e);
                let file = File::create(&path).map_err(error)?;
                let mut writer = FileWriter::try_new(std::io::BufWriter::new(file), &batch.schema())?;
                writer.write(batch)?;
                writer.finish()?;
                let file = writer.into_inner()?.into_inner().map_err(|e| error(e.into_error()))?;
                file.sync_all().map_err(error)?;
            }
        }
        Ok(name)
    }

    /// The rows of file `name`, as `schema` says they are.
    pub fn read(&self, name: &str, schema: &SchemaRef) -> Result<RecordBatch> {
        let batch = match self {
            Storage::Memory { files, .. } => files.get(name).cloned(),
            Storage::Folder { dir } => {
                let path = dir.join(DATA).join(name);
                let damaged = |reason: String| {
                    TesseraError::Option(format!("the database file {} is damaged: {reason}", path.display()))
                };
                let file = File::open(&path).map_err(|e| damaged(e.to_string()))?;
                let reader =
                    FileReader::try_new(std::io::BufReader::new(file), None).map_err(|e| damaged(e.to_string()))?;
                let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| damaged(e.to_string()))?;
                let file_schema = batches.first().map(|b| b.schema());
                Some(match file_schema {
                    Some(s) => arrow::compute::concat_batches(&s, &batches)?,
                    None => RecordBatch::new_empty(Arc::clone(schema)),
                })
            }
        };
        let batch = batch.ok_or_else(|| TesseraError::Internal(format!("no database file {name}")))?;
        if batch.schema().fields() != schema.fields() {
            return Err(TesseraError::Option(format!(
                "the database file {name} does not hold the columns its table has"
            )));
        }
        Ok(batch)
    }

    /// Replaces the manifest (atomically in a folder), then deletes the files it no longer
    /// names.
    pub fn commit(&mut self, manifest: &Manifest) -> Result<()> {
        self.write_manifest(manifest)?;
        self.remove_unnamed(manifest)
    }

    fn write_manifest(&self, manifest: &Manifest) -> Result<()> {
        let Storage::Folder { dir } = self else { return Ok(()) };
        let text = serde_json::to_vec_pretty(manifest).map_err(|e| TesseraError::Internal(e.to_string()))?;
        let tmp = dir.join("MANIFEST.tmp");
        let error = |e| TesseraError::io(format!("cannot write {}", tmp.display()), e);
        let mut file = File::create(&tmp).map_err(error)?;
        file.write_all(&text).map_err(error)?;
        file.sync_all().map_err(error)?;
        fs::rename(&tmp, dir.join(MANIFEST)).map_err(error)?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(error)
    }

    fn remove_unnamed(&mut self, manifest: &Manifest) -> Result<()> {
        let named = named_files(manifest);
        match self {
            Storage::Memory { files, .. } => files.retain(|name, _| named.contains(name.as_str())),
            Storage::Folder { dir } => {
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
