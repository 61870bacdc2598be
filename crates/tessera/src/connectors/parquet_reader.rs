//! Parquet files: columns are matched to the declared schema by name and cast to the declared
//! types (or read as dictionaries of them: see [`ReadOptions::dictionary_columns`]). Parquet
//! has no lines, so a malformed row is reported by its 1-based row number. A resumed run starts
//! at the checkpoint's row: row groups before it are not read at all.
//!
//! The file is longer than most (about 650 lines of code): its unit tests, a third of it, stay
//! beside the private decoder parts they check (column sets, pages released behind, mapping
//! ahead).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use super::parquet_dictionary::{self, DictionaryColumn};
use super::{BadRowPolicy, BatchReader, FreedHere, ReadOptions, RowShape, Skipped, SpareWork};
use crate::catalog::InputDef;
use crate::error::{Result, TesseraError};

/// A Parquet file mapped into memory: pages are decoded straight from the page cache, with no
/// read into a fresh buffer per page (W1's `wcg` plan ran 10% faster end to end than through
/// `File`'s reader, which copies every page into a newly allocated buffer). With the bytes
/// comes what maps the pages the reader will decode in ahead of it.
pub fn map_file(file: &std::fs::File) -> std::io::Result<(bytes::Bytes, MapAhead)> {
    // SAFETY: the map is read-only and private. Another process truncating the file while it
    // is read would fault the reading thread (SIGBUS), as it would in any reader that maps
    // files (DuckDB, Polars, Arrow's own); rewriting it in place can only hand the decoder
    // bytes it then rejects or reads as other values, never memory outside the map.
    let map = unsafe { memmap2::Mmap::map(file)? };
    // Where the page cache holds a file in 2 MiB folios (read in cold through this map, or
    // written in large writes, as `tessera generate` does), they are mapped with one entry
    // each instead of 512: a decoder that reads a file once takes a TLB miss per 4 KiB page
    // otherwise, and under a hypervisor each costs a two-level page walk (W1's file decoded in
    // 45 ms instead of 58). Small folios are mapped as before; an error (no THP) changes nothing.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    let map = Arc::new(map);
    Ok((bytes::Bytes::from_owner(SharedMap(Arc::clone(&map))), MapAhead { map, decoded: Arc::default() }))
}

/// The map, shared by the decoder's bytes and [`MapAhead`].
struct SharedMap(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Maps byte ranges of a mapped file in (reading from disk what is not cached), in order, on a
/// thread of its own. The reading thread otherwise takes a page fault every few pages it
/// decodes and does any disk read itself; this runs on the core beside it, idle while the
/// first batches are decoded (W1's shared plan ran 5 to 10 ms faster, the baseline 5 to 8).
/// It keeps at most `AHEAD` bytes ahead of the row groups the decoder has passed (and whose
/// pages [`ReleaseBehind`] dropped), so a long file keeps a bounded window resident: a 575 MB
/// file was otherwise mapped in whole, and the peak RSS of a run whose state is a few kilobytes
/// grew with the file. It stops after `LIMIT` bytes without a decoder's progress, and as soon as
/// the reader has dropped the map.
pub struct MapAhead {
    map: Arc<memmap2::Mmap>,
    /// Where the row groups the decoder has passed end (written by [`ReleaseBehind`]).
    decoded: Arc<std::sync::atomic::AtomicU64>,
}

impl MapAhead {
    /// Bytes mapped in at a time.
    #[cfg(target_os = "linux")]
    const CHUNK: u64 = 16 << 20;
    /// Bytes mapped in at most.
    #[cfg(target_os = "linux")]
    const LIMIT: u64 = 1 << 30;
    /// Bytes mapped in at most beyond what the decoder has passed.
    #[cfg(target_os = "linux")]
    const AHEAD: u64 = 64 << 20;

    /// Starts mapping `ranges` (offset, length) in.
    #[cfg(target_os = "linux")]
    fn start(self, ranges: Vec<(u64, u64)>) {
        let pieces = pieces(&ranges, self.map.len() as u64, (Self::CHUNK, Self::LIMIT));
        // Without the thread the decoder faults the pages in itself: no harm but the time.
        let _ = std::thread::Builder::new().name("tessera-map".into()).spawn(move || {
            for (offset, len) in pieces {
                while offset > self.decoded.load(std::sync::atomic::Ordering::Relaxed).saturating_add(Self::AHEAD) {
                    if Arc::strong_count(&self.map) == 1 {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                // An error: a kernel before 5.14.
                let mapped = self.map.advise_range(memmap2::Advice::PopulateRead, offset as usize, len as usize);
                if mapped.is_err() || Arc::strong_count(&self.map) == 1 {
                    return;
                }
            }
        });
    }

    #[cfg(not(target_os = "linux"))]
    fn start(self, _ranges: Vec<(u64, u64)>) {}

    /// What releases the pages of the row groups `groups` (rows each, and their byte range)
    /// once decoded.
    fn behind(&self, groups: Vec<(u64, (u64, u64))>) -> ReleaseBehind {
        let released =
            groups.first().map_or(0, |&(_, (offset, _))| offset / ReleaseBehind::HUGE_PAGE * ReleaseBehind::HUGE_PAGE);
        ReleaseBehind {
            map: Arc::clone(&self.map),
            decoded: Arc::clone(&self.decoded),
            groups: groups.into(),
            rows_passed: 0,
            rows_decoded: 0,
            passed: released,
            released,
        }
    }
}

/// Releases the mapped pages of the row groups the decoder has passed, so a long read does
/// not keep the whole file resident (the pages stay in the page cache; a page read again is
/// mapped in again from the file). It releases whole 2 MiB units: releasing row group by row
/// group split the file's huge-page mappings, and W1's run took 13% longer.
struct ReleaseBehind {
    map: Arc<memmap2::Mmap>,
    /// Shared with [`MapAhead`]: where the groups passed end.
    decoded: Arc<std::sync::atomic::AtomicU64>,
    /// The row groups not passed yet: their rows and byte range.
    groups: std::collections::VecDeque<(u64, (u64, u64))>,
    /// Rows of the groups passed, and rows decoded.
    rows_passed: u64,
    rows_decoded: u64,
    /// The bytes passed end here, and those before `released` are released.
    passed: u64,
    released: u64,
}

impl ReleaseBehind {
    const HUGE_PAGE: u64 = 2 << 20;

    /// `rows` more rows were decoded (by every column set).
    fn decoded(&mut self, rows: u64) {
        self.rows_decoded += rows;
        while let Some(&(group_rows, (offset, len))) = self.groups.front() {
            if self.rows_passed + group_rows > self.rows_decoded {
                break;
            }
            self.rows_passed += group_rows;
            self.groups.pop_front();
            self.passed = self.passed.max(offset.saturating_add(len).min(self.map.len() as u64));
        }
        self.decoded.store(self.passed, std::sync::atomic::Ordering::Relaxed);
        let end = self.passed / Self::HUGE_PAGE * Self::HUGE_PAGE;
        if end > self.released {
            // SAFETY: the map is read-only and backed by the file: dropping its pages loses
            // nothing, and any later read of them maps them in again from the file.
            #[cfg(unix)]
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.released as usize,
                    (end - self.released) as usize,
                )
            };
            self.released = end;
        }
    }
}

/// `ranges` (offset, length) within a map of `len` bytes, in order, cut in pieces of at most
/// `chunk` bytes, `limit` bytes in all.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn pieces(ranges: &[(u64, u64)], len: u64, (chunk, limit): (u64, u64)) -> Vec<(u64, u64)> {
    let mut pieces = Vec::new();
    let mut budget = limit;
    for &(offset, length) in ranges {
        let (mut at, end) = (offset.min(len), offset.saturating_add(length).min(len));
        while at < end && budget > 0 {
            let n = chunk.min(end - at).min(budget);
            pieces.push((at, n));
            (at, budget) = (at + n, budget - n);
        }
    }
    pieces
}

