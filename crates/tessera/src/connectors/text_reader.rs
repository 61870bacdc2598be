//! CSV and JSON-lines readers. Records are split here (CSV records may span lines inside
//! quotes) so every row keeps its line number; Arrow's decoders parse a whole batch at once and,
//! only when that fails, row by row to find the malformed rows. A resumed run skips the bytes
//! before the checkpoint's position unparsed, counting their lines.

use std::io::{BufRead, BufReader, Read};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::pipe_input::TextInput;
use super::{BadRowPolicy, BatchReader, ReadOptions, RowShape, Skipped};
use crate::catalog::{Format, InputDef};
use crate::error::{Result, TesseraError};

#[derive(Clone, Copy)]
enum TextFormat {
    Csv { delimiter: u8 },
    JsonLines,
}

pub struct TextReader {
    name: String,
    input: BufReader<CountingReader>,
    total_bytes: Option<u64>,
    format: TextFormat,
    /// The declared columns as read, and which of them a row must have.
    shape: RowShape,
    /// CSV: the schema of the file's columns in file order, and where each declared column is.
    decode_schema: SchemaRef,
    projection: Vec<usize>,
    batch_size: usize,
    /// Reading a pipe: how long rows may wait for a batch to fill.
    flush_after: Option<Duration>,
    line: u64,
    policy: BadRowPolicy,
    done: bool,
    /// A batch was asked for (a resumed run may seek only before).
    started: bool,
}

/// A reader that counts the bytes it hands out, for progress.
struct CountingReader {
    inner: TextInput,
    count: u64,
}

impl Read for CountingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

/// Records of one batch: their bytes back to back, each with its first line number.
struct Chunk {
    bytes: Vec<u8>,
    records: Vec<(u64, Range<usize>)>,
}

impl TextReader {
    pub fn new(
        source: InputDef,
        name: String,
        input: TextInput,
        total_bytes: Option<u64>,
        options: &ReadOptions,
    ) -> Result<Self> {
        let format = match source.format {
            Format::Csv => {
                let delimiter = match source.options.get("delimiter").map(String::as_str) {
                    None => b',',
                    Some("\\t") | Some("tab") => b'\t',
                    Some(d) if d.len() == 1 => d.as_bytes()[0],
                    Some(d) => return Err(TesseraError::Option(format!("delimiter must be one character, got '{d}'"))),
                };
                TextFormat::Csv { delimiter }
            }
            Format::JsonLines => TextFormat::JsonLines,
            Format::Parquet => return Err(TesseraError::Internal("TextReader used for Parquet".into())),
        };
        let shape = RowShape::of(source);
        let flush_after = matches!(input, TextInput::Pipe(_)).then_some(options.flush_after);
        let mut reader = TextReader {
            name,
            input: BufReader::with_capacity(1 << 20, CountingReader { inner: input, count: 0 }),
            total_bytes,
            format,
            decode_schema: Arc::new(Schema::new(
                (0..shape.schema.fields().len()).map(|c| shape.text_field(c)).collect::<Vec<_>>(),
            )),
            projection: (0..shape.schema.fields().len()).collect(),
            shape,
            batch_size: options.batch_size.max(1),
            flush_after,
            line: 0,
            policy: BadRowPolicy::new(options),
            done: false,
            started: false,
        };
        reader.skip_byte_order_mark()?;
        let has_header =
            !matches!(source.options.get("header").map(|h| h.to_ascii_lowercase()).as_deref(), Some("false"));
        if let (TextFormat::Csv { delimiter }, true) = (format, has_header) {
            // An empty file is not a CSV file with no rows: that is its header alone.
            if reader.total_bytes == Some(0) {
                let names: Vec<&str> = reader.shape.schema.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(TesseraError::Input {
                    file: reader.name,
                    line: 1,
                    reason: format!(
                        "the file is empty: a CSV file starts with a header row naming its columns ({}), and one \
                         without rows is that row alone",
                        names.join(",")
                    ),
                });
            }
            reader.read_header(delimiter)?;
        }
        Ok(reader)
    }

    /// Skips a UTF-8 byte order mark at the start of the input (some editors write one): it
    /// is no part of the first record.
    fn skip_byte_order_mark(&mut self) -> Result<()> {
        const BOM: &[u8] = b"\xEF\xBB\xBF";
        let start = self.input.fill_buf().map_err(|e| TesseraError::io(format!("cannot read {}", self.name), e))?;
        if start.starts_with(BOM) {
            self.input.consume(BOM.len());
        }
        Ok(())
    }

