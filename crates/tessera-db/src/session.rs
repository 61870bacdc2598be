//! The front door: a [`Session`] is what one client talks to (a run of `tessera run`, the
//! `tessera sql` shell, `explain`, `bench`, `compile`, and a server connection). It holds one
//! database (a folder, or memory for the session) with the client's streams, tables, views and
//! settings, reads every script with the one parser ([`tessera::sql::parse_script`]), applies
//! the settings given outside the script (they win over its `SET`s), and decides once how a
//! script runs:
//!
//! - a **script of streams** (sources, settings and queries; no table statement, no named
//!   database) is planned whole for the streaming engine, which runs it with its sinks,
//!   checkpoints and late-event output;
//! - **any other script** runs statement by statement on the database, its queries over
//!   streams included (each run to the end of its input).
//!
//! It lives beside the tables because it sees both halves; the engine crate knows nothing of
//! tables.

use std::path::{Path, PathBuf};

use tessera::connectors::ReadOptions;
use tessera::error::{Result, TesseraError};
use tessera::sql::{Statement, StatementKind};

use crate::{Database, Outcome, ReadTotals, Settings};

/// How a session is opened.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The database folder (created if absent); without one the database lives in memory
    /// until the session ends.
    pub db: Option<PathBuf>,
    /// What relative paths in statements are relative to (a script's folder).
    pub base_dir: PathBuf,
    /// Settings given outside the scripts (`--set`, `--parallelism`), by lower-case name:
    /// a script's `SET` of one is checked, and this value holds.
    pub settings: Vec<(String, String)>,
    /// What a malformed input row does, unless a statement says otherwise.
    pub read: Option<ReadOptions>,
}

/// A script read by a session, and how it runs.
pub enum Prepared {
    /// A script of streams, planned whole for the streaming engine.
    Streams(tessera::engine::Script),
    /// Statements to run in order on the database.
    Statements(Vec<Statement>),
}

/// What `compile` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileTarget {
    /// Flink SQL of a script of streams and window queries.
    Flink,
    /// Spark SQL of a database script: its tables, sampled views and estimates.
    Spark,
}

/// One client's session: see the module's documentation.
pub struct Session {
    options: SessionOptions,
    /// Opened by the first statement run on it: a script refused before it runs (a parse
    /// error, an output onto one of its inputs) leaves no database folder behind.
    database: Option<Database>,
    /// The defaults with the settings given outside the scripts.
    settings: Settings,
}

impl Session {
    /// A session; its settings are checked now, its database opened when first used.
    pub fn open(options: SessionOptions) -> Result<Session> {
        let mut settings = Settings::default();
        for (name, value) in &options.settings {
            settings.set(name, value).map_err(TesseraError::Option)?;
        }
        Ok(Session { options, database: None, settings })
    }

    /// The database, opened (or created) the first time.
    fn database_mut(&mut self) -> Result<&mut Database> {
        if self.database.is_none() {
            let mut database = match &self.options.db {
                Some(dir) => Database::open(dir)?,
                None => Database::in_memory()?,
            };
            database.override_settings(&self.options.settings)?;
            if let Some(read) = &self.options.read {
                database.set_read_options(read.clone());
            }
            database.set_base_dir(&self.options.base_dir);
            self.database = Some(database);
        }
        Ok(self.database.as_mut().expect("opened above"))
    }

    /// The statements of `text`, in order (the one parser of every script).
    pub fn parse(&self, text: &str) -> Result<Vec<Statement>> {
        tessera::sql::parse_script(text, &self.options.base_dir)
    }

    /// `text` read, and planned whole if it is a script of streams. A script of streams
    /// without a query is refused: it would do nothing.
    pub fn prepare(&self, text: &str) -> Result<Prepared> {
        let statements = self.parse(text)?;
        if !self.runs_on_the_streaming_engine(&statements) {
            return Ok(Prepared::Statements(statements));
        }
        let script = tessera::engine::Script::plan(&statements, self.settings().clone(), &self.options.settings)?;
        if script.queries.is_empty() {
            return Err(TesseraError::Plan(
                "the script has no queries (SELECT ... FROM a source): nothing to run".into(),
            ));
        }
        Ok(Prepared::Streams(script))
    }

    /// Whether `statements` are a script of streams: no database named, nothing on tables,
    /// and sources declared or no query at all (a script that would do nothing is refused as
    /// one). Queries without sources (over `VALUES`, `information_schema`) run on the database.
    fn runs_on_the_streaming_engine(&self, statements: &[Statement]) -> bool {
        let has = |kind: fn(&StatementKind) -> bool| statements.iter().any(|s| kind(&s.kind));
        self.options.db.is_none()
            && !statements.iter().any(Statement::works_on_tables)
            && (has(|k| matches!(k, StatementKind::CreateSource(_)))
                || !has(|k| matches!(k, StatementKind::Query { .. })))
    }

    /// Runs `statement` on the database (for a script that is not one of streams, or a
    /// statement typed in the shell).
    pub fn execute(&mut self, statement: &Statement) -> Result<Outcome> {
        self.database_mut()?.execute_statement(statement)
    }

    /// The plan of the script of streams `text`, as `tessera explain` prints it. A database
    /// script is refused: its queries are explained by `EXPLAIN` statements.
    pub fn explain(&self, text: &str) -> Result<serde_json::Value> {
        match self.prepare(text)? {
            Prepared::Streams(script) => Ok(tessera::explain::explain_json(&script)),
            Prepared::Statements(_) => Err(TesseraError::Option(
                "this is a database script: EXPLAIN SELECT ... and EXPLAIN REFRESH MATERIALIZED VIEW ... in it show \
                 a query's plan and a refresh's"
                    .into(),
            )),
        }
    }

    /// `text` compiled to the SQL of `target`.
    pub fn compile(&self, text: &str, target: CompileTarget) -> Result<String> {
        match target {
            CompileTarget::Flink => match self.prepare(text)? {
                Prepared::Streams(script) => tessera::compile::flink::compile_flink(&script),
                Prepared::Statements(_) => Err(TesseraError::Option(
                    "this is a database script: --target flink compiles a script of streams; a database script \
                     compiles with --target spark"
                        .into(),
                )),
            },
            CompileTarget::Spark if !self.options.settings.is_empty() => {
                Err(TesseraError::Option("--target spark takes its settings from SET in the script".into()))
            }
            CompileTarget::Spark => crate::compile_spark(&self.parse(text)?, &self.options.base_dir),
        }
    }

    /// What the statements run so far read (events, late events, skipped rows).
    pub fn read_totals(&self) -> ReadTotals {
        self.database.as_ref().map(Database::read_totals).unwrap_or_default()
    }

    /// The settings in force: the defaults, those given outside the scripts, and the `SET`s
    /// run so far.
    pub fn settings(&self) -> &Settings {
        self.database.as_ref().map_or(&self.settings, Database::settings)
    }

    /// What relative paths are relative to.
    pub fn base_dir(&self) -> &Path {
        &self.options.base_dir
    }
}