/// Builds the decoder starting at a given row.
type StartAt = Box<dyn FnOnce(u64) -> Result<Decoder> + Send>;

/// The projected columns decoded batch by batch, in sets of whole columns (in each, those the
/// parquet crate decodes, then those read as dictionaries here): the first by the
/// reading thread, the others ("deferred") by whichever thread gets to them first, the reading
/// thread when it needs them or a worker waiting for input (see [`BatchReader::spare_work`]).
/// The parquet crate decodes one column after the other on one thread; W1's three columns took
/// 44 ms that way and 25 ms in two sets on two threads. A thread of its own for the other set
/// bought nothing where a worker already keeps the second core busy (or spins on it) and cost
/// wake-ups; a worker that would otherwise wait does that work instead. Every set reads the
/// same row groups from the same row in batches of the same size, so their batches hold the
/// same rows.
struct Decoder {
    own: SetReader,
    deferred: Arc<Deferred>,
    /// Releases the pages of the row groups decoded (a mapped file's).
    behind: Option<ReleaseBehind>,
}

impl Decoder {
    /// The next batch's parts, one per column set (the reading thread's first), or `None` at
    /// the end.
    fn next(&mut self) -> Option<std::result::Result<Vec<RecordBatch>, String>> {
        let own = self.own.next();
        let others = self.deferred.take();
        match (own, others) {
            (None, None) => None,
            (None, Some(Ok(others))) if others.is_empty() => None,
            (Some(Ok(own)), Some(Ok(others))) if others.iter().all(|o| o.num_rows() == own.num_rows()) => {
                if let Some(behind) = self.behind.as_mut() {
                    behind.decoded(own.num_rows() as u64);
                }
                Some(Ok(std::iter::once(own).chain(others).collect()))
            }
            (Some(Err(e)), _) | (_, Some(Err(e))) => Some(Err(e)),
            _ => Some(Err(UNEVEN.into())),
        }
    }
}

const UNEVEN: &str = "the file's columns do not hold the same rows";

/// Reads a column set's part of each batch: the columns the parquet crate decodes, then those
/// read as dictionaries here (which read as many rows as the batch holds).
struct SetReader {
    arrow: Option<ParquetRecordBatchReader>,
    dictionaries: Vec<DictionaryColumn>,
    fields: Vec<arrow::datatypes::FieldRef>,
    /// The part's schema, once known.
    schema: Option<arrow::datatypes::SchemaRef>,
    /// Rows not read yet, and the rows of a batch (the last may hold fewer).
    rows_left: usize,
    batch_size: usize,
}

impl SetReader {
    fn next(&mut self) -> Option<std::result::Result<RecordBatch, String>> {
        let arrow = match self.arrow.as_mut() {
            Some(reader) => match reader.next()? {
                Ok(batch) => Some(batch),
                Err(e) => return Some(Err(e.to_string())),
            },
            None if self.rows_left == 0 => return None,
            None => None,
        };
        let rows = arrow.as_ref().map_or(self.batch_size.min(self.rows_left), RecordBatch::num_rows);
        self.rows_left = self.rows_left.saturating_sub(rows);
        if self.dictionaries.is_empty() {
            if let Some(batch) = arrow {
                return Some(Ok(batch));
            }
        }
        let mut columns = arrow.as_ref().map_or_else(Vec::new, |batch| batch.columns().to_vec());
        for dictionary in &mut self.dictionaries {
            match dictionary.next(rows) {
                Ok(column) => columns.push(column),
                Err(e) => return Some(Err(e)),
            }
        }
        let fields = &self.fields;
        let schema = self.schema.get_or_insert_with(|| {
            let arrow_fields = arrow.as_ref().map_or_else(Vec::new, |batch| batch.schema().fields().to_vec());
            Arc::new(arrow::datatypes::Schema::new([arrow_fields, fields.clone()].concat()))
        });
        let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
        Some(RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options).map_err(|_| UNEVEN.to_string()))
    }
}

