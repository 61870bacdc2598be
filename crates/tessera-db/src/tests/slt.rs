//! The sqllogictest suite (`tests/slt/*.slt` at the workspace's root), streams, tables and
//! views alike, run through one [`Session`] per file, as `tessera sql` runs what a user types:
//! every statement is parsed by the session's parser and run by the session, its errors
//! pointing into the statement. What a test adds to that:
//!
//! - `INSERT INTO source VALUES (...)` appends events to the CSV file of a source (declared by
//!   `CREATE SOURCE`, whose file is created with its header row), in arrival order; an
//!   `INSERT` into a table is the session's;
//! - a query over streams runs over all events inserted so far, to the end of its input; its
//!   rows come in the order the engine writes them: sort them (`rowsort`) unless the order is
//!   the point;
//! - `SHOW late_events` returns the late events of the previous statement.

use std::io::Write;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion_sql::sqlparser::ast;
use sqllogictest::{DBOutput, DefaultColumnType};
use tessera::catalog::{Location, SourceDef};
use tessera::sql::StatementKind;

use crate::{Outcome, Session, SessionOptions};

#[derive(Debug)]
struct SltError(String);

impl std::fmt::Display for SltError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SltError {}

impl From<tessera::TesseraError> for SltError {
    fn from(e: tessera::TesseraError) -> Self {
        SltError(e.to_string())
    }
}

struct SessionDb {
    _dir: tempfile::TempDir,
    session: Session,
    /// The sources declared so far, whose files INSERT appends to.
    sources: Vec<SourceDef>,
    last_late_events: u64,
}

impl SessionDb {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let session = Session::open(SessionOptions { base_dir: dir.path().into(), ..SessionOptions::default() })
            .expect("a session in memory");
        SessionDb { _dir: dir, session, sources: Vec::new(), last_late_events: 0 }
    }

    /// The file a source reads, created with its header row if absent.
    fn source_file(source: &SourceDef) -> Result<&Path, SltError> {
        let Location::File(path) = &source.location else {
            return Err(SltError(format!("source `{}` reads {:?}, not a file", source.name, source.location)));
        };
        if !path.exists() {
            let header: Vec<&str> = source.schema.fields().iter().map(|f| f.name().as_str()).collect();
            std::fs::write(path, header.join(",") + "\n").map_err(|e| SltError(e.to_string()))?;
        }
        Ok(path)
    }

    /// Appends the rows of `INSERT INTO source VALUES ...` to the source's file.
    fn append_events(source: &SourceDef, insert: &ast::Insert) -> Result<u64, SltError> {
        let Some(ast::SetExpr::Values(values)) = insert.source.as_ref().map(|q| q.body.as_ref()) else {
            return Err(SltError("events are inserted with VALUES".into()));
        };
        let mut lines = String::new();
        for row in &values.rows {
            let fields: Vec<String> = row
                .iter()
                .map(|e| match e.to_string() {
                    text if text.eq_ignore_ascii_case("NULL") => String::new(),
                    text => text.trim_matches('\'').to_string(),
                })
                .collect();
            lines.push_str(&(fields.join(",") + "\n"));
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(Self::source_file(source)?)
            .and_then(|mut file| file.write_all(lines.as_bytes()))
            .map_err(|e| SltError(e.to_string()))?;
        Ok(values.rows.len() as u64)
    }

    /// The source `insert` writes to, if it writes to one.
    fn source_of(&self, insert: &ast::Insert) -> Option<&SourceDef> {
        let ast::TableObject::TableName(name) = &insert.table else { return None };
        let name = name.to_string();
        self.sources.iter().find(|s| s.name.eq_ignore_ascii_case(&name))
    }
}

impl sqllogictest::DB for SessionDb {
    type Error = SltError;
    type ColumnType = DefaultColumnType;

    fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        if sql.trim().trim_end_matches(';').eq_ignore_ascii_case("SHOW late_events") {
            return Ok(DBOutput::Rows {
                types: vec![DefaultColumnType::Integer],
                rows: vec![vec![self.last_late_events.to_string()]],
            });
        }
        let mut output = DBOutput::StatementComplete(0);
        for statement in self.session.parse(sql)? {
            if let StatementKind::Other(other) = &statement.kind {
                if let ast::Statement::Insert(insert) = other.as_ref() {
                    if let Some(source) = self.source_of(insert) {
                        output = DBOutput::StatementComplete(Self::append_events(source, insert)?);
                        continue;
                    }
                }
            }
            let late_before = self.session.read_totals().late_events;
            let outcome = self.session.execute(&statement)?;
            self.last_late_events = self.session.read_totals().late_events - late_before;
            if let StatementKind::CreateSource(source) = &statement.kind {
                Self::source_file(source)?;
                self.sources.push(source.as_ref().clone());
            }
            output = match outcome {
                Outcome::Rows { schema, batches } => DBOutput::Rows {
                    types: schema.fields().iter().map(|f| column_type(f.data_type())).collect(),
                    rows: rows(&batches)?,
                },
                Outcome::Changed { rows } => DBOutput::StatementComplete(rows),
                Outcome::Done => DBOutput::StatementComplete(0),
            };
        }
        Ok(output)
    }

    fn engine_name(&self) -> &str {
        "tessera"
    }
}

/// The rows of `batches` in order, each value as text: NULL, integers as they are, floats
/// rounded to 6 decimals without trailing zeros, `(empty)` for an empty string, the rest as
/// Arrow displays them.
fn rows(batches: &[arrow::record_batch::RecordBatch]) -> Result<Vec<Vec<String>>, SltError> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SltError(e.to_string()))?;
        for row in 0..batch.num_rows() {
            rows.push(
                batch
                    .columns()
                    .iter()
                    .zip(&formatters)
                    .map(|(column, formatter)| match column.data_type() {
                        t if t.is_floating() && !column.is_null(row) => {
                            let float = arrow::compute::cast(column, &DataType::Float64).expect("a float");
                            let rounded = format!("{:.6}", float.as_primitive::<Float64Type>().value(row));
                            rounded.trim_end_matches('0').trim_end_matches('.').to_string()
                        }
                        _ => match formatter.value(row).to_string() {
                            text if text.is_empty() => "(empty)".into(),
                            text => text,
                        },
                    })
                    .collect(),
            );
        }
    }
    Ok(rows)
}

fn column_type(t: &DataType) -> DefaultColumnType {
    if t.is_integer() {
        DefaultColumnType::Integer
    } else if t.is_floating() {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/slt")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    files
}

#[test]
fn sqllogictest_files() {
    let files = slt_files();
    assert!(files.len() > 20, "the .slt files are missing");
    let mut failures = Vec::new();
    for file in &files {
        let mut runner = sqllogictest::Runner::new(|| async { Ok(SessionDb::new()) });
        if let Err(e) = runner.run_file(file) {
            failures.push(format!("{}: {e}", file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
