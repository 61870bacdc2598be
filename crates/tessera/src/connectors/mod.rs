//! Sources and sinks: CSV (with header), JSON lines and Parquet files or stdin in; CSV or JSON
//! lines out. Readers hand out Arrow batches in the source's declared schema; malformed rows
//! stop the run with `file:line` and the reason, or are skipped into a dead-letter file.

pub mod csv_writer;
pub mod file_identity;
pub mod memory;
mod parquet_dictionary;
mod parquet_reader;
mod pipe_input;
pub mod sink;
mod text_reader;

use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};

use arrow::array::ArrayRef;
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;

use crate::catalog::{Format, InputDef, Location};
use crate::error::{Result, TesseraError};

/// What to do with a malformed input row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Stop the run with the row's location and the reason (exit status 1).
    #[default]
    Fail,
    /// Write the row to the dead-letter file, count it and go on.
    Skip,
}

/// Rows per batch read from a source unless `SET batch_size` says otherwise. Each batch
/// crosses from the reading thread to a worker, and a hand-over costs the two threads tens
/// of microseconds (waking a sleeping thread on a virtual machine): at 8,192 rows that was a
/// third of a Parquet run's wall time for plans that share work; at 65,536 it is amortized,
/// and a batch of a few numeric columns is still a few megabytes.
pub const DEFAULT_BATCH_SIZE: usize = 65_536;

/// How sources are read.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    pub batch_size: usize,
    pub on_error: OnError,
    /// Where skipped rows go (JSON lines: file, line, reason, record).
    pub dead_letter_path: PathBuf,
    /// Whether skipped rows are added to what the dead-letter file holds (the statements of a
    /// database, one after another) instead of replacing it (a run).
    pub dead_letter_appends: bool,
    /// How many sets of whole columns a Parquet source is decoded in: the reading thread
    /// decodes the first, a single worker waiting for input the others ahead of it (default:
    /// two where there are two cores or more).
    pub column_sets: usize,
    /// Declared columns the queries read only bare, as the one group key of their windows or
    /// as an aggregate's argument: a reader may hand them out as dictionary arrays of the
    /// declared type (a Parquet column encoded with a dictionary is then read as its indices).
    pub dictionary_columns: Vec<usize>,
    /// A CSV or JSON-lines reader of a pipe (stdin, a FIFO) hands over the rows it has, in a
    /// batch that is not full, this long after the first of them arrived (`SET input_flush_ms`).
    pub flush_after: std::time::Duration,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            batch_size: DEFAULT_BATCH_SIZE,
            on_error: OnError::Fail,
            dead_letter_path: PathBuf::from("tessera-dead-letter.jsonl"),
            dead_letter_appends: false,
            column_sets: crate::exec::cores().min(2),
            dictionary_columns: Vec::new(),
            flush_after: std::time::Duration::from_millis(crate::settings::Settings::default().input_flush_ms),
        }
    }
}

/// Source rows in the declared schema: the columns a reader handed out as dictionaries (see
/// [`ReadOptions::dictionary_columns`]) decoded to their values (for rows written out as they were
/// read, such as late events).
pub fn declared_rows(batch: RecordBatch) -> Result<RecordBatch> {
    use arrow::datatypes::DataType;
    if !batch.schema().fields().iter().any(|f| matches!(f.data_type(), DataType::Dictionary(..))) {
        return Ok(batch);
    }
    let (schema, columns, _) = batch.into_parts();
    let mut fields = Vec::new();
    let mut plain = Vec::new();
    for (field, column) in schema.fields().iter().zip(columns) {
        match field.data_type() {
            DataType::Dictionary(_, value_type) => {
                plain.push(arrow::compute::cast(&column, value_type)?);
                fields.push(field.as_ref().clone().with_data_type(value_type.as_ref().clone()));
            }
            _ => {
                plain.push(column);
                fields.push(field.as_ref().clone());
            }
        }
    }
    Ok(RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), plain)?)
}

