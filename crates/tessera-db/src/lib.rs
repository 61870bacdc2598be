//! The database half of tessera: tables kept in a folder (or in memory for one run), changed by
//! `INSERT`, `UPDATE`, `DELETE` and `DROP`, and read by batch SQL that DataFusion plans and
//! runs with its own physical operators (joins, sorts, aggregates, window functions: none of
//! them written here). Each statement is atomic: it is checked first, its files written next,
//! and the database's manifest replaced last (see [`storage`]); a statement that fails changes
//! nothing. Every table records what each statement inserted and deleted ([`table::ChangeSet`]),
//! the change relations that maintain views incrementally. Materialized views are in
//! `views.rs` (their maintenance plans in `maintain.rs`), queries over streams in `streams.rs`,
//! reading files in `file.rs`.

mod convert;
mod datafile;
mod describe;
mod estimate;
mod estimator;
mod file;
mod maintain;
mod sample;
mod scan;
pub mod session;
mod spark;
mod spark_hash;
mod statement;
pub mod storage;
mod streams;
pub mod table;
mod vacuum;
mod views;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{Field, Int64Type};
use datafusion::datasource::{provider_as_source, MemTable, ViewTable};
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sql::sqlparser::ast;
use datafusion_sql::sqlparser::dialect::GenericDialect;
use datafusion_sql::sqlparser::parser::Parser;
pub use session::{CompileTarget, Prepared, Session, SessionOptions};
pub use spark::compile_spark;
pub use statement::files_read;
pub use streams::DataFusionBatchSql;
pub use tessera::settings::{Freshness, Settings};
pub use tessera::sql::{Statement, StatementKind};
use views::changes_needed_after;
pub use views::View;

use storage::{Manifest, Storage};
use table::{Edit, HeldKeys, Table, POSITION};
use tessera::error::{Result, TesseraError};

/// Rows a statement selected: their positions, and the values it computed on them.
type SelectedRows = (Vec<(u32, u32)>, Vec<ArrayRef>);

/// A database: its tables, where they are kept, and the runtime its queries run on.
pub struct Database {
    storage: Storage,
    manifest: Manifest,
    /// By lower-case name; tables and views share the names.
    tables: BTreeMap<String, Table>,
    views: BTreeMap<String, View>,
    runtime: tokio::runtime::Runtime,
    /// What relative paths in statements are relative to.
    base_dir: std::path::PathBuf,
    /// The streams (`CREATE SOURCE`) of the script being run, by lower-case name, as their
    /// text: queries that read them run on the streaming engine.
    sources: BTreeMap<String, String>,
    /// What a malformed row of a file does (stop the statement, or go to the dead-letter
    /// file) unless a statement's options say otherwise.
    read: tessera::connectors::ReadOptions,
    /// What the statements read, summed over the statements run.
    read_totals: std::cell::RefCell<ReadTotals>,
    /// The session's settings (`SET`, and the command line's `--set`).
    settings: Settings,
    /// The settings given on the command line: a script's `SET` of one is checked, and the
    /// command line's value holds.
    overridden: Vec<String>,
}

/// The events queries over streams read and the late ones among them (older than their
/// source's watermark when they arrived: counted, not aggregated), and the malformed rows of
/// streams and files skipped into the dead-letter file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReadTotals {
    pub events: u64,
    pub late_events: u64,
    pub skipped_rows: u64,
    /// The dead-letter file the last skipped rows went to.
    pub dead_letter: Option<std::path::PathBuf>,
}

/// What a statement gives back: the rows of a query, or how many rows it changed.
#[derive(Debug)]
pub enum Outcome {
    Rows { schema: arrow::datatypes::SchemaRef, batches: Vec<RecordBatch> },
    Changed { rows: u64 },
    Done,
}

impl Database {
    /// A database that lives in memory until it is dropped.
    pub fn in_memory() -> Result<Self> {
        Database::with(Storage::memory(), storage::new_manifest())
    }

    /// The database kept in folder `dir`, created if absent.
    pub fn open(dir: &Path) -> Result<Self> {
        let (storage, manifest) = Storage::open_folder(dir)?;
        Database::with(storage, manifest)
    }

