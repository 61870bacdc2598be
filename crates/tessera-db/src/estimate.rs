//! How fresh the answers of queries over materialized views are (`SET freshness`): the stale
//! contents (`stale`, the default), the views refreshed first (`exact`), or estimates of the
//! fresh answer with confidence intervals at `SET confidence` from the view's cleaned sample
//! (`svc_aqp`, `svc_corr`, `auto`; Stale View Cleaning, Section 5). Here: what a query asks, the
//! rows of the samples it reads, and its answer put together; the estimators are
//! [`crate::estimator`]'s.

pub use tessera::settings::{Freshness, Settings};

use hashbrown::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef};
use arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Column;
use datafusion::datasource::ViewTable;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{col, lit, Aggregate, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion_sql::sqlparser::ast;
use tessera::error::{Result, TesseraError};

use crate::estimator::{normal_quantile, Estimate, Estimator, Kind, SampleRows};
use crate::{Database, Outcome};

/// What an estimated query computes: its aggregates and the columns it returns.
struct Shape {
    kinds: Vec<Kind>,
    groups: usize,
    /// The columns of the answer, by name: a group column or an aggregate.
    outputs: Vec<(String, Output)>,
    /// The condition of HAVING on the aggregate's columns, applied to the estimates.
    having: Option<Expr>,
}

#[derive(Debug, Clone, Copy)]
enum Output {
    Group(usize),
    Aggregate(usize),
}

fn refused(why: impl std::fmt::Display) -> TesseraError {
    TesseraError::Plan(format!("cannot estimate this query from the view's sample: {why}"))
}

/// The parts of `plan` (a query over one view) an estimate needs: its shape, the aggregate,
/// the conditions on the view's rows and the view's scan below them.
fn analyze(plan: &LogicalPlan) -> Result<(Shape, &Aggregate, Vec<Expr>, &LogicalPlan)> {
    let plan = below_order(plan).0;
    let (projection, rest) = match plan {
        LogicalPlan::Projection(p) => (Some(p), p.input.as_ref()),
        other => (None, other),
    };
    let (having, rest) = match rest {
        LogicalPlan::Filter(filter) => (Some(filter.predicate.clone()), filter.input.as_ref()),
        other => (None, other),
    };
    let LogicalPlan::Aggregate(aggregate) = rest else {
        return Err(refused(
            "an estimate is of SELECT [group columns,] aggregates FROM view [WHERE ...] [GROUP BY ...] [HAVING ...]",
        ));
    };
    let mut predicates = Vec::new();
    let mut input = aggregate.input.as_ref();
    while let LogicalPlan::Filter(filter) = input {
        predicates.push(filter.predicate.clone());
        input = filter.input.as_ref();
    }
    // The view, inlined by DataFusion under its name, or scanned.
    if !matches!(input, LogicalPlan::SubqueryAlias(_) | LogicalPlan::TableScan(_)) {
        return Err(refused("it reads more than the view's rows, or reads them through a subquery"));
    }
    let mut kinds = Vec::new();
    for expr in &aggregate.aggr_expr {
        let Expr::AggregateFunction(AggregateFunction { func, params }) = expr.clone().unalias_nested().data else {
            return Err(refused(format!("`{expr}` is not an aggregate")));
        };
        if params.distinct || params.filter.is_some() {
            return Err(refused(format!("`{expr}` has DISTINCT or FILTER")));
        }
        let percentile = |p: &Expr| match p.clone().unalias_nested().data {
            Expr::Literal(value, _) => match value.cast_to(&DataType::Float64) {
                Ok(datafusion::common::ScalarValue::Float64(Some(p))) if (0.0..=1.0).contains(&p) => Ok(p),
                _ => Err(refused(format!("`{expr}`: the percentile is a number in [0, 1]"))),
            },
            _ => Err(refused(format!("`{expr}`: the percentile is a constant"))),
        };
        let name = func.name().to_ascii_lowercase();
        let ordered = !params.order_by.is_empty();
        kinds.push(match (name.as_str(), params.args.as_slice(), ordered) {
            ("count", [_], false) => Kind::Count,
            ("sum", [_], false) => Kind::Sum,
            ("avg" | "mean", [_], false) => Kind::Avg,
            ("min", [_], false) => Kind::Min,
            ("max", [_], false) => Kind::Max,
            ("median" | "approx_median", [_], false) => Kind::Quantile(0.5),
            ("percentile_cont" | "approx_percentile_cont", [_, p], _) => Kind::Quantile(percentile(p)?),
            _ => {
                return Err(refused(format!(
                    "`{expr}`: SUM, COUNT, AVG, MIN, MAX, MEDIAN and PERCENTILE_CONT (or APPROX_) of one column are estimated"
                )))
            }
        });
    }
    let groups = aggregate.group_expr.len();
    let output_of =
        |index: usize| if index < groups { Output::Group(index) } else { Output::Aggregate(index - groups) };
    let outputs = match projection {
        Some(p) => p
            .expr
            .iter()
            .zip(p.schema.fields())
            .map(|(e, field)| match e.clone().unalias_nested().data {
                Expr::Column(c) => aggregate
                    .schema
                    .index_of_column(&c)
                    .map(|i| (field.name().clone(), output_of(i)))
                    .map_err(|_| refused(format!("`{e}` is not a column of the aggregate"))),
                _ => Err(refused(format!(
                    "`{e}` is computed from aggregates; the columns of an estimate are group columns and aggregates"
                ))),
            })
            .collect::<Result<Vec<_>>>()?,
        None => aggregate.schema.fields().iter().enumerate().map(|(i, f)| (f.name().clone(), output_of(i))).collect(),
    };
    Ok((Shape { kinds, groups, outputs, having }, aggregate, predicates, input))
}

/// The plan below the ORDER BY and LIMIT at the top of `plan`, and those (outermost first).
fn below_order(plan: &LogicalPlan) -> (&LogicalPlan, Vec<&LogicalPlan>) {
    let mut order = Vec::new();
    let mut plan = plan;
    while let LogicalPlan::Sort(_) | LogicalPlan::Limit(_) = plan {
        order.push(plan);
        plan = plan.inputs()[0];
    }
    (plan, order)
}

/// `answer` ordered and limited as the query's `order` (its ORDER BY and LIMIT, outermost
/// first) says; their columns are the answer's, by name.
fn ordered(db: &Database, answer: RecordBatch, order: &[&LogicalPlan]) -> Result<RecordBatch> {
    if order.is_empty() {
        return Ok(answer);
    }
    let schema = answer.schema();
    let mut plan = LogicalPlanBuilder::scan(
        "__estimate",
        datafusion::datasource::provider_as_source(crate::mem_table(Arc::clone(&schema), vec![answer])?),
        None,
    )?
    .build()?;
    for node in order.iter().rev() {
        let exprs = node
            .expressions()
            .into_iter()
            .map(|e| {
                e.transform(|e| match &e {
                    Expr::Column(c) => Ok(Transformed::yes(Expr::Column(Column::new_unqualified(&c.name)))),
                    _ => Ok(Transformed::no(e)),
                })
                .map(|t| t.data)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        plan = node.with_new_exprs(exprs, vec![plan]).map_err(|e| refused(format!("its ORDER BY: {e}")))?;
    }
    let (_, batches) = db.run_plan(plan)?;
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// Which estimator answered, and why.
pub(crate) struct Chosen {
    pub freshness: Freshness,
    pub why: String,
}

impl Database {
    /// The answer of `query` (over one sampled view) estimated at the session's freshness,
    /// the sample cleaned first; and which estimator answered.
    pub(crate) fn estimate(&mut self, query: &ast::Query) -> Result<(SchemaRef, Vec<RecordBatch>, Chosen)> {
        let key = self.sampled_view_read_by(query)?;
        self.clean_sample(&key)?;
        let statement = ast::Statement::Query(Box::new(query.clone()));
        // The stale answer, from the whole view.
        let ctx = self.context(&[&statement], None)?;
        let plan = self.plan_statement(&ctx, &statement)?;
        let (shape, aggregate, _, _) = analyze(&plan)?;
        let (_, answer) = self.run_plan(exact_quantiles(aggregate)?)?;
        let group_types: Vec<DataType> =
            aggregate.schema.fields().iter().take(shape.groups).map(|f| f.data_type().clone()).collect();
        let converter = group_converter(&group_types)?;
        let mut stale: HashMap<OwnedRow, Vec<Option<f64>>> = HashMap::new();
        for batch in &answer {
            let groups = group_rows(&converter, &batch.columns()[..shape.groups], batch.num_rows())?;
            let values = batch.columns()[shape.groups..]
                .iter()
                .map(|a| arrow::compute::cast(a, &DataType::Float64))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            for (row, g) in groups.into_iter().enumerate() {
                let value = |a: &ArrayRef| a.is_valid(row).then(|| a.as_primitive::<Float64Type>().value(row));
                stale.insert(g, values.iter().map(value).collect());
            }
        }
        // The clean and the stale sample.
        let view = &self.views[&key];
        let sample = view.sample.as_ref().expect("a sampled view");
        let mut samples = Vec::new();
        for stale in [false, true] {
            let ctx = self.plain_context()?;
            let rows = self.sample_plan(view, sample, stale, sample.outlier_rows.as_ref())?;
            ctx.register_table(key.as_str(), Arc::new(ViewTable::new(rows, None)))?;
            let plan = self.plan_statement(&ctx, &statement)?;
            let (_, aggregate, predicates, input) = analyze(&plan)?;
            samples.push(self.sample_rows(&converter, &shape, aggregate, predicates, input, &sample.sampling)?);
        }
        let confidence = self.settings.confidence;
        let whole = sample.sampling.options.ratio >= 1.0;
        let estimator = Estimator { kinds: &shape.kinds, confidence, whole, clean: &samples[0], stale: &samples[1] };
        let corr = estimator.corr(&stale);
        let aqp = estimator.aqp_per_group(stale.keys());
        let chosen = match self.settings.freshness {
            Freshness::Auto => {
                let (corr_score, aqp_score) = (relative_variance(&corr, &aqp), relative_variance(&aqp, &aqp));
                // Without a variance to tell them apart (MIN, MAX and quantiles have none), the
                // clean sample's values, which assume nothing of the changes not sampled.
                let freshness = if corr_score < aqp_score { Freshness::SvcCorr } else { Freshness::SvcAqp };
                let why = match corr_score == aqp_score {
                    true => format!(
                        "auto chose {}: no variance tells the estimators apart (MIN, MAX and quantiles have none), so \
                         the clean sample's values",
                        freshness.name()
                    ),
                    false => format!(
                        "auto chose {}: summed relative variance {corr_score:.3e} with the correction, {aqp_score:.3e} \
                         from the clean sample alone",
                        freshness.name()
                    ),
                };
                Chosen { freshness, why }
            }
            freshness => Chosen { freshness, why: format!("freshness = '{}'", freshness.name()) },
        };
        let estimates = if chosen.freshness == Freshness::SvcCorr { corr } else { aqp };
        let estimates = self.having(&shape, aggregate, &converter, estimates)?;
        let z = normal_quantile(0.5 + self.settings.confidence / 2.0);
        let (schema, batch) = answer_batch(&shape, &converter, &group_types, estimates, z)?;
        let batch = ordered(self, batch, &below_order(&plan).1)?;
        Ok((schema, vec![batch], chosen))
    }

    /// Whether `query` is answered by an estimate: the freshness says so and it reads a view.
    pub(crate) fn estimates(&self, query: &ast::Query) -> Result<bool> {
        Ok(self.settings.freshness.estimates() && self.references(query)?.iter().any(|n| self.views.contains_key(n)))
    }

    /// `EXPLAIN` of an estimated query: the estimator that answers and why, the sample, its
    /// key and where its hash was pushed, and the queries run over the view and the samples.
    pub(crate) fn explain_estimate(&mut self, query: &ast::Query) -> Result<Outcome> {
        let (_, _, chosen) = self.estimate(query)?;
        let key = self.sampled_view_read_by(query)?;
        let view = &self.views[&key];
        let sample = view.sample.as_ref().expect("a sampled view");
        let options = sample.sampling.options;
        let statement = ast::Statement::Query(Box::new(query.clone()));
        let ctx = self.context(&[&statement], None)?;
        let plan = self.plan_statement(&ctx, &statement)?;
        let items = vec![
            ("estimator".to_string(), format!("{}: {}", chosen.freshness.name(), chosen.why)),
            (
                "interval".to_string(),
                format!(
                    "{:.0}% confidence: CLT over the sampled keys, Bernoulli sampling of ratio {} (SUM and COUNT as \
                     Horvitz-Thompson sums, AVG linearized); quantiles by the bootstrap, 400 resamples; MIN and MAX \
                     bounded by the extreme seen (a fresh value) on one side, by nothing on the other (NULL)",
                    self.settings.confidence * 100.0,
                    options.ratio
                ),
            ),
            ("view".to_string(), key.clone()),
            (
                "sample".to_string(),
                format!(
                    "ratio {}: {} rows, clean as of statement {}",
                    options.ratio,
                    sample.contents.rows(),
                    sample.cleaned_at
                ),
            ),
            ("sample key".to_string(), sample.sampling.key.clone()),
            ("sample hash".to_string(), sample.sampling.trace.join("\n")),
        ];
        let mut items = items;
        if let (Some(index), Some(rows)) = (&sample.sampling.outliers, &sample.outlier_rows) {
            items.push((
                "outlier index".to_string(),
                format!(
                    "{}: {} keys of the view, kept whole and counted exactly (weight 1), the sample's other keys \
                     weighted 1/{}",
                    index.options.describe(),
                    rows.hashes.len(),
                    options.ratio
                ),
            ));
        }
        items.push(("stale answer".to_string(), plan.display_indent().to_string()));
        crate::items_outcome(items)
    }

    /// The view `query` reads, which must be all it reads and have a sample.
    fn sampled_view_read_by(&self, query: &ast::Query) -> Result<String> {
        let names = self.references(query)?;
        let freshness = self.settings.freshness.name();
        match names.as_slice() {
            [name] if self.views.contains_key(name) => {
                if self.views[name].sample.is_none() {
                    return Err(TesseraError::Plan(format!(
                        "freshness = '{freshness}' estimates from a view's sample, and materialized view `{name}` has \
                         none: create it WITH (sample = m), or SET freshness = 'stale' or 'exact'"
                    )));
                }
                Ok(name.clone())
            }
            _ => Err(refused(format!(
                "freshness = '{freshness}' estimates queries over one sampled view; this one reads {}",
                if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
            ))),
        }
    }

    /// The rows of one sample an estimate reads (see [`SampleRows`]).
    fn sample_rows(
        &self,
        converter: &RowConverter,
        shape: &Shape,
        aggregate: &Aggregate,
        predicates: Vec<Expr>,
        input: &LogicalPlan,
        sampling: &crate::sample::Sampling,
    ) -> Result<SampleRows> {
        let (keys, m) = (sampling.key_columns.len(), sampling.options.ratio);
        let mut exprs: Vec<Expr> = (0..keys).map(|i| col(format!("__key{i}"))).collect();
        exprs.extend(aggregate.group_expr.iter().enumerate().map(|(i, g)| g.clone().alias(format!("__grp{i}"))));
        let cond = predicates.into_iter().reduce(Expr::and).unwrap_or(lit(true));
        exprs.push(cond.alias("__cond"));
        for (j, expr) in aggregate.aggr_expr.iter().enumerate() {
            let Expr::AggregateFunction(AggregateFunction { params, .. }) = expr.clone().unalias_nested().data else {
                return Err(TesseraError::Internal("an analyzed aggregate".into()));
            };
            exprs.push(params.args[0].clone().alias(format!("__arg{j}")));
        }
        exprs.push(col("__outlier"));
        let plan = LogicalPlanBuilder::from(input.clone()).project(exprs)?.build()?;
        let (_, batches) = self.run_plan(plan)?;
        let key_converter = match batches.first() {
            Some(b) => {
                RowConverter::new(b.columns()[..keys].iter().map(|c| SortField::new(c.data_type().clone())).collect())?
            }
            None => RowConverter::new(Vec::new())?,
        };
        let n = shape.kinds.len();
        let mut rows = SampleRows {
            keys: Vec::new(),
            groups: Vec::new(),
            y: vec![Vec::new(); n],
            c: vec![Vec::new(); n],
            w: Vec::new(),
            v: Vec::new(),
            whole: Vec::new(),
        };
        for batch in &batches {
            let k = key_converter.convert_columns(&batch.columns()[..keys])?;
            rows.keys.extend(k.iter().map(|r| r.owned()));
            rows.groups.extend(group_rows(converter, &batch.columns()[keys..keys + shape.groups], batch.num_rows())?);
            let cond = batch.column(keys + shape.groups).as_boolean();
            let outlier = batch.column(keys + shape.groups + 1 + n).as_boolean();
            for row in 0..batch.num_rows() {
                let whole = outlier.is_valid(row) && outlier.value(row);
                rows.w.push(if whole { 1.0 } else { 1.0 / m });
                rows.v.push(if whole { 0.0 } else { (1.0 - m) / (m * m) });
                rows.whole.push(whole);
            }
            for (j, kind) in shape.kinds.iter().enumerate() {
                let arg = batch.column(keys + shape.groups + 1 + j);
                let values = match kind {
                    Kind::Count => None,
                    _ => Some(arrow::compute::cast(arg, &DataType::Float64)?),
                };
                for row in 0..batch.num_rows() {
                    let counts = cond.is_valid(row) && cond.value(row) && arg.is_valid(row);
                    let y = match (&values, counts) {
                        (_, false) => 0.0,
                        (None, true) => 1.0,
                        (Some(v), true) => v.as_primitive::<Float64Type>().value(row),
                    };
                    rows.y[j].push(y);
                    rows.c[j].push(if counts { 1.0 } else { 0.0 });
                }
            }
        }
        Ok(rows)
    }

    /// The groups of `estimates` whose estimated values meet the query's HAVING (all of them
    /// without one); a value that could not be estimated meets no condition.
    fn having(
        &self,
        shape: &Shape,
        aggregate: &Aggregate,
        converter: &RowConverter,
        estimates: HashMap<OwnedRow, Vec<Estimate>>,
    ) -> Result<HashMap<OwnedRow, Vec<Estimate>>> {
        let Some(having) = &shape.having else { return Ok(estimates) };
        let groups: Vec<(OwnedRow, Vec<Estimate>)> = estimates.into_iter().collect();
        // The aggregate's columns as `__h0` ..: the groups', then the estimates.
        let mut fields = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        if shape.groups > 0 {
            let group_columns = converter.convert_rows(groups.iter().map(|(g, _)| g.row()))?;
            for (i, column) in group_columns.into_iter().enumerate() {
                fields.push(Field::new(format!("__h{i}"), column.data_type().clone(), true));
                columns.push(column);
            }
        }
        for j in 0..shape.kinds.len() {
            fields.push(Field::new(format!("__h{}", shape.groups + j), DataType::Float64, true));
            columns.push(Arc::new(groups.iter().map(|(_, e)| e[j].value).collect::<Float64Array>()));
        }
        fields.push(Field::new("__row", DataType::UInt64, false));
        columns.push(Arc::new(arrow::array::UInt64Array::from_iter_values(0..groups.len() as u64)));
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
        let condition = having
            .clone()
            .transform(|e| match &e {
                Expr::Column(c) => match aggregate.schema.index_of_column(c) {
                    Ok(i) => Ok(Transformed::yes(col(format!("__h{i}")))),
                    Err(error) => Err(error),
                },
                _ => Ok(Transformed::no(e)),
            })?
            .data;
        let scan = LogicalPlanBuilder::scan(
            "__estimates",
            datafusion::datasource::provider_as_source(crate::mem_table(schema, vec![batch])?),
            None,
        )?;
        let plan = scan.filter(condition)?.project(vec![col("__row")])?.build()?;
        let (_, kept) = self.run_plan(plan).map_err(|e| refused(format!("its HAVING: {e}")))?;
        let kept: std::collections::HashSet<u64> = kept
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<arrow::datatypes::UInt64Type>().values().to_vec())
            .collect();
        Ok(groups.into_iter().enumerate().filter(|(i, _)| kept.contains(&(*i as u64))).map(|(_, g)| g).collect())
    }

    /// The logical plan DataFusion makes of `statement` in `ctx`.
    fn plan_statement(
        &self,
        ctx: &datafusion::prelude::SessionContext,
        statement: &ast::Statement,
    ) -> Result<LogicalPlan> {
        let statement = datafusion::sql::parser::Statement::Statement(Box::new(statement.clone()));
        Ok(self.runtime.block_on(ctx.state().statement_to_plan(statement))?)
    }
}

/// `aggregate` with its approximate quantiles (APPROX_PERCENTILE_CONT, APPROX_MEDIAN) computed
/// exactly, as the samples' are: the stale answer an estimate corrects.
fn exact_quantiles(aggregate: &Aggregate) -> Result<LogicalPlan> {
    use datafusion::functions_aggregate::{median::median_udaf, percentile_cont::percentile_cont_udaf};
    let exprs = aggregate
        .aggr_expr
        .iter()
        .map(|e| {
            e.clone()
                .transform(|e| match &e {
                    Expr::AggregateFunction(f) if f.func.name() == "approx_median" => {
                        Ok(Transformed::yes(Expr::AggregateFunction(AggregateFunction {
                            func: median_udaf(),
                            params: f.params.clone(),
                        })))
                    }
                    Expr::AggregateFunction(f) if f.func.name() == "approx_percentile_cont" => {
                        let mut params = f.params.clone();
                        params.args.truncate(2);
                        Ok(Transformed::yes(Expr::AggregateFunction(AggregateFunction {
                            func: percentile_cont_udaf(),
                            params,
                        })))
                    }
                    _ => Ok(Transformed::no(e)),
                })
                .map(|t| t.data)
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let exact = Aggregate::try_new(Arc::clone(&aggregate.input), aggregate.group_expr.clone(), exprs)?;
    Ok(LogicalPlan::Aggregate(exact))
}

/// Comparable rows of the group columns of types `types` (no GROUP BY: one group, of a
/// constant).
fn group_converter(types: &[DataType]) -> Result<RowConverter> {
    let fields = if types.is_empty() { vec![DataType::Boolean] } else { types.to_vec() };
    Ok(RowConverter::new(fields.into_iter().map(SortField::new).collect())?)
}

/// The groups of `rows` rows of group columns `columns`, as comparable rows.
fn group_rows(converter: &RowConverter, columns: &[ArrayRef], rows: usize) -> Result<Vec<OwnedRow>> {
    let constant: Vec<ArrayRef> = vec![Arc::new(arrow::array::BooleanArray::from(vec![true; rows]))];
    let columns = if columns.is_empty() { &constant[..] } else { columns };
    Ok(converter.convert_columns(columns)?.iter().map(|r| r.owned()).collect())
}

/// The sum over groups and aggregates of each estimate's variance relative to the square of
/// the clean sample's estimate (`scale`).
fn relative_variance(estimates: &HashMap<OwnedRow, Vec<Estimate>>, scale: &HashMap<OwnedRow, Vec<Estimate>>) -> f64 {
    let mut total = 0.0;
    for (g, values) in estimates {
        for (j, e) in values.iter().enumerate() {
            let s = scale.get(g).and_then(|s| s[j].value).map_or(1.0, |v| v.abs().max(1e-12));
            total += e.variance.unwrap_or(0.0) / (s * s);
        }
    }
    total
}

/// The answer of an estimate: per group (sorted) its columns, each aggregate `x` as `x`,
/// `x_ci_low`, `x_ci_high` at `z` standard errors.
fn answer_batch(
    shape: &Shape,
    converter: &RowConverter,
    group_types: &[DataType],
    estimates: HashMap<OwnedRow, Vec<Estimate>>,
    z: f64,
) -> Result<(SchemaRef, RecordBatch)> {
    let mut groups: Vec<(OwnedRow, Vec<Estimate>)> = estimates.into_iter().collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let group_columns =
        if shape.groups == 0 { Vec::new() } else { converter.convert_rows(groups.iter().map(|(g, _)| g.row()))? };
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (name, output) in &shape.outputs {
        match *output {
            Output::Group(i) => {
                fields.push(Field::new(name, group_types[i].clone(), true));
                columns.push(Arc::clone(&group_columns[i]));
            }
            Output::Aggregate(j) => {
                let column = |f: &dyn Fn(&Estimate) -> Option<f64>| -> ArrayRef {
                    Arc::new(groups.iter().map(|(_, e)| f(&e[j])).collect::<Float64Array>())
                };
                let bounds = |e: &Estimate| match e.interval {
                    Some(interval) => Some(interval),
                    None => Some((e.value? - z * e.variance?.sqrt(), e.value? + z * e.variance?.sqrt())),
                };
                fields.push(Field::new(name, DataType::Float64, true));
                columns.push(column(&|e| e.value));
                fields.push(Field::new(format!("{name}_ci_low"), DataType::Float64, true));
                // A side nothing bounds (MIN's low, MAX's high) is NULL.
                columns.push(column(&|e| bounds(e).map(|b| b.0).filter(|b| b.is_finite())));
                fields.push(Field::new(format!("{name}_ci_high"), DataType::Float64, true));
                columns.push(column(&|e| bounds(e).map(|b| b.1).filter(|b| b.is_finite())));
            }
        }
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new_with_options(
        Arc::clone(&schema),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(groups.len())),
    )?;
    Ok((schema, batch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_bad_values_and_say_what_is_accepted() {
        let mut settings = Settings::default();
        settings.set("freshness", "SVC_CORR").unwrap();
        assert_eq!(settings.freshness, Freshness::SvcCorr);
        let e = settings.set("freshness", "fresh").unwrap_err();
        assert!(e.contains("stale, svc_aqp, svc_corr, auto, exact"), "{e}");
        for bad in ["0", "1", "1.5", "-0.1", "x"] {
            assert!(settings.set("confidence", bad).is_err(), "{bad}");
        }
        settings.set("confidence", "0.9").unwrap();
        assert_eq!(settings.confidence, 0.9);
        assert!(settings.set("fresh", "x").unwrap_err().contains("unknown setting"));
    }
}
