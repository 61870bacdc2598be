//! A table: its rows in segments (the rows one statement inserted, and which of them were
//! deleted since) and what each statement changed (the change relation incremental maintenance
//! reads). A table without a declared primary key gets a hidden row id as its key, numbered in
//! insertion order. A table loaded from a folder holds its segments' file names and counts
//! only: a segment's rows are read (and kept) the first time a statement needs them whole, so
//! opening a database reads its manifest and deletion files, not its rows. Queries read the
//! files through [`TableScan`]; so do the key checks of a statement, which look up only the
//! keys it inserts ([`HeldKeys`], found by the database with a semi-join).
//!
//! A statement's edit is checked first ([`Table::check`]: nothing changes when a key is
//! violated), its files written next, and only then applied in memory.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{filter_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use hashbrown::HashMap;

use crate::convert::checked_cast;
use crate::datafile::ROWS_PER_GROUP;
use crate::scan::{ScannedFile, TableScan};
use crate::storage::{ChangeEntry, FolderReader, Manifest, SegmentEntry, Storage, TableEntry};
use tessera::catalog::{sql_type_name, TimeUnit};
use tessera::error::{Result, TesseraError};

/// The hidden key column of a table without a declared primary key.
pub const ROW_ID: &str = "_tessera_row_id";

pub struct Table {
    pub name: String,
    /// The declared columns: what queries see.
    pub schema: SchemaRef,
    /// The declared columns, then the hidden row id if there is one.
    stored: SchemaRef,
    /// Key columns (indices into `stored`).
    key: Vec<usize>,
    hidden_row_id: bool,
    next_row_id: u64,
    /// What a number given for a TIMESTAMP column counts (`WITH (time_unit = ...)`); without
    /// one, numbers are refused there.
    pub time_unit: Option<TimeUnit>,
    /// The most characters a text column declared `VARCHAR(n)` or `CHAR(n)` holds, by column
    /// name.
    pub max_lengths: BTreeMap<String, u64>,
    segments: Vec<Segment>,
    changes: Vec<ChangeSet>,
}

struct Segment {
    rows: FileRows,
    deleted: Vec<bool>,
    deleted_count: usize,
    deleted_file: Option<String>,
}

/// The rows of a data file: held, or read the first time they are needed and then kept
/// (shared by the segment and the change set of the statement that wrote them).
#[derive(Clone)]
pub struct FileRows {
    file: String,
    count: usize,
    schema: SchemaRef,
    held: Arc<OnceLock<RecordBatch>>,
    reader: Option<FolderReader>,
}

impl FileRows {
    /// Rows held already, written to `file`.
    fn held(rows: RecordBatch, file: String) -> Self {
        let count = rows.num_rows();
        let schema = rows.schema();
        FileRows { file, count, schema, held: Arc::new(OnceLock::from(rows)), reader: None }
    }

    /// The `count` rows of `file`, read by `reader` when first needed.
    fn on_disk(file: String, count: usize, schema: SchemaRef, reader: FolderReader) -> Self {
        FileRows { file, count, schema, held: Arc::new(OnceLock::new()), reader: Some(reader) }
    }

    pub fn num_rows(&self) -> usize {
        self.count
    }

    /// The rows, read now if they are not held.
    pub fn batch(&self) -> Result<RecordBatch> {
        if let Some(rows) = self.held.get() {
            return Ok(rows.clone());
        }
        let reader =
            self.reader.as_ref().ok_or_else(|| TesseraError::Internal(format!("no rows for {}", self.file)))?;
        let rows = self.counted(reader.read(&self.file, &self.schema)?)?;
        Ok(self.held.get_or_init(|| rows).clone())
    }

    /// The rows in batches of at most `batch_size` rows: read as they are taken (and not kept)
    /// if they are not held.
    fn batches(&self, batch_size: usize) -> Result<Box<dyn Iterator<Item = Result<RecordBatch>>>> {
        if let (None, Some(reader)) = (self.held.get(), &self.reader) {
            return reader.read_batches(&self.file, &self.schema, batch_size);
        }
        let rows = self.batch()?;
        let starts = (0..rows.num_rows()).step_by(batch_size.max(1));
        Ok(Box::new(starts.map(move |start| Ok(rows.slice(start, batch_size.min(rows.num_rows() - start))))))
    }