    fn with(storage: Storage, manifest: Manifest) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(tessera::exec::cores().clamp(1, 2))
            .thread_name("tessera-sql")
            // Evaluating a deeply nested expression recurses (see tessera::sql::nesting).
            .thread_stack_size(tessera::exec::THREAD_STACK_BYTES)
            .build()
            .map_err(|e| TesseraError::io("cannot start the query runtime", e))?;
        let mut database = Database {
            storage,
            manifest: storage::new_manifest(),
            tables: BTreeMap::new(),
            views: BTreeMap::new(),
            runtime,
            base_dir: ".".into(),
            sources: BTreeMap::new(),
            read: tessera::connectors::ReadOptions { dead_letter_appends: true, ..Default::default() },
            read_totals: Default::default(),
            settings: Settings::default(),
            overridden: Vec::new(),
        };
        database.load(manifest)?;
        Ok(database)
    }

    /// Makes `manifest` the state the session sees: its tables and views read. On failure the
    /// state is as before.
    fn load(&mut self, manifest: Manifest) -> Result<()> {
        let tables = manifest
            .tables
            .iter()
            .map(|(key, entry)| Ok((key.clone(), Table::load(entry, &self.storage)?)))
            .collect::<Result<_>>()?;
        let before = (
            std::mem::replace(&mut self.manifest, manifest),
            std::mem::replace(&mut self.tables, tables),
            std::mem::take(&mut self.views),
        );
        if let Err(e) = self.load_views() {
            (self.manifest, self.tables, self.views) = before;
            return Err(e);
        }
        Ok(())
    }

    /// Brings the session to the state the folder holds, if another process has committed
    /// statements since it was read (only possible while this one does not write). A reader
    /// registers the state it reads, so that the writer keeps its files (see [`storage`]);
    /// where it cannot, the files of a state may be removed while it is read, once two newer
    /// ones are committed: then the newer state is read.
    fn catch_up(&mut self) -> Result<()> {
        let mut attempts = 0;
        loop {
            if self.storage.read_manifest()?.sequence == self.manifest.sequence {
                return Ok(());
            }
            let manifest = self.storage.read_state()?;
            match self.load(manifest) {
                Ok(()) => return Ok(()),
                Err(error) => {
                    // The state read before stays the one registered.
                    self.storage.register(&self.manifest)?;
                    match attempts < 5 && !self.storage.writes() {
                        true => attempts += 1,
                        false => return Err(error),
                    }
                }
            }
        }
    }

    /// Whether `statement` may write the database: every statement but reading ones (queries
    /// that answer from what is stored, EXPLAIN, SET, CREATE SOURCE). Queries with another
    /// freshness than `stale` refresh views or clean samples.
    fn may_write(&self, statement: &Statement) -> bool {
        match &statement.kind {
            StatementKind::Query { .. } => self.settings.freshness != Freshness::Stale,
            StatementKind::Other(statement) => !matches!(
                statement.as_ref(),
                ast::Statement::Explain { .. }
                    | ast::Statement::ShowTables { .. }
                    | ast::Statement::ExplainTable { .. }
                    | ast::Statement::ShowVariable { .. }
            ),
            StatementKind::ExplainRefresh { .. } | StatementKind::CreateSource(_) | StatementKind::Set { .. } => false,
            StatementKind::Copy { .. } | StatementKind::Refresh { .. } => true,
        }
    }

    /// The lower-case names of the tables and views `query` reads.
    fn references(&self, query: &ast::Query) -> Result<Vec<String>> {
        let statement =
            datafusion::sql::parser::Statement::Statement(Box::new(ast::Statement::Query(Box::new(query.clone()))));
        let ctx = SessionContext::new();
        Ok(ctx.state().resolve_table_references(&statement)?.iter().map(|r| r.table().to_lowercase()).collect())
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Makes relative paths in statements (a table's initial contents, COPY's file) relative to
    /// `dir` (a script's folder) instead of the working directory.
    pub fn set_base_dir(&mut self, dir: &Path) {
        self.base_dir = dir.to_path_buf();
    }

    /// Settings given outside the statements (`--set name=value`): they hold from now on and
    /// win over the statements' `SET`s.
    pub fn override_settings(&mut self, assignments: &[(String, String)]) -> Result<()> {
        for (name, value) in assignments {
            self.settings.set(name, value).map_err(TesseraError::Option)?;
            self.overridden.push(name.clone());
        }
        Ok(())
    }

    /// What the statements run so far read.
    pub fn read_totals(&self) -> ReadTotals {
        self.read_totals.borrow().clone()
    }

    /// What a malformed row of a file or stream does (`on_error`, `dead_letter_path`) unless a
    /// statement says otherwise.
    pub fn set_read_options(&mut self, read: tessera::connectors::ReadOptions) {
        // The statements of a database skip rows one after another into one file.
        self.read = tessera::connectors::ReadOptions { dead_letter_appends: true, ..read };
    }

    /// Adds to the read totals: `skipped_rows` went to `dead_letter`.
    fn count_read(&self, events: u64, late_events: u64, skipped_rows: u64, dead_letter: &Path) {
        let mut totals = self.read_totals.borrow_mut();
        totals.events += events;
        totals.late_events += late_events;
        if skipped_rows > 0 {
            totals.skipped_rows += skipped_rows;
            totals.dead_letter = Some(dead_letter.to_path_buf());
        }
    }

    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.get(&name.to_lowercase())
    }

    /// The names of table `name`'s key columns (none without a declared key or table).
    pub fn table_key(&self, name: &str) -> Vec<String> {
        self.tables.get(name).map(|t| t.key_names()).unwrap_or_default()
    }

    pub fn view(&self, name: &str) -> Option<&View> {
        self.views.get(&name.to_lowercase())
    }

    /// Runs every statement of `sql` in order; the outcome of each.
    pub fn execute(&mut self, sql: &str) -> Result<Vec<Outcome>> {
        tessera::sql::parse_script(sql, &self.base_dir)?.iter().map(|s| self.execute_statement(s)).collect()
    }

    /// Runs `statement` on the last committed state. One process writes a database folder at a
    /// time: a statement that may write takes the folder's lock (kept by the session from then
    /// on), and is refused with the holder named while another process has it (after waiting
    /// `SET lock_wait_ms` for it).
    pub fn execute_statement(&mut self, statement: &Statement) -> Result<Outcome> {
        let wait = std::time::Duration::from_millis(self.settings.lock_wait_ms);
        let locked_now = self.may_write(statement) && self.storage.lock_for_writing(wait)?;
        if locked_now || !self.storage.writes() {
            self.catch_up()?;
        }
        let script = &statement.script;
        let located = |e| tessera::sql::ScriptText::new(script).locate(e);
        match &statement.kind {
            StatementKind::Other(other) => {
                self.execute_sql(other, script).map_err(|e| located(self.suggest_relation(e)))
            }
            StatementKind::Query { query, emit_written, .. } => {
                self.execute_query(query, statement, *emit_written).map_err(|e| located(self.suggest_relation(e)))
            }
            StatementKind::Copy { table, path, options } => self.copy(table, path, options),
            StatementKind::Refresh { view, sample } => self.refresh(view, *sample),
            StatementKind::ExplainRefresh { view } => self.explain_refresh(view),
            StatementKind::CreateSource(source) => {
                self.create_source(&source.name, statement.text(), statement.start, script)
            }
            StatementKind::Set { name, value } => {
                let error = |m| tessera::sql::ScriptText::new(script).error(m, statement.location());
                match self.overridden.contains(name) {
                    true => Settings::default().set(name, value).map_err(error)?,
                    false => self.settings.set(name, value).map_err(error)?,
                }
                Ok(Outcome::Done)
            }
        }
    }

    /// `error` with the closest name the database holds suggested, if it is about a relation
    /// it does not hold.
    fn suggest_relation(&self, error: TesseraError) -> TesseraError {
        let TesseraError::Sql(mut diagnostic) = error else { return error };
        let missing = diagnostic.message.strip_prefix("table '").and_then(|rest| rest.strip_suffix("' not found"));
        if let Some(missing) = missing.filter(|_| diagnostic.help.is_none()) {
            let names = self.tables.values().map(|t| t.name.as_str()).chain(self.views.keys().map(String::as_str));
            let names = names.chain(self.sources.keys().map(String::as_str));
            diagnostic.help =
                tessera::sql::diagnostic::closest_name(missing, names).map(|n| format!("did you mean `{n}`?"));
        }
        TesseraError::Sql(diagnostic)
    }

    /// Runs query `statement`: over streams on the streaming engine, from a sample's estimate,
    /// or by DataFusion over the tables and views.
    fn execute_query(&mut self, query: &ast::Query, statement: &Statement, emit_written: bool) -> Result<Outcome> {
        if self.reads_a_stream(query) {
            let script = self.compile_stream(statement.text(), statement.start, &statement.script)?;
            let (schema, batches) = self.run_stream(&script)?;
            return Ok(Outcome::Rows { schema, batches });
        }
        if emit_written {
            return Err(TesseraError::Plan(
                "EMIT is for queries over streams: this one reads tables and views, whose rows it returns once".into(),
            ));
        }
        if self.settings.freshness == Freshness::Exact {
            self.refresh_views_read_by(query)?;
        }
        if self.estimates(query)? {
            let (schema, batches, _) = self.estimate(query)?;
            return Ok(Outcome::Rows { schema, batches });
        }
        let (schema, batches) = self.query_with_columns(query, Some(&statement.script))?;
        Ok(Outcome::Rows { schema, batches })
    }

    /// Runs `statement` of `script`.
    fn execute_sql(&mut self, statement: &ast::Statement, script: &str) -> Result<Outcome> {
        match statement {
            ast::Statement::Explain { statement: explained, .. } => {
                let ast::Statement::Query(query) = explained.as_ref() else {
                    return Err(TesseraError::Plan(format!("EXPLAIN of `{explained}`: queries are explained")));
                };
                if self.reads_a_stream(query) {
                    // The plan `tessera explain` prints, a row per line.
                    let script = self.compile_stream_query(query, Some(script))?;
                    let text = tessera::explain::explain_text(&tessera::explain::explain_json(&script));
                    return describe::text_rows(&["plan"], text.lines().map(|line| vec![line.to_string()]).collect());
                }
                if self.estimates(query)? {
                    return self.explain_estimate(query);
                }
                let ctx = self.context(&[explained.as_ref()], None)?;
                let (schema, batches) = self.run(&ctx, statement.clone())?;
                Ok(Outcome::Rows { schema, batches })
            }
            ast::Statement::CreateTable(create) => self.create_table(create, script),
            ast::Statement::Insert(insert) => self.insert(insert, script),
            ast::Statement::Delete(delete) => self.delete(delete),
            ast::Statement::Update(update) => self.update(update),
            ast::Statement::Drop { object_type: ast::ObjectType::Table, if_exists, names, .. } => {
                self.drop_tables(names, *if_exists)
            }
            ast::Statement::CreateView(create) if create.materialized => self.create_view(create),
            ast::Statement::Drop { object_type: ast::ObjectType::MaterializedView, if_exists, names, .. } => {
                self.drop_views(names, *if_exists)
            }
            ast::Statement::ShowTables { .. } => self.show_tables(),
            ast::Statement::ExplainTable { table_name, .. } => self.describe(table_name),
            ast::Statement::ShowVariable { variable } => self.show_setting(variable),
            ast::Statement::Vacuum(vacuum) => self.vacuum(vacuum),
            other => Err(TesseraError::Plan(format!("this statement is not supported on tables: {other}"))),
        }
    }

    /// The columns and rows of `query` (of `script`, where errors point) over the tables, the
    /// views and the streams.
    fn query_with_columns(
        &self,
        query: &ast::Query,
        script: Option<&str>,
    ) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
        if self.reads_a_stream(query) {
            return self.stream_query(query, script);
        }
        let statement = ast::Statement::Query(Box::new(query.clone()));
        let ctx = self.context(&[&statement], None)?;
        self.run(&ctx, statement)
    }

    /// A DataFusion session with the tables and views `reads` name registered (`positions`:
    /// that one with its rows' positions as a last column). Only those: registering a table
    /// whose segments had rows deleted copies its live rows.
    fn context(&self, reads: &[&ast::Statement], positions: Option<&str>) -> Result<SessionContext> {
        let ctx = self.plain_context()?;
        // Each relation under every spelling the statements use (names are matched without
        // case: `"My T"` and `my t` are one table).
        let mut named: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        let mut catalog_read = false;
        for statement in reads {
            let statement = datafusion::sql::parser::Statement::Statement(Box::new((*statement).clone()));
            for reference in ctx.state().resolve_table_references(&statement)? {
                catalog_read |= reference.schema() == Some("information_schema");
                named.entry(reference.table().to_lowercase()).or_default().insert(reference.table().to_string());
            }
        }
        if catalog_read {
            // information_schema lists what is registered: every table and view, as named.
            for (key, table) in &self.tables {
                named.entry(key.clone()).or_default().insert(table.name.clone());
            }
            for key in self.views.keys() {
                named.entry(key.clone()).or_default().insert(key.clone());
            }
        }
        for (key, spellings) in &named {
            for spelling in spellings {
                if let Some(table) = self.tables.get(key) {
                    register(&ctx, spelling, table, positions == Some(key.as_str()))?;
                } else if let Some(view) = self.views.get(key) {
                    match &view.maintenance {
                        maintain::Maintenance::Recompute(_) => register(&ctx, spelling, &view.contents, false)?,
                        maintain::Maintenance::Incremental(incremental) => {
                            // Users see its columns computed from the stored ones.
                            let stored = LogicalPlanBuilder::scan(
                                format!("__stored_{key}"),
                                provider_as_source(Arc::new(view.contents.scan(false)?)),
                                None,
                            )?
                            .build()?;
                            let visible = incremental.visible(stored).map_err(TesseraError::Internal)?;
                            ctx.register_table(
                                datafusion::common::TableReference::bare(spelling.as_str()),
                                Arc::new(ViewTable::new(visible, None)),
                            )?;
                        }
                    }
                }
            }
        }
        Ok(ctx)
    }

    /// The columns and rows of `statement`, planned and run by DataFusion.
    fn run(
        &self,
        ctx: &SessionContext,
        statement: ast::Statement,
    ) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
        let run = async {
            let plan = ctx
                .state()
                .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(statement)))
                .await?;
            let frame = ctx.execute_logical_plan(plan).await?;
            let schema = Arc::new(frame.schema().as_arrow().clone());
            Ok((schema, frame.collect().await?))
        };
        self.runtime.block_on(run).map_err(|e| self.failed(e))
    }

    /// The columns and rows of logical plan `plan`.
    fn run_plan(&self, plan: LogicalPlan) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
        let ctx = self.plain_context()?;
        let run = async {
            let frame = ctx.execute_logical_plan(plan).await?;
            let schema = Arc::new(frame.schema().as_arrow().clone());
            Ok((schema, frame.collect().await?))
        };
        self.runtime.block_on(run).map_err(|e| self.failed(e))
    }

    /// DataFusion's error as tessera says it: an operator that did not fit the memory limit
    /// names the limit.
    fn failed(&self, error: datafusion::error::DataFusionError) -> TesseraError {
        match (error.find_root(), self.settings.memory_limit) {
            (datafusion::error::DataFusionError::ResourcesExhausted(what), Some(limit)) => {
                TesseraError::Execution(format!(
                    "the statement needs more memory than memory_limit ({}) allows, and what it holds cannot be \
                     spilled to disk: {what}",
                    tessera::settings::show_size(limit)
                ))
            }
            _ => TesseraError::from(error),
        }
    }

    /// A DataFusion session with nothing registered: its operators hold at most
    /// `memory_limit` and spill beyond it (into the database folder's `tmp/`, or the system's
    /// temporary folder for a database in memory).
    pub(crate) fn plain_context(&self) -> Result<SessionContext> {
        // Spans let the planner's errors point at the line and column of the script.
        let config = SessionConfig::new()
            .with_target_partitions(tessera::exec::cores().clamp(1, 2))
            .with_information_schema(true)
            .set_bool("datafusion.sql_parser.collect_spans", true);
        let Some(limit) = self.settings.memory_limit else { return Ok(SessionContext::new_with_config(config)) };
        // What a sort keeps back for merging its spilled runs: DataFusion's 10MB, or a
        // sixteenth of a smaller limit.
        let config =
            config.set_usize("datafusion.execution.sort_spill_reservation_bytes", (limit as usize / 16).min(10 << 20));
        let mut runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(datafusion::execution::memory_pool::FairSpillPool::new(limit as usize)));
        if let Some(spill) = self.storage.spill_folder() {
            // A folder that cannot be made is named by the operator that spills.
            let _ = std::fs::create_dir_all(&spill);
            runtime = runtime.with_temp_file_path(spill);
        }
        Ok(SessionContext::new_with_config_rt(config, runtime.build_arc()?))
    }

    /// The name and key of a table or view to create, or `None` if one exists already and the
    /// statement says IF NOT EXISTS.
    /// Whether a table, view or stream is called `key` (lower case).
    fn exists(&self, key: &str) -> bool {
        self.tables.contains_key(key) || self.views.contains_key(key) || self.sources.contains_key(key)
    }

    fn new_name(&self, name: &ast::ObjectName, if_not_exists: bool) -> Result<Option<(String, String)>> {
        let name = object_name(name)?;
        let key = name.to_lowercase();
        if !self.exists(&key) {
            Ok(Some((name, key)))
        } else if if_not_exists {
            Ok(None)
        } else {
            Err(TesseraError::Plan(format!("`{name}` already exists")))
        }
    }

    /// `CREATE TABLE`: its columns as declared, or as the query of `CREATE TABLE ... AS` gives
    /// them; its initial contents from a file (`WITH (path = ...)`) or that query.
    fn create_table(&mut self, create: &ast::CreateTable, script: &str) -> Result<Outcome> {
        let Some((name, key)) = self.new_name(&create.name, create.if_not_exists)? else { return Ok(Outcome::Done) };
        let mut primary_key = Vec::new();
        let mut fields = Vec::new();
        let mut max_lengths = std::collections::BTreeMap::new();
        for column in &create.columns {
            if let Some(length) = declared_length(&column.data_type) {
                max_lengths.insert(column.name.value.clone(), length);
            }
            let data_type = column_type(&column.data_type).ok_or_else(|| {
                TesseraError::Plan(format!(
                    "column `{}`: type {} is not supported",
                    column.name.value, column.data_type
                ))
            })?;
            let mut nullable = true;
            for option in &column.options {
                match &option.option {
                    ast::ColumnOption::NotNull => nullable = false,
                    ast::ColumnOption::PrimaryKey(_) => primary_key.push(column.name.value.clone()),
                    ast::ColumnOption::Null => {}
                    other => return Err(TesseraError::Plan(format!("column option `{other}` is not supported"))),
                }
            }
            fields.push(Field::new(&column.name.value, data_type, nullable));
        }
        for constraint in &create.constraints {
            match constraint {
                ast::TableConstraint::PrimaryKey(pk) if primary_key.is_empty() => {
                    primary_key.extend(pk.columns.iter().map(|c| c.column.expr.to_string()));
                }
                other => return Err(TesseraError::Plan(format!("table constraint `{other}` is not supported"))),
            }
        }
        let given = match &create.query {
            Some(query) => {
                let (schema, batches) = self.query_with_columns(query, Some(script))?;
                if fields.is_empty() {
                    fields = schema.fields().iter().map(|f| stored_field(f)).collect::<Result<_>>()?;
                } else if fields.len() != schema.fields().len() {
                    return Err(TesseraError::Plan(format!(
                        "CREATE TABLE `{name}` declares {} columns and its query gives {}",
                        fields.len(),
                        schema.fields().len()
                    )));
                }
                Some(arrow::compute::concat_batches(&schema, &batches)?)
            }
            None => None,
        };
        if fields.is_empty() {
            return Err(TesseraError::Plan(format!(
                "CREATE TABLE `{name}` has no columns: declare them, or give AS a query"
            )));
        }
        let mut table = Table::new(&name, fields, &primary_key)?;
        table.max_lengths = max_lengths;
        let options = match &create.table_options {
            ast::CreateTableOptions::With(options) => options.as_slice(),
            ast::CreateTableOptions::None => &[],
            other => {
                return Err(TesseraError::Plan(format!("table options `{other}` are not supported: use WITH (...)")))
            }
        };
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        let options = options.iter().map(key_value).collect::<Result<Vec<_>>>()?;
        let file_options = file::FileOptions::parse(&options, "CREATE TABLE", &["path"])?;
        if let Some((_, unit)) = options.iter().find(|(name, _)| name == "time_unit") {
            table.time_unit =
                Some(tessera::catalog::TimeUnit::parse(unit).ok_or_else(|| {
                    TesseraError::Plan(format!("time_unit is 's', 'ms', 'us' or 'ns', not `{unit}`"))
                })?);
        }
        let path = options.iter().find(|(name, _)| name == "path").map(|(_, path)| path);
        let rows = match (path, given) {
            (Some(_), Some(_)) => {
                return Err(TesseraError::Plan(format!(
                    "CREATE TABLE `{name}` takes its rows from a file (path) or from a query (AS), not both"
                )))
            }
            (Some(path), None) => {
                let (rows, _, skipped) =
                    file::read_rows(&self.base_dir.join(path), &file_options, &table, &self.read, &self.base_dir)?;
                self.count_read(0, 0, skipped.rows, &skipped.dead_letter);
                Some(rows)
            }
            (None, Some(given)) => Some(table.conform(given.columns().to_vec())?),
            (None, None) => None,
        };
        if let Some(rows) = rows {
            let edit = Edit { inserted: Some(rows), ..Edit::default() };
            table.check(&edit, &HeldKeys::default())?;
            table.apply(edit, manifest.sequence, &mut self.storage, &mut manifest)?;
        }
        manifest.tables.insert(key.clone(), table.entry());
        self.storage.commit(&self.manifest, &manifest)?;
        self.manifest = manifest;
        self.tables.insert(key, table);
        Ok(Outcome::Done)
    }

    fn insert(&mut self, insert: &ast::Insert, script: &str) -> Result<Outcome> {
        let ast::TableObject::TableName(name) = &insert.table else {
            return Err(TesseraError::Plan("INSERT INTO a table function is not supported".into()));
        };
        let key = self.existing(name)?;
        let source =
            insert.source.as_ref().ok_or_else(|| TesseraError::Plan("INSERT needs VALUES or a query".into()))?;
        let (given_schema, given) = self.query_with_columns(source, Some(script))?;
        // One batch, so that a value that does not fit is named by its row among all given.
        let given = arrow::compute::concat_batches(&given_schema, &given)?;
        let table = &self.tables[&key];
        let declared = table.schema.fields();
        // The column each given column fills.
        let targets: Vec<usize> = if insert.columns.is_empty() {
            (0..declared.len()).collect()
        } else {
            insert
                .columns
                .iter()
                .map(|c| {
                    let c = object_name(c)?;
                    declared
                        .iter()
                        .position(|f| f.name().eq_ignore_ascii_case(&c))
                        .ok_or_else(|| TesseraError::Plan(format!("table `{}` has no column `{c}`", table.name)))
                })
                .collect::<Result<_>>()?
        };
        let width = given.num_columns();
        if width != targets.len() {
            return Err(TesseraError::Plan(format!(
                "INSERT INTO `{}` gives {width} columns for {} target columns",
                table.name,
                targets.len()
            )));
        }
        let mut columns: Vec<ArrayRef> =
            declared.iter().map(|f| arrow::array::new_null_array(f.data_type(), given.num_rows())).collect();
        for (i, &target) in targets.iter().enumerate() {
            columns[target] = Arc::clone(given.column(i));
        }
        let rows = table.conform(columns)?;
        let count = rows.num_rows() as u64;
        self.commit(&key, Edit { inserted: Some(rows), ..Edit::default() })?;
        Ok(Outcome::Changed { rows: count })
    }

    fn delete(&mut self, delete: &ast::Delete) -> Result<Outcome> {
        let from = match &delete.from {
            ast::FromTable::WithFromKeyword(from) | ast::FromTable::WithoutKeyword(from) => from,
        };
        let [ast::TableWithJoins { relation: ast::TableFactor::Table { name, .. }, joins }] = from.as_slice() else {
            return Err(TesseraError::Plan("DELETE takes one table".into()));
        };
        if !joins.is_empty() || delete.using.is_some() {
            return Err(TesseraError::Plan("DELETE with joins or USING is not supported".into()));
        }
        let key = self.existing(name)?;
        let positions = self.positions(&key, &[], delete.selection.as_ref())?;
        let deleted: Vec<(u32, u32)> = positions.iter().flat_map(|(p, _)| p.iter().copied()).collect();
        let count = deleted.len() as u64;
        self.commit(&key, Edit { deleted, ..Edit::default() })?;
        Ok(Outcome::Changed { rows: count })
    }

    fn update(&mut self, update: &ast::Update) -> Result<Outcome> {
        let ast::TableFactor::Table { name, .. } = &update.table.relation else {
            return Err(TesseraError::Plan("UPDATE takes one table".into()));
        };
        if !update.table.joins.is_empty() || update.from.is_some() {
            return Err(TesseraError::Plan("UPDATE with joins or FROM is not supported".into()));
        }
        let key = self.existing(name)?;
        let table = &self.tables[&key];
        let mut values: Vec<ast::Expr> = table
            .schema
            .fields()
            .iter()
            .map(|f| ast::Expr::Identifier(ast::Ident::with_quote('"', f.name())))
            .collect();
        for assignment in &update.assignments {
            let ast::AssignmentTarget::ColumnName(column) = &assignment.target else {
                return Err(TesseraError::Plan("UPDATE assigns columns one by one".into()));
            };
            let column = object_name(column)?;
            let i = table
                .schema
                .fields()
                .iter()
                .position(|f| f.name().eq_ignore_ascii_case(&column))
                .ok_or_else(|| TesseraError::Plan(format!("table `{}` has no column `{column}`", table.name)))?;
            values[i] = assignment.value.clone();
        }
        let selected = self.positions(&key, &values, update.selection.as_ref())?;
        let table = &self.tables[&key];
        let mut deleted = Vec::new();
        let mut parts: Vec<Vec<ArrayRef>> = vec![Vec::new(); table.schema.fields().len()];
        for (positions, columns) in selected {
            deleted.extend(positions);
            parts.iter_mut().zip(columns).for_each(|(part, column)| part.push(column));
        }
        // The new values as one batch, so that a value that does not fit is named by its row
        // among all the updated ones.
        let columns = parts
            .iter()
            .zip(table.schema.fields())
            .map(|(part, field)| match part.as_slice() {
                [] => Ok(arrow::array::new_empty_array(field.data_type())),
                part => arrow::compute::concat(&part.iter().map(|c| c.as_ref()).collect::<Vec<_>>()),
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let rows = table.conform(columns)?;
        let count = deleted.len() as u64;
        self.commit(&key, Edit { deleted, inserted: Some(rows) })?;
        Ok(Outcome::Changed { rows: count })
    }

    /// The positions of the rows of table `key` where `selection` holds, each batch with the
    /// values of `expressions` on those rows. The expressions keep their places in the script,
    /// so that errors point there.
    fn positions(
        &self,
        key: &str,
        expressions: &[ast::Expr],
        selection: Option<&ast::Expr>,
    ) -> Result<Vec<SelectedRows>> {
        let mut statement = parse_one(&format!("SELECT {POSITION} FROM {}", quoted(key)))?;
        if let ast::Statement::Query(query) = &mut statement {
            if let ast::SetExpr::Select(select) = query.body.as_mut() {
                let items = expressions.iter().map(|e| ast::SelectItem::UnnamedExpr(e.clone()));
                select.projection.splice(0..0, items);
                select.selection = selection.cloned();
            }
        }
        // Errors are about the statement as written: the rows' positions are not among its
        // columns.
        let hidden = [format!(", {key}.{POSITION}"), format!(", {POSITION}")];
        let ctx = self.context(&[&statement], Some(key))?;
        let (_, batches) = self.run(&ctx, statement).map_err(|e| {
            e.map_message(|m| hidden.iter().fold(m.to_string(), |m, column| m.replace(column.as_str(), "")))
        })?;
        Ok(batches
            .into_iter()
            .map(|batch| {
                let n = batch.num_columns() - 1;
                let positions =
                    batch.column(n).as_primitive::<Int64Type>().values().iter().map(|&p| table::position(p));
                (positions.collect(), batch.columns()[..n].to_vec())
            })
            .collect())
    }

    /// The live rows of table `key` that hold the keys of `rows` (rows of the table's declared
    /// columns), found by a semi-join of those keys with the table's scan: a query reads the
    /// table's key columns only, and only the row groups and pages whose statistics allow the
    /// keys (DataFusion pushes the join's key bounds into the scan).
    fn held_keys(&self, key: &str, rows: &RecordBatch) -> Result<HeldKeys> {
        let table = self.tables.get(key).ok_or_else(|| TesseraError::Internal(format!("no table {key}")))?;
        if !table.has_primary_key() || rows.num_rows() == 0 || table.rows() == 0 {
            return Ok(HeldKeys::default());
        }
        let names = table.key_names();
        let given: Vec<String> = (0..names.len()).map(|i| format!("__tessera_key_{i}")).collect();
        let columns = table.key_columns(rows);
        let fields: Vec<Field> =
            given.iter().zip(&columns).map(|(name, c)| Field::new(name, c.data_type().clone(), true)).collect();
        let keys = RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), columns)?;
        let ctx = self.plain_context()?;
        let scan = Arc::new(table.scan(true)?);
        let found = async {
            use datafusion::prelude::ident;
            let selected: Vec<&str> = names.iter().map(String::as_str).chain([POSITION]).collect();
            let table = ctx.read_table(scan)?.select_columns(&selected)?;
            let on = names.iter().zip(&given).map(|(name, given)| ident(name).eq(ident(given)));
            let keys = ctx.read_batch(keys)?;
            table.join_on(keys, datafusion::common::JoinType::LeftSemi, on)?.collect().await
        };
        let found = self.runtime.block_on(found).map_err(|e| self.failed(e))?;
        table.held_keys(&found)
    }

    /// Applies `edit` to table `key` as one statement: checked, written, then the manifest
    /// replaced.
    fn commit(&mut self, key: &str, edit: Edit) -> Result<()> {
        let held = match &edit.inserted {
            Some(rows) => self.held_keys(key, rows)?,
            None => HeldKeys::default(),
        };
        let table = self.tables.get_mut(key).ok_or_else(|| TesseraError::Internal(format!("no table {key}")))?;
        table.check(&edit, &held)?;
        if edit.deleted.is_empty() && edit.inserted.as_ref().is_none_or(|r| r.num_rows() == 0) {
            return Ok(());
        }
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        table.apply(edit, manifest.sequence, &mut self.storage, &mut manifest)?;
        table.forget_changes_through(changes_needed_after(key, self.views.values()));
        manifest.tables.insert(key.to_string(), table.entry());
        self.storage.commit(&self.manifest, &manifest)?;
        self.manifest = manifest;
        Ok(())
    }

    /// `COPY table FROM 'file'`: the file's rows inserted, or with `op_column` applied as the
    /// column says (`insert`, `update` or `delete`, or `I`, `U`, `D`), in the file's order.
    fn copy(&mut self, name: &ast::ObjectName, path: &Path, options: &[(String, String)]) -> Result<Outcome> {
        let key = self.existing(name)?;
        let options = file::FileOptions::parse(options, "COPY", &[])?;
        let table = &self.tables[&key];
        let (rows, ops, skipped) =
            file::read_rows(&self.base_dir.join(path), &options, table, &self.read, &self.base_dir)?;
        let op_column = options.op_column.as_deref();
        let count = rows.num_rows() as u64;
        let edit = match (ops, op_column) {
            (Some(ops), Some(op_column)) => {
                let held = self.held_keys(&key, &rows)?;
                self.tables[&key].edit_from_ops(rows, &ops, op_column, &held)?
            }
            _ => Edit { inserted: Some(rows), ..Edit::default() },
        };
        self.commit(&key, edit)?;
        self.count_read(0, 0, skipped.rows, &skipped.dead_letter);
        Ok(Outcome::Changed { rows: count })
    }

    /// The columns and rows of query `sql` over the tables and views.
    fn sql(&self, sql: &str) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
        let statement = parse_one(sql)?;
        let ctx = self.context(&[&statement], None)?;
        self.run(&ctx, statement)
    }

    fn drop_tables(&mut self, names: &[ast::ObjectName], if_exists: bool) -> Result<Outcome> {
        let mut keys = Vec::new();
        for name in names {
            match self.existing(name) {
                Ok(key) => keys.push(key),
                Err(_) if if_exists => {}
                Err(e) => return Err(e),
            }
        }
        self.refuse_dropping_what_views_read(&keys)?;
        self.remove(&keys, &[])
    }

    /// Drops `tables` and `views` in one statement: the manifest without them, then memory.
    fn remove(&mut self, tables: &[String], views: &[String]) -> Result<Outcome> {
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        tables.iter().for_each(|key| drop(manifest.tables.remove(key)));
        views.iter().for_each(|key| drop(manifest.views.remove(key)));
        self.storage.commit(&self.manifest, &manifest)?;
        self.manifest = manifest;
        tables.iter().for_each(|key| drop(self.tables.remove(key)));
        views.iter().for_each(|key| drop(self.views.remove(key)));
        Ok(Outcome::Done)
    }

    /// The key of the existing table `name`.
    fn existing(&self, name: &ast::ObjectName) -> Result<String> {
        self.existing_as(name, false)
    }

    /// The lower-case name of the view `name`, or an error saying what `name` is.
    pub(crate) fn existing_view(&self, name: &ast::ObjectName) -> Result<String> {
        self.existing_as(name, true)
    }

    /// The lower-case name of the table (or the view, `view`) `name`, or an error saying what
    /// it is instead.
    fn existing_as(&self, name: &ast::ObjectName, view: bool) -> Result<String> {
        let name = object_name(name)?;
        let key = name.to_lowercase();
        let wanted = if view { "materialized view" } else { "table" };
        if (view && self.views.contains_key(&key)) || (!view && self.tables.contains_key(&key)) {
            Ok(key)
        } else if self.views.contains_key(&key) {
            Err(TesseraError::Plan(format!(
                "`{name}` is a materialized view, not a table: it changes by REFRESH MATERIALIZED VIEW, and goes by \
                 DROP MATERIALIZED VIEW"
            )))
        } else if self.tables.contains_key(&key) {
            Err(TesseraError::Plan(format!(
                "`{name}` is a table, not a materialized view: it changes by INSERT, UPDATE, DELETE and COPY, and goes \
                 by DROP TABLE"
            )))
        } else if self.sources.contains_key(&key) {
            Err(TesseraError::Plan(format!("`{name}` is a source (a stream), not a {wanted}")))
        } else {
            Err(TesseraError::Plan(format!("no {wanted} `{name}`")))
        }
    }
}