/// The column sets after the first, and their parts of the batches decoded ahead.
#[derive(Default)]
struct Deferred(std::sync::Mutex<Option<DeferredSets>>);

struct DeferredSets {
    readers: Vec<SetReader>,
    ready: std::collections::VecDeque<Option<std::result::Result<Vec<RecordBatch>, String>>>,
}

impl Deferred {
    /// Batches' parts a worker decodes ahead of the reading thread at most.
    const AHEAD: usize = 2;

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<DeferredSets>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The other sets' parts of the next batch: decoded ahead, or decoded now.
    fn take(&self) -> Option<std::result::Result<Vec<RecordBatch>, String>> {
        let mut sets = self.lock();
        let sets = sets.as_mut()?;
        sets.ready.pop_front().unwrap_or_else(|| sets.decode())
    }

    /// Decodes the next batch's parts ahead unless enough are, the end was reached, the
    /// decoder has not started or the reading thread is busy with the sets; whether it did.
    fn decode_ahead(&self, freed_here: &mut FreedHere<dyn Array>) -> bool {
        let Ok(mut sets) = self.0.try_lock() else { return false };
        let Some(sets) = sets.as_mut() else { return false };
        let ended = sets.ready.back().is_some_and(|parts| !matches!(parts, Some(Ok(_))));
        if ended || sets.ready.len() >= Self::AHEAD {
            return false;
        }
        let parts = sets.decode();
        for part in parts.iter().flatten().flatten() {
            part.columns().iter().for_each(|column| freed_here.hold(column));
        }
        sets.ready.push_back(parts);
        true
    }
}

impl DeferredSets {
    /// Every set's part of the next batch (`Some` of nothing without sets, so that the first
    /// set alone decides where the batches end), `None` once a set ended.
    fn decode(&mut self) -> Option<std::result::Result<Vec<RecordBatch>, String>> {
        let parts = self.readers.iter_mut().map(SetReader::next).collect::<Option<Vec<_>>>()?;
        Some(parts.into_iter().collect())
    }
}

/// Splits `roots` (column indices, ascending) into at most `sets` sets of whole columns of
/// about equal decoding work (`weight`), each in ascending order: the heaviest column first
/// into the lightest set. The first set, decoded by the thread that also hands the batches on,
/// is the lightest. Empty sets are left out (one is kept without columns).
fn column_sets(roots: &[usize], weight: impl Fn(usize) -> u64, sets: usize) -> Vec<Vec<usize>> {
    let mut by_weight = roots.to_vec();
    by_weight.sort_by_key(|&root| std::cmp::Reverse(weight(root)));
    let mut split = vec![(0u64, Vec::new()); sets.max(1)];
    for root in by_weight {
        // Ties go to the last set, so the first one stays the lightest.
        let (total, set) = split.iter_mut().rev().min_by_key(|(total, _)| *total).expect("one set at least");
        *total += weight(root);
        set.push(root);
    }
    split.sort_by_key(|(total, _)| *total);
    let mut split: Vec<Vec<usize>> = split
        .into_iter()
        .filter(|(_, set)| !set.is_empty())
        .map(|(_, mut set)| {
            set.sort_unstable();
            set
        })
        .collect();
    if split.is_empty() {
        split.push(Vec::new()); // no columns: one reader still counts the rows
    }
    split
}

pub struct ParquetReader {
    name: String,
    /// Until the first batch is read, how to start reading (at row 0, or where `seek` says).
    start: Option<StartAt>,
    decoder: Option<Decoder>,
    /// The column sets after the first, once decoding started.
    deferred: Arc<Deferred>,
    /// The declared columns as read, and which of them a row must have.
    shape: RowShape,
    /// Where each declared column is in the decoder's parts: the part, and the position there.
    columns: Vec<(usize, usize)>,
    /// The column sets: the first the reading thread's, the others deferred.
    sets: usize,
    rows_read: u64,
    total_rows: u64,
    policy: BadRowPolicy,
}