    /// `rows`, read from the file, if they are as many as the manifest says.
    fn counted(&self, rows: RecordBatch) -> Result<RecordBatch> {
        match rows.num_rows() == self.count {
            true => Ok(rows),
            false => Err(TesseraError::Database(format!(
                "the database file {} holds {} rows where the manifest says {}",
                self.file,
                rows.num_rows(),
                self.count
            ))),
        }
    }
}

impl Segment {
    fn live(&self) -> usize {
        self.rows.num_rows() - self.deleted_count
    }

    /// The live rows, a row group at a time, read as they are taken.
    fn live_batches(&self) -> Result<impl Iterator<Item = Result<RecordBatch>> + '_> {
        let mut start = 0;
        Ok(self.rows.batches(ROWS_PER_GROUP)?.map(move |batch| {
            let batch = batch?;
            let deleted = &self.deleted[start..start + batch.num_rows()];
            start += batch.num_rows();
            match deleted.iter().any(|&d| d) {
                true => Ok(filter_record_batch(&batch, &BooleanArray::from_iter(deleted.iter().map(|d| Some(!d))))?),
                false => Ok(batch),
            }
        }))
    }
}

/// Which segments a compaction rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compaction {
    /// After every statement, and by `VACUUM`: segments of fewer than a row group's rows are
    /// merged when four or more of one size tier (a power of four) are there, and a segment a
    /// quarter or more of whose rows are deleted is rewritten without them. A row is rewritten
    /// by merges at most once per tier below a row group's size (9 times), and a rewrite for
    /// deletions writes at most three live rows per deleted row it drops.
    Tiered,
    /// `VACUUM FULL`: every segment rewritten into one, without its deleted rows, if the table
    /// has more than one segment or any deleted row.
    Full,
}

/// What a compaction did to a table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    pub segments_before: usize,
    pub segments_after: usize,
    /// Live rows written into new segments.
    pub rows_written: usize,
    /// Deleted rows dropped.
    pub rows_dropped: usize,
}

/// The groups of segments (each segment's rows and deleted rows) `compaction` rewrites, each
/// group into one new segment.
fn compaction_groups(segments: &[(usize, usize)], compaction: Compaction) -> Vec<Vec<usize>> {
    if compaction == Compaction::Full {
        let rewrite = segments.len() > 1 || segments.iter().any(|&(_, deleted)| deleted > 0);
        return match rewrite {
            true => vec![(0..segments.len()).collect()],
            false => Vec::new(),
        };
    }
    let mut groups = Vec::new();
    let mut tiers: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    let holey = |(rows, deleted): (usize, usize)| deleted > 0 && deleted * 4 >= rows;
    for (s, &(rows, deleted)) in segments.iter().enumerate() {
        let live = rows - deleted;
        if live == 0 {
            groups.push(vec![s]);
        } else if live < ROWS_PER_GROUP {
            tiers.entry(live.ilog2() / 2).or_default().push(s);
        } else if holey((rows, deleted)) {
            groups.push(vec![s]);
        }
    }
    for members in tiers.into_values() {
        match members.len() >= 4 {
            true => groups.push(members),
            false => groups.extend(members.into_iter().filter(|&s| holey(segments[s])).map(|s| vec![s])),
        }
    }
    groups
}

/// The live rows holding some keys: each key (in Arrow's row format) to its row's position.
#[derive(Default)]
pub struct HeldKeys(HashMap<Vec<u8>, (u32, u32)>);

impl HeldKeys {
    fn get(&self, key: &[u8]) -> Option<(u32, u32)> {
        self.0.get(key).copied()
    }
}

/// What one statement did to a table: the rows it inserted and the rows it deleted (an update
/// is both), with the statement's sequence number.
#[derive(Clone)]
pub struct ChangeSet {
    pub sequence: u64,
    pub inserted: Option<FileRows>,
    pub deleted: Option<FileRows>,
}

/// A statement's edit of one table: rows deleted by position, then rows inserted.
#[derive(Default)]
pub struct Edit {
    pub deleted: Vec<(u32, u32)>,
    /// Rows with the declared columns.
    pub inserted: Option<RecordBatch>,
}

