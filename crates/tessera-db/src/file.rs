//! A table's rows from a file (`CREATE TABLE ... WITH (path = ...)`, `COPY`): read by the
//! streaming engine's readers, so CSV, JSON lines and Parquet are parsed one way everywhere and a
//! malformed row stops the statement with `file:line` and the reason, or with `on_error =
//! 'skip'` goes to the dead-letter file and is counted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use tessera::catalog::{Format, InputDef, Location, TimeUnit};
use tessera::connectors::{open_input, OnError, ReadOptions};
use tessera::error::{Result, TesseraError};

use crate::table::Table;

/// How a file is read: the WITH options of `COPY` and of `CREATE TABLE` beside `path`.
#[derive(Debug, Default, Clone)]
pub struct FileOptions {
    format: Option<Format>,
    /// The column whose values say insert, update or delete (`COPY` only).
    pub op_column: Option<String>,
    /// What the readers take: `delimiter`, `header`, `time_unit`.
    reader: BTreeMap<String, String>,
    on_error: Option<OnError>,
    dead_letter: Option<PathBuf>,
}

impl FileOptions {
    /// The options of `statement` (`COPY` or `CREATE TABLE`), by lower-case name; `ignored` are
    /// names the statement reads itself.
    pub fn parse(options: &[(String, String)], statement: &str, ignored: &[&str]) -> Result<Self> {
        let mut parsed = FileOptions::default();
        for (name, value) in options {
            match name.as_str() {
                "format" => {
                    let format = Format::parse(value).ok_or_else(|| {
                        TesseraError::Plan(format!("format `{value}` is not one of csv, jsonl, parquet"))
                    })?;
                    parsed.format = Some(format);
                }
                "op_column" if statement == "COPY" => parsed.op_column = Some(value.clone()),
                "delimiter" | "header" | "time_unit" => {
                    parsed.reader.insert(name.clone(), value.clone());
                }
                "on_error" => {
                    parsed.on_error = Some(match value.to_ascii_lowercase().as_str() {
                        "fail" => OnError::Fail,
                        "skip" => OnError::Skip,
                        other => {
                            return Err(TesseraError::Plan(format!("on_error is `fail` or `skip`, not `{other}`")))
                        }
                    })
                }
                "dead_letter" => parsed.dead_letter = Some(PathBuf::from(value)),
                other if ignored.contains(&other) => {}
                other => {
                    return Err(TesseraError::Plan(format!(
                        "{statement} has no option `{other}`: it takes format, {}delimiter, header, time_unit, \
                         on_error and dead_letter",
                        if statement == "COPY" { "op_column, " } else { "path, " }
                    )))
                }
            }
        }
        Ok(parsed)
    }
}

/// Malformed rows a read skipped, and the dead-letter file they went to.
pub struct Skipped {
    pub rows: u64,
    pub dead_letter: PathBuf,
}

