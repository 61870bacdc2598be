//! Where results go: CSV with a header row or JSON lines, to stdout or a file; late rows to
//! their own CSV file; or into memory for tests and the library API.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;

use crate::error::{Result, TesseraError};

/// Receives the rows of every query of a run.
pub trait ResultSink: Send {
    /// Called once per query before any row, with its output schema.
    fn open_query(&mut self, query: usize, schema: &SchemaRef) -> Result<()>;
    fn write_rows(&mut self, query: usize, batch: &RecordBatch) -> Result<()>;
    /// Source rows that came too late for a window of `query`.
    fn write_late(&mut self, query: usize, batch: &RecordBatch) -> Result<()>;
    fn finish(&mut self) -> Result<()>;
}

/// Output file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    #[default]
    Csv,
    JsonLines,
}

enum Encoder {
    Csv(Box<arrow::csv::Writer<Box<dyn Write + Send>>>),
    Json(arrow::json::LineDelimitedWriter<Box<dyn Write + Send>>),
}

impl Encoder {
    fn new(format: OutputFormat, out: Box<dyn Write + Send>) -> Self {
        match format {
            OutputFormat::Csv => Encoder::Csv(Box::new(arrow::csv::WriterBuilder::new().with_header(true).build(out))),
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

    fn finish(self) -> Result<()> {
        let mut out = match self {
            Encoder::Csv(w) => w.into_inner(),
            Encoder::Json(mut w) => {
                w.finish()?;
                w.into_inner()
            }
        };
        out.flush().map_err(|e| TesseraError::io("cannot write results", e))
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

fn create(path: &Path) -> Result<Box<dyn Write + Send>> {
    let file = File::create(path).map_err(|e| TesseraError::io(format!("cannot create {}", path.display()), e))?;
    Ok(Box::new(BufWriter::with_capacity(1 << 20, file)))
}

/// Writes results to stdout or a file. Queries with the same columns share one stream (one
/// header); a query with different columns gets its own file, `NAME-q<N>.EXT` beside `--output`.
pub struct FileSink {
    format: OutputFormat,
    output: Option<PathBuf>,
    late_output: Option<PathBuf>,
    /// Per query: the stream it writes to.
    stream_of_query: Vec<usize>,
    streams: Vec<(SchemaRef, Option<Encoder>)>,
    late: Option<Encoder>,
}

impl FileSink {
    pub fn new(format: OutputFormat, output: Option<PathBuf>, late_output: Option<PathBuf>) -> Self {
        FileSink { format, output, late_output, stream_of_query: Vec::new(), streams: Vec::new(), late: None }
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
}

fn same_columns(a: &SchemaRef, b: &SchemaRef) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields().iter().zip(b.fields()).all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
}

impl ResultSink for FileSink {
    fn open_query(&mut self, query: usize, schema: &SchemaRef) -> Result<()> {
        if self.stream_of_query.len() <= query {
            self.stream_of_query.resize(query + 1, usize::MAX);
        }
        let stream = match self.streams.iter().position(|(s, _)| same_columns(s, schema)) {
            Some(s) => s,
            None => {
                let stream = self.streams.len();
                if stream > 0 && self.output.is_none() && self.format == OutputFormat::Csv {
                    return Err(TesseraError::Option(
                        "the script's queries have different columns: give --output FILE (one file per query) or --format jsonl".into(),
                    ));
                }
                let out: Box<dyn Write + Send> = match self.path_for_stream(stream) {
                    Some(path) => create(&path)?,
                    None => Box::new(ClosablePipe { inner: BufWriter::new(std::io::stdout()), closed: false }),
                };
                self.streams.push((schema.clone(), Some(Encoder::new(self.format, out))));
                stream
            }
        };
        self.stream_of_query[query] = stream;
        Ok(())
    }

    fn write_rows(&mut self, query: usize, batch: &RecordBatch) -> Result<()> {
        let stream = self.stream_of_query[query];
        let (schema, encoder) = &mut self.streams[stream];
        let batch = if batch.schema().fields() == schema.fields() {
            batch.clone()
        } else {
            batch.clone().with_schema(schema.clone())?
        };
        match encoder.as_mut() {
            Some(encoder) => encoder.write(&batch),
            None => Err(TesseraError::Internal("write after finish".into())),
        }
    }

    fn write_late(&mut self, _query: usize, batch: &RecordBatch) -> Result<()> {
        let Some(path) = &self.late_output else { return Ok(()) };
        if self.late.is_none() {
            self.late = Some(Encoder::new(OutputFormat::Csv, create(path)?));
        }
        self.late.as_mut().expect("created above").write(batch)
    }

    fn finish(&mut self) -> Result<()> {
        for (schema, encoder) in &mut self.streams {
            if let Some(mut encoder) = encoder.take() {
                // A query without rows still gets its CSV header.
                encoder.write(&RecordBatch::new_empty(schema.clone()))?;
                encoder.finish()?;
            }
        }
        if let Some(late) = self.late.take() {
            late.finish()?;
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
}
