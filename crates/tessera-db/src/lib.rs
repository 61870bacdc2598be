//! The database half of tessera: tables kept in a folder (or in memory for one run), changed by
//! `INSERT`, `UPDATE`, `DELETE` and `DROP`, and read by batch SQL that DataFusion plans and
//! runs with its own physical operators (joins, sorts, aggregates, window functions: none of
//! them written here). Each statement is atomic: it is checked first, its files written next,
//! and the database's manifest replaced last (see [`storage`]); a statement that fails changes
//! nothing. Every table records what each statement inserted and deleted ([`table::ChangeSet`]),
//! the change relations that maintain views incrementally.

mod file;
mod key_index;
mod maintain;
mod statement;
pub mod storage;
pub mod table;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{Field, Int64Type};
use datafusion::common::Column;
use datafusion::datasource::{provider_as_source, MemTable, ViewTable};
use datafusion::logical_expr::{col, lit, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sql::sqlparser::ast;
use datafusion_sql::sqlparser::dialect::GenericDialect;
use datafusion_sql::sqlparser::parser::Parser;
use datafusion_sql::sqlparser::tokenizer::Location;
pub use statement::{parse, Statement};

use storage::{Manifest, Storage};
use table::{Edit, Table, POSITION};
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

/// A materialized view: its query, and its contents as of its last refresh (stale in between:
/// queries read them as they are).
pub struct View {
    pub query: ast::Query,
    /// How a refresh brings it up to date (and what its contents hold: an incrementally
    /// maintained view stores each group's counts and sums, see [`maintain`]).
    pub maintenance: maintain::Maintenance,
    pub contents: Table,
    /// The sequence number of the last statement its contents reflect.
    pub refreshed_at: u64,
}

impl View {
    /// The columns users see.
    fn schema(&self) -> arrow::datatypes::SchemaRef {
        match &self.maintenance {
            maintain::Maintenance::Incremental(incremental) => Arc::clone(&incremental.schema),
            maintain::Maintenance::Recompute(_) => Arc::clone(&self.contents.schema),
        }
    }
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
            .build()
            .map_err(|e| TesseraError::io("cannot start the query runtime", e))?;
        let tables = manifest
            .tables
            .iter()
            .map(|(key, entry)| Ok((key.clone(), Table::load(entry, &storage)?)))
            .collect::<Result<_>>()?;
        let mut database = Database {
            storage,
            manifest,
            tables,
            views: BTreeMap::new(),
            runtime,
            base_dir: ".".into(),
            sources: BTreeMap::new(),
            read: tessera::connectors::ReadOptions { dead_letter_appends: true, ..Default::default() },
            read_totals: Default::default(),
        };
        database.load_views()?;
        Ok(database)
    }

    /// Loads the views of the manifest, each after the views it reads.
    fn load_views(&mut self) -> Result<()> {
        let mut pending: Vec<(String, ast::Query)> = Vec::new();
        for (key, entry) in &self.manifest.views {
            let damaged = || TesseraError::Option(format!("the view `{key}` is damaged: its query is not one"));
            let query = match statement::parse(&entry.query)?.pop() {
                Some(Statement::Sql { statement, .. }) => match *statement {
                    ast::Statement::Query(query) => *query,
                    _ => return Err(damaged()),
                },
                _ => return Err(damaged()),
            };
            pending.push((key.clone(), query));
        }
        while !pending.is_empty() {
            let ready = pending.iter().position(|(_, query)| {
                self.references(query).is_ok_and(|names| {
                    names.iter().all(|n| !self.manifest.views.contains_key(n) || self.views.contains_key(n))
                })
            });
            let Some(ready) = ready else {
                let names: Vec<&str> = pending.iter().map(|(k, _)| k.as_str()).collect();
                return Err(TesseraError::Option(format!("the views {names:?} read each other")));
            };
            let (key, query) = pending.remove(ready);
            let entry = &self.manifest.views[&key];
            let contents = Table::load(&entry.contents, &self.storage)?;
            let maintenance = self.plan_view(&query)?;
            let refreshed_at = entry.refreshed_at;
            self.views.insert(key, View { query, maintenance, contents, refreshed_at });
        }
        Ok(())
    }

    /// The lower-case names of the tables and views `query` reads.
    fn references(&self, query: &ast::Query) -> Result<Vec<String>> {
        let statement =
            datafusion::sql::parser::Statement::Statement(Box::new(ast::Statement::Query(Box::new(query.clone()))));
        let ctx = SessionContext::new();
        Ok(ctx.state().resolve_table_references(&statement)?.iter().map(|r| r.table().to_lowercase()).collect())
    }

    /// How the view with `query` is maintained, planned over the tables and views as they are.
    fn plan_view(&self, query: &ast::Query) -> Result<maintain::Maintenance> {
        // Planned over empty tables of the same columns: the plan keeps no rows alive.
        let ctx = SessionContext::new();
        for name in self.references(query)? {
            let schema = match (self.tables.get(&name), self.views.get(&name)) {
                (Some(table), _) => Arc::clone(&table.schema),
                (None, Some(view)) => view.schema(),
                (None, None) => continue,
            };
            register_batches(&ctx, &name, schema, Vec::new())?;
        }
        let statement =
            datafusion::sql::parser::Statement::Statement(Box::new(ast::Statement::Query(Box::new(query.clone()))));
        let plan = self.runtime.block_on(ctx.state().statement_to_plan(statement))?;
        Ok(maintain::plan(&plan, &Sources { db: self, since: 0, planning: true }))
    }

    /// Makes relative paths in statements (a table's initial contents, COPY's file) relative to
    /// `dir` (a script's folder) instead of the working directory.
    pub fn set_base_dir(&mut self, dir: &Path) {
        self.base_dir = dir.to_path_buf();
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

    pub fn view(&self, name: &str) -> Option<&View> {
        self.views.get(&name.to_lowercase())
    }

    /// Runs every statement of `sql` in order; the outcome of each.
    pub fn execute(&mut self, sql: &str) -> Result<Vec<Outcome>> {
        parse(sql)?.iter().map(|s| self.execute_statement(s)).collect()
    }

    pub fn execute_statement(&mut self, statement: &Statement) -> Result<Outcome> {
        match statement {
            Statement::Sql { statement, script } => self.execute_sql(statement, script),
            Statement::Copy { table, path, options } => self.copy(table, path, options),
            Statement::Refresh { view } => self.refresh(view),
            Statement::ExplainRefresh { view } => self.explain_refresh(view),
            Statement::Source { name, text, start, script } => self.create_source(name, text, *start, script),
        }
    }

    /// Runs `statement` of `script`.
    fn execute_sql(&mut self, statement: &ast::Statement, script: &str) -> Result<Outcome> {
        match statement {
            ast::Statement::Query(query) => {
                let (schema, batches) = self.query_with_columns(query, Some(script))?;
                Ok(Outcome::Rows { schema, batches })
            }
            ast::Statement::CreateTable(create) => self.create_table(create),
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

    /// `CREATE SOURCE`: checked by compiling it after the sources before it.
    fn create_source(&mut self, name: &str, text: &str, start: Location, script: &str) -> Result<Outcome> {
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
    fn compile_stream(&self, text: &str, start: Location, script: &str) -> Result<tessera::engine::Script> {
        let mut compiled: String = self.sources.values().map(|source| format!("{source};\n")).collect();
        let first_line = compiled.matches('\n').count() as u64 + 1;
        compiled.push_str(text);
        compiled.push_str(";\n");
        tessera::engine::Script::compile(&compiled, &self.base_dir).map_err(|error| {
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
        })
    }

    /// Whether `query` reads a stream: a source of the script, or a window over one.
    fn reads_a_stream(&self, query: &ast::Query) -> bool {
        use datafusion_sql::sqlparser::ast::visit_relations;
        let mut found = false;
        let _ = visit_relations(query, |name| {
            let name = name.to_string().to_lowercase();
            found |=
                self.sources.contains_key(&name) || ["tumble", "hop", "session", "windows"].contains(&name.as_str());
            std::ops::ControlFlow::<()>::Continue(())
        });
        found
    }

    /// The rows of window query `query` (of `script`) over the script's streams, run by the
    /// streaming engine to the end of its input.
    fn stream_query(
        &self,
        query: &ast::Query,
        script: Option<&str>,
    ) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
        use datafusion_sql::sqlparser::ast::Spanned;
        let span = query.span();
        let script = match script {
            Some(script) if span.start.line > 0 => {
                let text = &script[statement::offset(script, span.start)..statement::offset(script, span.end)];
                self.compile_stream(text, span.start, script)?
            }
            _ => {
                let text = query.to_string();
                self.compile_stream(&text, Location { line: 1, column: 1 }, &text)?
            }
        };
        let options = tessera::engine::RunOptions {
            parallelism: tessera::exec::pipeline::Parallelism::Auto(tessera::exec::cores()),
            read: self.read.clone(),
            ..tessera::engine::RunOptions::default()
        };
        let mut sink = tessera::connectors::sink::MemorySink::default();
        let stats = tessera::engine::run_script(&script, &options, &mut sink)?;
        self.count_read(stats.events_in, stats.late_events, stats.bad_rows, &self.read.dead_letter_path);
        let schema = script
            .queries
            .first()
            .map(|q| Arc::clone(&q.output_schema))
            .ok_or_else(|| TesseraError::Internal("a window query compiled to no query".into()))?;
        Ok((schema, sink.rows.into_iter().next().unwrap_or_default()))
    }

    /// A DataFusion session with the tables and views `reads` name registered (`positions`:
    /// that one with its rows' positions as a last column). Only those: registering a table
    /// whose segments had rows deleted copies its live rows.
    fn context(&self, reads: &[&ast::Statement], positions: Option<&str>) -> Result<SessionContext> {
        let ctx = self.plain_context();
        let mut named = std::collections::BTreeSet::new();
        for statement in reads {
            let statement = datafusion::sql::parser::Statement::Statement(Box::new((*statement).clone()));
            named.extend(ctx.state().resolve_table_references(&statement)?.iter().map(|r| r.table().to_lowercase()));
        }
        for (key, table) in self.tables.iter().filter(|(key, _)| named.contains(key.as_str())) {
            register(&ctx, key, table, positions == Some(key.as_str()))?;
        }
        for (key, view) in self.views.iter().filter(|(key, _)| named.contains(key.as_str())) {
            match &view.maintenance {
                maintain::Maintenance::Recompute(_) => register(&ctx, key, &view.contents, false)?,
                maintain::Maintenance::Incremental(incremental) => {
                    // Users see its columns computed from the stored ones.
                    let stored = LogicalPlanBuilder::scan(
                        format!("__stored_{key}"),
                        provider_as_source(mem_table(
                            Arc::clone(&view.contents.schema),
                            view.contents.batches(false)?,
                        )?),
                        None,
                    )?
                    .build()?;
                    let visible = incremental.visible(stored).map_err(TesseraError::Internal)?;
                    ctx.register_table(key.as_str(), Arc::new(ViewTable::new(visible, None)))?;
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
        self.runtime.block_on(async {
            let plan = ctx
                .state()
                .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(statement)))
                .await?;
            let frame = ctx.execute_logical_plan(plan).await?;
            let schema = Arc::new(frame.schema().as_arrow().clone());
            Ok((schema, frame.collect().await?))
        })
    }

    /// The columns and rows of logical plan `plan`.
    fn run_plan(&self, plan: LogicalPlan) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
        self.runtime.block_on(async {
            let frame = self.plain_context().execute_logical_plan(plan).await?;
            let schema = Arc::new(frame.schema().as_arrow().clone());
            Ok((schema, frame.collect().await?))
        })
    }

    /// A DataFusion session with nothing registered.
    fn plain_context(&self) -> SessionContext {
        SessionContext::new_with_config(SessionConfig::new().with_target_partitions(tessera::exec::cores().clamp(1, 2)))
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

    fn create_table(&mut self, create: &ast::CreateTable) -> Result<Outcome> {
        let Some((name, key)) = self.new_name(&create.name, create.if_not_exists)? else { return Ok(Outcome::Done) };
        let mut primary_key = Vec::new();
        let mut fields = Vec::new();
        for column in &create.columns {
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
        let mut table = Table::new(&name, fields, &primary_key)?;
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
        if let Some((_, path)) = options.iter().find(|(name, _)| name == "path") {
            let (rows, _, skipped) =
                file::read_rows(&self.base_dir.join(path), &file_options, &table, &self.read, &self.base_dir)?;
            self.count_read(0, 0, skipped.rows, &skipped.dead_letter);
            let edit = Edit { inserted: Some(rows), ..Edit::default() };
            table.check(&edit)?;
            table.apply(edit, manifest.sequence, &mut self.storage, &mut manifest)?;
        }
        manifest.tables.insert(key.clone(), table.entry());
        self.storage.commit(&manifest)?;
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
        let given = self.query_with_columns(source, Some(script))?.1;
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
        let width = given.first().map_or(targets.len(), |b| b.num_columns());
        if width != targets.len() {
            return Err(TesseraError::Plan(format!(
                "INSERT INTO `{}` gives {width} columns for {} target columns",
                table.name,
                targets.len()
            )));
        }
        let mut parts = Vec::new();
        for batch in given {
            let mut columns: Vec<ArrayRef> =
                declared.iter().map(|f| arrow::array::new_null_array(f.data_type(), batch.num_rows())).collect();
            for (i, &target) in targets.iter().enumerate() {
                columns[target] = Arc::clone(batch.column(i));
            }
            parts.push(table.conform(columns)?);
        }
        let rows = arrow::compute::concat_batches(&table.schema, &parts)?;
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
        let mut values: Vec<String> = table.schema.fields().iter().map(|f| quoted(f.name())).collect();
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
            values[i] = assignment.value.to_string();
        }
        let selected = self.positions(&key, &values, update.selection.as_ref())?;
        let table = &self.tables[&key];
        let mut deleted = Vec::new();
        let mut parts = Vec::new();
        for (positions, columns) in selected {
            deleted.extend(positions);
            parts.push(table.conform(columns)?);
        }
        let rows = arrow::compute::concat_batches(&table.schema, &parts)?;
        let count = deleted.len() as u64;
        self.commit(&key, Edit { deleted, inserted: Some(rows) })?;
        Ok(Outcome::Changed { rows: count })
    }

    /// The positions of the rows of table `key` where `selection` holds, each batch with the
    /// values of `expressions` on those rows.
    fn positions(&self, key: &str, expressions: &[String], selection: Option<&ast::Expr>) -> Result<Vec<SelectedRows>> {
        let mut select: Vec<String> = expressions.to_vec();
        select.push(POSITION.to_string());
        let mut sql = format!("SELECT {} FROM {}", select.join(", "), quoted(key));
        if let Some(selection) = selection {
            sql.push_str(&format!(" WHERE {selection}"));
        }
        let (_, batches) = self.sql(&sql, Some(key))?;
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

    /// Applies `edit` to table `key` as one statement: checked, written, then the manifest
    /// replaced.
    fn commit(&mut self, key: &str, edit: Edit) -> Result<()> {
        let table = self.tables.get_mut(key).ok_or_else(|| TesseraError::Internal(format!("no table {key}")))?;
        table.check(&edit)?;
        if edit.deleted.is_empty() && edit.inserted.as_ref().is_none_or(|r| r.num_rows() == 0) {
            return Ok(());
        }
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        table.apply(edit, manifest.sequence, &mut self.storage, &mut manifest)?;
        table.forget_changes_through(changes_needed_after(key, self.views.values()));
        manifest.tables.insert(key.to_string(), table.entry());
        self.storage.commit(&manifest)?;
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
            (Some(ops), Some(op_column)) => table.edit_from_ops(rows, &ops, op_column)?,
            _ => Edit { inserted: Some(rows), ..Edit::default() },
        };
        self.commit(&key, edit)?;
        self.count_read(0, 0, skipped.rows, &skipped.dead_letter);
        Ok(Outcome::Changed { rows: count })
    }

    /// The edit that brings the stored rows of `view` up to date from the tables' changes
    /// since its last refresh (see [`maintain`]).
    fn maintained_edit(&self, view: &View, incremental: &maintain::Incremental) -> Result<Edit> {
        let sources = Sources { db: self, since: view.refreshed_at, planning: false };
        let Some(change) = incremental.change(&sources).map_err(TesseraError::Internal)? else {
            return Ok(Edit::default());
        };
        let (schema, change) = self.run_plan(change)?;
        let ctx = self.plain_context();
        register_batches(&ctx, "__change", schema, change)?;
        register(&ctx, "__stored", &view.contents, true)?;
        let (_, merged) = self.run(&ctx, parse_one(&incremental.merge_query())?)?;
        let width = view.contents.schema.fields().len();
        let mut edit = Edit::default();
        let mut inserted = Vec::new();
        let mut dirty = Vec::new();
        for batch in merged {
            let insert = batch.column(width).as_boolean();
            let again = batch.column(width + 1).as_boolean();
            let positions = batch.column(width + 2).as_primitive::<Int64Type>();
            edit.deleted.extend(positions.iter().flatten().map(table::position));
            let rows = view.contents.conform(batch.columns()[..width].to_vec())?;
            inserted.push(arrow::compute::filter_record_batch(&rows, insert)?);
            dirty.push(arrow::compute::filter_record_batch(&rows, again)?);
        }
        let dirty: Vec<RecordBatch> = dirty.into_iter().filter(|b| b.num_rows() > 0).collect();
        if let (Some(first), maintain::Root::Grouped { groups, .. }) = (dirty.first(), &incremental.root) {
            // The groups whose extreme was deleted, computed again from their rows.
            let keys: Vec<usize> = (0..groups.len()).collect();
            let schema = Arc::new(first.schema().project(&keys)?);
            let keys = dirty.iter().map(|b| b.project(&keys)).collect::<std::result::Result<Vec<_>, _>>()?;
            let groups =
                LogicalPlanBuilder::scan("__dirty", provider_as_source(mem_table(schema, keys)?), None)?.build()?;
            let plan = incremental.regrouped(&sources, groups).map_err(TesseraError::Internal)?;
            for batch in self.run_plan(plan)?.1 {
                inserted.push(view.contents.conform(batch.columns().to_vec())?);
            }
        }
        edit.inserted = Some(arrow::compute::concat_batches(&view.contents.schema, &inserted)?);
        Ok(edit)
    }

    /// The columns and rows of query `sql` over the tables and views.
    fn sql(&self, sql: &str, positions: Option<&str>) -> Result<(arrow::datatypes::SchemaRef, Vec<RecordBatch>)> {
        let statement = parse_one(sql)?;
        let ctx = self.context(&[&statement], positions)?;
        self.run(&ctx, statement)
    }

    fn create_view(&mut self, create: &ast::CreateView) -> Result<Outcome> {
        let Some((name, key)) = self.new_name(&create.name, create.if_not_exists)? else { return Ok(Outcome::Done) };
        if self.reads_a_stream(&create.query) {
            return Err(TesseraError::Plan(format!(
                "materialized view `{name}` reads a stream: its changes are not recorded; insert the window \
                 query's rows into a table (INSERT INTO t SELECT ... FROM TUMBLE(...)) and define the view over it"
            )));
        }
        let (view, rows) = self.compute_view(&name, &create.query)?;
        self.save_view(key, view, Edit { inserted: Some(rows), ..Edit::default() })?;
        Ok(Outcome::Done)
    }

    /// `REFRESH MATERIALIZED VIEW`: its query computed again over the tables as they are.
    fn refresh(&mut self, name: &ast::ObjectName) -> Result<Outcome> {
        let key = object_name(name)?.to_lowercase();
        self.refresh_view(&key).map_err(|e| match e {
            TesseraError::Internal(m) if m == "no view" => TesseraError::Plan(format!("no materialized view `{name}`")),
            other => other,
        })
    }

    /// Refreshes view `key`, after the views it reads (so a view over a view is maintained
    /// from its input's fresh contents and their change).
    fn refresh_view(&mut self, key: &str) -> Result<Outcome> {
        let view = self.views.get(key).ok_or_else(|| TesseraError::Internal("no view".into()))?;
        for read in self.references(&view.query.clone())? {
            if self.views.contains_key(&read) {
                self.refresh_view(&read)?;
            }
        }
        let key = key.to_string();
        let view = &self.views[&key];
        let edit = match &view.maintenance {
            maintain::Maintenance::Incremental(incremental) => self.maintained_edit(view, incremental)?,
            maintain::Maintenance::Recompute(_) => {
                // Every row replaced, so that the contents' change is their whole change.
                let (_, rows) = self.compute_view(&view.contents.name, &view.query.clone())?;
                Edit { deleted: view.contents.positions(), inserted: Some(rows) }
            }
        };
        let count = (edit.deleted.len() + edit.inserted.as_ref().map_or(0, |r| r.num_rows())) as u64;
        let mut view = self.views.remove(&key).expect("the view exists");
        view.refreshed_at = self.manifest.sequence;
        self.save_view(key, view, edit)?;
        Ok(Outcome::Changed { rows: count })
    }

    /// How `REFRESH` would bring the view up to date: one row per item (the strategy and why,
    /// the view's key, the changes waiting, the queries it runs).
    fn explain_refresh(&self, name: &ast::ObjectName) -> Result<Outcome> {
        let key = object_name(name)?.to_lowercase();
        let view = self.views.get(&key).ok_or_else(|| TesseraError::Plan(format!("no materialized view `{name}`")))?;
        let mut items: Vec<(String, String)> = vec![("view".into(), view.contents.name.clone())];
        match &view.maintenance {
            maintain::Maintenance::Recompute(why) => {
                items.push(("refresh".into(), "recompute: the query runs again over the tables".into()));
                items.push(("why".into(), why.clone()));
                items.push(("key".into(), "the rows themselves (none derived for this query)".into()));
            }
            maintain::Maintenance::Incremental(incremental) => {
                items.push(("refresh".into(), incremental.strategy().into()));
                items.push(("key".into(), incremental.key()));
                for table in &incremental.tables {
                    let since = self
                        .tables
                        .get(table)
                        .map_or(&[][..], |t| t.changes())
                        .iter()
                        .filter(|c| c.sequence > view.refreshed_at);
                    let (inserted, deleted) = since.fold((0, 0), |(i, d), c| {
                        (
                            i + c.inserted.as_ref().map_or(0, |r| r.num_rows()),
                            d + c.deleted.as_ref().map_or(0, |r| r.num_rows()),
                        )
                    });
                    items.push((
                        format!("changes of {table}"),
                        format!("{inserted} rows inserted, {deleted} deleted since statement {}", view.refreshed_at),
                    ));
                }
                let sources = Sources { db: self, since: view.refreshed_at, planning: false };
                if let Some(change) = incremental.change(&sources).map_err(TesseraError::Internal)? {
                    let optimized = self.plain_context().state().optimize(&change)?;
                    items.push(("change plan".into(), optimized.display_indent().to_string()));
                    items.push(("merge query".into(), incremental.merge_query()));
                }
            }
        }
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            Field::new("item", arrow::datatypes::DataType::Utf8, false),
            Field::new("value", arrow::datatypes::DataType::Utf8, false),
        ]));
        let (names, values): (Vec<String>, Vec<String>) = items.into_iter().unzip();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(arrow::array::StringArray::from(names)), Arc::new(arrow::array::StringArray::from(values))],
        )?;
        Ok(Outcome::Rows { schema, batches: vec![batch] })
    }

    /// A view named `name`, empty, and the rows of `query` now, which it is to hold.
    fn compute_view(&self, name: &str, query: &ast::Query) -> Result<(View, RecordBatch)> {
        let maintenance = self.plan_view(query)?;
        let (schema, batches) = match &maintenance {
            maintain::Maintenance::Recompute(_) => self.query_with_columns(query, None)?,
            maintain::Maintenance::Incremental(incremental) => {
                let sources = Sources { db: self, since: self.manifest.sequence, planning: false };
                self.run_plan(incremental.stored(&sources).map_err(TesseraError::Internal)?)?
            }
        };
        let fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect();
        let contents = Table::new(name, fields, &[])?;
        let rows = batches.iter().map(|b| contents.conform(b.columns().to_vec())).collect::<Result<Vec<_>>>()?;
        let rows = arrow::compute::concat_batches(&contents.schema, &rows)?;
        Ok((View { query: query.clone(), maintenance, contents, refreshed_at: self.manifest.sequence }, rows))
    }

    /// Writes `rows` as the contents of `view` and replaces the manifest with it in.
    fn save_view(&mut self, key: String, mut view: View, edit: Edit) -> Result<()> {
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        view.contents.check(&edit)?;
        view.contents.apply(edit, manifest.sequence, &mut self.storage, &mut manifest)?;
        // The tables and views it reads keep only the changes a view still needs; so do its
        // own contents.
        if let maintain::Maintenance::Incremental(incremental) = &view.maintenance {
            for name in &incremental.tables {
                let needing = self.views.values().chain(std::iter::once(&view));
                let needed = changes_needed_after(name, needing);
                if let Some(table) = self.tables.get_mut(name) {
                    table.forget_changes_through(needed);
                    manifest.tables.insert(name.clone(), table.entry());
                } else if let Some(read) = self.views.get_mut(name) {
                    read.contents.forget_changes_through(needed);
                    if let Some(entry) = manifest.views.get_mut(name) {
                        entry.contents = read.contents.entry();
                    }
                }
            }
        }
        view.contents.forget_changes_through(changes_needed_after(&key, self.views.values()));
        manifest.views.insert(
            key.clone(),
            storage::ViewEntry {
                query: view.query.to_string(),
                contents: view.contents.entry(),
                refreshed_at: view.refreshed_at,
            },
        );
        self.storage.commit(&manifest)?;
        self.manifest = manifest;
        self.views.insert(key, view);
        Ok(())
    }

    fn drop_views(&mut self, names: &[ast::ObjectName], if_exists: bool) -> Result<Outcome> {
        let mut keys = Vec::new();
        for name in names {
            let key = object_name(name)?.to_lowercase();
            if self.views.contains_key(&key) {
                keys.push(key);
            } else if !if_exists {
                return Err(TesseraError::Plan(format!("no materialized view `{name}`")));
            }
        }
        self.refuse_dropping_what_views_read(&keys)?;
        self.remove(&[], &keys)
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

    /// An error if a view other than those of `dropped` reads one of them.
    fn refuse_dropping_what_views_read(&self, dropped: &[String]) -> Result<()> {
        for (name, view) in self.views.iter().filter(|(name, _)| !dropped.contains(name)) {
            if let Some(read) = self.references(&view.query)?.into_iter().find(|r| dropped.contains(r)) {
                return Err(TesseraError::Plan(format!(
                    "materialized view `{name}` reads `{read}`: drop the view first"
                )));
            }
        }
        Ok(())
    }

    /// Drops `tables` and `views` in one statement: the manifest without them, then memory.
    fn remove(&mut self, tables: &[String], views: &[String]) -> Result<Outcome> {
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        tables.iter().for_each(|key| drop(manifest.tables.remove(key)));
        views.iter().for_each(|key| drop(manifest.views.remove(key)));
        self.storage.commit(&manifest)?;
        self.manifest = manifest;
        tables.iter().for_each(|key| drop(self.tables.remove(key)));
        views.iter().for_each(|key| drop(self.views.remove(key)));
        Ok(Outcome::Done)
    }

    /// The key of the existing table `name`.
    fn existing(&self, name: &ast::ObjectName) -> Result<String> {
        let name = object_name(name)?;
        let key = name.to_lowercase();
        if self.tables.contains_key(&key) {
            Ok(key)
        } else {
            Err(TesseraError::Plan(format!("no table `{name}`")))
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

/// The sequence number after which the changes of table or view `name` are needed: the oldest
/// refresh of the incrementally maintained `views` reading it (`u64::MAX` if none does).
fn changes_needed_after<'a>(name: &str, views: impl Iterator<Item = &'a View>) -> u64 {
    views
        .filter_map(|view| match &view.maintenance {
            maintain::Maintenance::Incremental(i) if i.tables.contains(name) => Some(view.refreshed_at),
            _ => None,
        })
        .min()
        .unwrap_or(u64::MAX)
}

/// Registers the live rows of `table` as `name` (`with_positions`: and their positions, see
/// [`Table::batches`]).
fn register(ctx: &SessionContext, name: &str, table: &Table, with_positions: bool) -> Result<()> {
    let batches = table.batches(with_positions)?;
    let schema = match batches.first() {
        Some(batch) => batch.schema(),
        None if with_positions => {
            let mut fields: Vec<Field> = table.schema.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.push(Field::new(POSITION, arrow::datatypes::DataType::Int64, false));
            Arc::new(arrow::datatypes::Schema::new(fields))
        }
        None => Arc::clone(&table.schema),
    };
    register_batches(ctx, name, schema, batches)
}

/// Registers `batches` as table `name`, in two partitions (one a core).
fn register_batches(
    ctx: &SessionContext,
    name: &str,
    schema: arrow::datatypes::SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<()> {
    ctx.register_table(name, mem_table(schema, batches)?)?;
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

/// The tables of the database in the versions a view's maintenance plans read (see
/// [`maintain::Relations`]): their changes since statement `since`; without rows if
/// `planning`.
struct Sources<'a> {
    db: &'a Database,
    since: u64,
    planning: bool,
}

impl Sources<'_> {
    /// The rows of table or view `name` (a view's stored rows), and how users see a view's
    /// stored rows if they are not its columns.
    fn relation(&self, name: &str) -> std::result::Result<(&Table, Option<&maintain::Incremental>), String> {
        if let Some(table) = self.db.tables.get(name) {
            return Ok((table, None));
        }
        let view = self.db.views.get(name).ok_or_else(|| format!("it reads `{name}`, which is not a table"))?;
        match &view.maintenance {
            maintain::Maintenance::Incremental(incremental) => Ok((&view.contents, Some(incremental))),
            maintain::Maintenance::Recompute(_) => Ok((&view.contents, None)),
        }
    }

    /// The change sets of `table` since the view's last refresh.
    fn changes<'t>(&self, table: &'t Table) -> impl Iterator<Item = &'t table::ChangeSet> {
        let since = self.since;
        table.changes().iter().filter(move |c| c.sequence > since)
    }
}

