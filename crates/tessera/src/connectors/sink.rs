//! Where results go: CSV with a header row or JSON lines, to stdout or a file; late rows to
//! their own CSV file; or into memory for tests and the library API.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;

use super::csv_writer::CsvWriter;
use crate::error::{Result, TesseraError};

/// Receives the rows of every query of a run.
pub trait ResultSink: Send {
    /// Called once per query before any row, with its output schema.
    fn open_query(&mut self, query: usize, schema: &SchemaRef) -> Result<()>;
    fn write_rows(&mut self, query: usize, batch: &RecordBatch) -> Result<()>;
    /// Source rows that came too late for a window of `query`.
    fn write_late(&mut self, query: usize, batch: &RecordBatch) -> Result<()>;
    fn finish(&mut self) -> Result<()>;
    /// Makes everything written so far durable and returns the length of every output, for a
    /// checkpoint.
    fn checkpoint(&mut self) -> Result<Vec<u64>>;
    /// Cuts the outputs back to the lengths a checkpoint returned, before any query opens:
    /// rows written after the checkpoint are written again by the resumed run.
    fn resume(&mut self, positions: &[u64]) -> Result<()>;
}

/// Output file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    #[default]
    Csv,
    JsonLines,
}

enum Encoder {
    Csv(CsvWriter<Box<dyn Write + Send>>),
    Json(arrow::json::LineDelimitedWriter<Box<dyn Write + Send>>),
}

impl Encoder {
    /// An encoder writing to `out`; CSV starts with a header row if `header`.
    fn new(format: OutputFormat, out: Box<dyn Write + Send>, header: bool) -> Self {
        match format {
            OutputFormat::Csv => Encoder::Csv(CsvWriter::new(out, header)),
            OutputFormat::JsonLines => Encoder::Json(arrow::json::LineDelimitedWriter::new(out)),
        }
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        match self {
            Encoder::Csv(w) => w.write(batch)?,
            Encoder::Json(w) => w.write(batch)?,
        }
        Ok(())
    }

    /// Hands the rows written so far to the output and flushes it.
    fn flush(&mut self) -> Result<()> {
        match self {
            Encoder::Csv(w) => w.flush(),
            Encoder::Json(w) => w.get_mut().flush().map_err(|e| TesseraError::io("cannot write results", e)),
        }
    }

    /// Flushes everything written and hands back the output.
    fn finish(self) -> Result<Box<dyn Write + Send>> {
        let mut out = match self {
            Encoder::Csv(w) => w.into_inner()?,
            Encoder::Json(mut w) => {
                w.finish()?;
                w.into_inner()
            }
        };
        out.flush().map_err(|e| TesseraError::io("cannot write results", e))?;
        Ok(out)
    }
}

/// One output file (or stdout) and its encoder.
struct Output {
    format: OutputFormat,
    encoder: Option<Encoder>,
    /// The file, for syncing and its length (`None`: stdout).
    file: Option<File>,
    /// Whether anything (the CSV header at least) was written.
    started: bool,
}

impl Output {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.started = true;
        let encoder = self.encoder.as_mut().ok_or_else(|| TesseraError::Internal("write after finish".into()))?;
        encoder.write(batch)?;
        // Rows for stdout are shown as they come (a file's are complete at the end, or at a
        // checkpoint).
        if self.file.is_none() {
            encoder.flush()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(encoder) = self.encoder.take() {
            encoder.finish()?;
        }
        Ok(())
    }

    /// Flushes and syncs; the file's length.
    fn checkpoint(&mut self) -> Result<u64> {
        let file = self.file.as_ref().ok_or_else(|| {
            TesseraError::Option("checkpoints need --output FILE: rows written to stdout cannot be cut back".into())
        })?;
        if let Some(encoder) = self.encoder.take() {
            // A CSV header is written once, before the first rows.
            self.encoder = Some(Encoder::new(self.format, encoder.finish()?, !self.started));
        }
        file.sync_all().map_err(|e| TesseraError::io("cannot sync results", e))?;
        Ok(file.metadata().map_err(|e| TesseraError::io("cannot read the results' length", e))?.len())
    }
}

/// Output whose reader may go away (`tessera run q.sql | head`): a closed pipe is not an error,
/// the rest of the output is dropped.
struct ClosablePipe<W: Write> {
    inner: W,
    closed: bool,
}

impl<W: Write> Write for ClosablePipe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            other => other,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        match self.inner.flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            other => other,
        }
    }
}