/// A stream of batches from one source.
pub trait BatchReader: Send {
    /// The next batch of well-formed rows, in the source's declared schema (the columns of
    /// [`ReadOptions::dictionary_columns`] perhaps as dictionaries of the declared types).
    fn next_batch(&mut self) -> Result<Option<RecordBatch>>;
    /// Bytes consumed so far and the total, when known (for progress).
    fn progress(&self) -> (u64, Option<u64>);
    /// Malformed rows skipped so far, and what they took of the dead-letter file.
    fn skipped(&self) -> Skipped;
    /// Resuming from a checkpoint: moves to `position` (what [`progress`](Self::progress)
    /// returned after the last batch the checkpoint holds) without decoding what lies before,
    /// and goes on from `skipped` (what [`skipped`](Self::skipped) returned then; `None` from
    /// a checkpoint that did not record it). `false` when this reader cannot (the caller then
    /// reads those batches again); only a reader that has not returned a batch yet is asked.
    fn seek(&mut self, _position: u64, _skipped: Option<Skipped>) -> Result<bool> {
        Ok(false)
    }
    /// Work of this reader another thread can do while it waits for the next batch, ahead of
    /// the reading thread, which then has less to do.
    fn spare_work(&self) -> Option<SpareWork> {
        None
    }
}

/// Does a piece of a reader's work on the calling thread (see [`BatchReader::spare_work`]):
/// whether there was any to do. Short, and never waits for the reading thread.
pub type SpareWork = Box<dyn FnMut() -> bool + Send>;

/// Values one thread allocated and handed to others, kept until the others are done with them
/// so that they are freed on the thread that allocated them. Freed on another thread, memory
/// comes back to the allocating thread's heap only lazily (mimalloc, like other thread-caching
/// allocators, collects such frees later), and meanwhile that thread takes fresh pages for
/// the next batches. W1's reading thread touched 17.3 MiB of fresh memory for batches of
/// 1.5 MiB, 6.8 MiB with this (a W1 run's heap 20.7 MiB against 11.9, the baseline's 2 MiB
/// pages 24 against 19): on a virtual machine that was idle, the host backs each fresh page
/// anew, and a run then takes two to three times as long.
pub struct FreedHere<T: ?Sized> {
    held: std::collections::VecDeque<std::sync::Arc<T>>,
}

impl<T: ?Sized> FreedHere<T> {
    /// Values kept at most: a consumer that keeps more (an operator holding input rows) frees
    /// the oldest itself.
    const LIMIT: usize = 64;

    /// Keeps `value` (after freeing what the others are done with).
    pub fn hold(&mut self, value: &std::sync::Arc<T>) {
        self.free_released();
        if self.held.len() == Self::LIMIT {
            self.held.pop_front();
        }
        self.held.push_back(std::sync::Arc::clone(value));
    }

    /// Frees the values no other thread holds any more.
    pub fn free_released(&mut self) {
        self.held.retain(|value| std::sync::Arc::strong_count(value) > 1);
    }
}

impl<T: ?Sized> Default for FreedHere<T> {
    fn default() -> Self {
        FreedHere { held: Default::default() }
    }
}