impl maintain::Relations for Sources<'_> {
    fn scan(&self, name: &str, version: maintain::Version) -> std::result::Result<LogicalPlan, String> {
        use maintain::Version;
        let (table, visible) = self.relation(name)?;
        let error = |e: TesseraError| e.to_string();
        let schema = Arc::clone(table.keyed_schema());
        let mut counted_fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        counted_fields.push(Field::new("__m", arrow::datatypes::DataType::Int64, false));
        let counted = Arc::new(arrow::datatypes::Schema::new(counted_fields));
        // `parts` with every row counted `count`.
        let with_count = |parts: Vec<RecordBatch>, count: i64| -> Vec<RecordBatch> {
            parts
                .into_iter()
                .filter(|p| p.num_rows() > 0)
                .filter_map(|p| {
                    let mut columns = p.columns().to_vec();
                    columns.push(Arc::new(arrow::array::Int64Array::from(vec![count; p.num_rows()])));
                    RecordBatch::try_new(Arc::clone(&counted), columns).ok()
                })
                .collect()
        };
        let inserted = || self.changes(table).filter_map(|c| c.inserted.clone()).collect::<Vec<_>>();
        let deleted = || self.changes(table).filter_map(|c| c.deleted.clone()).collect::<Vec<_>>();
        let rows = || if self.planning { Ok(Vec::new()) } else { table.keyed_batches().map_err(error) };
        let scan = |label: &str, schema, batches| {
            LogicalPlanBuilder::scan(
                format!("__{label}_{name}"),
                provider_as_source(mem_table(schema, batches).map_err(error)?),
                None,
            )
            .map_err(|e| e.to_string())
        };
        let builder = match version {
            // Every row counted once: a column of ones added by the plan, not stored.
            Version::New => {
                let mut exprs: Vec<Expr> =
                    schema.fields().iter().map(|f| col(Column::new_unqualified(f.name()))).collect();
                exprs.push(lit(1i64).alias("__m"));
                scan("new", schema, rows()?)?.project(exprs).map_err(|e| e.to_string())?
            }
            Version::Old => {
                let mut batches = with_count(rows()?, 1);
                batches.extend(with_count(inserted(), -1));
                batches.extend(with_count(deleted(), 1));
                scan("old", Arc::clone(&counted), batches)?
            }
            Version::Delta => {
                let mut batches = with_count(inserted(), 1);
                batches.extend(with_count(deleted(), -1));
                scan("delta", Arc::clone(&counted), batches)?
            }
        };
        let plan = builder.build().map_err(|e| e.to_string())?;
        match visible {
            // A view's columns computed from its stored ones, each row with its count and key.
            Some(incremental) => incremental.visible_counted(plan, &table.key_names()),
            None => Ok(plan),
        }
    }

    fn key(&self, name: &str) -> Vec<String> {
        self.relation(name).map(|(table, _)| table.key_names()).unwrap_or_default()
    }

    fn changed(&self, name: &str) -> bool {
        self.relation(name).is_ok_and(|(table, _)| self.changes(table).next().is_some())
    }
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

/// A `WITH (name = value)` option as (lower-case name, value).
fn key_value(option: &ast::SqlOption) -> Result<(String, String)> {
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