/// The output file `path`, cut to `keep` bytes (0: empty), and whether it already has content.
fn open_output(path: &Path, format: OutputFormat, keep: u64) -> Result<Output> {
    let error = |e| TesseraError::io(format!("cannot create {}", path.display()), e);
    let mut file = OpenOptions::new().write(true).create(true).truncate(keep == 0).open(path).map_err(error)?;
    if keep > 0 {
        file.set_len(keep).map_err(error)?;
        file.seek(SeekFrom::Start(keep)).map_err(error)?;
    }
    let handle = file.try_clone().map_err(error)?;
    // CSV rows come in pieces of their own (see `CsvWriter`): a buffer would copy them again.
    let out: Box<dyn Write + Send> = match format {
        OutputFormat::Csv => Box::new(file),
        OutputFormat::JsonLines => Box::new(BufWriter::with_capacity(1 << 20, file)),
    };
    Ok(Output { format, encoder: Some(Encoder::new(format, out, keep == 0)), file: Some(handle), started: keep > 0 })
}

/// Writes results to stdout or a file. Queries with the same columns share one stream (one
/// header): the first query's columns go to `--output`, each further set of columns, in the
/// order of the queries, to its own file `NAME-q<N>.EXT` beside it (`N` from 2).
pub struct FileSink {
    format: OutputFormat,
    output: Option<PathBuf>,
    late_output: Option<PathBuf>,
    /// Per query: the stream it writes to.
    stream_of_query: Vec<usize>,
    /// Per stream: its columns, and its output once a query opened it.
    streams: Vec<(SchemaRef, Option<Output>)>,
    late: Option<Output>,
    /// Resuming: the length to keep of each output stream (then of the late rows).
    resume: Vec<u64>,
}

impl FileSink {
    /// A sink for queries with the output columns `query_schemas` (in the order of the queries).
    pub fn new(
        format: OutputFormat,
        output: Option<PathBuf>,
        late_output: Option<PathBuf>,
        query_schemas: &[SchemaRef],
    ) -> Result<Self> {
        let mut streams: Vec<(SchemaRef, Option<Output>)> = Vec::new();
        let mut stream_of_query = Vec::with_capacity(query_schemas.len());
        for schema in query_schemas {
            let stream = streams.iter().position(|(s, _)| same_columns(s, schema)).unwrap_or_else(|| {
                streams.push((schema.clone(), None));
                streams.len() - 1
            });
            stream_of_query.push(stream);
        }
        if streams.len() > 1 && output.is_none() && format == OutputFormat::Csv {
            return Err(TesseraError::Option(
                "the script's queries have different columns: give --output FILE (one file per set of columns) or --format jsonl".into(),
            ));
        }
        Ok(FileSink { format, output, late_output, stream_of_query, streams, late: None, resume: Vec::new() })
    }

    fn path_for_stream(&self, stream: usize) -> Option<PathBuf> {
        let output = self.output.as_ref()?;
        if stream == 0 {
            return Some(output.clone());
        }
        let stem = output.file_stem().and_then(|s| s.to_str()).unwrap_or("output");
        let name = match output.extension().and_then(|e| e.to_str()) {
            Some(ext) => format!("{stem}-q{}.{ext}", stream + 1),
            None => format!("{stem}-q{}", stream + 1),
        };
        Some(output.with_file_name(name))
    }

    /// Every file this sink may write, with what it is (`--output`, ...), before it writes any.
    pub fn files(&self) -> Vec<super::file_identity::FileUse> {
        use super::file_identity::FileUse;
        let streams = (0..self.streams.len()).filter_map(|stream| {
            let role = match self.stream_of_query.iter().position(|&s| s == stream) {
                Some(query) if stream > 0 => format!("the output of query {}", query + 1),
                _ => "--output".to_string(),
            };
            Some(FileUse::new(role, self.path_for_stream(stream)?))
        });
        streams.chain(self.late_output.iter().map(|path| FileUse::new("--late-output", path))).collect()
    }
}

fn same_columns(a: &SchemaRef, b: &SchemaRef) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields().iter().zip(b.fields()).all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
}

