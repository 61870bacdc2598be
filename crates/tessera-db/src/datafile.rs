//! The database's data files: Parquet, with statistics and page indexes, which DuckDB, Spark
//! and pyarrow read as they are, and which queries read a column chunk at a time.
//!
//! Every byte a read uses is checked. A file's name carries the XXH64 of its tail (from the end
//! of its last column chunk to the end of the file: page indexes, footer, magic), and the footer
//! holds the XXH64 of every column chunk (key `tessera.xxh64`, row group by row group). A reader
//! checks the tail when it reads the metadata and a chunk whenever it reads any of the chunk's
//! bytes (the whole chunk is read then: a page alone cannot be checked). A file whose bytes do
//! not match is an error that names it, never rows read wrong.
//!
//! Files are written one row group at a time: writing holds one row group, not the file.

use std::fs::File;
use std::hash::Hasher;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetFileReaderFactory;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::future::BoxFuture;
use futures::FutureExt;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::metadata::{KeyValue, PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;

use tessera::error::{Result, TesseraError};

/// Rows a row group holds at most: the unit statistics prune and a core scans.
pub const ROWS_PER_GROUP: usize = 128 * 1024;
/// The footer key of the column chunks' checksums.
const CHUNK_CHECKSUMS: &str = "tessera.xxh64";
/// A Parquet file begins and ends with it.
const MAGIC: &[u8] = b"PAR1";

/// XXH64 (seed 0) of `bytes`: the checksum of every file of a database.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    hasher.write(bytes);
    hasher.finish()
}

/// Writes `batches` (of `schema`, taken one at a time) as data file number `number` in folder
/// `data`, synced; its name, which carries its checksum, and its number of rows. A batch that is
/// an error stops the write, and the partial file is removed.
pub fn write(
    data: &Path,
    number: u64,
    schema: &SchemaRef,
    batches: impl IntoIterator<Item = Result<RecordBatch>>,
) -> Result<(String, usize)> {
    let partial = data.join(format!("{number:08}.partial"));
    let written = write_partial(data, number, &partial, schema, batches);
    if written.is_err() {
        let _ = std::fs::remove_file(partial);
    }
    written
}

fn write_partial(
    data: &Path,
    number: u64,
    partial: &Path,
    schema: &SchemaRef,
    batches: impl IntoIterator<Item = Result<RecordBatch>>,
) -> Result<(String, usize)> {
    let io = |what: &'static str, path: &Path| {
        let what = format!("cannot {what} {}", path.display());
        move |e| TesseraError::io(what, e)
    };
    let mut file = File::create(partial).map_err(io("write", partial))?;
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROWS_PER_GROUP))
        .build();
    let failed = |e: ParquetError| TesseraError::Execution(format!("cannot write {}: {e}", partial.display()));
    let mut writer = ArrowWriter::try_new(Vec::new(), Arc::clone(schema), Some(properties)).map_err(failed)?;
    // The writer's bytes from offset `moved` on are in its buffer; those before, in the file.
    let mut moved = 0u64;
    let mut sums = Vec::new();
    let mut move_groups = |writer: &mut ArrowWriter<Vec<u8>>, sums: &mut Vec<String>| -> Result<()> {
        writer.sync().map_err(io("write", partial))?;
        let chunks = writer.flushed_row_groups().iter().flat_map(|g| g.columns());
        for chunk in chunks.skip(sums.len()) {
            let (start, length) = chunk.byte_range();
            let start = (start - moved) as usize;
            sums.push(format!("{:016x}", checksum(&writer.inner()[start..start + length as usize])));
        }
        file.write_all(writer.inner()).map_err(io("write", partial))?;
        moved += writer.inner().len() as u64;
        writer.inner_mut().clear();
        Ok(())
    };
    let (mut groups, mut rows) = (0, 0);
    for batch in batches {
        let batch = batch?;
        rows += batch.num_rows();
        writer.write(&batch).map_err(failed)?;
        if writer.flushed_row_groups().len() > groups {
            move_groups(&mut writer, &mut sums)?;
            groups = writer.flushed_row_groups().len();
        }
    }
    writer.flush().map_err(failed)?;
    move_groups(&mut writer, &mut sums)?;
    writer.append_key_value_metadata(KeyValue::new(CHUNK_CHECKSUMS.to_string(), sums.join(" ")));
    let metadata = writer.finish().map_err(failed)?;
    writer.sync().map_err(io("write", partial))?;
    let tail_start = (data_end(&metadata) - moved) as usize;
    let name = format!("{number:08}-{:016x}.parquet", checksum(&writer.inner()[tail_start..]));
    file.write_all(writer.inner()).map_err(io("write", partial))?;
    file.sync_all().map_err(io("write", partial))?;
    let path = data.join(&name);
    std::fs::rename(partial, &path).map_err(io("name", &path))?;
    Ok((name, rows))
}

