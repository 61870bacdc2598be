//! Materialized views: created over empty tables to plan their maintenance, refreshed
//! incrementally from the change relations of what they read (or recomputed, with the reason;
//! see [`crate::maintain`]), views over views refreshed after the views they read, explained, and
//! dropped only when no view reads them. A view's stored rows are edited by a refresh, not
//! rewritten.
//!
//! Their samples (the rows of a clean or stale sample, the outlier index, cleaning) are
//! [`samples`]'s.

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Field, Int64Type};
use datafusion::common::Column;
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{col, lit, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::SessionContext;
use datafusion_sql::sqlparser::ast;
use tessera::error::{Result, TesseraError};

use crate::sample::{Indexed, OutlierOptions, SampleOptions, Sampling};
use crate::table::{self, Edit, HeldKeys, Table};
use crate::{
    key_value, maintain, mem_table, object_name, parse_one, register, register_batches, sample, storage, Database,
    Outcome, StatementKind,
};

mod samples;

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
    /// Its sample, if it was created `WITH (sample = m)`.
    pub sample: Option<Sample>,
}

/// A view's sample (see [`sample`]): the rows of sampled keys, clean as of a statement.
pub struct Sample {
    pub sampling: sample::Sampling,
    /// The view's rows of sampled keys, as the view's contents store them.
    pub contents: Table,
    /// The sequence number of the last statement the rows reflect.
    pub cleaned_at: u64,
    /// The outlier index's rows picked as of the view's refresh, where it has one.
    pub outlier_base: Option<OutlierBase>,
    /// The outlier index's rows, where it has one and they were computed.
    pub outlier_rows: Option<OutlierRows>,
    /// The stale sample: the view's stored rows of sampled keys, which change only when the
    /// view is refreshed; kept from the refresh (or the first estimate after the database is
    /// opened) so that an estimate does not hash every row of the view again. Its arrays are
    /// those the clean sample started from.
    pub stale_rows: std::sync::OnceLock<Vec<RecordBatch>>,
}

/// Where a sample's outlier index starts from (Section 6.2: the bar set from the indexed table
/// at maintenance, the index then kept from the changes): the hashes of the keys of the
/// indexed table's rows the rule picks when the view is refreshed (or first cleaned after the
/// database is opened), and the value a row changed since must reach to join them (the k-th
/// largest then, where the rule keeps k).
pub struct OutlierBase {
    /// The view's `refreshed_at` they were picked for.
    pub refreshed_at: u64,
    pub hashes: Vec<i64>,
    pub at_least: Option<f64>,
    /// The database file of `hashes`, once written (at the refresh).
    pub file: Option<String>,
}

impl OutlierBase {
    fn schema() -> arrow::datatypes::SchemaRef {
        Arc::new(arrow::datatypes::Schema::new(vec![Field::new("hash", arrow::datatypes::DataType::Int64, false)]))
    }
}

/// The rows of a sample's outlier index as of a statement: the hashes of their keys, and
/// their stored rows, clean.
pub struct OutlierRows {
    /// The sequence number of the last statement they reflect.
    pub at: u64,
    pub hashes: Vec<i64>,
    pub clean: Vec<RecordBatch>,
    /// The view's stored rows of those keys.
    pub stale: Vec<RecordBatch>,
}

impl Sample {
    pub(crate) fn entry(&self) -> storage::SampleEntry {
        storage::SampleEntry {
            ratio: self.sampling.options.ratio,
            seed: self.sampling.options.seed,
            contents: self.contents.entry(),
            cleaned_at: self.cleaned_at,
            outliers: self.sampling.outliers.as_ref().map(|o| o.options.clone()),
            outlier_base: self.outlier_base.as_ref().and_then(|b| {
                Some(storage::OutlierBaseEntry {
                    refreshed_at: b.refreshed_at,
                    at_least: b.at_least,
                    file: b.file.clone()?,
                })
            }),
        }
    }
}

impl View {
    /// The columns users see.
    pub(crate) fn schema(&self) -> arrow::datatypes::SchemaRef {
        match &self.maintenance {
            maintain::Maintenance::Incremental(incremental) => Arc::clone(&incremental.schema),
            maintain::Maintenance::Recompute(_) => Arc::clone(&self.contents.schema),
        }
    }
}