/// The rows of file `path` as `table`'s rows, its columns matched by name (a column the file
/// lacks is NULL), the values of the op column, and the malformed rows skipped.
/// `read` says what a malformed row does unless the options say otherwise; `base_dir` is what a
/// relative dead-letter path is relative to.
pub fn read_rows(
    path: &Path,
    options: &FileOptions,
    table: &Table,
    read: &ReadOptions,
    base_dir: &Path,
) -> Result<(RecordBatch, Option<StringArray>, Skipped)> {
    let format = match options.format {
        Some(format) => format,
        None => path.extension().and_then(|e| e.to_str()).and_then(Format::parse).unwrap_or(Format::Csv),
    };
    let file = path.display().to_string();
    let op_column = options.op_column.as_deref();
    let is_op = |name: &str| op_column.is_some_and(|op| op.eq_ignore_ascii_case(name));
    // The table's columns the file has (a JSON line names its own), then the op column.
    let named = file_columns(path, format, &options.reader)?;
    if let (Format::Csv, Some(names)) = (format, &named) {
        let unknown =
            names.iter().find(|n| !is_op(n) && !table.schema.fields().iter().any(|f| f.name().eq_ignore_ascii_case(n)));
        if let Some(unknown) = unknown {
            return Err(TesseraError::Input {
                file,
                line: 1,
                reason: format!("the header has a column `{unknown}`, which table `{}` does not", table.name),
            });
        }
    }
    let in_file = |name: &str| named.as_ref().is_none_or(|names| names.iter().any(|n| n.eq_ignore_ascii_case(name)));
    // Numbers in TIMESTAMP columns count the statement's time_unit, else the table's: they are
    // read as timestamps of that unit, then converted to the column's.
    let mut reader_options = options.reader.clone();
    let time_unit = match reader_options.get("time_unit") {
        Some(unit) => Some(
            TimeUnit::parse(unit)
                .ok_or_else(|| TesseraError::Plan(format!("time_unit is 's', 'ms', 'us' or 'ns', not `{unit}`")))?,
        ),
        None => table.time_unit,
    };
    if let Some(unit) = time_unit {
        reader_options.insert("time_unit".into(), unit.suffix().into());
    }
    let read_as = |field: &Field| match (field.data_type(), time_unit) {
        (DataType::Timestamp(_, zone), Some(unit)) => {
            field.clone().with_data_type(DataType::Timestamp(unit.to_arrow(), zone.clone()))
        }
        _ => field.clone(),
    };
    let mut fields: Vec<Field> =
        table.schema.fields().iter().filter(|f| in_file(f.name())).map(|f| read_as(f)).collect();
    if let Some(op) = op_column {
        if !in_file(op) {
            return Err(TesseraError::Input {
                file,
                line: 1,
                reason: format!("the file has no column `{op}` (op_column)"),
            });
        }
        fields.push(Field::new(op, DataType::Utf8, true));
    }
    let schema = Arc::new(Schema::new(fields));
    let location = Location::File(path.to_path_buf());
    let input = InputDef { schema: &schema, location: &location, format, options: &reader_options, event_time: None };
    let read = ReadOptions {
        on_error: options.on_error.unwrap_or(read.on_error),
        dead_letter_path: options
            .dead_letter
            .as_ref()
            .map_or_else(|| read.dead_letter_path.clone(), |p| base_dir.join(p)),
        ..read.clone()
    };
    let mut reader = open_input(input, &read)?;
    let mut parts = Vec::new();
    let mut ops: Vec<ArrayRef> = Vec::new();
    while let Some(batch) = reader.next_batch()? {
        let column = |name: &str| {
            let found = schema.fields().iter().position(|f| f.name().eq_ignore_ascii_case(name));
            found.map(|i| Arc::clone(batch.column(i)))
        };
        let columns = table
            .schema
            .fields()
            .iter()
            .map(|f| column(f.name()).unwrap_or_else(|| arrow::array::new_null_array(f.data_type(), batch.num_rows())))
            .collect();
        parts.push(table.conform(columns)?);
        if let Some(op) = op_column.and_then(column) {
            ops.push(op);
        }
    }
    let rows = arrow::compute::concat_batches(&table.schema, &parts)?;
    let ops = match op_column {
        None => None,
        Some(_) => {
            let refs: Vec<&dyn arrow::array::Array> = ops.iter().map(|a| a.as_ref()).collect();
            let all = if refs.is_empty() {
                arrow::array::new_empty_array(&DataType::Utf8)
            } else {
                arrow::compute::concat(&refs)?
            };
            Some(all.as_string::<i32>().clone())
        }
    };
    let skipped = Skipped { rows: reader.skipped().rows, dead_letter: read.dead_letter_path };
    Ok((rows, ops, skipped))
}

/// The names of a file's columns: a CSV file's header, a Parquet file's schema; `None` for JSON
/// lines, whose every line names its own, and a CSV file without a header (`header = 'false'`:
/// the table's columns in order, then the op column).
fn file_columns(path: &Path, format: Format, options: &BTreeMap<String, String>) -> Result<Option<Vec<String>>> {
    let open = || std::fs::File::open(path).map_err(|e| TesseraError::io(format!("cannot open {}", path.display()), e));
    let invalid = |reason: String| TesseraError::Input { file: path.display().to_string(), line: 1, reason };
    let schema = match format {
        Format::JsonLines => return Ok(None),
        Format::Csv if options.get("header").is_some_and(|h| h.eq_ignore_ascii_case("false")) => return Ok(None),
        Format::Csv => {
            let delimiter = match options.get("delimiter").map(String::as_str) {
                Some("\\t") | Some("tab") => b'\t',
                Some(d) if d.len() == 1 => d.as_bytes()[0],
                _ => b',',
            };
            let (header, _) = arrow::csv::reader::Format::default()
                .with_header(true)
                .with_delimiter(delimiter)
                .infer_schema(std::io::BufReader::new(open()?), Some(0))
                .map_err(|e| invalid(e.to_string()))?;
            if header.fields().is_empty() {
                // An empty file: the reader says what it lacks, with the table's columns.
                return Ok(None);
            }
            header
        }
        Format::Parquet => parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(open()?)
            .map_err(|e| invalid(e.to_string()))?
            .schema()
            .as_ref()
            .clone(),
    };
    Ok(Some(schema.fields().iter().map(|f| f.name().trim().to_string()).collect()))
}