/// Opens a source (see [`crate::catalog::SourceDef::input`]) or a table's file for reading.
pub fn open_input(source: InputDef, options: &ReadOptions) -> Result<Box<dyn BatchReader>> {
    let (name, input, total): (String, Box<dyn std::io::Read + Send>, Option<u64>) = match source.location {
        Location::File(path) => {
            let file = File::open(path).map_err(|e| TesseraError::io(format!("cannot open {}", path.display()), e))?;
            let metadata = file.metadata().ok();
            if source.format == Format::Parquet {
                let name = path.display().to_string();
                let (bytes, ahead) = parquet_reader::map_file(&file)
                    .map_err(|e| TesseraError::io(format!("cannot map {}", path.display()), e))?;
                return Ok(Box::new(parquet_reader::ParquetReader::new(source, name, bytes, Some(ahead), options)?));
            }
            if metadata.as_ref().is_some_and(|m| !m.is_file()) {
                return read_pipe(source, path.display().to_string(), Box::new(file), options);
            }
            (path.display().to_string(), Box::new(file), metadata.map(|m| m.len()))
        }
        Location::Stdin => {
            if source.format == Format::Parquet {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                    .map_err(|e| TesseraError::io("cannot read stdin", e))?;
                let bytes = bytes::Bytes::from(bytes);
                return Ok(Box::new(parquet_reader::ParquetReader::new(
                    source,
                    "<stdin>".into(),
                    bytes,
                    None,
                    options,
                )?));
            }
            return read_pipe(source, "<stdin>".to_string(), Box::new(std::io::stdin()), options);
        }
    };
    read_text(source, name, input, total, options)
}

/// Reads a CSV or JSON-lines source from a pipe, handing over rows after at most
/// [`ReadOptions::flush_after`].
fn read_pipe(
    source: InputDef,
    name: String,
    input: Box<dyn std::io::Read + Send>,
    options: &ReadOptions,
) -> Result<Box<dyn BatchReader>> {
    let pipe = pipe_input::PipeInput::spawn(&name, input)
        .map_err(|e| TesseraError::io(format!("cannot start reading {name}"), e))?;
    let input = pipe_input::TextInput::Pipe(pipe);
    Ok(Box::new(text_reader::TextReader::new(source, name, input, None, options)?))
}

/// Reads a CSV or JSON-lines source from any byte stream; `name` is used in error messages.
pub fn read_text(
    source: InputDef,
    name: String,
    input: Box<dyn std::io::Read + Send>,
    total_bytes: Option<u64>,
    options: &ReadOptions,
) -> Result<Box<dyn BatchReader>> {
    let input = pipe_input::TextInput::File(input);
    Ok(Box::new(text_reader::TextReader::new(source, name, input, total_bytes, options)?))
}

/// Malformed rows a reader skipped, and the bytes their entries take in the dead-letter file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Skipped {
    pub rows: u64,
    pub dead_letter_bytes: u64,
}

/// Rows that failed to parse, kept for the user to inspect.
pub struct DeadLetter {
    path: PathBuf,
    appends: bool,
    writer: Option<BufWriter<File>>,
    bytes: u64,
}

impl DeadLetter {
    pub fn new(path: &Path, appends: bool) -> Self {
        DeadLetter { path: path.to_path_buf(), appends, writer: None, bytes: 0 }
    }

    /// Goes on with the file an interrupted run wrote, cut back to the `bytes` its checkpoint
    /// counted (the entries after it are written again as their rows are read again).
    fn resume(&mut self, bytes: u64) -> Result<()> {
        let cannot = |e| TesseraError::io(format!("cannot resume the dead-letter file {}", self.path.display()), e);
        let file = match std::fs::OpenOptions::new().write(true).open(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && bytes == 0 => return Ok(()),
            opened => opened.map_err(cannot)?,
        };
        let held = file.metadata().map_err(cannot)?.len();
        if held < bytes {
            return Err(TesseraError::Checkpoint(format!(
                "the dead-letter file {} holds {held} bytes, fewer than the {bytes} the checkpoint counted: it changed",
                self.path.display()
            )));
        }
        file.set_len(bytes).map_err(cannot)?;
        let mut writer = BufWriter::new(file);
        writer.seek(std::io::SeekFrom::End(0)).map_err(cannot)?;
        self.writer = Some(writer);
        self.bytes = bytes;
        Ok(())
    }