    /// Maps the header's column names to the declared columns; extra file columns are read as
    /// text and dropped.
    fn read_header(&mut self, delimiter: u8) -> Result<()> {
        let mut chunk = Chunk { bytes: Vec::new(), records: Vec::new() };
        if !self.read_record(&mut chunk)? {
            return Ok(());
        }
        let (line, range) = chunk.records[0].clone();
        let text = String::from_utf8_lossy(&chunk.bytes[range]).into_owned();
        let names = split_csv_fields(text.trim_end_matches(['\n', '\r']), delimiter);
        let mut fields = Vec::new();
        let mut projection = vec![usize::MAX; self.shape.schema.fields().len()];
        for (i, name) in names.iter().enumerate() {
            let name = name.trim();
            match self.shape.schema.fields().iter().position(|f| f.name().eq_ignore_ascii_case(name)) {
                Some(d) if projection[d] == usize::MAX => {
                    projection[d] = i;
                    fields.push(self.shape.text_field(d));
                }
                _ => fields.push(Field::new(format!("__extra_{i}"), DataType::Utf8, true)),
            }
        }
        if let Some(missing) = projection.iter().position(|&p| p == usize::MAX) {
            return Err(TesseraError::Input {
                file: self.name.clone(),
                line,
                reason: format!(
                    "header has no column `{}` (header: {})",
                    self.shape.schema.field(missing).name(),
                    names.join(", ")
                ),
            });
        }
        self.decode_schema = Arc::new(Schema::new(fields));
        self.projection = projection;
        Ok(())
    }

    /// Appends the next non-blank record to `chunk`; false at the end of the input.
    fn read_record(&mut self, chunk: &mut Chunk) -> Result<bool> {
        loop {
            let start = chunk.bytes.len();
            let first_line = self.line + 1;
            let mut quotes = 0usize;
            loop {
                let before = chunk.bytes.len();
                let n = self
                    .input
                    .read_until(b'\n', &mut chunk.bytes)
                    .map_err(|e| TesseraError::io(format!("cannot read {}", self.name), e))?;
                if n == 0 {
                    break;
                }
                self.line += 1;
                if let TextFormat::Csv { .. } = self.format {
                    quotes += chunk.bytes[before..].iter().filter(|&&b| b == b'"').count();
                    if quotes % 2 == 1 {
                        continue; // a quoted field spans lines
                    }
                }
                break;
            }
            if chunk.bytes.len() == start {
                return Ok(false);
            }
            if chunk.bytes[start..].iter().all(|b| b.is_ascii_whitespace()) {
                chunk.bytes.truncate(start);
                continue;
            }
            if chunk.bytes.last() != Some(&b'\n') {
                chunk.bytes.push(b'\n');
            }
            chunk.records.push((first_line, start..chunk.bytes.len()));
            return Ok(true);
        }
    }

    /// Decodes `bytes`, which hold `records` records: the decoder sizes its buffers for them,
    /// with room for a few dozen (so a record with too many fields is reported with their number).
    fn decode(
        &self,
        bytes: &[u8],
        records: usize,
    ) -> std::result::Result<Option<RecordBatch>, arrow::error::ArrowError> {
        match self.format {
            TextFormat::Csv { delimiter } => {
                let mut decoder = arrow::csv::ReaderBuilder::new(Arc::clone(&self.decode_schema))
                    .with_header(false)
                    .with_delimiter(delimiter)
                    .with_batch_size(records.max(64))
                    .build_decoder();
                feed(bytes, |b| decoder.decode(b))?;
                decoder.flush()
            }
            TextFormat::JsonLines => {
                // Numbers in TIMESTAMP columns (decoded as text) arrive as their digits.
                let mut decoder = arrow::json::ReaderBuilder::new(Arc::clone(&self.decode_schema))
                    .with_coerce_primitive(true)
                    .with_batch_size(records.max(64))
                    .build_decoder()?;
                feed(bytes, |b| decoder.decode(b))?;
                decoder.flush()
            }
        }
    }

    /// A CSV field by its column's name and its 1-based position in the record.
    fn field_name(&self, index: usize) -> String {
        match self.decode_schema.fields().get(index) {
            Some(field) if !field.name().starts_with("__extra_") => {
                format!("column `{}` (field {})", field.name(), index + 1)
            }
            _ => format!("field {}", index + 1),
        }
    }

