//! The samples of materialized views: the rows of a view's clean or stale sample, its outlier
//! index (picked at a refresh, kept clean with the changes since), and cleaning a sample before
//! a query estimates from it.

use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::{Float64Type, Int64Type};
use datafusion::common::Column;
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{col, lit, Expr, LogicalPlan, LogicalPlanBuilder};
use tessera::error::{Result, TesseraError};

use super::{rows_scan, stored_scan, OutlierBase, OutlierRows, Sample, Sources, View};
use crate::sample::{Indexed, Sampling};
use crate::table::{Edit, HeldKeys, Table};
use crate::{maintain, mem_table, storage, Database};

impl Database {
    /// The rows users see of the clean sample of `view`, or of its stale sample (its stored
    /// rows sampled), with the sample key's columns after them as `__key0` ... and whether the
    /// row is an outlier, `__outlier`. With the outlier index's keys `outliers` (their
    /// hashes and clean rows), the rows of those keys are all there, clean or stale, and no
    /// others of them.
    pub(crate) fn sample_plan(
        &self,
        view: &View,
        sample: &Sample,
        stale: bool,
        outliers: Option<&OutlierRows>,
    ) -> Result<LogicalPlan> {
        let contents = if stale { &view.contents } else { &sample.contents };
        let internal = TesseraError::Internal;
        let mut plan = if stale {
            // The view's rows are read (and their deleted rows filtered out) only when the stale
            // sample is not kept yet.
            let rows = match sample.stale_rows.get() {
                Some(rows) => rows.clone(),
                None => {
                    let sampled = sample.sampling.sample_stored(stored_scan(contents)?).map_err(internal)?;
                    let rows = self.run_plan(sampled)?.1;
                    sample.stale_rows.get_or_init(|| rows).clone()
                }
            };
            rows_scan(&contents.schema, rows)?
        } else {
            stored_scan(contents)?
        };
        let maintain::Maintenance::Incremental(incremental) = &view.maintenance else {
            return Err(TesseraError::Internal("a sampled view is maintained incrementally".into()));
        };
        let flag = match outliers {
            None => lit(false),
            Some(OutlierRows { hashes, clean, stale: stale_rows, .. }) => {
                let among = sample.sampling.stored_among(plan.schema(), hashes).map_err(internal)?;
                // The sample's rows of other keys, and the outliers' rows, stale or clean.
                let regular = LogicalPlanBuilder::from(plan).filter(!among.clone())?.build()?;
                let rows = if stale { stale_rows } else { clean };
                let table = mem_table(Arc::clone(&contents.schema), rows.clone())?;
                let outlier_rows = LogicalPlanBuilder::scan("__outliers", provider_as_source(table), None)?.build()?;
                plan = LogicalPlanBuilder::from(regular).union(outlier_rows)?.build()?;
                sample.sampling.stored_among(plan.schema(), hashes).map_err(internal)?
            }
        };
        let keys = sample.sampling.key_columns.iter().enumerate();
        let mut extra: Vec<Expr> =
            keys.map(|(i, k)| col(Column::new_unqualified(k)).alias(format!("__key{i}"))).collect();
        extra.push(flag.alias("__outlier"));
        incremental.visible_with(plan, extra).map_err(TesseraError::Internal)
    }

    /// The hashes and values of the rows of `rows` (the indexed table's) the outlier index of
    /// `sampling` picks (see [`Sampling::outlier_rows_plan`]), largest first.
    fn pick_outliers(
        &self,
        sampling: &Sampling,
        rows: LogicalPlan,
        top: bool,
        at_least: Option<f64>,
    ) -> Result<(Vec<i64>, Vec<f64>)> {
        let plan = sampling.outlier_rows_plan(rows, top, at_least).map_err(TesseraError::Internal)?;
        let Some(plan) = plan else { return Ok((Vec::new(), Vec::new())) };
        let (_, batches) = self.run_plan(plan)?;
        let hashes = batches.iter().flat_map(|b| b.column(0).as_primitive::<Int64Type>().iter().flatten());
        let values = batches.iter().flat_map(|b| b.column(1).as_primitive::<Float64Type>().iter().flatten());
        Ok((hashes.collect(), values.collect()))
    }