/// The Arrow type of a table column declared in SQL: a source column's types, and DECIMAL
/// (NUMERIC) with its precision and scale (38 and 10 where not given, at most 38 digits).
fn column_type(sql: &ast::DataType) -> Option<arrow::datatypes::DataType> {
    use ast::{DataType as S, ExactNumberInfo as N};
    match sql {
        S::Decimal(info) | S::Numeric(info) | S::Dec(info) => {
            let (precision, scale) = match *info {
                N::None => (38, 10),
                N::Precision(p) => (p, 0),
                N::PrecisionAndScale(p, s) => (p, s),
            };
            let precision = u8::try_from(precision).ok().filter(|p| (1..=38).contains(p))?;
            let scale = i8::try_from(scale).ok().filter(|s| (0..=precision as i8).contains(s))?;
            Some(arrow::datatypes::DataType::Decimal128(precision, scale))
        }
        other => tessera::sql::arrow_type(other),
    }
}

/// The length `n` of a text type declared `VARCHAR(n)`, `CHAR(n)` and the like.
fn declared_length(sql: &ast::DataType) -> Option<u64> {
    use ast::DataType as S;
    match sql {
        S::Varchar(length)
        | S::Char(length)
        | S::Character(length)
        | S::CharVarying(length)
        | S::CharacterVarying(length) => match length {
            Some(ast::CharacterLength::IntegerLength { length, .. }) => Some(*length),
            _ => None,
        },
        _ => None,
    }
}