    /// Arrow's CSV messages (fields counted from 0, records called lines and counted within
    /// the batch) told in the file's terms: the column by name and 1-based field number, the
    /// file's line being the error's.
    fn describe_error(&self, message: &str) -> String {
        let TextFormat::Csv { .. } = self.format else {
            return message.to_string();
        };
        let not_parsed = || {
            let (value, rest) = message.strip_prefix("Error while parsing value '")?.rsplit_once("' as type '")?;
            let index = leading_number(rest.split_once("' for column ")?.1)?;
            let declared = self.decode_schema.fields().get(index)?.data_type();
            Some(format!(
                "cannot read '{value}' as {} in {}",
                crate::catalog::sql_type_name(declared),
                self.field_name(index)
            ))
        };
        let fields = || {
            let (_, counts) = message.strip_prefix("incorrect number of fields for line ")?.split_once(", ")?;
            let (expected, got) = counts.strip_prefix("expected ")?.split_once(" got ")?;
            Some(format!("expected {expected} fields, got {got}"))
        };
        let utf8 = || {
            let field = message.strip_prefix("Encountered invalid UTF-8 data for line ")?.split_once(" and field ")?.1;
            Some(format!("invalid UTF-8 in {}", self.field_name(leading_number(field)?.checked_sub(1)?)))
        };
        not_parsed().or_else(fields).or_else(utf8).unwrap_or_else(|| message.to_string())
    }

    /// Whether the next record is at hand (or comes) before `deadline`.
    fn next_record_by(&mut self, deadline: Instant) -> bool {
        Instant::now() < deadline && (!self.input.buffer().is_empty() || self.input.get_mut().inner.ready_by(deadline))
    }

    fn record_text(chunk: &Chunk, range: &Range<usize>) -> String {
        String::from_utf8_lossy(&chunk.bytes[range.clone()]).trim_end_matches(['\n', '\r']).to_string()
    }

    /// Decodes a chunk: its rows, their lines, and the records that do not decode (`malformed`,
    /// found by halving the chunk when it fails as a whole).
    fn decode_chunk(&self, chunk: &Chunk, malformed: &mut Vec<Malformed>) -> Result<(RecordBatch, Vec<u64>)> {
        let lines: Vec<u64> = chunk.records.iter().map(|(l, _)| *l).collect();
        match self.decode(&chunk.bytes, chunk.records.len()) {
            Ok(Some(batch)) if batch.num_rows() == chunk.records.len() => return Ok((batch, lines)),
            Ok(None) if chunk.records.is_empty() => {
                return Ok((RecordBatch::new_empty(Arc::clone(&self.decode_schema)), lines))
            }
            _ => {}
        }
        // The whole chunk failed: sift its halves.
        let (mut good, mut good_lines) = (Vec::new(), Vec::new());
        let (front, back) = chunk.records.split_at(chunk.records.len() / 2);
        for half in [front, back] {
            self.sift(chunk, half, (&mut good, &mut good_lines), malformed);
        }
        Ok((arrow::compute::concat_batches(&self.decode_schema, &good)?, good_lines))
    }

    /// Appends the decoded rows of the records of `records` that decode to `good` (as batches,
    /// and their lines), in order, and the others to `malformed`: a part that decodes whole is
    /// good, one that does not is halved, down to single records (a malformed record costs
    /// about two decodes of its chunk, not one decode per record).
    fn sift(
        &self,
        chunk: &Chunk,
        records: &[(u64, Range<usize>)],
        good: (&mut Vec<RecordBatch>, &mut Vec<u64>),
        malformed: &mut Vec<Malformed>,
    ) {
        if records.is_empty() {
            return;
        }
        let part: Vec<u8> = records.iter().flat_map(|(_, range)| chunk.bytes[range.clone()].iter().copied()).collect();
        match (self.decode(&part, records.len()), records) {
            (Ok(Some(batch)), _) if batch.num_rows() == records.len() => {
                good.0.push(batch);
                good.1.extend(records.iter().map(|(line, _)| *line));
            }
            (outcome, [(line, range)]) => {
                let reason = match outcome {
                    Err(e) => self.describe_error(&clean_arrow_error(&e)),
                    Ok(_) => "not a complete record".to_string(),
                };
                malformed.push(Malformed { line: *line, reason, record: Self::record_text(chunk, range) });
            }
            (_, _) => {
                let (front, back) = records.split_at(records.len() / 2);
                self.sift(chunk, front, (&mut *good.0, &mut *good.1), malformed);
                self.sift(chunk, back, good, malformed);
            }
        }
    }
}

/// A record that is not a well-formed row: its line, why, and its text.
struct Malformed {
    line: u64,
    reason: String,
    record: String,
}

/// Hands `bytes` to a push decoder until it has taken them all (or takes no more).
fn feed(
    bytes: &[u8],
    mut decode: impl FnMut(&[u8]) -> std::result::Result<usize, arrow::error::ArrowError>,
) -> std::result::Result<(), arrow::error::ArrowError> {
    let mut offset = 0;
    while offset < bytes.len() {
        let used = decode(&bytes[offset..])?;
        if used == 0 {
            break;
        }
        offset += used;
    }
    Ok(())
}