impl ResultSink for FileSink {
    fn open_query(&mut self, query: usize, schema: &SchemaRef) -> Result<()> {
        let stream = *self.stream_of_query.get(query).ok_or_else(|| {
            TesseraError::Internal(format!("query {query} opened on a sink made for {}", self.stream_of_query.len()))
        })?;
        if !same_columns(&self.streams[stream].0, schema) {
            return Err(TesseraError::Internal(format!("query {query} opened with other columns")));
        }
        if self.streams[stream].1.is_some() {
            return Ok(());
        }
        let output = match self.path_for_stream(stream) {
            Some(path) => open_output(&path, self.format, self.resume.get(stream).copied().unwrap_or(0))?,
            None => {
                let out = Box::new(ClosablePipe { inner: BufWriter::new(std::io::stdout()), closed: false });
                Output {
                    format: self.format,
                    encoder: Some(Encoder::new(self.format, out, true)),
                    file: None,
                    started: false,
                }
            }
        };
        self.streams[stream].1 = Some(output);
        Ok(())
    }

    fn write_rows(&mut self, query: usize, batch: &RecordBatch) -> Result<()> {
        let stream = self.stream_of_query[query];
        let (schema, output) = &mut self.streams[stream];
        let output = output.as_mut().ok_or_else(|| TesseraError::Internal(format!("query {query} not opened")))?;
        let batch = if batch.schema().fields() == schema.fields() {
            batch.clone()
        } else {
            batch.clone().with_schema(schema.clone())?
        };
        output.write(&batch)
    }

    fn write_late(&mut self, _query: usize, batch: &RecordBatch) -> Result<()> {
        let Some(path) = &self.late_output else { return Ok(()) };
        if self.late.is_none() {
            self.late = Some(open_output(path, OutputFormat::Csv, 0)?);
        }
        self.late.as_mut().expect("created above").write(batch)
    }

    fn finish(&mut self) -> Result<()> {
        for (schema, output) in self.streams.iter_mut().filter_map(|(s, o)| Some((s, o.as_mut()?))) {
            if output.encoder.is_some() {
                // A query without rows still gets its CSV header.
                output.write(&RecordBatch::new_empty(schema.clone()))?;
                output.finish()?;
            }
        }
        if let Some(late) = self.late.as_mut() {
            late.finish()?;
        }
        Ok(())
    }

    /// The length of every result stream (0 until a query opens it), then of the late rows
    /// (0 until there are any).
    fn checkpoint(&mut self) -> Result<Vec<u64>> {
        let mut positions = Vec::new();
        for (_, output) in &mut self.streams {
            positions.push(output.as_mut().map_or(Ok(0), Output::checkpoint)?);
        }
        if self.late_output.is_some() {
            positions.push(self.late.as_mut().map_or(Ok(0), Output::checkpoint)?);
        }
        Ok(positions)
    }

    fn resume(&mut self, positions: &[u64]) -> Result<()> {
        if self.output.is_none() {
            return Err(TesseraError::Option(
                "resuming from a checkpoint needs --output FILE: rows written to stdout cannot be cut back".into(),
            ));
        }
        self.resume = positions.to_vec();
        // Late rows may not come again before the end: cut their file back now.
        if let Some(path) = &self.late_output {
            self.late = Some(open_output(path, OutputFormat::Csv, positions.last().copied().unwrap_or(0))?);
        }
        Ok(())
    }
}

/// Keeps every result in memory, per query.
#[derive(Default)]
pub struct MemorySink {
    pub schemas: Vec<Option<SchemaRef>>,
    pub rows: Vec<Vec<RecordBatch>>,
    pub late: Vec<Vec<RecordBatch>>,
}

impl ResultSink for MemorySink {
    fn open_query(&mut self, query: usize, schema: &SchemaRef) -> Result<()> {
        if self.rows.len() <= query {
            self.rows.resize_with(query + 1, Vec::new);
            self.late.resize_with(query + 1, Vec::new);
            self.schemas.resize(query + 1, None);
        }
        self.schemas[query] = Some(schema.clone());
        Ok(())
    }

    fn write_rows(&mut self, query: usize, batch: &RecordBatch) -> Result<()> {
        self.rows[query].push(batch.clone());
        Ok(())
    }

    fn write_late(&mut self, query: usize, batch: &RecordBatch) -> Result<()> {
        self.late[query].push(batch.clone());
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }

    /// The number of batches of each query's rows, then of its late rows.
    fn checkpoint(&mut self) -> Result<Vec<u64>> {
        Ok(self.rows.iter().chain(&self.late).map(|b| b.len() as u64).collect())
    }

    fn resume(&mut self, positions: &[u64]) -> Result<()> {
        let n = self.rows.len();
        for (batches, &keep) in self.rows.iter_mut().chain(self.late.iter_mut()).zip(positions) {
            batches.truncate(keep as usize);
        }
        (positions.len() == 2 * n || n == 0)
            .then_some(())
            .ok_or_else(|| TesseraError::Internal("resuming a memory sink of another run".into()))
    }
}