impl ParquetReader {
    /// A reader of `input`; `ahead` maps the pages it will decode in ahead of it.
    pub fn new(
        source: InputDef,
        name: String,
        input: bytes::Bytes,
        ahead: Option<MapAhead>,
        options: &ReadOptions,
    ) -> Result<Self> {
        let invalid = |e: parquet::errors::ParquetError| TesseraError::Input {
            file: name.clone(),
            line: 0,
            reason: e.to_string(),
        };
        let metadata = ArrowReaderMetadata::load(&input, Default::default()).map_err(invalid)?;
        let file_schema = metadata.schema().clone();
        let total_rows = metadata.metadata().file_metadata().num_rows().max(0) as u64;
        // The file's column holding each declared column.
        let mut fields = Vec::new();
        for field in source.schema.fields() {
            let index =
                file_schema.fields().iter().position(|f| f.name().eq_ignore_ascii_case(field.name())).ok_or_else(
                    || TesseraError::Input {
                        file: name.clone(),
                        line: 0,
                        reason: format!(
                            "no column `{}` in the file (it has: {})",
                            field.name(),
                            file_schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    },
                )?;
            let file_type = file_schema.field(index).data_type();
            if matches!(field.data_type(), DataType::Timestamp(..))
                && file_type.is_integer()
                && !source.options.contains_key("time_unit")
            {
                return Err(TesseraError::Input {
                    file: name.clone(),
                    line: 0,
                    reason: format!(
                        "column `{}` holds numbers ({file_type}), but a TIMESTAMP number needs a unit: add \
                         time_unit = 's', 'ms', 'us' or 'ns' to the source's WITH, or declare the column BIGINT",
                        field.name()
                    ),
                });
            }
            fields.push(index);
        }
        // File columns read as dictionaries where the file allows: root, leaf and the declared
        // type of the values. Every declared column on the root must take a dictionary.
        let parquet_schema = metadata.parquet_schema();
        let as_dictionary = |column: usize| {
            let (root, value_type) = (fields[column], source.schema.field(column).data_type());
            let mut leaves =
                (0..parquet_schema.num_columns()).filter(|&l| parquet_schema.get_column_root_idx(l) == root);
            let leaf = leaves.next().filter(|_| leaves.next().is_none())?;
            let readable = options.dictionary_columns.contains(&column)
                && file_schema.field(root).data_type() == value_type
                && parquet_dictionary::readable(metadata.metadata(), leaf, value_type);
            readable.then(|| (leaf, value_type.clone()))
        };
        let mut roots = fields.clone();
        roots.sort_unstable();
        roots.dedup();
        let dictionary_roots: Vec<(usize, (usize, arrow::datatypes::DataType))> = roots
            .iter()
            .filter_map(|&root| {
                let mut leaves = (0..fields.len()).filter(|&c| fields[c] == root).map(as_dictionary);
                let leaf = leaves.next()??;
                leaves.all(|other| other.as_ref() == Some(&leaf)).then_some((root, leaf))
            })
            .collect();
        let leaf_of = |root: usize| dictionary_roots.iter().find(|(r, _)| *r == root).map(|(_, leaf)| leaf.clone());
        let row_groups = metadata.metadata().row_groups();
        let weight = |root: usize| {
            let of_root = |leaf: &usize| parquet_schema.get_column_root_idx(*leaf) == root;
            let leaves = (0..parquet_schema.num_columns()).filter(of_root).collect::<Vec<_>>();
            let sizes = row_groups.iter().flat_map(|g| leaves.iter().map(|&leaf| g.column(leaf).uncompressed_size()));
            sizes.map(|size| size.max(0) as u64).sum()
        };
        // Each set's roots the parquet crate decodes, then those read as dictionaries: the
        // order of the set's part of a batch.
        let sets: Vec<(Vec<usize>, Vec<usize>)> = column_sets(&roots, weight, options.column_sets)
            .into_iter()
            .map(|set| set.into_iter().partition(|&root| leaf_of(root).is_none()))
            .collect();
        let columns = fields
            .iter()
            .map(|root| {
                let in_set =
                    |(arrow, dictionary): &(Vec<usize>, Vec<usize>)| arrow.contains(root) || dictionary.contains(root);
                let part = sets.iter().position(in_set).expect("every column is in a set");
                let (arrow, dictionary) = &sets[part];
                match dictionary.iter().position(|r| r == root) {
                    Some(i) => (part, arrow.len() + i),
                    None => (part, arrow.binary_search(root).expect("present")),
                }
            })
            .collect();
        let mut shape = RowShape::of(source);
        for (column, &root) in fields.iter().enumerate() {
            if leaf_of(root).is_some() {
                let data_type = parquet_dictionary::dictionary_type(shape.schema.field(column).data_type());
                shape.read_as(column, data_type);
            }
        }
        // The fields of each set's dictionary columns.
        let dictionary_field = |root: usize| {
            let column = fields.iter().position(|&r| r == root).expect("a declared column");
            Arc::new(shape.schema.field(column).clone())
        };
        let dictionary_fields: Vec<Vec<arrow::datatypes::FieldRef>> = sets
            .iter()
            .map(|(_, dictionary)| dictionary.iter().map(|&root| dictionary_field(root)).collect())
            .collect();
        let batch_size = options.batch_size.max(1);
        let start_name = name.clone();
        let deferred = Arc::new(Deferred::default());
        let start_deferred = Arc::clone(&deferred);
        let sets_count = sets.len();
        let start: StartAt = Box::new(move |row| {
            let file_metadata = metadata.metadata();
            // Whole row groups before `row` are skipped without reading them.
            let mut skipped = 0u64;
            let mut groups = Vec::new();
            for (i, group) in file_metadata.row_groups().iter().enumerate() {
                let rows = group.num_rows().max(0) as u64;
                if groups.is_empty() && skipped + rows <= row {
                    skipped += rows;
                } else {
                    groups.push(i);
                }
            }
            // Rows of each row group read (the first from `offset` on) and its bytes.
            let offset = (row - skipped) as usize;
            let read_rows = |i: usize, g: usize| {
                let rows = file_metadata.row_group(g).num_rows().max(0) as u64;
                if i == 0 {
                    rows.saturating_sub(offset as u64)
                } else {
                    rows
                }
            };
            let byte_range = |g: usize| {
                let ranges = file_metadata.row_group(g).columns().iter().map(|c| c.byte_range());
                ranges.fold((u64::MAX, 0u64), |(lo, hi), (at, len)| (lo.min(at), hi.max(at.saturating_add(len))))
            };
            let behind = ahead.as_ref().map(|ahead| {
                let groups = groups.iter().enumerate().map(|(i, &g)| {
                    let (lo, hi) = byte_range(g);
                    (read_rows(i, g), (lo, hi.saturating_sub(lo)))
                });
                ahead.behind(groups.collect())
            });
            if let Some(ahead) = ahead {
                let projected = ProjectionMask::roots(metadata.parquet_schema(), roots.iter().copied());
                let chunks = |g: &usize| file_metadata.row_group(*g).columns().iter().map(|c| c.byte_range());
                let leaves = |g: &usize| chunks(g).enumerate().filter(|(leaf, _)| projected.leaf_included(*leaf));
                ahead.start(groups.iter().flat_map(|g| leaves(g).map(|(_, range)| range)).collect());
            }
            let invalid = |reason: String| TesseraError::Input { file: start_name.clone(), line: 0, reason };
            let rows: u64 = groups.iter().map(|&g| file_metadata.row_group(g).num_rows().max(0) as u64).sum();
            let mut readers = sets
                .iter()
                .zip(&dictionary_fields)
                .map(|((arrow, dictionary), fields)| {
                    let arrow = (!arrow.is_empty())
                        .then(|| {
                            ParquetRecordBatchReaderBuilder::new_with_metadata(input.clone(), metadata.clone())
                                .with_row_groups(groups.clone())
                                .with_offset(offset)
                                .with_projection(ProjectionMask::roots(
                                    metadata.parquet_schema(),
                                    arrow.iter().copied(),
                                ))
                                .with_batch_size(batch_size)
                                .build()
                                .map_err(|e| invalid(e.to_string()))
                        })
                        .transpose()?;
                    let dictionaries = dictionary
                        .iter()
                        .map(|&root| {
                            let found = dictionary_roots.iter().find(|(r, _)| *r == root);
                            let (leaf, value_type) = found.expect("a dictionary root").1.clone();
                            let metadata = Arc::clone(metadata.metadata());
                            DictionaryColumn::new(input.clone(), metadata, leaf, value_type, groups.clone(), offset)
                        })
                        .collect();
                    let rows_left = (rows - offset as u64) as usize;
                    Ok(SetReader { arrow, dictionaries, fields: fields.clone(), schema: None, rows_left, batch_size })
                })
                .collect::<Result<Vec<_>>>()?;
            let own = readers.remove(0);
            *start_deferred.lock() = Some(DeferredSets { readers, ready: Default::default() });
            Ok(Decoder { own, deferred: start_deferred, behind })
        });
        Ok(ParquetReader {
            name,
            start: Some(start),
            decoder: None,
            deferred,
            shape,
            columns,
            sets: sets_count,
            rows_read: 0,
            total_rows,
            policy: BadRowPolicy::new(options),
        })
    }

    fn decoder(&mut self) -> Result<&mut Decoder> {
        if let Some(start) = self.start.take() {
            self.decoder = Some(start(self.rows_read)?);
        }
        Ok(self.decoder.as_mut().expect("started above"))
    }
}

impl BatchReader for ParquetReader {
    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            let Some(parts) = self.decoder()?.next() else {
                self.policy.flush()?;
                return Ok(None);
            };
            let parts = parts.map_err(|reason| TesseraError::Input {
                file: self.name.clone(),
                line: self.rows_read + 1,
                reason,
            })?;
            let first_row = self.rows_read + 1;
            self.rows_read += parts[0].num_rows() as u64;
            let columns = self
                .columns
                .iter()
                .zip(self.shape.schema.fields())
                .map(|(&(part, i), field)| {
                    let column = parts[part].column(i);
                    // Text in a TIMESTAMP column is parsed row by row (see RowShape::rows).
                    let text_timestamps =
                        matches!(field.data_type(), DataType::Timestamp(..)) && column.data_type() == &DataType::Utf8;
                    if column.data_type() == field.data_type() || text_timestamps {
                        Ok(Arc::clone(column))
                    } else {
                        cast(column, field.data_type()).map_err(|e| TesseraError::Input {
                            file: self.name.clone(),
                            line: first_row,
                            reason: format!(
                                "column `{}` of type {} cannot be read as {}: {e}",
                                field.name(),
                                column.data_type(),
                                field.data_type()
                            ),
                        })
                    }
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
            let (name, policy) = (&self.name, &mut self.policy);
            let batch =
                self.shape.rows(columns, |row, reason| policy.bad_row(name, first_row + row as u64, reason, ""))?;
            if batch.num_rows() > 0 {
                self.policy.flush()?;
                return Ok(Some(batch));
            }
        }
    }