/// A scan of the stored rows of `table` (a view's contents or its sample's), as `__stored`.
fn stored_scan(table: &Table) -> Result<LogicalPlan> {
    rows_scan(&table.schema, table.batches()?)
}

/// A scan of `rows` (of a view's stored columns, `schema`), as `__stored`.
fn rows_scan(schema: &arrow::datatypes::SchemaRef, rows: Vec<RecordBatch>) -> Result<LogicalPlan> {
    let rows = mem_table(Arc::clone(schema), rows)?;
    Ok(LogicalPlanBuilder::scan("__stored", provider_as_source(rows), None)?.build()?)
}

/// The sequence number after which the changes of table or view `name` are needed: the oldest
/// refresh of the incrementally maintained `views` reading it (`u64::MAX` if none does).
pub(crate) fn changes_needed_after<'a>(name: &str, views: impl Iterator<Item = &'a View>) -> u64 {
    views
        .filter_map(|view| match &view.maintenance {
            maintain::Maintenance::Incremental(i) if i.tables.contains(name) => Some(view.refreshed_at),
            _ => None,
        })
        .min()
        .unwrap_or(u64::MAX)
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
        let inserted =
            || self.changes(table).filter_map(|c| c.inserted.as_ref().map(|r| r.batch())).collect::<Result<Vec<_>>>();
        let deleted =
            || self.changes(table).filter_map(|c| c.deleted.as_ref().map(|r| r.batch())).collect::<Result<Vec<_>>>();
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
                batches.extend(with_count(inserted().map_err(error)?, -1));
                batches.extend(with_count(deleted().map_err(error)?, 1));
                scan("old", Arc::clone(&counted), batches)?
            }
            Version::Delta => {
                let mut batches = with_count(inserted().map_err(error)?, 1);
                batches.extend(with_count(deleted().map_err(error)?, -1));
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

impl Database {
    /// Loads the views of the manifest, each after the views it reads.
    pub(crate) fn load_views(&mut self) -> Result<()> {
        let mut pending: Vec<(String, ast::Query)> = Vec::new();
        for (key, entry) in &self.manifest.views {
            let damaged = || TesseraError::Option(format!("the view `{key}` is damaged: its query is not one"));
            let query = match tessera::sql::parse_script(&entry.query, &self.base_dir)?.pop().map(|s| s.kind) {
                Some(StatementKind::Query { query, .. }) => *query,
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
            let sample = match &entry.sample {
                Some(s) => Some(Sample {
                    sampling: self.plan_sampling(
                        &key,
                        &query,
                        &maintenance,
                        SampleOptions { ratio: s.ratio, seed: s.seed },
                        s.outliers.clone(),
                    )?,
                    contents: Table::load(&s.contents, &self.storage)?,
                    cleaned_at: s.cleaned_at,
                    outlier_base: match &s.outlier_base {
                        Some(b) => {
                            let hashes = self.storage.read(&b.file, &OutlierBase::schema())?;
                            Some(OutlierBase {
                                refreshed_at: b.refreshed_at,
                                hashes: hashes.column(0).as_primitive::<Int64Type>().values().to_vec(),
                                at_least: b.at_least,
                                file: Some(b.file.clone()),
                            })
                        }
                        None => None,
                    },
                    outlier_rows: None,
                    stale_rows: std::sync::OnceLock::new(),
                }),
                None => None,
            };
            self.views.insert(key, View { query, maintenance, contents, refreshed_at, sample });
        }
        Ok(())
    }

    /// How the view with `query` is maintained, planned over the tables and views as they are.
    pub(crate) fn plan_view(&self, query: &ast::Query) -> Result<maintain::Maintenance> {
        // Planned over empty tables of the same columns: the plan keeps no rows alive.
        let ctx = SessionContext::new();
        let statement =
            datafusion::sql::parser::Statement::Statement(Box::new(ast::Statement::Query(Box::new(query.clone()))));
        // Each relation under the spelling the query uses (names are matched without case).
        for reference in ctx.state().resolve_table_references(&statement)? {
            let name = reference.table().to_lowercase();
            let schema = match (self.tables.get(&name), self.views.get(&name)) {
                (Some(table), _) => Arc::clone(&table.schema),
                (None, Some(view)) => view.schema(),
                (None, None) => continue,
            };
            register_batches(&ctx, reference.table(), schema, Vec::new())?;
        }
        let plan = self.runtime.block_on(ctx.state().statement_to_plan(statement))?;
        Ok(maintain::plan(&plan, &Sources { db: self, since: 0, planning: true }))
    }

    /// How the sample of view `name` (of `query`, maintained by `maintenance`) is cleaned; an
    /// error if the view cannot have one.
    fn plan_sampling(
        &self,
        name: &str,
        query: &ast::Query,
        maintenance: &maintain::Maintenance,
        options: SampleOptions,
        outliers: Option<OutlierOptions>,
    ) -> Result<Sampling> {
        let refused =
            |why: String| TesseraError::Plan(format!("materialized view `{name}` cannot keep a sample: {why}"));
        let maintain::Maintenance::Incremental(incremental) = maintenance else {
            let maintain::Maintenance::Recompute(why) = maintenance else { unreachable!() };
            return Err(refused(format!("it is recomputed on refresh ({why}), so it has no key to sample by")));
        };
        if let Some(view) = self.references(query)?.into_iter().find(|n| self.views.contains_key(n)) {
            return Err(refused(format!("it reads the view `{view}`; a sampled view reads tables only")));
        }
        if let Some(index) = &outliers {
            let refused = |why: String| {
                TesseraError::Plan(format!("materialized view `{name}` cannot keep the outlier index: {why}"))
            };
            let schema = if index.table.eq_ignore_ascii_case(name) {
                // The view's own column: its rows as users see them.
                Arc::clone(&incremental.schema)
            } else {
                let table = self
                    .tables
                    .get(&index.table)
                    .ok_or_else(|| refused(format!("`{}` is neither a table nor the view `{name}`", index.table)))?;
                Arc::clone(&table.schema)
            };
            let field = schema.fields().iter().find(|f| f.name().eq_ignore_ascii_case(&index.column));
            match field {
                None => return Err(refused(format!("`{}` has no column `{}`", index.table, index.column))),
                Some(f) if !f.data_type().is_numeric() => {
                    return Err(refused(format!(
                        "`{}.{}` is {}; an outlier index is on a numeric column",
                        index.table,
                        index.column,
                        f.data_type()
                    )))
                }
                Some(_) => {}
            }
        }
        Sampling::plan(options, outliers, name, incremental, &Sources { db: self, since: 0, planning: true })
            .map_err(refused)
    }

    /// The edit that brings `contents` (a view's stored rows, or its sample's) up to date
    /// from the tables' changes since statement `since` with `incremental` (see
    /// [`maintain`]); `sampled`: the change sampled at the root first.
    pub(crate) fn maintained_edit(
        &self,
        contents: &Table,
        since: u64,
        incremental: &maintain::Incremental,
        sampled: Option<&Sampling>,
    ) -> Result<Edit> {
        let sources = Sources { db: self, since, planning: false };
        let Some(mut change) = incremental.change(&sources).map_err(TesseraError::Internal)? else {
            return Ok(Edit::default());
        };
        if let Some(sampling) = sampled {
            change = sampling.sample_stored(change).map_err(TesseraError::Internal)?;
        }
        let (schema, change) = self.run_plan(change)?;
        let ctx = self.plain_context()?;
        register_batches(&ctx, "__change", schema, change)?;
        register(&ctx, "__stored", contents, true)?;
        let (_, merged) = self.run(&ctx, parse_one(&incremental.merge_query())?)?;
        let width = contents.schema.fields().len();
        let mut edit = Edit::default();
        let mut inserted = Vec::new();
        let mut dirty = Vec::new();
        for batch in merged {
            let insert = batch.column(width).as_boolean();
            let again = batch.column(width + 1).as_boolean();
            let positions = batch.column(width + 2).as_primitive::<Int64Type>();
            edit.deleted.extend(positions.iter().flatten().map(table::position));
            let rows = contents.conform(batch.columns()[..width].to_vec())?;
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
                inserted.push(contents.conform(batch.columns().to_vec())?);
            }
        }
        edit.inserted = Some(arrow::compute::concat_batches(&contents.schema, &inserted)?);
        Ok(edit)
    }

    pub(crate) fn create_view(&mut self, create: &ast::CreateView) -> Result<Outcome> {
        let Some((name, key)) = self.new_name(&create.name, create.if_not_exists)? else { return Ok(Outcome::Done) };
        if self.reads_a_stream(&create.query) {
            return Err(TesseraError::Plan(format!(
                "materialized view `{name}` reads a stream: its changes are not recorded; insert the window \
                 query's rows into a table (INSERT INTO t SELECT ... FROM TUMBLE(...)) and define the view over it"
            )));
        }
        let options = match &create.options {
            ast::CreateTableOptions::None => Vec::new(),
            ast::CreateTableOptions::With(options) => options.iter().map(key_value).collect::<Result<Vec<_>>>()?,
            other => {
                return Err(TesseraError::Plan(format!("view options `{other}` are not supported: use WITH (...)")))
            }
        };
        let (sample_options, outliers) = sample::parse_options(&options)
            .map_err(|m| TesseraError::Plan(format!("materialized view `{name}`: {m}")))?;
        let (mut view, rows) = self.compute_view(&name, &create.query)?;
        if let Some(options) = sample_options {
            view.sample = Some(Sample {
                sampling: self.plan_sampling(&name, &create.query, &view.maintenance, options, outliers)?,
                contents: Table::new(
                    &name,
                    view.contents.schema.fields().iter().map(|f| f.as_ref().clone()).collect(),
                    &[],
                )?,
                cleaned_at: view.refreshed_at,
                outlier_base: None,
                outlier_rows: None,
                stale_rows: std::sync::OnceLock::new(),
            });
        }
        self.save_view(key, view, Edit { inserted: Some(rows), ..Edit::default() })?;
        Ok(Outcome::Done)
    }

    /// `REFRESH MATERIALIZED VIEW name [SAMPLE]`: the view brought up to date from the tables as
    /// they are, or only its sample (an error if it has none).
    pub(crate) fn refresh(&mut self, name: &ast::ObjectName, sample: bool) -> Result<Outcome> {
        let key = self.existing_view(name)?;
        if !sample {
            return self.refresh_view(&key);
        }
        match self.views.get(&key) {
            Some(view) if view.sample.is_none() => Err(TesseraError::Plan(format!(
                "materialized view `{name}` has no sample: create it WITH (sample = m)"
            ))),
            _ => self.clean_sample(&key).map(|rows| Outcome::Changed { rows }),
        }
    }

    /// Refreshes the views `query` reads (`SET freshness = 'exact'`).
    pub(crate) fn refresh_views_read_by(&mut self, query: &ast::Query) -> Result<()> {
        for name in self.references(query)? {
            if self.views.contains_key(&name) {
                self.refresh_view(&name)?;
            }
        }
        Ok(())
    }

    /// Refreshes view `key`, after the views it reads (so a view over a view is maintained
    /// from its input's fresh contents and their change).
    pub(crate) fn refresh_view(&mut self, key: &str) -> Result<Outcome> {
        let view = self.views.get(key).ok_or_else(|| TesseraError::Internal("no view".into()))?;
        self.refresh_views_read_by(&view.query.clone())?;
        let key = key.to_string();
        let view = &self.views[&key];
        let edit = match &view.maintenance {
            maintain::Maintenance::Incremental(incremental) => {
                self.maintained_edit(&view.contents, view.refreshed_at, incremental, None)?
            }
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
    pub(crate) fn explain_refresh(&self, name: &ast::ObjectName) -> Result<Outcome> {
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
                    let optimized = self.plain_context()?.state().optimize(&change)?;
                    items.push(("change plan".into(), optimized.display_indent().to_string()));
                    items.push(("merge query".into(), incremental.merge_query()));
                }
                if let Some(sample) = &view.sample {
                    let options = sample.sampling.options;
                    let seed = options.seed.map_or(String::new(), |s| format!(", seed {s}"));
                    items.push((
                        "sample".into(),
                        format!(
                            "ratio {}{seed}: {} rows, clean as of statement {}",
                            options.ratio,
                            sample.contents.rows(),
                            sample.cleaned_at
                        ),
                    ));
                    items.push(("sample key".into(), sample.sampling.key.clone()));
                    items.push(("sample hash".into(), sample.sampling.trace.join("\n")));
                    if let Some(index) = &sample.sampling.outliers {
                        let how = match index.indexed {
                            Indexed::Table { .. } => {
                                format!("pushed up to the view by the sample's key at `{}`", index.options.table)
                            }
                            Indexed::View => "the view's own rows, ranked as of its refresh".to_string(),
                        };
                        items.push((
                            "outlier index".into(),
                            format!(
                                "{}: {how}; its rows recomputed from the tables at each cleaning of the sample",
                                index.options.describe()
                            ),
                        ));
                    }
                    let sources = Sources { db: self, since: sample.cleaned_at, planning: false };
                    if let Some(mut change) =
                        sample.sampling.cleaning.change(&sources).map_err(TesseraError::Internal)?
                    {
                        if sample.sampling.sampled_at_root() {
                            change = sample.sampling.sample_stored(change).map_err(TesseraError::Internal)?;
                        }
                        let optimized = self.plain_context()?.state().optimize(&change)?;
                        items.push(("cleaning plan".into(), optimized.display_indent().to_string()));
                    }
                }
            }
        }
        crate::items_outcome(items)
    }

    /// A view named `name`, empty, and the rows of `query` now, which it is to hold.
    pub(crate) fn compute_view(&self, name: &str, query: &ast::Query) -> Result<(View, RecordBatch)> {
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
        Ok((
            View { query: query.clone(), maintenance, contents, refreshed_at: self.manifest.sequence, sample: None },
            rows,
        ))
    }

    /// Applies `edit` to the contents of `view` (its sample taken again from them) and
    /// replaces the manifest with it in.
    pub(crate) fn save_view(&mut self, key: String, mut view: View, edit: Edit) -> Result<()> {
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        view.contents.check(&edit, &HeldKeys::default())?;
        view.contents.apply(edit, manifest.sequence, &mut self.storage, &mut manifest)?;
        if let Some(sample) = &mut view.sample {
            // The sample of fresh contents is clean.
            let stored = stored_scan(&view.contents)?;
            let sampled = sample.sampling.sample_stored(stored).map_err(TesseraError::Internal)?;
            let rows = self.run_plan(sampled)?.1;
            let rows =
                rows.iter().map(|b| sample.contents.conform(b.columns().to_vec())).collect::<Result<Vec<_>>>()?;
            let inserted = arrow::compute::concat_batches(&sample.contents.schema, &rows)?;
            sample.stale_rows = std::sync::OnceLock::from(vec![inserted.clone()]);
            let edit = Edit { deleted: sample.contents.positions(), inserted: Some(inserted) };
            sample.contents.apply(edit, manifest.sequence, &mut self.storage, &mut manifest)?;
            sample.contents.forget_changes_through(u64::MAX);
            sample.cleaned_at = view.refreshed_at;
            sample.outlier_base =
                self.outlier_base(&sample.sampling, &view.contents, &view.maintenance, view.refreshed_at)?;
            if let Some(base) = &mut sample.outlier_base {
                let hashes = arrow::array::Int64Array::from(base.hashes.clone());
                let batch = RecordBatch::try_new(OutlierBase::schema(), vec![Arc::new(hashes)])?;
                base.file = Some(self.storage.write(&mut manifest, &batch)?);
            }
            sample.outlier_rows = None;
        }
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
                sample: view.sample.as_ref().map(Sample::entry),
            },
        );
        self.storage.commit(&self.manifest, &manifest)?;
        self.manifest = manifest;
        self.views.insert(key, view);
        Ok(())
    }

    pub(crate) fn drop_views(&mut self, names: &[ast::ObjectName], if_exists: bool) -> Result<Outcome> {
        let mut keys = Vec::new();
        for name in names {
            match self.existing_view(name) {
                Ok(key) => keys.push(key),
                // IF EXISTS passes over a name that is nothing, not over a table or a source.
                Err(_) if if_exists && !self.exists(&object_name(name)?.to_lowercase()) => {}
                Err(e) => return Err(e),
            }
        }
        self.refuse_dropping_what_views_read(&keys)?;
        self.remove(&[], &keys)
    }

    /// An error if a view other than those of `dropped` reads one of them.
    pub(crate) fn refuse_dropping_what_views_read(&self, dropped: &[String]) -> Result<()> {
        for (name, view) in self.views.iter().filter(|(name, _)| !dropped.contains(name)) {
            if let Some(read) = self.references(&view.query)?.into_iter().find(|r| dropped.contains(r)) {
                return Err(TesseraError::Plan(format!(
                    "materialized view `{name}` reads `{read}`: drop the view first"
                )));
            }
        }
        Ok(())
    }
}
