//! The sqllogictest suite (`tests/slt/*.slt`), run through the library's entry points
//! (`tessera::engine`, `tessera::explain`) only. Each file gets a fresh engine:
//!
//! - `CREATE SOURCE` and `SET` statements form the file's preamble, in order;
//! - `INSERT INTO source VALUES (...)` appends events to the source's CSV file in arrival order;
//! - a query is compiled as a script, the preamble (a statement per line) then the query, and
//!   run with `run_script` over all events inserted so far, flushing open windows at the end of
//!   the input. Rows come in the order the engine writes them: sort them (`rowsort`) unless the
//!   order is the point. Errors are the engine's messages, their lines those of that script;
//! - `EXPLAIN query` returns the text EXPLAIN of that script (`tessera explain`), a row per line;
//! - `SHOW late_events` returns the late events of the previous query.

use std::io::Write;
use std::path::{Path, PathBuf};

use sqllogictest::{DBOutput, DefaultColumnType};
use tessera::catalog::{Location, SourceDef};
use tessera::connectors::sink::MemorySink;
use tessera::engine::{run_script, RunOptions, Script};
use tessera::explain::{explain_json, explain_text};

use super::harness::rows_in_order;

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

struct StreamDb {
    dir: tempfile::TempDir,
    /// The CREATE SOURCE and SET statements so far.
    preamble: Vec<String>,
    last_late_events: u64,
}

impl StreamDb {
    fn new() -> Self {
        StreamDb { dir: tempfile::tempdir().expect("temp dir"), preamble: vec![], last_late_events: 0 }
    }

    /// The preamble, a statement per line, followed by `statement` (if any), compiled.
    fn compile(&self, statement: Option<&str>) -> Result<Script, SltError> {
        let statements = self.preamble.iter().map(String::as_str).chain(statement);
        let text: String = statements.map(|s| format!("{s};\n")).collect();
        Ok(Script::compile(&text, self.dir.path())?)
    }

    /// The file a source reads, which INSERT appends to.
    fn source_file(source: &SourceDef) -> Result<&Path, SltError> {
        match &source.location {
            Location::File(path) => Ok(path),
            other => Err(SltError(format!("source `{}` reads {other:?}, not a file", source.name))),
        }
    }

    /// Creates the CSV file, with its header, of every declared source that has none yet.
    fn create_source_files(script: &Script) -> Result<(), SltError> {
        for name in script.catalog.source_names() {
            let source = script.catalog.source(name).expect("listed source");
            let path = Self::source_file(source)?;
            if !path.exists() {
                let header: Vec<&str> = source.schema.fields().iter().map(|f| f.name().as_str()).collect();
                std::fs::write(path, header.join(",") + "\n").map_err(|e| SltError(e.to_string()))?;
            }
        }
        Ok(())
    }

    fn insert(&mut self, sql: &str) -> Result<u64, SltError> {
        use datafusion_sql::sqlparser::ast::{SetExpr, Statement};
        use datafusion_sql::sqlparser::dialect::GenericDialect;
        use datafusion_sql::sqlparser::parser::Parser;
        let statements = Parser::parse_sql(&GenericDialect {}, sql).map_err(|e| SltError(e.to_string()))?;
        let Some(Statement::Insert(insert)) = statements.first() else {
            return Err(SltError("expected INSERT".into()));
        };
        let Some(SetExpr::Values(values)) = insert.source.as_ref().map(|q| q.body.as_ref()) else {
            return Err(SltError("expected VALUES".into()));
        };
        let table = insert.table.to_string();
        let script = self.compile(None)?;
        let source = script.catalog.source(&table).ok_or_else(|| SltError(format!("unknown source {table}")))?;
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

    fn query(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        let script = self.compile(Some(sql))?;
        let index = script.queries.len().checked_sub(1).ok_or_else(|| SltError("no query".into()))?;
        let mut sink = MemorySink::default();
        let stats = run_script(&script, &RunOptions::default(), &mut sink)?;
        self.last_late_events = stats.queries[index].late_events;
        let rows: Vec<Vec<String>> =
            rows_in_order(&sink.rows[index]).iter().map(|r| r.iter().map(|v| v.render()).collect()).collect();
        if stats.queries[index].rows_out != rows.len() as u64 {
            return Err(SltError(format!("{} rows written, {} counted", rows.len(), stats.queries[index].rows_out)));
        }
        let types = script.queries[index].output_schema.fields().iter().map(|f| column_type(f.data_type())).collect();
        Ok(DBOutput::Rows { types, rows })
    }

    fn explain(&self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        let text = explain_text(&explain_json(&self.compile(Some(sql))?));
        Ok(DBOutput::Rows {
            types: vec![DefaultColumnType::Text],
            rows: text.lines().map(|l| vec![l.into()]).collect(),
        })
    }
}

fn column_type(t: &arrow::datatypes::DataType) -> DefaultColumnType {
    if t.is_integer() {
        DefaultColumnType::Integer
    } else if t.is_floating() {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

impl sqllogictest::DB for StreamDb {
    type Error = SltError;
    type ColumnType = DefaultColumnType;

    fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        let trimmed = sql.trim().trim_end_matches(';');
        let upper = trimmed.to_ascii_uppercase();
        if upper.starts_with("CREATE SOURCE") || upper.starts_with("SET ") {
            // Check it compiles after the preamble, then keep it for the statements that follow.
            let script = self.compile(Some(trimmed))?;
            Self::create_source_files(&script)?;
            self.preamble.push(trimmed.to_string());
            Ok(DBOutput::StatementComplete(0))
        } else if upper.starts_with("INSERT") {
            Ok(DBOutput::StatementComplete(self.insert(trimmed)?))
        } else if upper == "SHOW LATE_EVENTS" {
            Ok(DBOutput::Rows {
                types: vec![DefaultColumnType::Integer],
                rows: vec![vec![self.last_late_events.to_string()]],
            })
        } else if upper.starts_with("EXPLAIN ") {
            self.explain(&trimmed["EXPLAIN ".len()..])
        } else {
            self.query(trimmed)
        }
    }

    fn engine_name(&self) -> &str {
        "tessera"
    }
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slt");
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
    assert!(!files.is_empty(), "no .slt files found");
    let mut failures = Vec::new();
    for file in &files {
        let mut runner = sqllogictest::Runner::new(|| async { Ok(StreamDb::new()) });
        if let Err(e) = runner.run_file(file) {
            failures.push(format!("{}: {e}", file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