    pub fn write(&mut self, file: &str, line: u64, reason: &str, record: &str) -> Result<()> {
        if self.writer.is_none() {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(self.appends)
                .truncate(!self.appends)
                .open(&self.path)
                .map_err(|e| TesseraError::io(format!("cannot create dead-letter file {}", self.path.display()), e))?;
            self.writer = Some(BufWriter::new(f));
        }
        let entry = serde_json::json!({ "file": file, "line": line, "reason": reason, "record": record }).to_string();
        let writer = self.writer.as_mut().expect("opened above");
        writeln!(writer, "{entry}").map_err(|e| TesseraError::io("cannot write the dead-letter file", e))?;
        self.bytes += entry.len() as u64 + 1;
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        if let Some(w) = &mut self.writer {
            w.flush().map_err(|e| TesseraError::io("cannot write the dead-letter file", e))?;
        }
        Ok(())
    }
}

/// The shape rows are read in: every declared column nullable (so a decoder never fails on a
/// missing value), the columns a row must nevertheless have (the event-time column and NOT
/// NULL columns), the event-time column if there is one, whose values must be windowable
/// ([`crate::window::MAX_EVENT_TIME`]), and the TIMESTAMP columns, which text formats decode
/// as text: a timestamp written as text is parsed, a number is counted in the source's
/// `time_unit` and refused without one (JSON's decoder would read it as whatever unit the
/// column has, silently).
pub(crate) struct RowShape {
    pub(crate) schema: arrow::datatypes::SchemaRef,
    required: Vec<usize>,
    event_time: Option<(usize, &'static str)>,
    timestamps: Vec<usize>,
    /// Whether the source declares `time_unit`, so numbers in TIMESTAMP columns have a unit.
    numbers_have_a_unit: bool,
}

impl RowShape {
    pub(crate) fn of(source: InputDef) -> Self {
        let fields = source.schema.fields();
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(
            fields.iter().map(|f| f.as_ref().clone().with_nullable(true)).collect::<Vec<_>>(),
        ));
        let mut required: Vec<usize> = (0..fields.len()).filter(|&i| !fields[i].is_nullable()).collect();
        let event_time = source.event_time.map(|time| (time.index, time.unit.suffix()));
        if let Some((index, _)) = event_time.filter(|(index, _)| !required.contains(index)) {
            required.push(index);
        }
        let timestamps =
            (0..fields.len()).filter(|&i| matches!(fields[i].data_type(), DataType::Timestamp(..))).collect();
        RowShape {
            schema,
            required,
            event_time,
            timestamps,
            numbers_have_a_unit: source.options.contains_key("time_unit"),
        }
    }

    /// Column `column` as a text decoder reads it: TIMESTAMP columns as text (see
    /// [`rows`](Self::rows)), the others as declared.
    pub(crate) fn text_field(&self, column: usize) -> arrow::datatypes::Field {
        let field = self.schema.field(column).clone();
        if self.timestamps.contains(&column) {
            field.with_data_type(DataType::Utf8)
        } else {
            field
        }
    }

    /// TIMESTAMP column `column` from its text: timestamps parsed, whole numbers taken as counts
    /// of the column's unit where the source declares `time_unit`; the rows that are neither,
    /// with the reason.
    fn timestamps_from_text(
        &self,
        column: usize,
        text: &arrow::array::StringArray,
    ) -> Result<(ArrayRef, Vec<(usize, String)>)> {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::Int64Type;
        let field = self.schema.field(column);
        let parsed = arrow::compute::cast(text, field.data_type())?;
        if parsed.null_count() == text.null_count() {
            return Ok((parsed, Vec::new()));
        }
        let counts = arrow::compute::cast(&parsed, &DataType::Int64)?;
        let mut values: Vec<Option<i64>> = counts.as_primitive::<Int64Type>().iter().collect();
        let mut failures = Vec::new();
        for row in (0..text.len()).filter(|&r| text.is_valid(r) && parsed.is_null(r)) {
            let written = text.value(row).trim();
            match written.parse::<i64>() {
                Ok(count) if self.numbers_have_a_unit => values[row] = Some(count),
                Ok(_) => failures.push((
                    row,
                    format!(
                        "column `{}` holds the number {written}, but a TIMESTAMP number needs a unit: add \
                         time_unit = 's', 'ms', 'us' or 'ns' to the source's WITH, or write a timestamp",
                        field.name()
                    ),
                )),
                Err(_) => {
                    failures.push((row, format!("cannot read '{written}' as TIMESTAMP in column `{}`", field.name())))
                }
            }
        }
        let counts: ArrayRef = std::sync::Arc::new(arrow::array::Int64Array::from(values));
        Ok((arrow::compute::cast(&counts, field.data_type())?, failures))
    }

