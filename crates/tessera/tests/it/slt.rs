//! The sqllogictest suite (`tests/slt/*.slt`). Each file gets a fresh engine. Streams are made
//! deterministic by explicit events: `INSERT INTO source VALUES (...)` appends events to a
//! source in arrival order, and every query runs over all events inserted so far, flushing
//! open windows at the end of the input. `SHOW late_events` returns the late events of the
//! previous query.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sqllogictest::{DBOutput, DefaultColumnType};
use tessera::connectors::sink::MemorySink;
use tessera::connectors::{open_source, ReadOptions};
use tessera::engine::Script;
use tessera::exec::pipeline::{run_source, Parallelism, SourceOptions};

use super::harness::rows;

#[derive(Debug)]
struct SltError(String);

impl std::fmt::Display for SltError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SltError {}

struct StreamDb {
    dir: tempfile::TempDir,
    /// Statements that define the session: CREATE SOURCE and SET, in order.
    preamble: Vec<String>,
    /// Events per source file (CSV lines after the header).
    events: BTreeMap<String, Vec<String>>,
    last_late_events: u64,
}

impl StreamDb {
    fn new() -> Self {
        StreamDb {
            dir: tempfile::tempdir().expect("temp dir"),
            preamble: vec![],
            events: BTreeMap::new(),
            last_late_events: 0,
        }
    }

    /// The path option of a source's DDL.
    fn source_file(ddl: &str) -> Option<String> {
        let lower = ddl.to_ascii_lowercase();
        let at = lower.find("path")?;
        let rest = &ddl[at..];
        let open = rest.find('\'')?;
        let close = rest[open + 1..].find('\'')?;
        Some(rest[open + 1..open + 1 + close].to_string())
    }

    fn insert(&mut self, sql: &str) -> Result<u64, SltError> {
        use datafusion_sql::sqlparser::ast::{SetExpr, Statement};
        use datafusion_sql::sqlparser::dialect::GenericDialect;
        use datafusion_sql::sqlparser::parser::Parser;
        let statements = Parser::parse_sql(&GenericDialect {}, sql).map_err(|e| SltError(e.to_string()))?;
        let Some(Statement::Insert(insert)) = statements.first() else {
            return Err(SltError("expected INSERT".into()));
        };
        let table = insert.table.to_string().to_ascii_lowercase();
        let ddl = self
            .preamble
            .iter()
            .find(|d| d.to_ascii_lowercase().contains(&format!("source {table}")))
            .ok_or_else(|| SltError(format!("unknown source {table}")))?;
        let file = Self::source_file(ddl).ok_or_else(|| SltError("source without path".into()))?;
        let Some(SetExpr::Values(values)) = insert.source.as_ref().map(|q| q.body.as_ref()) else {
            return Err(SltError("expected VALUES".into()));
        };
        let lines = self.events.entry(file).or_default();
        for row in &values.rows {
            let fields: Vec<String> = row
                .iter()
                .map(|e| {
                    let text = e.to_string();
                    if text.eq_ignore_ascii_case("NULL") {
                        String::new()
                    } else {
                        text.trim_matches('\'').to_string()
                    }
                })
                .collect();
            lines.push(fields.join(","));
        }
        Ok(values.rows.len() as u64)
    }

    fn query(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        let text = format!("{}\n{sql};", self.preamble.join(";\n") + if self.preamble.is_empty() { "" } else { ";" });
        let script = Script::compile(&text, self.dir.path()).map_err(|e| SltError(e.to_string()))?;
        let query = script.queries.last().ok_or_else(|| SltError("no query".into()))?;
        let source = script.catalog.source(&query.source).expect("bound source").clone();
        self.write_source_files(&source)?;
        let mut reader = open_source(&source, &ReadOptions::default()).map_err(|e| SltError(e.to_string()))?;
        let mut sink = MemorySink::default();
        let index = script.queries.len() - 1;
        let groups = script.window_groups();
        let groups: Vec<_> = groups.iter().filter(|g| g.members.iter().any(|m| m.query == index)).collect();
        let run = run_source(
            &source,
            reader.as_mut(),
            &[(index, query)],
            &groups,
            &mut sink,
            SourceOptions::workers(Parallelism::Fixed(1)),
        )
        .map_err(|e| SltError(e.to_string()))?;
        self.last_late_events = run.query_metrics[index].late_events;
        let types = query.output_schema.fields().iter().map(|f| column_type(f.data_type())).collect();
        let rows = rows(&sink.rows[index]).into_iter().map(|r| r.iter().map(|v| v.render()).collect()).collect();
        Ok(DBOutput::Rows { types, rows })
    }

    fn write_source_files(&self, source: &tessera::catalog::SourceDef) -> Result<(), SltError> {
        if let tessera::catalog::Location::File(path) = &source.location {
            let file = path.strip_prefix(self.dir.path()).unwrap_or(path).to_string_lossy().to_string();
            let header: Vec<&str> = source.schema.fields().iter().map(|f| f.name().as_str()).collect();
            let mut text = header.join(",") + "\n";
            for line in self.events.get(&file).into_iter().flatten() {
                text.push_str(line);
                text.push('\n');
            }
            std::fs::write(path, text).map_err(|e| SltError(e.to_string()))?;
        }
        Ok(())
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
            // Check it compiles on its own, then keep it for the queries that follow.
            let candidate = format!("{};\n{trimmed};", self.preamble.join(";\n"));
            Script::compile(&candidate, self.dir.path()).map_err(|e| SltError(e.to_string()))?;
            self.preamble.push(trimmed.to_string());
            Ok(DBOutput::StatementComplete(0))
        } else if upper.starts_with("INSERT") {
            Ok(DBOutput::StatementComplete(self.insert(trimmed)?))
        } else if upper == "SHOW LATE_EVENTS" {
            Ok(DBOutput::Rows {
                types: vec![DefaultColumnType::Integer],
                rows: vec![vec![self.last_late_events.to_string()]],
            })
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