/// Where the last column chunk ends: the tail (page indexes and footer) starts there.
fn data_end(metadata: &ParquetMetaData) -> u64 {
    let ends = metadata.row_groups().iter().flat_map(|g| g.columns()).map(|c| {
        let (start, length) = c.byte_range();
        start + length
    });
    ends.max().unwrap_or(MAGIC.len() as u64)
}

/// A data file whose tail has been checked: its metadata (with page indexes) and where each
/// column chunk lies with its checksum.
struct Checked {
    metadata: Arc<ParquetMetaData>,
    /// Column chunks in file order: their byte ranges and checksums.
    chunks: Vec<(Range<u64>, u64)>,
}

/// An open data file: reads and checks its bytes.
struct DataFile {
    path: PathBuf,
    file: File,
    size: u64,
    /// The checksum of its tail, from its name.
    tail_checksum: u64,
    checked: Option<Arc<Checked>>,
    /// Chunks read and checked, by index, kept while reads stay in one row group (a reader
    /// asks for a chunk's pages one range at a time).
    recent: Vec<(usize, Bytes)>,
}

impl DataFile {
    fn open(path: PathBuf) -> Result<Self> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let tail_checksum = name
            .strip_suffix(".parquet")
            .and_then(|stem| stem.split_once('-'))
            .and_then(|(_, sum)| u64::from_str_radix(sum, 16).ok());
        let file = File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => damaged(&path, "missing"),
            _ => damaged(&path, &format!("unreadable: {e}")),
        })?;
        let Some(tail_checksum) = tail_checksum else {
            return Err(damaged(&path, "damaged: its name carries no checksum"));
        };
        let size = file.metadata().map_err(|e| damaged(&path, &format!("unreadable: {e}")))?.len();
        Ok(DataFile { path, file, size, tail_checksum, checked: None, recent: Vec::new() })
    }

    fn read_at(&self, range: Range<u64>) -> Result<Vec<u8>> {
        if range.end > self.size || range.start > range.end {
            return Err(damaged(&self.path, "damaged: it is shorter than its metadata says"));
        }
        let mut bytes = vec![0; (range.end - range.start) as usize];
        self.file
            .read_exact_at(&mut bytes, range.start)
            .map_err(|e| damaged(&self.path, &format!("unreadable: {e}")))?;
        Ok(bytes)
    }

    /// The file's metadata, its tail checked first.
    fn checked(&mut self) -> Result<Arc<Checked>> {
        if let Some(checked) = &self.checked {
            return Ok(Arc::clone(checked));
        }
        let corrupt = |reason: &str| damaged(&self.path, &format!("damaged: {reason}"));
        let ending = self.size.checked_sub(8).ok_or_else(|| corrupt("it is too short for a Parquet file"))?;
        let last = self.read_at(ending..self.size)?;
        if &last[4..] != MAGIC {
            return Err(corrupt("it does not end as a Parquet file does"));
        }
        let footer_length = u64::from(u32::from_le_bytes(last[..4].try_into().expect("4 bytes")));
        let footer_start =
            ending.checked_sub(footer_length).ok_or_else(|| corrupt("its footer is longer than the file"))?;
        let footer = self.read_at(footer_start..ending)?;
        // A footer tessera wrote that does not decode has been altered.
        let bare = ParquetMetaDataReader::decode_metadata(&footer)
            .map_err(|e| corrupt(&format!("its contents do not match its checksum (its footer: {e})")))?;
        let tail_start = data_end(&bare).min(footer_start);
        let tail = Bytes::from(self.read_at(tail_start..self.size)?);
        if checksum(&tail) != self.tail_checksum {
            return Err(corrupt("its contents do not match its checksum"));
        }
        let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Optional);
        reader.try_parse_sized(&tail, self.size).map_err(|e| corrupt(&e.to_string()))?;
        let metadata = reader.finish().map_err(|e| corrupt(&e.to_string()))?;
        let sums: Vec<u64> = metadata
            .file_metadata()
            .key_value_metadata()
            .and_then(|pairs| pairs.iter().find(|p| p.key == CHUNK_CHECKSUMS))
            .and_then(|p| p.value.as_deref())
            .unwrap_or_default()
            .split_whitespace()
            .map(|sum| u64::from_str_radix(sum, 16))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| corrupt("its chunk checksums are unreadable"))?;
        let ranges: Vec<Range<u64>> = metadata
            .row_groups()
            .iter()
            .flat_map(|g| g.columns())
            .map(|c| {
                let (start, length) = c.byte_range();
                start..start + length
            })
            .collect();
        if ranges.len() != sums.len() {
            return Err(corrupt("it does not hold a checksum for every column chunk"));
        }
        let mut chunks: Vec<(Range<u64>, u64)> = ranges.into_iter().zip(sums).collect();
        chunks.sort_by_key(|(range, _)| range.start);
        let checked = Arc::new(Checked { metadata: Arc::new(metadata), chunks });
        self.checked = Some(Arc::clone(&checked));
        Ok(checked)
    }

    /// The bytes of `range`, every chunk they touch read whole and checked (bytes outside the
    /// chunks are the magic at the start or the tail, checked already).
    fn bytes(&mut self, range: Range<u64>) -> Result<Bytes> {
        let checked = self.checked()?;
        let first = checked.chunks.partition_point(|(chunk, _)| chunk.end <= range.start);
        let touched: Vec<usize> =
            (first..checked.chunks.len()).take_while(|&i| checked.chunks[i].0.start < range.end).collect();
        if let [one] = touched[..] {
            let chunk = checked.chunks[one].0.clone();
            if chunk.start <= range.start && range.end <= chunk.end {
                let bytes = self.chunk(&checked, one)?;
                return Ok(bytes.slice((range.start - chunk.start) as usize..(range.end - chunk.start) as usize));
            }
        }
        let mut joined = Vec::with_capacity((range.end - range.start) as usize);
        let mut at = range.start;
        for i in touched {
            let chunk = checked.chunks[i].0.clone();
            if chunk.start > at {
                joined.extend(self.read_at(at..chunk.start)?);
                at = chunk.start;
            }
            let bytes = self.chunk(&checked, i)?;
            let to = range.end.min(chunk.end);
            joined.extend_from_slice(&bytes[(at - chunk.start) as usize..(to - chunk.start) as usize]);
            at = to;
        }
        if at < range.end {
            joined.extend(self.read_at(at..range.end)?);
        }
        Ok(Bytes::from(joined))
    }

    /// Column chunk `i`, read and checked (or kept from a recent read).
    fn chunk(&mut self, checked: &Checked, i: usize) -> Result<Bytes> {
        if let Some((_, bytes)) = self.recent.iter().find(|(held, _)| *held == i) {
            return Ok(bytes.clone());
        }
        let (range, sum) = &checked.chunks[i];
        let bytes = Bytes::from(self.read_at(range.clone())?);
        if checksum(&bytes) != *sum {
            return Err(damaged(&self.path, "damaged: its contents do not match its checksum"));
        }
        // Keep the chunks of one row group: as many as the file has columns.
        let columns = checked.metadata.file_metadata().schema_descr().num_columns();
        if self.recent.len() >= columns.max(1) {
            self.recent.remove(0);
        }
        self.recent.push((i, bytes.clone()));
        Ok(bytes)
    }
}