    /// Reads `column` as `data_type` (which stands for the declared type).
    pub(crate) fn read_as(&mut self, column: usize, data_type: arrow::datatypes::DataType) {
        let mut fields: Vec<arrow::datatypes::Field> =
            self.schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields[column] = fields[column].clone().with_data_type(data_type);
        self.schema = std::sync::Arc::new(arrow::datatypes::Schema::new(fields));
    }

    /// The rows of decoded `columns` (TIMESTAMP columns possibly as text, see
    /// [`text_field`](Self::text_field)) but those with a TIMESTAMP they cannot be read as,
    /// missing a required value or with an event time outside the windowable range, which
    /// are reported by their index in the batch.
    pub(crate) fn rows(
        &self,
        mut columns: Vec<ArrayRef>,
        mut bad_row: impl FnMut(usize, &str) -> Result<()>,
    ) -> Result<RecordBatch> {
        use arrow::array::{Array, AsArray};
        use arrow::datatypes::Int64Type;
        let mut unreadable: Vec<(usize, String)> = Vec::new();
        for &c in &self.timestamps {
            if let Some(text) = columns[c].as_string_opt::<i32>() {
                let (converted, failures) = self.timestamps_from_text(c, text)?;
                columns[c] = converted;
                unreadable.extend(failures);
            }
        }
        unreadable.sort_by_key(|(row, _)| *row);
        let batch = RecordBatch::try_new(std::sync::Arc::clone(&self.schema), columns)?;
        // Event times as counts; a time too large for 64 bits (an unsigned column) is cast to NULL.
        let times = match self.event_time {
            Some((index, _)) => Some(arrow::compute::cast(batch.column(index), &DataType::Int64)?),
            None => None,
        };
        let times = times.as_ref().map(|times| times.as_primitive::<Int64Type>());
        let windowable = match (times, self.event_time) {
            (Some(times), Some((index, _))) => {
                times.null_count() == batch.column(index).null_count()
                    && arrow::compute::min(times).is_none_or(crate::window::is_windowable)
                    && arrow::compute::max(times).is_none_or(crate::window::is_windowable)
            }
            _ => true,
        };
        let unwindowable =
            |row: usize| times.is_some_and(|t| t.is_null(row) || !crate::window::is_windowable(t.value(row)));
        if unreadable.is_empty() && windowable && self.required.iter().all(|&c| batch.column(c).null_count() == 0) {
            return Ok(batch);
        }
        let mut keep = vec![true; batch.num_rows()];
        let mut unreadable = unreadable.into_iter().peekable();
        for (row, keep_row) in keep.iter_mut().enumerate() {
            let missing = self.required.iter().find(|&&c| batch.column(c).is_null(row));
            let reason = match (unreadable.next_if(|(r, _)| *r == row), missing) {
                (Some((_, reason)), _) => reason,
                (None, Some(&c)) => format!("column `{}` is NULL or missing", self.schema.field(c).name()),
                (None, None) => match self.event_time.filter(|_| unwindowable(row)) {
                    Some((index, unit)) => format!(
                        "event time {} is outside the times tessera windows, {} to {} {unit} (±2^62)",
                        arrow::util::display::array_value_to_string(batch.column(index), row)?,
                        -crate::window::MAX_EVENT_TIME,
                        crate::window::MAX_EVENT_TIME,
                    ),
                    None => continue,
                },
            };
            // A row whose TIMESTAMP columns fail twice is reported once.
            while unreadable.next_if(|(r, _)| *r == row).is_some() {}
            *keep_row = false;
            bad_row(row, &reason)?;
        }
        Ok(arrow::compute::filter_record_batch(&batch, &arrow::array::BooleanArray::from(keep))?)
    }
}