/// The column a table stores for query column `field` (`CREATE TABLE ... AS`): its name and
/// type, text of any representation as VARCHAR; a column of no type (a bare NULL) or of a
/// nested type is refused.
fn stored_field(field: &Field) -> Result<Field> {
    use arrow::datatypes::DataType as T;
    let data_type = match field.data_type() {
        T::Utf8View | T::LargeUtf8 => T::Utf8,
        T::Null => {
            return Err(TesseraError::Plan(format!(
                "column `{}` of the query has no type (a bare NULL): CAST it to the type the table should store",
                field.name()
            )))
        }
        nested if nested.is_nested() => {
            return Err(TesseraError::Plan(format!(
                "column `{}` of the query is {}: tables store no lists, structs or maps",
                field.name(),
                tessera::catalog::sql_type_name(nested)
            )))
        }
        other => other.clone(),
    };
    Ok(Field::new(field.name(), data_type, true))
}

/// Registers the live rows of `table` as `name` (`with_positions`: and their positions, see
/// [`Table::scan`]).
fn register(ctx: &SessionContext, name: &str, table: &Table, with_positions: bool) -> Result<()> {
    ctx.register_table(datafusion::common::TableReference::bare(name), Arc::new(table.scan(with_positions)?))?;
    Ok(())
}