fn damaged(path: &Path, reason: &str) -> TesseraError {
    TesseraError::Database(format!("the database file {} is {reason}", path.display()))
}

/// The rows of data file `path`, every byte read checked.
pub fn read(path: &Path) -> Result<RecordBatch> {
    let (schema, batches) = read_batches(path, usize::MAX)?;
    let batches = batches.collect::<Result<Vec<_>>>()?;
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// The rows of data file `path` in batches of at most `batch_size` rows, read as they are
/// taken, every byte read checked; and their schema.
pub fn read_batches(path: &Path, batch_size: usize) -> Result<(SchemaRef, impl Iterator<Item = Result<RecordBatch>>)> {
    let mut file = DataFile::open(path.to_path_buf())?;
    let checked = file.checked()?;
    let corrupt = |e: ParquetError| damaged(path, &format!("damaged: {e}"));
    let metadata =
        ArrowReaderMetadata::try_new(Arc::clone(&checked.metadata), ArrowReaderOptions::new()).map_err(corrupt)?;
    let rows = checked.metadata.file_metadata().num_rows().max(1) as usize;
    let builder =
        ParquetRecordBatchStreamBuilder::new_with_metadata(file, metadata).with_batch_size(rows.min(batch_size));
    let stream = builder.build().map_err(corrupt)?;
    // The footer's key-value pairs (the checksums) are not the rows' metadata.
    let schema = Arc::new(stream.schema().as_ref().clone().with_metadata(Default::default()));
    let path = path.to_path_buf();
    let batch_schema = Arc::clone(&schema);
    // The file's futures are ready when made: taking a batch waits on nothing.
    let batches = futures::executor::block_on_stream(stream).map(move |batch| {
        let batch = batch.map_err(|e: ParquetError| match e {
            ParquetError::External(inner) => match inner.downcast::<TesseraError>() {
                Ok(error) => *error,
                Err(other) => damaged(&path, &format!("damaged: {other}")),
            },
            other => damaged(&path, &format!("damaged: {other}")),
        })?;
        Ok(batch.with_schema(Arc::clone(&batch_schema))?)
    });
    Ok((schema, batches))
}

/// What DataFusion's Parquet scan reads a database's data files with: every byte checked.
#[derive(Debug)]
pub struct CheckedFiles {
    /// The folder of the data files (a scanned file's location is its name).
    pub data: PathBuf,
}

impl ParquetFileReaderFactory for CheckedFiles {
    fn create_reader(
        &self,
        _partition_index: usize,
        file: PartitionedFile,
        _metadata_size_hint: Option<usize>,
        _metrics: &ExecutionPlanMetricsSet,
    ) -> datafusion::common::Result<Box<dyn AsyncFileReader + Send>> {
        let path = self.data.join(file.path().as_ref());
        let file = DataFile::open(path).map_err(|e| datafusion::common::DataFusionError::External(Box::new(e)))?;
        Ok(Box::new(file))
    }
}

fn parquet_error(error: TesseraError) -> ParquetError {
    ParquetError::External(Box::new(error))
}

impl AsyncFileReader for DataFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let bytes = self.bytes(range).map_err(parquet_error);
        futures::future::ready(bytes).boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        let metadata = self.checked().map(|c| Arc::clone(&c.metadata)).map_err(parquet_error);
        futures::future::ready(metadata).boxed()
    }
}