impl Table {
    /// A new, empty table of `columns` keyed by `primary_key` (none: a hidden row id).
    pub fn new(name: &str, columns: Vec<Field>, primary_key: &[String]) -> Result<Self> {
        let schema = Arc::new(Schema::new(columns));
        let mut key = Vec::new();
        for column in primary_key {
            let i = schema.index_of(column).map_err(|_| {
                TesseraError::Plan(format!(
                    "the primary key of `{name}` names `{column}`, which is not one of its columns"
                ))
            })?;
            key.push(i);
        }
        let hidden_row_id = key.is_empty();
        // Key columns hold no NULL.
        let mut fields: Vec<Field> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| f.as_ref().clone().with_nullable(f.is_nullable() && !key.contains(&i)))
            .collect();
        if hidden_row_id {
            key.push(fields.len());
            fields.push(Field::new(ROW_ID, DataType::Int64, false));
        }
        let stored = Arc::new(Schema::new(fields.clone()));
        let schema = Arc::new(Schema::new(fields[..schema.fields().len()].to_vec()));
        Ok(Table {
            name: name.to_string(),
            schema,
            stored,
            key,
            hidden_row_id,
            next_row_id: 0,
            time_unit: None,
            max_lengths: BTreeMap::new(),
            segments: Vec::new(),
            changes: Vec::new(),
        })
    }

    /// The table as the manifest records it.
    pub fn entry(&self) -> TableEntry {
        TableEntry {
            name: self.name.clone(),
            columns: self
                .stored
                .fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().to_string(), f.is_nullable()))
                .collect(),
            key: self.key_names(),
            hidden_row_id: self.hidden_row_id,
            next_row_id: self.next_row_id,
            time_unit: self.time_unit.map(|unit| unit.suffix().to_string()),
            max_lengths: self.max_lengths.clone(),
            segments: self
                .segments
                .iter()
                .map(|s| SegmentEntry {
                    file: s.rows.file.clone(),
                    rows: s.rows.num_rows() as u64,
                    deleted: s.deleted_file.clone(),
                })
                .collect(),
            changes: self
                .changes
                .iter()
                .map(|c| ChangeEntry {
                    sequence: c.sequence,
                    inserted: c.inserted.as_ref().map(|r| r.file.clone()),
                    inserted_rows: c.inserted.as_ref().map(|r| r.num_rows() as u64),
                    deleted: c.deleted.as_ref().map(|r| r.file.clone()),
                    deleted_rows: c.deleted.as_ref().map(|r| r.num_rows() as u64),
                })
                .collect(),
        }
    }

    /// The table a manifest entry describes, its rows read from `storage`.
    pub fn load(entry: &TableEntry, storage: &Storage) -> Result<Self> {
        let damaged = |reason: String| TesseraError::Option(format!("the table `{}` is damaged: {reason}", entry.name));
        let fields = entry
            .columns
            .iter()
            .map(|(name, data_type, nullable)| {
                let data_type: DataType = data_type.parse().map_err(|e| damaged(format!("{e}")))?;
                Ok(Field::new(name, data_type, *nullable))
            })
            .collect::<Result<Vec<_>>>()?;
        let declared = fields.len() - usize::from(entry.hidden_row_id);
        let key: Vec<String> = if entry.hidden_row_id { Vec::new() } else { entry.key.clone() };
        let mut table = Table::new(&entry.name, fields[..declared].to_vec(), &key)?;
        if table.stored.fields().iter().map(|f| f.as_ref()).ne(fields.iter()) {
            return Err(damaged("its columns do not match its key".into()));
        }
        table.next_row_id = entry.next_row_id;
        if let Some(column) = entry.max_lengths.keys().find(|c| table.schema.field_with_name(c).is_err()) {
            return Err(damaged(format!("a length for `{column}`, which it does not have")));
        }
        table.max_lengths = entry.max_lengths.clone();
        table.time_unit = match &entry.time_unit {
            Some(unit) => Some(TimeUnit::parse(unit).ok_or_else(|| damaged(format!("its time_unit `{unit}`")))?),
            None => None,
        };
        // Rows are read when first needed; in memory every file is held now.
        let rows_of = |file: &str, count: u64| -> Result<FileRows> {
            let count = count as usize;
            Ok(match storage.reader() {
                Some(reader) => FileRows::on_disk(file.to_string(), count, Arc::clone(&table.stored), reader),
                None => FileRows::held(storage.read(file, &table.stored)?, file.to_string()),
            })
        };
        for segment in &entry.segments {
            let rows = rows_of(&segment.file, segment.rows)?;
            let mut deleted = vec![false; rows.num_rows()];
            if let Some(file) = &segment.deleted {
                let positions = storage.read(file, &positions_schema())?;
                let positions = positions.column(0).as_any().downcast_ref::<UInt32Array>().expect("UInt32 positions");
                for &p in positions.values() {
                    *deleted
                        .get_mut(p as usize)
                        .ok_or_else(|| damaged(format!("a deleted row {p} beyond its segment")))? = true;
                }
            }
            let deleted_count = deleted.iter().filter(|&&d| d).count();
            table.segments.push(Segment { rows, deleted, deleted_count, deleted_file: segment.deleted.clone() });
        }
        for change in &entry.changes {
            // A change set's inserted rows are a segment's file: the segment's rows, shared.
            // (until a compaction rewrote the segment: then they are counted in the manifest).
            let inserted = match (&change.inserted, change.inserted_rows) {
                (Some(file), count) => match (table.segments.iter().find(|s| s.rows.file == *file), count) {
                    (Some(segment), _) => Some(segment.rows.clone()),
                    (None, Some(count)) => Some(rows_of(file, count)?),
                    (None, None) => Some(FileRows::held(storage.read(file, &table.stored)?, file.clone())),
                },
                (None, _) => None,
            };
            // Its deleted rows are counted in the manifest (read here to count them where not).
            let deleted = match (&change.deleted, change.deleted_rows) {
                (Some(file), Some(count)) => Some(rows_of(file, count)?),
                (Some(file), None) => Some(FileRows::held(storage.read(file, &table.stored)?, file.clone())),
                (None, _) => None,
            };
            table.changes.push(ChangeSet { sequence: change.sequence, inserted, deleted });
        }
        Ok(table)
    }

    /// Whether statements look its keys up: it has a declared primary key (a hidden row id is
    /// new for every row).
    pub fn has_primary_key(&self) -> bool {
        !self.hidden_row_id
    }

    /// The keys held by live rows among those of `found`: rows of the key columns and
    /// [`POSITION`], as a scan of the table with positions gives them.
    pub fn held_keys(&self, found: &[RecordBatch]) -> Result<HeldKeys> {
        let converter = self.key_converter()?;
        let mut held = HashMap::new();
        for batch in found {
            let n = self.key.len();
            let keys = converter.convert_columns(&batch.columns()[..n])?;
            let positions = batch.column(n).as_primitive::<arrow::datatypes::Int64Type>();
            for (row, &p) in positions.values().iter().enumerate() {
                if held.insert(keys.row(row).data().to_vec(), position(p)).is_some() {
                    return Err(TesseraError::Database(format!("the table `{}` holds a key twice", self.name)));
                }
            }
        }
        Ok(HeldKeys(held))
    }

    fn key_converter(&self) -> Result<RowConverter> {
        Ok(RowConverter::new(
            self.key.iter().map(|&i| SortField::new(self.stored.field(i).data_type().clone())).collect(),
        )?)
    }

    /// The key columns of `rows` (with the table's stored columns, or its declared ones where
    /// it has a primary key).
    pub fn key_columns(&self, rows: &RecordBatch) -> Vec<ArrayRef> {
        self.key.iter().map(|&i| Arc::clone(rows.column(i))).collect()
    }

    /// The live rows, with the declared columns.
    pub fn batches(&self) -> Result<Vec<RecordBatch>> {
        let mut batches = Vec::with_capacity(self.segments.len());
        for s in 0..self.segments.len() {
            batches.extend(self.live_rows(s, false)?);
        }
        Ok(batches)
    }

    /// The live rows of segment `s`, with the declared columns (`with_positions`: and a last
    /// column `position`, segment << 32 | row, for a statement to name rows by); `None` if it
    /// has none.
    fn live_rows(&self, s: usize, with_positions: bool) -> Result<Option<RecordBatch>> {
        let segment = &self.segments[s];
        let declared = self.schema.fields().len();
        let rows = segment.rows.batch()?;
        let mut columns: Vec<ArrayRef> = rows.columns()[..declared].to_vec();
        let mut fields: Vec<Field> = self.schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        if with_positions {
            let base = (s as i64) << 32;
            columns.push(Arc::new(Int64Array::from_iter_values((0..rows.num_rows() as i64).map(|r| base | r))));
            fields.push(Field::new(POSITION, DataType::Int64, false));
        }
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
        let batch = match segment.deleted_count {
            0 => batch,
            _ => filter_record_batch(&batch, &BooleanArray::from_iter(segment.deleted.iter().map(|d| Some(!d))))?,
        };
        Ok((batch.num_rows() > 0).then_some(batch))
    }

    /// What a query reads the live rows with (`with_positions`: and their positions, see
    /// [`Table::live_rows`]): files on disk not read by this process yet are scanned (only
    /// what the query needs), other rows are held.
    pub fn scan(&self, with_positions: bool) -> Result<TableScan> {
        let mut scan = TableScan {
            schema: Arc::clone(&self.schema),
            stored: Arc::clone(&self.stored),
            positions: with_positions,
            data: None,
            files: Vec::new(),
            held: Vec::new(),
        };
        for (s, segment) in self.segments.iter().enumerate() {
            let rows = &segment.rows;
            match (&rows.reader, rows.held.get()) {
                (Some(reader), None) if rows.file.ends_with(".parquet") => {
                    scan.data = Some(reader.data());
                    let deleted = (segment.deleted_count > 0).then(|| segment.deleted.clone());
                    scan.files.push(ScannedFile { name: rows.file.clone(), segment: s, rows: rows.count, deleted });
                }
                _ => scan.held.extend(self.live_rows(s, with_positions)?),
            }
        }
        Ok(scan)
    }

    /// The live rows with the declared columns and the hidden row id, if the table has one:
    /// its rows with their key.
    pub fn keyed_batches(&self) -> Result<Vec<RecordBatch>> {
        let mut batches = Vec::with_capacity(self.segments.len());
        for segment in &self.segments {
            let rows = segment.rows.batch()?;
            let batch = if segment.deleted_count == 0 {
                rows
            } else {
                filter_record_batch(&rows, &BooleanArray::from_iter(segment.deleted.iter().map(|d| Some(!d))))?
            };
            if batch.num_rows() > 0 {
                batches.push(batch);
            }
        }
        Ok(batches)
    }

    /// The columns of [`Table::keyed_batches`] and of the change sets' rows.
    pub fn keyed_schema(&self) -> &SchemaRef {
        &self.stored
    }

    /// The names of the key columns: the primary key's, or the hidden row id.
    pub fn key_names(&self) -> Vec<String> {
        self.key.iter().map(|&i| self.stored.field(i).name().clone()).collect()
    }

    /// The positions of the live rows.
    pub fn positions(&self) -> Vec<(u32, u32)> {
        let mut positions = Vec::with_capacity(self.rows());
        for (s, segment) in self.segments.iter().enumerate() {
            let live = segment.deleted.iter().enumerate().filter(|(_, d)| !**d);
            positions.extend(live.map(|(r, _)| (s as u32, r as u32)));
        }
        positions
    }

    /// The number of live rows.
    pub fn rows(&self) -> usize {
        self.segments.iter().map(|s| s.rows.num_rows() - s.deleted_count).sum()
    }

    /// The first row of text `column` (of column `name`) longer than the column holds.
    fn too_long(&self, name: &str, column: &ArrayRef) -> Option<usize> {
        let most = *self.max_lengths.get(name)? as usize;
        let text = column.as_string_opt::<i32>()?;
        (0..text.len())
            .find(|&r| text.is_valid(r) && text.value(r).len() > most && text.value(r).chars().count() > most)
    }

    /// The SQL type of `field`, a column of the table, with its length where it has one.
    pub fn type_name(&self, field: &Field) -> String {
        match self.max_lengths.get(field.name()) {
            Some(length) => format!("VARCHAR({length})"),
            None => sql_type_name(field.data_type()),
        }
    }

    pub fn changes(&self) -> &[ChangeSet] {
        &self.changes
    }

    /// `columns` (one per declared column, in order) as the table's rows: converted to the
    /// declared types by checked conversion ([`checked_cast`]), a value that does not fit its
    /// column or a NULL key refused with the row it is in.
    pub fn conform(&self, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
        let mut cast = Vec::with_capacity(columns.len());
        for (column, field) in columns.iter().zip(self.schema.fields()) {
            let column = checked_cast(column, field.data_type(), self.time_unit).map_err(|misfit| {
                TesseraError::Execution(format!(
                    "column `{}` of `{}` is {}: {} (row {} of the rows given); nothing of the statement was applied",
                    field.name(),
                    self.name,
                    self.type_name(field),
                    misfit.reason,
                    misfit.row + 1
                ))
            })?;
            if let Some(row) = self.too_long(field.name(), &column) {
                return Err(TesseraError::Execution(format!(
                    "column `{}` of `{}` is {}: '{}' has {} characters (row {} of the rows given); nothing of the \
                     statement was applied",
                    field.name(),
                    self.name,
                    self.type_name(field),
                    column.as_string::<i32>().value(row).replace('\'', "''"),
                    column.as_string::<i32>().value(row).chars().count(),
                    row + 1
                )));
            }
            if !field.is_nullable() && column.null_count() > 0 {
                let row = (0..column.len()).find(|&r| column.is_null(r)).unwrap_or(0);
                return Err(TesseraError::Execution(format!(
                    "column `{}` of `{}` cannot be NULL (it is part of the primary key): row {} of the rows given has none",
                    field.name(),
                    self.name,
                    row + 1
                )));
            }
            cast.push(column);
        }
        let rows = columns.first().map_or(0, |c| c.len());
        let options = arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(Arc::clone(&self.schema), cast, &options)?)
    }

    /// Checks `edit` against the table: every deleted position live, every inserted row with a
    /// key, and no key twice among the rows left and inserted (`held`: the live rows holding the
    /// inserted rows' keys). Changes nothing.
    pub fn check(&self, edit: &Edit, held: &HeldKeys) -> Result<()> {
        for &(s, r) in &edit.deleted {
            let live = self.segments.get(s as usize).and_then(|seg| seg.deleted.get(r as usize)).is_some_and(|d| !d);
            if !live {
                return Err(TesseraError::Internal(format!("row {s}:{r} of `{}` deleted twice", self.name)));
            }
        }
        let Some(inserted) = &edit.inserted else { return Ok(()) };
        if inserted.schema().fields() != self.schema.fields() {
            return Err(TesseraError::Internal(format!("rows for `{}` with other columns", self.name)));
        }
        if self.hidden_row_id {
            return Ok(());
        }
        let converter = self.key_converter()?;
        let keys = converter.convert_columns(&self.key_columns(inserted))?;
        let deleted: hashbrown::HashSet<(u32, u32)> = edit.deleted.iter().copied().collect();
        let mut seen: HashMap<&[u8], usize> = HashMap::with_capacity(inserted.num_rows());
        for row in 0..inserted.num_rows() {
            let key = keys.row(row);
            let held = held.get(key.data()).is_some_and(|p| !deleted.contains(&p));
            if held || seen.insert(key.data(), row).is_some() {
                return Err(TesseraError::Execution(format!(
                    "duplicate primary key in `{}`: ({}) = ({}) is already in the table; nothing of the statement was applied",
                    self.name,
                    self.key.iter().map(|&k| self.stored.field(k).name().as_str()).collect::<Vec<_>>().join(", "),
                    self.key
                        .iter()
                        .map(|&k| arrow::util::display::array_value_to_string(inserted.column(k), row))
                        .collect::<std::result::Result<Vec<_>, _>>()?
                        .join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The edit that applies `rows` as `ops` says, row by row in order: `insert` (or `I`) adds
    /// a row whose key is not held, `update` (`U`) replaces the row holding its key, `delete`
    /// (`D`) removes it (its other columns are not read). A key may change several times in
    /// one file; the table needs a declared primary key to name rows by (`held`: the live rows
    /// holding the keys of `rows`).
    pub fn edit_from_ops(
        &self,
        rows: RecordBatch,
        ops: &StringArray,
        op_column: &str,
        held: &HeldKeys,
    ) -> Result<Edit> {
        if self.hidden_row_id {
            return Err(TesseraError::Plan(format!(
                "`{}` has no primary key: op_column needs one to find the rows to update and delete",
                self.name
            )));
        }
        let keys = self.key_converter()?.convert_columns(&self.key_columns(&rows))?;
        // Rows of the file inserted so far by key, and the table's rows deleted so far.
        let mut pending: HashMap<&[u8], usize> = HashMap::new();
        let mut deleted: Vec<(u32, u32)> = Vec::new();
        let mut gone: hashbrown::HashSet<(u32, u32)> = hashbrown::HashSet::new();
        for row in 0..rows.num_rows() {
            let key = keys.row(row);
            let op = if ops.is_valid(row) { ops.value(row).trim().to_ascii_lowercase() } else { String::new() };
            let held_by_file = pending.contains_key(key.data());
            let held_by_table = held.get(key.data()).filter(|p| !gone.contains(p));
            let missing = || {
                TesseraError::Execution(format!(
                    "row {} of the file ({op}) names a key of `{}` that no row holds; nothing of the statement was applied",
                    row + 1,
                    self.name
                ))
            };
            let mut remove = |pending: &mut HashMap<&[u8], usize>| -> Result<()> {
                if pending.remove(key.data()).is_none() {
                    let position = held_by_table.ok_or_else(missing)?;
                    gone.insert(position);
                    deleted.push(position);
                }
                Ok(())
            };
            match op.as_str() {
                "i" | "insert" if held_by_file || held_by_table.is_some() => {
                    return Err(TesseraError::Execution(format!(
                        "row {} of the file inserts a key `{}` already holds; nothing of the statement was applied",
                        row + 1,
                        self.name
                    )))
                }
                "i" | "insert" => {
                    pending.insert(key.data(), row);
                }
                "u" | "update" => {
                    remove(&mut pending)?;
                    pending.insert(key.data(), row);
                }
                "d" | "delete" => remove(&mut pending)?,
                _ => {
                    return Err(TesseraError::Execution(format!(
                        "row {} of the file has `{op}` in {op_column}: expected insert, update or delete (I, U, D)",
                        row + 1
                    )))
                }
            }
        }
        let mut kept: Vec<u32> = pending.into_values().map(|r| r as u32).collect();
        kept.sort_unstable();
        let inserted = take_record_batch(&rows, &UInt32Array::from(kept))?;
        Ok(Edit { deleted, inserted: Some(inserted) })
    }

    /// Applies a checked `edit` as statement `sequence`: writes its files to `storage`, then
    /// changes the table, and compacts it ([`Compaction::Tiered`]). `manifest` gets the new
    /// file numbers.
    pub fn apply(&mut self, edit: Edit, sequence: u64, storage: &mut Storage, manifest: &mut Manifest) -> Result<()> {
        // Files first: a failure leaves the table as it was.
        let inserted = match edit.inserted {
            Some(rows) if rows.num_rows() > 0 => Some(self.with_key(rows)?),
            _ => None,
        };
        let new_segment = inserted.as_ref().map(|rows| storage.write(manifest, rows)).transpose()?;
        let mut by_segment: HashMap<u32, Vec<u32>> = HashMap::new();
        for &(s, r) in &edit.deleted {
            by_segment.entry(s).or_default().push(r);
        }
        let deleted_rows = if edit.deleted.is_empty() {
            None
        } else {
            let parts = by_segment
                .iter()
                .map(|(&s, rows)| {
                    Ok(take_record_batch(&self.segments[s as usize].rows.batch()?, &UInt32Array::from(rows.clone()))?)
                })
                .collect::<Result<Vec<_>>>()?;
            Some(arrow::compute::concat_batches(&self.stored, &parts)?)
        };
        let deleted_file = deleted_rows.as_ref().map(|rows| storage.write(manifest, rows)).transpose()?;
        let mut deletion_files = Vec::new();
        for (&s, rows) in &by_segment {
            let segment = &self.segments[s as usize];
            let mut positions: Vec<u32> =
                (0..segment.rows.num_rows() as u32).filter(|&r| segment.deleted[r as usize]).collect();
            positions.extend(rows);
            positions.sort_unstable();
            let batch = RecordBatch::try_new(positions_schema(), vec![Arc::new(UInt32Array::from(positions))])?;
            deletion_files.push((s, storage.write(manifest, &batch)?));
        }
        // Then memory.
        for (s, file) in deletion_files {
            let segment = &mut self.segments[s as usize];
            for &r in &by_segment[&s] {
                segment.deleted[r as usize] = true;
                segment.deleted_count += 1;
            }
            segment.deleted_file = Some(file);
        }
        let inserted = match (inserted, new_segment) {
            (Some(rows), Some(file)) => {
                let rows = FileRows::held(rows, file);
                self.segments.push(Segment {
                    deleted: vec![false; rows.num_rows()],
                    rows: rows.clone(),
                    deleted_count: 0,
                    deleted_file: None,
                });
                Some(rows)
            }
            _ => None,
        };
        let deleted = match (deleted_rows, deleted_file) {
            (Some(rows), Some(file)) => Some(FileRows::held(rows, file)),
            _ => None,
        };
        if inserted.is_some() || deleted.is_some() {
            self.changes.push(ChangeSet { sequence, inserted, deleted });
        }
        self.compact(Compaction::Tiered, storage, manifest)?;
        Ok(())
    }

    /// Rewrites the segments `compaction` chooses (their files first, then memory): their
    /// live rows into new segments, a row group at a time, their deleted rows dropped. The
    /// rows, their keys and the change sets stay as they were; positions change.
    pub fn compact(
        &mut self,
        compaction: Compaction,
        storage: &mut Storage,
        manifest: &mut Manifest,
    ) -> Result<Compacted> {
        let mut compacted = Compacted { segments_before: self.segments.len(), ..Compacted::default() };
        // Merged segments may make a tier of four: until none is left.
        loop {
            let sizes: Vec<(usize, usize)> =
                self.segments.iter().map(|s| (s.rows.num_rows(), s.deleted_count)).collect();
            let groups = compaction_groups(&sizes, compaction);
            if groups.is_empty() {
                compacted.segments_after = self.segments.len();
                return Ok(compacted);
            }
            self.rewrite(&groups, storage, manifest, &mut compacted)?;
        }
    }

    /// Rewrites each of `groups` of segments into one new segment, counting it in `compacted`.
    fn rewrite(
        &mut self,
        groups: &[Vec<usize>],
        storage: &mut Storage,
        manifest: &mut Manifest,
        compacted: &mut Compacted,
    ) -> Result<()> {
        let mut written = Vec::new();
        for group in groups {
            let live: usize = group.iter().map(|&s| self.segments[s].live()).sum();
            compacted.rows_written += live;
            compacted.rows_dropped += group.iter().map(|&s| self.segments[s].deleted_count).sum::<usize>();
            if live == 0 {
                continue;
            }
            let segments = group.iter().map(|&s| self.segments[s].live_batches()).collect::<Result<Vec<_>>>()?;
            let (file, rows) = storage.write_batches(manifest, &self.stored, segments.into_iter().flatten())?;
            if rows != live {
                return Err(TesseraError::Internal(format!(
                    "a compaction of `{}` wrote {rows} of {live} rows",
                    self.name
                )));
            }
            written.push(match storage.reader() {
                Some(reader) => FileRows::on_disk(file, rows, Arc::clone(&self.stored), reader),
                None => FileRows::held(storage.read(&file, &self.stored)?, file),
            });
        }
        // Then memory: the segments kept, in their order, then the new ones.
        let rewritten: hashbrown::HashSet<usize> = groups.iter().flatten().copied().collect();
        let segments = std::mem::take(&mut self.segments).into_iter().enumerate();
        self.segments = segments.filter(|(s, _)| !rewritten.contains(s)).map(|(_, segment)| segment).collect();
        for rows in written {
            self.segments.push(Segment {
                deleted: vec![false; rows.num_rows()],
                rows,
                deleted_count: 0,
                deleted_file: None,
            });
        }
        Ok(())
    }

    /// Forgets the change sets of statements up to `sequence` (no view needs them).
    pub fn forget_changes_through(&mut self, sequence: u64) {
        self.changes.retain(|c| c.sequence > sequence);
    }

    /// Rows of the declared columns with the hidden row id added, if the table has one.
    fn with_key(&mut self, rows: RecordBatch) -> Result<RecordBatch> {
        if !self.hidden_row_id {
            return Ok(rows.with_schema(Arc::clone(&self.stored))?);
        }
        let first = self.next_row_id as i64;
        self.next_row_id += rows.num_rows() as u64;
        let mut columns = rows.columns().to_vec();
        columns.push(Arc::new(Int64Array::from_iter_values(first..first + rows.num_rows() as i64)));
        Ok(RecordBatch::try_new(Arc::clone(&self.stored), columns)?)
    }
}

/// The column a statement reads positions from (see [`Table::batches`]).
pub const POSITION: &str = "_tessera_position";

/// A position column's value as (segment, row).
pub fn position(value: i64) -> (u32, u32) {
    ((value >> 32) as u32, value as u32)
}

fn positions_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("position", DataType::UInt32, false)]))
}