/// Registers `batches` as table `name`, in two partitions (one a core).
fn register_batches(
    ctx: &SessionContext,
    name: &str,
    schema: arrow::datatypes::SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<()> {
    ctx.register_table(datafusion::common::TableReference::bare(name), mem_table(schema, batches)?)?;
    Ok(())
}

/// `batches` as a table in two partitions (one a core).
fn mem_table(schema: arrow::datatypes::SchemaRef, batches: Vec<RecordBatch>) -> Result<Arc<MemTable>> {
    let mut partitions = vec![Vec::new(), Vec::new()];
    for (i, batch) in batches.into_iter().enumerate() {
        partitions[i % 2].push(batch);
    }
    Ok(Arc::new(MemTable::try_new(schema, partitions)?))
}

fn object_name(name: &ast::ObjectName) -> Result<String> {
    match name.0.as_slice() {
        [part] => Ok(part.as_ident().map_or_else(|| part.to_string(), |i| i.value.clone())),
        _ => Err(TesseraError::Plan(format!("`{name}`: tables are named by one name, not a path"))),
    }
}

/// The one statement of `sql`, which tessera wrote.
fn parse_one(sql: &str) -> Result<ast::Statement> {
    let mut statements = Parser::parse_sql(&GenericDialect {}, sql)
        .map_err(|e| TesseraError::Internal(format!("cannot parse {sql}: {e}")))?;
    statements.pop().ok_or_else(|| TesseraError::Internal(format!("no statement in {sql}")))
}

/// `name` as an identifier DataFusion reads as written.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Rows of `item` and `value`: what an EXPLAIN of the database shows.
fn items_outcome(items: Vec<(String, String)>) -> Result<Outcome> {
    describe::text_rows(&["item", "value"], items.into_iter().map(|(item, value)| vec![item, value]).collect())
}

/// A `WITH (name = value)` option as (lower-case name, value).
pub(crate) fn key_value(option: &ast::SqlOption) -> Result<(String, String)> {
    let ast::SqlOption::KeyValue { key, value } = option else {
        return Err(TesseraError::Plan(format!("option `{option}` is not one of name = value")));
    };
    let value = match value {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) | ast::Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        },
        other => other.to_string(),
    };
    Ok((key.value.to_lowercase(), value))
}

#[cfg(test)]
mod tests;