/// Arrow's parse errors count lines within the batch, fields from 0 and say `line` for a
/// record; the reader knows the file's line. The message without Arrow's lines and its
/// "Parser error:" prefix.
fn clean_arrow_error(e: &arrow::error::ArrowError) -> String {
    let text = match e {
        arrow::error::ArrowError::ParseError(m)
        | arrow::error::ArrowError::CsvError(m)
        | arrow::error::ArrowError::JsonError(m) => m.clone(),
        other => other.to_string(),
    };
    let text = match text.find(" at line ") {
        Some(p) => {
            let rest = &text[p + " at line ".len()..];
            let after_number = rest.trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{}{}", &text[..p], after_number)
        }
        None => text,
    };
    match text.find(". Row data:") {
        Some(p) => text[..p].to_string(),
        None => text,
    }
}

/// The number `text` starts with.
fn leading_number(text: &str) -> Option<usize> {
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    text[..end].parse().ok()
}

/// Splits one CSV record into fields, honouring quotes and doubled quotes.
pub fn split_csv_fields(line: &str, delimiter: u8) -> Vec<String> {
    let delimiter = delimiter as char;
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut in_quotes = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if in_quotes && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => in_quotes = !in_quotes,
            c if c == delimiter && !in_quotes => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

impl BatchReader for TextReader {
    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        self.started = true;
        while !self.done {
            let mut chunk =
                Chunk { bytes: Vec::with_capacity(self.batch_size * 32), records: Vec::with_capacity(self.batch_size) };
            // Reading a pipe, rows are handed over by then even if the batch is not full.
            let mut hand_over_by = None;
            while chunk.records.len() < self.batch_size {
                if hand_over_by.is_some_and(|deadline| !self.next_record_by(deadline)) {
                    break;
                }
                if !self.read_record(&mut chunk)? {
                    self.done = true;
                    break;
                }
                hand_over_by = hand_over_by.or_else(|| self.flush_after.map(|delay| Instant::now() + delay));
            }
            if chunk.records.is_empty() {
                break;
            }
            let mut malformed = Vec::new();
            let (decoded, lines) = self.decode_chunk(&chunk, &mut malformed)?;
            let columns: Vec<ArrayRef> = self.projection.iter().map(|&i| Arc::clone(decoded.column(i))).collect();
            let batch = self.shape.rows(columns, |row, reason| {
                let record =
                    chunk.records.iter().find(|(l, _)| *l == lines[row]).map(|(_, r)| Self::record_text(&chunk, r));
                let record = record.unwrap_or_default();
                malformed.push(Malformed { line: lines[row], reason: reason.to_string(), record });
                Ok(())
            })?;
            // In the order of the file: the first malformed row is the one that stops a run.
            malformed.sort_by_key(|m| m.line);
            for Malformed { line, reason, record } in malformed {
                self.policy.bad_row(&self.name, line, &reason, &record)?;
            }
            if batch.num_rows() > 0 {
                self.policy.flush()?;
                return Ok(Some(batch));
            }
        }
        self.policy.flush()?;
        Ok(None)
    }

    /// The bytes consumed: read from the input less those still buffered.
    fn progress(&self) -> (u64, Option<u64>) {
        (self.input.get_ref().count - self.input.buffer().len() as u64, self.total_bytes)
    }

    fn skipped(&self) -> Skipped {
        self.policy.skipped()
    }

    /// Positions are bytes consumed.
    fn seek(&mut self, position: u64, skipped: Option<Skipped>) -> Result<bool> {
        if self.started || !self.policy.resume(skipped)? {
            return Ok(false);
        }
        while self.progress().0 < position {
            let buffered =
                self.input.fill_buf().map_err(|e| TesseraError::io(format!("cannot read {}", self.name), e))?;
            if buffered.is_empty() {
                return Err(TesseraError::Checkpoint(format!(
                    "{} ended before the checkpoint's position (byte {position}): the input changed",
                    self.name
                )));
            }
            let take = buffered.len().min((position - self.progress().0) as usize);
            // Lines are counted as the records were: one per newline.
            self.line += self.input.buffer()[..take].iter().filter(|&&b| b == b'\n').count() as u64;
            self.input.consume(take);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_quoted_fields() {
        assert_eq!(split_csv_fields(r#"a,"b,c","say ""hi""""#, b','), vec!["a", "b,c", r#"say "hi""#]);
        assert_eq!(split_csv_fields("x", b','), vec!["x"]);
    }
}