/// A malformed row: either the error that stops the run, or a dead-letter entry.
pub(crate) struct BadRowPolicy {
    on_error: OnError,
    dead_letter: DeadLetter,
    count: u64,
}

impl BadRowPolicy {
    pub(crate) fn new(options: &ReadOptions) -> Self {
        BadRowPolicy {
            on_error: options.on_error,
            dead_letter: DeadLetter::new(&options.dead_letter_path, options.dead_letter_appends),
            count: 0,
        }
    }

    pub(crate) fn bad_row(&mut self, file: &str, line: u64, reason: &str, record: &str) -> Result<()> {
        match self.on_error {
            OnError::Fail => Err(TesseraError::Input { file: file.to_string(), line, reason: reason.to_string() }),
            OnError::Skip => {
                self.count += 1;
                self.dead_letter.write(file, line, reason, record)
            }
        }
    }

    pub(crate) fn skipped(&self) -> Skipped {
        Skipped { rows: self.count, dead_letter_bytes: self.dead_letter.bytes }
    }

    /// Hands the dead-letter entries written so far to the file: a reader does after every
    /// batch, since a checkpoint taken after the batch counts on them being there.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.dead_letter.flush()
    }

    /// Whether a reader may move to a checkpoint's position: with rows failing the run none
    /// was skipped; with rows skipped, when the checkpoint counted them (they are then counted
    /// on from there, and the dead-letter file cut back to its entries).
    pub(crate) fn resume(&mut self, skipped: Option<Skipped>) -> Result<bool> {
        match (self.on_error, skipped) {
            (OnError::Fail, _) => Ok(true),
            (OnError::Skip, None) => Ok(false),
            (OnError::Skip, Some(skipped)) => {
                self.dead_letter.resume(skipped.dead_letter_bytes)?;
                self.count = skipped.rows;
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::FreedHere;

    #[test]
    fn values_are_freed_by_the_holder_once_the_others_let_go() {
        let mut freed_here = FreedHere::default();
        let (first, second) = (Arc::new(vec![1u8; 16]), Arc::new(vec![2u8; 16]));
        let (first_watch, second_watch) = (Arc::downgrade(&first), Arc::downgrade(&second));
        freed_here.hold(&first);
        freed_here.hold(&second);
        // The other thread lets go of the first only: the holder keeps it alive until it frees.
        drop(first);
        assert!(first_watch.upgrade().is_some());
        freed_here.free_released();
        assert!(first_watch.upgrade().is_none(), "freed by the holder");
        assert!(second_watch.upgrade().is_some(), "still used by the other");
        drop(second);
        assert!(second_watch.upgrade().is_some());
        // Holding the next value frees what was released before.
        freed_here.hold(&Arc::new(vec![3u8; 16]));
        assert!(second_watch.upgrade().is_none());
    }

    #[test]
    fn at_most_a_limited_number_of_values_is_kept() {
        let mut freed_here = FreedHere::default();
        let values: Vec<_> = (0..FreedHere::<u32>::LIMIT + 10).map(Arc::new).collect();
        for value in &values {
            freed_here.hold(value);
        }
        assert_eq!(freed_here.held.len(), FreedHere::<u32>::LIMIT);
        assert_eq!(*freed_here.held[0], 10, "the oldest are let go");
        assert!(values.iter().take(10).all(|v| Arc::strong_count(v) == 1));
    }
}
