//! Streams in a database's script: `CREATE SOURCE` kept as text, and the queries that read a
//! source (or a window over one) compiled with the sources declared so far and run by the
//! streaming engine to the end of its input, errors pointing into the statement as written.
//! Also the batch engine the streaming engine asks to answer the continuous queries a script
//! keeps whole (`SET allow_unbounded_state`): DataFusion over the events kept so far.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sql::sqlparser::ast;
use datafusion_sql::sqlparser::tokenizer::Location;
use tessera::error::{Result, TesseraError};

use tessera::sql::offset;

use crate::{Database, Outcome};

impl Database {
    /// `CREATE SOURCE`: checked by compiling it after the sources before it.
    pub(crate) fn create_source(&mut self, name: &str, text: &str, start: Location, script: &str) -> Result<Outcome> {
        let key = name.to_lowercase();
        if self.exists(&key) {
            return Err(TesseraError::Plan(format!("`{name}` already exists")));
        }
        self.compile_stream(text, start, script)?;
        self.sources.insert(key, text.to_string());
        Ok(Outcome::Done)
    }

    /// The script's sources and then `text`, which starts at `start` in `script`, compiled
    /// for the streaming engine; errors in `text` point into `script`.
    pub(crate) fn compile_stream(&self, text: &str, start: Location, script: &str) -> Result<tessera::engine::Script> {
        let mut compiled: String = self.sources.values().map(|source| format!("{source};\n")).collect();
        let first_line = compiled.matches('\n').count() as u64 + 1;
        compiled.push_str(text);
        compiled.push_str(";\n");
        tessera::engine::Script::compile_with_settings(&compiled, &self.base_dir, self.settings.clone(), &[]).map_err(
            |error| {
                let TesseraError::Sql(diagnostic) = error else { return error };
                match diagnostic.location.filter(|at| at.line >= first_line) {
                    Some(at) => {
                        let line = at.line - first_line + start.line;
                        let column = if at.line == first_line { at.column + start.column - 1 } else { at.column };
                        tessera::sql::ScriptText::new(script).error_with_help(
                            diagnostic.message,
                            Some(tessera::error::Location { line, column }),
                            diagnostic.help,
                        )
                    }
                    None => TesseraError::Sql(diagnostic),
                }
            },
        )
    }

    /// Whether `query` reads a stream: a source of the script, a window or temporal query over
    /// one, or (where the script has sources) a relation that is neither a table, a view, a
    /// table function nor one of the query's own (`WITH`), which the stream compiler then
    /// names, closest source suggested.
    pub(crate) fn reads_a_stream(&self, query: &ast::Query) -> bool {
        let own: Vec<String> = query
            .with
            .iter()
            .flat_map(|with| with.cte_tables.iter().map(|cte| cte.alias.name.value.to_lowercase()))
            .collect();
        let functions = match self.sources.is_empty() {
            true => Default::default(),
            false => SessionContext::new().state().table_functions().clone(),
        };
        let mut found = false;
        let _ = tessera::sql::walk::relations(query, |name| {
            let name = name.to_string().trim_matches('"').to_lowercase();
            let unknown = !self.sources.is_empty()
                && !name.contains('.')
                && !self.exists(&name)
                && !own.contains(&name)
                && !functions.contains_key(&name);
            found |= unknown
                || self.sources.contains_key(&name)
                || ["tumble", "hop", "session", "windows", "temporal"].contains(&name.as_str());
            std::ops::ControlFlow::<()>::Continue(())
        });
        found
    }

    /// Window query `query` (of `script`) over the script's streams, compiled.
    pub(crate) fn compile_stream_query(
        &self,
        query: &ast::Query,
        script: Option<&str>,
    ) -> Result<tessera::engine::Script> {
        use datafusion_sql::sqlparser::ast::Spanned;
        let span = query.span();
        match script {
            Some(script) if span.start.line > 0 => {
                let text = &script[offset(script, span.start)..offset(script, span.end)];
                self.compile_stream(text, span.start, script)
            }
            _ => {
                let text = query.to_string();
                self.compile_stream(&text, Location { line: 1, column: 1 }, &text)
            }
        }
    }

    /// The rows of window query `query` (of `script`) over the script's streams, run by the
    /// streaming engine to the end of its input.
    pub(crate) fn stream_query(
        &self,
        query: &ast::Query,
        script: Option<&str>,
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        self.run_stream(&self.compile_stream_query(query, script)?)
    }

    /// The rows of the one query of `script`, run by the streaming engine to the end of its
    /// input.
    pub(crate) fn run_stream(&self, script: &tessera::engine::Script) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let options = tessera::engine::RunOptions {
            parallelism: tessera::exec::pipeline::Parallelism::Auto(tessera::exec::cores()),
            read: self.read.clone(),
            batch_sql: Some(Arc::new(DataFusionBatchSql::on(self.runtime.handle().clone()))),
            ..tessera::engine::RunOptions::default()
        };
        let mut sink = tessera::connectors::sink::MemorySink::default();
        let stats = tessera::engine::run_script(script, &options, &mut sink)?;
        self.count_read(stats.events_in, stats.late_events, stats.bad_rows, &self.read.dead_letter_path);
        let schema = script
            .queries
            .first()
            .map(|q| Arc::clone(&q.output_schema))
            .ok_or_else(|| TesseraError::Internal("a window query compiled to no query".into()))?;
        Ok((schema, sink.rows.into_iter().next().unwrap_or_default()))
    }
}

/// DataFusion answering a query over one in-memory table: the events a continuous query kept
/// whole has read so far, named as their source. Its joins, sorts and aggregates are
/// DataFusion's physical operators.
pub struct DataFusionBatchSql {
    runtime: tokio::runtime::Handle,
    /// The runtime it owns when it was not given one.
    _owned: Option<tokio::runtime::Runtime>,
}

impl DataFusionBatchSql {
    /// An engine on a runtime of its own (a worker per core, up to two).
    pub fn new() -> Result<Self> {
        let owned = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(tessera::exec::cores().clamp(1, 2))
            .thread_name("tessera-batch")
            .build()
            .map_err(|e| TesseraError::io("cannot start the query runtime", e))?;
        Ok(DataFusionBatchSql { runtime: owned.handle().clone(), _owned: Some(owned) })
    }

    /// An engine on `runtime`.
    pub fn on(runtime: tokio::runtime::Handle) -> Self {
        DataFusionBatchSql { runtime, _owned: None }
    }
}

impl tessera::exec::prefix::BatchSql for DataFusionBatchSql {
    fn query(&self, sql: &str, table: &str, schema: SchemaRef, rows: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let config = SessionConfig::new().with_target_partitions(tessera::exec::cores().clamp(1, 2));
        let ctx = SessionContext::new_with_config(config);
        ctx.register_table(table, Arc::new(MemTable::try_new(schema, vec![rows])?))?;
        self.runtime.block_on(async { Ok(ctx.sql(sql).await?.collect().await?) })
    }
}