    /// The outlier index's start for a view refreshed at `refreshed_at` whose sample is
    /// `sampling`: the rows its rule picks among the indexed table's rows now, or among the
    /// view's `contents` (as of its refresh) for an index on its own column (`None` without an
    /// index).
    pub(super) fn outlier_base(
        &self,
        sampling: &Sampling,
        contents: &Table,
        maintenance: &maintain::Maintenance,
        refreshed_at: u64,
    ) -> Result<Option<OutlierBase>> {
        let Some(index) = &sampling.outliers else { return Ok(None) };
        let internal = TesseraError::Internal;
        let rows = match &index.indexed {
            Indexed::Table { .. } => {
                let sources = Sources { db: self, since: refreshed_at, planning: false };
                maintain::Relations::scan(&sources, &index.options.table, maintain::Version::New).map_err(internal)?
            }
            Indexed::View => {
                let maintain::Maintenance::Incremental(incremental) = maintenance else {
                    return Err(internal("a sampled view is maintained incrementally".into()));
                };
                sampling.view_ranked(stored_scan(contents)?, incremental).map_err(internal)?
            }
        };
        let (hashes, values) = self.pick_outliers(sampling, rows, true, None)?;
        let at_least = match index.options.k {
            Some(k) if values.len() as u64 >= k => values.last().copied(),
            _ => None,
        };
        Ok(Some(OutlierBase { refreshed_at, hashes, at_least, file: None }))
    }

    /// Computes the rows of the outlier index of view `key`'s clean sample, unless they are as
    /// of its cleaning already (or it has no index). Its keys are those of the rows picked at
    /// the view's refresh ([`OutlierBase`]) and of the indexed table's rows inserted, deleted
    /// or replaced since that reach its bar, so that an outlier's change is counted exactly;
    /// their rows are the stale view's brought up to date by the view's maintenance with the
    /// filter on their hashes pushed down where the sample's hash goes: from the changes, not
    /// a scan of the tables.
    fn clean_outliers(&mut self, key: &str) -> Result<()> {
        let view = self.views.get(key).ok_or_else(|| TesseraError::Internal("no view".into()))?;
        let Some(sample) = &view.sample else { return Ok(()) };
        let Some(index) = &sample.sampling.outliers else { return Ok(()) };
        // As of the sample's cleaning: the tables have not changed since.
        let at = sample.cleaned_at;
        if sample.outlier_rows.as_ref().is_some_and(|rows| rows.at == at) {
            return Ok(());
        }
        let internal = TesseraError::Internal;
        let picked_anew = match &sample.outlier_base {
            Some(base) if base.refreshed_at == view.refreshed_at => None,
            _ => self.outlier_base(&sample.sampling, &view.contents, &view.maintenance, view.refreshed_at)?,
        };
        let base = picked_anew.as_ref().or(sample.outlier_base.as_ref()).expect("an index has a start");
        let since = Sources { db: self, since: view.refreshed_at, planning: false };
        let mut hashes = base.hashes.clone();
        if let Indexed::Table { .. } = index.indexed {
            let delta =
                maintain::Relations::scan(&since, &index.options.table, maintain::Version::Delta).map_err(internal)?;
            hashes.extend(self.pick_outliers(&sample.sampling, delta, false, base.at_least)?.0);
        }
        hashes.sort_unstable();
        hashes.dedup();
        // The stale view's rows of those keys, cleaned as a table of their own.
        let stored = stored_scan(&view.contents)?;
        let among = sample.sampling.stored_among(stored.schema(), &hashes).map_err(internal)?;
        let (_, stale) = self.run_plan(LogicalPlanBuilder::from(stored).filter(among)?.build()?)?;
        let fields = view.contents.schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut rows = Table::new(&view.contents.name, fields, &[])?;
        let (mut scratch, mut manifest) = (storage::Storage::memory(), storage::new_manifest());
        let stale = stale.iter().map(|b| rows.conform(b.columns().to_vec())).collect::<Result<Vec<_>>>()?;
        let stale_rows = arrow::compute::concat_batches(&rows.schema, &stale)?;
        rows.apply(Edit { deleted: Vec::new(), inserted: Some(stale_rows.clone()) }, 1, &mut scratch, &mut manifest)?;
        let maintain::Maintenance::Incremental(incremental) = &view.maintenance else {
            return Err(TesseraError::Internal("a sampled view is maintained incrementally".into()));
        };
        // Planned over no rows: planning checks the maintenance plan, and over the tables it
        // would copy every table with deletions.
        let planning = Sources { planning: true, ..since };
        let cleaning = sample.sampling.outliers_cleaning(incremental, &hashes, &planning).map_err(internal)?;
        let edit = self.maintained_edit(&rows, view.refreshed_at, &cleaning, None)?;
        rows.check(&edit, &HeldKeys::default())?;
        rows.apply(edit, 2, &mut scratch, &mut manifest)?;
        let clean = rows.batches()?;
        let sample = self.views.get_mut(key).and_then(|v| v.sample.as_mut()).expect("the view has a sample");
        if picked_anew.is_some() {
            sample.outlier_base = picked_anew;
        }
        sample.outlier_rows = Some(OutlierRows { at, hashes, clean, stale: vec![stale_rows] });
        Ok(())
    }