    fn progress(&self) -> (u64, Option<u64>) {
        (self.rows_read, Some(self.total_rows))
    }

    fn skipped(&self) -> Skipped {
        self.policy.skipped()
    }

    /// Decoding the other column sets' parts of the next batches, when there are other sets.
    /// The worker keeps the columns it decoded and frees them itself.
    fn spare_work(&self) -> Option<SpareWork> {
        let deferred = Arc::clone(&self.deferred);
        let mut freed_here = FreedHere::default();
        let work = move || deferred.decode_ahead(&mut freed_here);
        (self.sets > 1).then(|| Box::new(work) as SpareWork)
    }

    /// Positions are rows read.
    fn seek(&mut self, position: u64, skipped: Option<Skipped>) -> Result<bool> {
        let found = self.start.is_some() && position <= self.total_rows && self.policy.resume(skipped)?;
        if found {
            self.rows_read = position;
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};
    use arrow::record_batch::RecordBatch;

    use super::{column_sets, pieces, ParquetReader};
    use crate::connectors::{BatchReader, ReadOptions};

    #[test]
    fn columns_are_split_in_sets_of_about_equal_weight_the_lightest_first() {
        // W1's file: device_id, temperature, ts.
        let weights = [12_612, 13_945, 130];
        let weight = |root: usize| weights[root];
        assert_eq!(column_sets(&[0, 1, 2], weight, 2), vec![vec![0, 2], vec![1]]);
        assert_eq!(column_sets(&[0, 1, 2], weight, 1), vec![vec![0, 1, 2]]);
        assert_eq!(column_sets(&[0, 1, 2], weight, 3), vec![vec![2], vec![0], vec![1]]);
        assert_eq!(column_sets(&[0, 1, 2], weight, 0), vec![vec![0, 1, 2]]);
        assert_eq!(column_sets(&[2], weight, 2), vec![vec![2]]);
        assert_eq!(column_sets(&[], weight, 2), vec![Vec::<usize>::new()]);
        // Equal weights: two each, the first set never heavier.
        assert_eq!(column_sets(&[0, 1, 2, 3], |_| 5, 2), vec![vec![1, 3], vec![0, 2]]);
    }

    /// Four columns (one with NULLs, one a string) in row groups of 700 rows.
    fn file(rows: usize) -> bytes::Bytes {
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from_iter_values((0..rows as i64).map(|i| i % 37))) as _),
            ("temp", Arc::new(Float64Array::from_iter((0..rows).map(|i| (i % 5 != 0).then_some(i as f64 / 4.0)))) as _),
            ("name", Arc::new(StringArray::from_iter_values((0..rows).map(|i| format!("sensor-{}", i % 11)))) as _),
            ("ts", Arc::new(Int32Array::from_iter_values((0..rows as i32).map(|i| i / 3))) as _),
        ])
        .expect("batch");
        let properties =
            parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(700)).build();
        let mut out = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), Some(properties)).expect("writer");
        writer.write(&batch).expect("write");
        writer.close().expect("close");
        out.into()
    }

    /// Every batch read, from `from` on, with `sets` column sets; the spare work is done
    /// `spare` times before each batch, as by a worker waiting for it.
    fn read_all(input: &bytes::Bytes, sets: usize, from: Option<u64>, spare: usize) -> Vec<RecordBatch> {
        let options = ReadOptions { column_sets: sets, ..ReadOptions::default() };
        let (batches, spare_work) = read_with(input, "BIGINT", options, from, spare).expect("read");
        assert_eq!(spare_work, sets > 1, "spare work only with other column sets");
        batches
    }

    /// Every batch of `s (ts BIGINT, name VARCHAR, temp DOUBLE, id <id_type>)` read in batches
    /// of 256 rows with `options`, from `from` on, the spare work done `spare` times before
    /// each batch; and whether there was spare work.
    fn read_with(
        input: &bytes::Bytes,
        id_type: &str,
        options: ReadOptions,
        from: Option<u64>,
        spare: usize,
    ) -> crate::error::Result<(Vec<RecordBatch>, bool)> {
        let source = crate::sql::parse_script(
            &format!(
                "CREATE SOURCE s (ts BIGINT, name VARCHAR, temp DOUBLE, id {id_type}, WATERMARK FOR ts AS ts)
                 WITH (connector = 'file', path = 'x.parquet')"
            ),
            std::path::Path::new("."),
        )
        .expect("source")
        .remove(0);
        let crate::sql::StatementKind::CreateSource(source) = source.kind else { panic!("a source") };
        let options = ReadOptions { batch_size: 256, ..options };
        let mut reader = ParquetReader::new(source.input(), "x.parquet".into(), input.clone(), None, &options)?;
        if let Some(row) = from {
            assert!(reader.seek(row, None)?);
        }
        let mut work = reader.spare_work();
        let mut batches = Vec::new();
        loop {
            for _ in 0..spare {
                work.as_mut().map(|work| work());
            }
            match reader.next_batch()? {
                Some(batch) => batches.push(batch),
                None => return Ok((batches, work.is_some())),
            }
        }
    }

    /// `batch` written with `properties`.
    fn written(batch: &RecordBatch, properties: parquet::file::properties::WriterProperties) -> bytes::Bytes {
        let mut out = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), Some(properties)).expect("writer");
        writer.write(batch).expect("write");
        writer.close().expect("close");
        out.into()
    }

    /// `rows` rows with `id` an `Int32` key of 23 values, every seventh NULL, `temp` of 50
    /// values, every ninth NULL, and `name` of 97 values, every eleventh NULL.
    fn nullable_int32_keys(rows: usize) -> RecordBatch {
        let ids = Int32Array::from_iter((0..rows as i32).map(|i| (i % 7 != 3).then_some(i * 7919 % 23 - 5)));
        RecordBatch::try_from_iter([
            ("id", Arc::new(ids) as _),
            (
                "temp",
                Arc::new(Float64Array::from_iter((0..rows).map(|i| (i % 9 != 4).then_some((i % 50) as f64 / 4.0))))
                    as _,
            ),
            (
                "name",
                Arc::new(StringArray::from_iter((0..rows).map(|i| (i % 11 != 5).then(|| format!("n{}", i % 97))))) as _,
            ),
            ("ts", Arc::new(Int64Array::from_iter_values(0..rows as i64)) as _),
        ])
        .expect("batch")
    }

    /// Reads `input` with `name`, `temp` and `id` (columns 1 to 3) taken as dictionaries and as
    /// plain columns: the same rows, each of the three read as a dictionary or not per
    /// `dictionaries`.
    fn check_dictionary_columns(input: &bytes::Bytes, id_type: &str, dictionaries: [bool; 3], what: &str) {
        let plain = read_with(input, id_type, ReadOptions::default(), None, 0).expect("plain").0;
        // Resumed a third and two thirds of the way in (in and past the first row group).
        let total = plain.iter().map(RecordBatch::num_rows).sum::<usize>() as u64;
        for (sets, from, spare) in [(1, None, 0), (2, None, 1), (2, Some(total / 3), 0), (3, Some(total * 2 / 3), 2)] {
            let options =
                ReadOptions { column_sets: sets, dictionary_columns: vec![1, 2, 3], ..ReadOptions::default() };
            let (read, _) = read_with(input, id_type, options, from, spare).expect("read");
            let skipped = from.unwrap_or(0) as usize;
            let rows: usize = read.iter().map(RecordBatch::num_rows).sum();
            assert_eq!(rows + skipped, plain.iter().map(RecordBatch::num_rows).sum::<usize>(), "{what}");
            for (column, dictionary) in [1, 2, 3].into_iter().zip(dictionaries) {
                let data_type = read[0].schema().field(column).data_type().clone();
                let read_as_dictionary = matches!(data_type, arrow::datatypes::DataType::Dictionary(..));
                assert_eq!(read_as_dictionary, dictionary, "{what}: column {column} read as {data_type}");
            }
            let read = read.into_iter().map(|b| crate::connectors::declared_rows(b).expect("plain"));
            let plain = arrow::compute::concat_batches(&plain[0].schema(), &plain).expect("concat");
            let read = arrow::compute::concat_batches(&plain.schema(), &read.collect::<Vec<_>>()).expect("concat");
            assert_eq!(read, plain.slice(skipped, rows), "{what}: {sets} sets from {from:?}");
        }
    }

    #[test]
    fn dictionary_encoded_columns_read_as_dictionaries_hold_the_rows_read_plain() {
        use parquet::file::properties::{WriterProperties, WriterVersion};
        // Batches of 256 rows straddle row groups of 700: their dictionaries are joined.
        check_dictionary_columns(&file(2_000), "BIGINT", [true, true, true], "non-null keys");
        let batch = nullable_int32_keys(2_000);
        let properties = || {
            WriterProperties::builder()
                .set_max_row_group_row_count(Some(700))
                .set_write_batch_size(50)
                .set_data_page_row_count_limit(90)
        };
        let small_pages = written(&batch, properties().build());
        assert!(data_pages(&small_pages, 0).len() >= 7, "{:?}", data_pages(&small_pages, 0));
        check_dictionary_columns(&small_pages, "INT", [true, true, true], "NULLs, small pages");
        let v2 = written(&batch, properties().set_writer_version(WriterVersion::PARQUET_2_0).build());
        assert!(data_pages(&v2, 0).iter().all(|&(_, v2)| v2));
        check_dictionary_columns(&v2, "INT", [true, true, true], "pages of format v2");
        // The dictionary fills up after a few keys: later pages fall back to plain encoding.
        let fallback = written(&batch, properties().set_dictionary_page_size_limit(40).build());
        // (the integer and the string column: leaves 0 and 2)
        for leaf in [0, 2] {
            let encodings: Vec<_> = data_pages(&fallback, leaf).into_iter().map(|(encoding, _)| encoding).collect();
            assert!(encodings.contains(&parquet::basic::Encoding::PLAIN), "{encodings:?}");
            assert!(encodings.iter().any(|e| e != &parquet::basic::Encoding::PLAIN), "{encodings:?}");
        }
        check_dictionary_columns(&fallback, "INT", [true, true, true], "pages in plain encoding");
        // Read by the parquet crate: no dictionary, or another type declared.
        let no_dictionary = properties().set_dictionary_enabled(false).build();
        check_dictionary_columns(&written(&batch, no_dictionary), "INT", [false, false, false], "no dictionary");
        check_dictionary_columns(
            &written(&batch, properties().build()),
            "BIGINT",
            [true, true, false],
            "declared BIGINT",
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Any number of distinct values (one: indices of no bits; up to 5,000: 13 bits), any
        /// share of NULLs, pages and row groups of any size, either page format: read as
        /// dictionaries, the rows read plain.
        #[test]
        fn dictionary_columns_hold_the_rows_of_any_file(
            rows in 1usize..3_000,
            distinct in proptest::prop_oneof![1i64..3, 1i64..5_000],
            nulls in 0u32..4,
            page_rows in 1usize..700,
            group_rows in 300usize..2_000,
            v2 in proptest::bool::ANY,
            seed in 0u64..1_000,
        ) {
            use parquet::file::properties::{WriterProperties, WriterVersion};
            let value = |i: usize| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(seed) >> 20;
            let null = |i: usize| nulls > 0 && value(i) % (8 >> nulls) == 0;
            let ids = Int32Array::from_iter((0..rows).map(|i| (!null(i)).then(|| (value(i) as i64 % distinct) as i32 - 7)));
            let temps = Float64Array::from_iter((0..rows).map(|i| (!null(i + 1)).then(|| (value(i) as i64 % distinct) as f64 / 8.0)));
            let batch = RecordBatch::try_from_iter([
                ("id", Arc::new(ids) as _),
                ("temp", Arc::new(temps) as _),
                ("name", Arc::new(StringArray::from_iter_values((0..rows).map(|i| format!("n{}", i % 3)))) as _),
                ("ts", Arc::new(Int64Array::from_iter_values(0..rows as i64)) as _),
            ])
            .expect("batch");
            let version = if v2 { WriterVersion::PARQUET_2_0 } else { WriterVersion::PARQUET_1_0 };
            let properties = WriterProperties::builder()
                .set_max_row_group_row_count(Some(group_rows))
                .set_write_batch_size(page_rows.min(64))
                .set_data_page_row_count_limit(page_rows)
                .set_writer_version(version)
                .build();
            check_dictionary_columns(&written(&batch, properties), "INT", [true, true, true], "a random file");
        }
    }

    #[test]
    fn a_batch_whose_dictionaries_outnumber_its_rows_holds_its_rows_values_instead() {
        use arrow::array::AsArray;
        use parquet::file::properties::WriterProperties;
        use parquet::file::reader::FileReader;
        // Distinct numbers: each row group's dictionary fills up (4 KiB, about 512 values) and
        // its later pages fall back to plain encoding. Batches of 400 rows cross from the
        // dictionary to the plain pages, and from one row group (1,500 rows) to the next.
        let rows = 4_000;
        let batch = RecordBatch::try_from_iter([
            ("f", Arc::new(Float64Array::from_iter_values((0..rows).map(|i| (i * 7 % rows) as f64 / 4.0))) as _),
            ("i", Arc::new(Int64Array::from_iter_values((0..rows as i64).map(|i| i * 3 - 900))) as _),
        ])
        .expect("batch");
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1_500))
            .set_dictionary_page_size_limit(4_096)
            .set_data_page_row_count_limit(100)
            .set_write_batch_size(50)
            .build();
        let input = written(&batch, properties);
        let metadata =
            Arc::new(parquet::file::metadata::ParquetMetaDataReader::new().parse_and_finish(&input).expect("metadata"));
        let file = parquet::file::serialized_reader::SerializedFileReader::new(input.clone()).expect("reader");
        for (leaf, column) in batch.columns().iter().enumerate() {
            let encodings: Vec<_> = data_pages(&input, leaf).into_iter().map(|(encoding, _)| encoding).collect();
            assert!(encodings.contains(&parquet::basic::Encoding::PLAIN), "{encodings:?}");
            // The longest row group dictionary.
            let mut longest = 0;
            for group in 0..metadata.num_row_groups() {
                let mut pages = file.get_row_group(group).expect("group").get_column_page_reader(leaf).expect("pages");
                while let Some(page) = pages.get_next_page().expect("page") {
                    if let parquet::column::page::Page::DictionaryPage { num_values, .. } = page {
                        longest = longest.max(num_values as usize);
                    }
                }
            }
            let groups = (0..metadata.num_row_groups()).collect();
            let mut reader = super::DictionaryColumn::new(
                input.clone(),
                Arc::clone(&metadata),
                leaf,
                column.data_type().clone(),
                groups,
                0,
            );
            let mut read = Vec::new();
            loop {
                let part = reader.next(400).expect("read");
                if part.is_empty() {
                    break;
                }
                let values = part.as_any_dictionary().values().len();
                assert!(values <= part.len().max(longest), "{values} values for {} rows", part.len());
                read.push(arrow::compute::cast(&part, column.data_type()).expect("cast"));
            }
            let read = arrow::compute::concat(&read.iter().map(|a| a.as_ref()).collect::<Vec<_>>()).expect("concat");
            assert_eq!(&read, column);
        }
    }

    #[test]
    fn a_damaged_dictionary_column_fails_the_read_without_panicking() {
        let input = file(2_000);
        let metadata =
            parquet::file::metadata::ParquetMetaDataReader::new().parse_and_finish(&input).expect("metadata");
        let (start, length) = metadata.row_group(0).column(0).byte_range();
        let mut failed = 0;
        // Every byte of the first key chunk in turn set to each of a few values.
        for at in start..start + length {
            for value in [0x00, 0x07, 0x80, 0xff] {
                let mut damaged = input.to_vec();
                damaged[at as usize] = value;
                let options = ReadOptions { dictionary_columns: vec![2, 3], ..ReadOptions::default() };
                match read_with(&damaged.into(), "BIGINT", options, None, 0) {
                    Ok((batches, _)) => {
                        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 2_000, "byte {at}")
                    }
                    Err(_) => failed += 1,
                }
            }
        }
        assert!(failed > 0, "some damage is detected");
    }

    /// The data pages of the chunk of column `leaf` in the first row group: each one's encoding,
    /// and whether it is of format v2.
    fn data_pages(input: &bytes::Bytes, leaf: usize) -> Vec<(parquet::basic::Encoding, bool)> {
        use parquet::column::page::Page;
        use parquet::file::reader::FileReader;
        let reader = parquet::file::serialized_reader::SerializedFileReader::new(input.clone()).expect("reader");
        let mut pages = reader.get_row_group(0).expect("row group").get_column_page_reader(leaf).expect("pages");
        let mut found = Vec::new();
        while let Some(page) = pages.get_next_page().expect("page") {
            match page {
                Page::DataPage { encoding, .. } => found.push((encoding, false)),
                Page::DataPageV2 { encoding, .. } => found.push((encoding, true)),
                Page::DictionaryPage { .. } => {}
            }
        }
        found
    }

    #[test]
    fn column_sets_decoded_apart_or_ahead_read_the_rows_of_one_set() {
        let input = file(2_000);
        let one = read_all(&input, 1, None, 0);
        assert_eq!(one.iter().map(RecordBatch::num_rows).sum::<usize>(), 2_000);
        for (sets, spare) in [(2, 0), (2, 1), (2, 3), (3, 2), (4, 5)] {
            assert_eq!(read_all(&input, sets, None, spare), one, "{sets} sets, spare work {spare} times");
        }
        // Resumed past the first row group.
        let resumed = read_all(&input, 1, Some(1_000), 0);
        assert_eq!(resumed.iter().map(RecordBatch::num_rows).sum::<usize>(), 1_000);
        assert_eq!(read_all(&input, 2, Some(1_000), 2), resumed);
    }

    #[test]
    fn ranges_are_mapped_in_chunks_within_the_map_and_the_limit() {
        let ranges = [(0, 40), (100, 10), (195, 10), (300, 5)];
        assert_eq!(pieces(&ranges, 200, (16, 1000)), vec![(0, 16), (16, 16), (32, 8), (100, 10), (195, 5)]);
        assert_eq!(pieces(&ranges, 200, (16, 20)), vec![(0, 16), (16, 4)]);
        assert_eq!(pieces(&[(0, u64::MAX)], 10, (16, 1000)), vec![(0, 10)]);
        assert!(pieces(&[], 10, (16, 1000)).is_empty());
    }
}