    /// Cleans the sample of view `key` from the changes since it was last cleaned, if any
    /// (the cleaning expression, [`sample`]): the rows of sampled keys brought up to date,
    /// the view's other rows left stale; and its outlier index's rows. The number of sample
    /// rows it edited.
    pub(crate) fn clean_sample(&mut self, key: &str) -> Result<u64> {
        let edited = self.clean_sample_rows(key)?;
        self.clean_outliers(key)?;
        Ok(edited)
    }

    /// The sample's rows of [`Database::clean_sample`]: the number it edited.
    fn clean_sample_rows(&mut self, key: &str) -> Result<u64> {
        let view = self.views.get(key).ok_or_else(|| TesseraError::Internal("no view".into()))?;
        let Some(sample) = &view.sample else { return Ok(0) };
        let sources = Sources { db: self, since: sample.cleaned_at, planning: false };
        if !sample.sampling.cleaning.tables.iter().any(|t| maintain::Relations::changed(&sources, t)) {
            // Clean already: nothing to write.
            return Ok(0);
        }
        let sampled = sample.sampling.sampled_at_root().then_some(&sample.sampling);
        let edit = self.maintained_edit(&sample.contents, sample.cleaned_at, &sample.sampling.cleaning, sampled)?;
        let count = (edit.deleted.len() + edit.inserted.as_ref().map_or(0, |r| r.num_rows())) as u64;
        let cleaned_at = self.manifest.sequence;
        let mut manifest = self.manifest.clone();
        manifest.sequence += 1;
        let view = self.views.get_mut(key).expect("the view exists");
        let sample = view.sample.as_mut().expect("the view has a sample");
        sample.contents.check(&edit, &HeldKeys::default())?;
        sample.contents.apply(edit, manifest.sequence, &mut self.storage, &mut manifest)?;
        sample.contents.forget_changes_through(u64::MAX);
        sample.cleaned_at = cleaned_at;
        if let Some(entry) = manifest.views.get_mut(key) {
            entry.sample = Some(sample.entry());
        }
        self.storage.commit(&self.manifest, &manifest)?;
        self.manifest = manifest;
        Ok(count)
    }
}
