//! How fresh the answers of queries over materialized views are (`SET freshness`): the stale
//! contents (`stale`, the default), the views refreshed first (`exact`), or estimates of the
//! fresh answer with confidence intervals at `SET confidence` from the view's cleaned sample
//! (`svc_aqp`, `svc_corr`, `auto`; Stale View Cleaning, Section 5).

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

use crate::{spark_hash, Database, Outcome};

/// How a query over materialized views is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Freshness {
    /// From the views' contents as of their last refresh.
    #[default]
    Stale,
    /// From the clean sample alone, scaled (SVC+AQP).
    SvcAqp,
    /// The stale answer plus the change estimated from the clean and stale samples (SVC+CORR).
    SvcCorr,
    /// SVC+CORR or SVC+AQP, whichever has the smaller estimated variance for the query.
    Auto,
    /// The views refreshed, then the query answered.
    Exact,
}

impl Freshness {
    const NAMES: [(&'static str, Freshness); 5] = [
        ("stale", Freshness::Stale),
        ("svc_aqp", Freshness::SvcAqp),
        ("svc_corr", Freshness::SvcCorr),
        ("auto", Freshness::Auto),
        ("exact", Freshness::Exact),
    ];

    pub fn name(self) -> &'static str {
        Freshness::NAMES.iter().find(|(_, f)| *f == self).map_or("stale", |(n, _)| n)
    }

    /// Whether the answer is estimated from samples.
    pub fn estimates(self) -> bool {
        matches!(self, Freshness::SvcAqp | Freshness::SvcCorr | Freshness::Auto)
    }
}

/// The settings of a session over a database.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub freshness: Freshness,
    /// The probability the intervals of estimates cover the fresh answer.
    pub confidence: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { freshness: Freshness::Stale, confidence: 0.95 }
    }
}

impl Settings {
    /// Applies `SET name = value`; an unknown name or a bad value is an error that says what
    /// is accepted.
    pub fn set(&mut self, name: &str, value: &str) -> std::result::Result<(), String> {
        match name {
            "freshness" => {
                let lower = value.to_ascii_lowercase();
                self.freshness =
                    Freshness::NAMES.iter().find(|(n, _)| *n == lower).map(|(_, f)| *f).ok_or_else(|| {
                        let names: Vec<&str> = Freshness::NAMES.iter().map(|(n, _)| *n).collect();
                        format!("freshness `{value}` is not one of {}", names.join(", "))
                    })?;
            }
            "confidence" => match value.parse::<f64>() {
                Ok(c) if c > 0.0 && c < 1.0 => self.confidence = c,
                _ => return Err(format!("confidence `{value}` is not a probability strictly between 0 and 1")),
            },
            other => return Err(format!("unknown setting `{other}`: the database has freshness and confidence")),
        }
        Ok(())
    }
}

/// The quantile of the standard normal distribution at `p` (0 < p < 1): Wichura's algorithm
/// AS 241 (PPND16), accurate to about 1e-16.
#[allow(clippy::excessive_precision, reason = "AS 241's published coefficients")]
pub fn normal_quantile(p: f64) -> f64 {
    let q = p - 0.5;
    if q.abs() <= 0.425 {
        let r = 0.180625 - q * q;
        let num = ((((((2509.0809287301226727 * r + 33430.575583588128105) * r + 67265.770927008700853) * r
            + 45921.953931549871457)
            * r
            + 13731.693765509461125)
            * r
            + 1971.5909503065514427)
            * r
            + 133.14166789178437745)
            * r
            + 3.387132872796366608;
        let den = ((((((5226.495278852545925 * r + 28729.085735721942674) * r + 39307.89580009271061) * r
            + 21213.794301586595867)
            * r
            + 5394.1960214247511077)
            * r
            + 687.1870074920579083)
            * r
            + 42.313330701600911252)
            * r
            + 1.0;
        return q * num / den;
    }
    let r = if q < 0.0 { p } else { 1.0 - p };
    let r = (-r.ln()).sqrt();
    let value = if r <= 5.0 {
        let r = r - 1.6;
        let num = ((((((7.7454501427834140764e-4 * r + 0.0227238449892691845833) * r + 0.24178072517745061177) * r
            + 1.27045825245236838258)
            * r
            + 3.64784832476320460504)
            * r
            + 5.7694972214606914055)
            * r
            + 4.6303378461565452959)
            * r
            + 1.42343711074968357734;
        let den = ((((((1.05075007164441684324e-9 * r + 5.475938084995344946e-4) * r + 0.0151986665636164571966)
            * r
            + 0.14810397642748007459)
            * r
            + 0.68976733498510000455)
            * r
            + 1.6763848301838038494)
            * r
            + 2.05319162663775882187)
            * r
            + 1.0;
        num / den
    } else {
        let r = r - 5.0;
        let num = ((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r + 0.0012426609473880784386)
            * r
            + 0.026532189526576123093)
            * r
            + 0.29656057182850489123)
            * r
            + 1.7848265399172913358)
            * r
            + 5.4637849111641143699)
            * r
            + 6.6579046435011037772;
        let den = ((((((2.04426310338993978564e-15 * r + 1.4215117583164458887e-7) * r + 1.8463183175100546818e-5)
            * r
            + 7.868691311456132591e-4)
            * r
            + 0.0148753612908506148525)
            * r
            + 0.13692988092273580531)
            * r
            + 0.59983220655588793769)
            * r
            + 1.0;
        num / den
    };
    if q < 0.0 {
        -value
    } else {
        value
    }
}

/// What an estimated query computes: its aggregates and the columns it returns.
struct Shape {
    kinds: Vec<Kind>,
    groups: usize,
    /// The columns of the answer, by name: a group column or an aggregate.
    outputs: Vec<(String, Output)>,
    /// The condition of HAVING on the aggregate's columns, applied to the estimates.
    having: Option<Expr>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Count,
    Sum,
    Avg,
    /// MEDIAN (0.5), PERCENTILE_CONT and APPROX_PERCENTILE_CONT: the quantile in [0, 1].
    Quantile(f64),
    Min,
    Max,
}

impl Kind {
    /// Whether it is computed from the values themselves rather than sums of them.
    fn by_values(self) -> bool {
        matches!(self, Kind::Quantile(_) | Kind::Min | Kind::Max)
    }
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

/// The rows of a sample an estimate reads: per row its key, its group in the query, whether
/// it meets the query's conditions, per aggregate its value `y` (0 where it does not count)
/// and whether it counts `c` (1 or 0), and its weight: `w`, the inverse of the probability it
/// is in the sample (`1 / m`, or 1 for a row of the outlier index, which is there whole), and
/// `v`, what its value adds to the variance of a weighted sum (`(1 - m) / m^2`, or 0).
struct SampleRows {
    keys: Vec<OwnedRow>,
    groups: Vec<OwnedRow>,
    y: Vec<Vec<f64>>,
    c: Vec<Vec<f64>>,
    w: Vec<f64>,
    v: Vec<f64>,
    /// Whether the row is the outlier index's (there whole) rather than sampled.
    whole: Vec<bool>,
}

/// A value that counts for a quantile, MIN or MAX, with its row's weight, and whether it was
/// sampled (resampled by the bootstrap) rather than an outlier (kept).
#[derive(Debug, Clone, Copy)]
struct Weighted {
    value: f64,
    weight: f64,
    sampled: bool,
}

/// Weighted sums per group: `y` = sum of `w * y`, `y2` = sum of `v * y^2`, `c` = sum of
/// `w * c`, `vy` = sum of `v * y`, `vc` = sum of `v * c`.
#[derive(Default, Clone)]
struct Sums {
    /// Rows that meet the conditions.
    rows: usize,
    y: Vec<f64>,
    y2: Vec<f64>,
    c: Vec<f64>,
    vy: Vec<f64>,
    vc: Vec<f64>,
    /// The values that count, for quantiles, MIN and MAX.
    values: Vec<Vec<Weighted>>,
}

impl Sums {
    fn new(aggregates: usize) -> Self {
        let zeros = vec![0.0; aggregates];
        Sums {
            rows: 0,
            y: zeros.clone(),
            y2: zeros.clone(),
            c: zeros.clone(),
            vy: zeros.clone(),
            vc: zeros,
            values: vec![Vec::new(); aggregates],
        }
    }
}

/// An estimate, its variance, and its interval where it is not the normal one (`None`: no
/// interval can be given).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Estimate {
    pub value: Option<f64>,
    pub variance: Option<f64>,
    pub interval: Option<(f64, f64)>,
}

impl Estimate {
    fn normal(value: f64, variance: f64) -> Self {
        Estimate { value: Some(value), variance: Some(variance), interval: None }
    }
}

const ABSENT: Estimate = Estimate { value: None, variance: None, interval: None };

/// A key's clean and stale value, where it has one, its weight and whether it was sampled.
#[derive(Debug, Clone, Copy)]
struct Pair {
    clean: Option<f64>,
    stale: Option<f64>,
    weight: f64,
    sampled: bool,
}

/// Bootstrap replicates of the estimates of quantiles.
pub(crate) const REPLICATES: usize = 400;

/// The `q` quantile of `values`, `None` if empty. Of equally weighted values it is the
/// interpolated one of SQL's PERCENTILE_CONT (the mean of the middle two for the median of an
/// even count); otherwise the smallest value whose cumulative weight reaches `q` of the total.
fn quantile(values: &mut [Weighted], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.value.total_cmp(&b.value));
    let n = values.len();
    if values.iter().all(|v| v.weight == values[0].weight) {
        let h = (n - 1) as f64 * q;
        let low = h.floor() as usize;
        let high = (low + 1).min(n - 1);
        return Some(values[low].value + (h - low as f64) * (values[high].value - values[low].value));
    }
    let target = q * values.iter().map(|v| v.weight).sum::<f64>();
    let mut cumulative = 0.0;
    for v in values.iter() {
        cumulative += v.weight;
        if cumulative >= target {
            return Some(v.value);
        }
    }
    values.last().map(|v| v.value)
}

/// The bootstrap's streams of draws: of a quantile's values (SVC+AQP), of the key-matched
/// pairs of its correction (SVC+CORR).
pub(crate) const VALUES_STREAM: i32 = 1;
pub(crate) const PAIRS_STREAM: i32 = 2;

/// Bootstrap resample `replicate` of `items` in their order: the `k`-th sampled item replaced
/// by the sampled item at [`spark_hash::drawn`]`(stream, replicate, k)`, the outliers' kept.
/// The draws are a hash of their coordinates, so that Spark's SQL draws the same.
fn resampled<T>(items: &[T], sampled: impl Fn(&T) -> bool, stream: i32, replicate: usize) -> Vec<&T> {
    let pool: Vec<&T> = items.iter().filter(|i| sampled(i)).collect();
    let mut k: i32 = 0;
    items
        .iter()
        .map(|item| {
            if !sampled(item) {
                return item;
            }
            k += 1;
            pool[spark_hash::drawn(stream, replicate as i32, k - 1, pool.len())]
        })
        .collect()
}

/// A bootstrap estimate: `value` with the variance of `replicates` and their percentile
/// interval at `confidence`, each shifted by `shift`.
fn bootstrapped(value: f64, mut replicates: Vec<f64>, confidence: f64, shift: f64) -> Estimate {
    if replicates.len() < 2 {
        return Estimate { value: Some(value), variance: None, interval: None };
    }
    replicates.sort_by(f64::total_cmp);
    let n = replicates.len();
    let mean = replicates.iter().sum::<f64>() / n as f64;
    let variance = replicates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let at = |q: f64| replicates[((q * (n - 1) as f64).round() as usize).min(n - 1)];
    let tail = (1.0 - confidence) / 2.0;
    Estimate {
        value: Some(value),
        variance: Some(variance),
        interval: Some((shift + at(tail), shift + at(1.0 - tail))),
    }
}

/// The bounds of MAX (`max`, or MIN when false) over the fresh rows that count, of which
/// `values` (sample and outliers) are seen: the extreme seen is a bound that always holds; the
/// other is Cantelli's inequality over the rows not seen, each a draw of the sampled values'
/// mean `mu` and variance `s^2`: with `u` such rows, estimated as the sampled rows' weights
/// less one each, P(some row beyond `mu + e`) <= u * s^2 / (s^2 + e^2), which is `1 -
/// confidence` at `e = s * sqrt(u / (1 - confidence) - 1)`. `None` with fewer than two
/// sampled values.
fn extreme_bounds(values: &[Weighted], max: bool, confidence: f64) -> Option<(f64, f64)> {
    let sign = if max { 1.0 } else { -1.0 };
    let seen = values.iter().map(|v| sign * v.value).fold(f64::NEG_INFINITY, f64::max);
    let sampled: Vec<f64> = values.iter().filter(|v| v.sampled).map(|v| sign * v.value).collect();
    if sampled.len() < 2 {
        return None;
    }
    let n = sampled.len() as f64;
    let mu = sampled.iter().sum::<f64>() / n;
    let s2 = sampled.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / (n - 1.0);
    let unseen: f64 = values.iter().filter(|v| v.sampled).map(|v| v.weight - 1.0).sum();
    let alpha = 1.0 - confidence;
    let e = if unseen / alpha > 1.0 { (s2 * (unseen / alpha - 1.0)).sqrt() } else { 0.0 };
    let far = seen.max(mu + e);
    Some(if max { (seen, far) } else { (-far, -seen) })
}

/// The estimators of Stale View Cleaning, Section 5, for Bernoulli sampling of ratio `m` (a
/// hash sample keeps each key independently with probability `m`), with the rows of the
/// outlier index taken whole (Section 6.3: weight 1, no variance): Horvitz-Thompson sums
/// `sum(w * y)` with variance `sum(v * y^2)`; AVG as the ratio of the sums, its variance by
/// linearization; SVC+CORR the same over the key-matched differences of the clean and the
/// stale sample (a key missing from one counts 0 there). Quantiles (MEDIAN, PERCENTILE_CONT,
/// APPROX_PERCENTILE_CONT) by the bootstrap: the clean sample's weighted quantile with the
/// percentile interval of the quantiles of resamples; under SVC+CORR the stale quantile plus
/// the change of the samples' quantiles, resampled by key so that the clean and the stale
/// value of a key stay together (Section 5.2). MIN and MAX as the Appendix (12.1) says: the
/// clean sample's extreme, or under SVC+CORR the stale extreme moved by the largest change of
/// a key, within the bounds of [`extreme_bounds`].
struct Estimator<'a> {
    kinds: &'a [Kind],
    confidence: f64,
    clean: &'a SampleRows,
    stale: &'a SampleRows,
}

impl Estimator<'_> {
    fn sums(&self, rows: &SampleRows) -> HashMap<OwnedRow, Sums> {
        let mut sums: HashMap<OwnedRow, Sums> = HashMap::new();
        for i in 0..rows.keys.len() {
            let s = sums.entry(rows.groups[i].clone()).or_insert_with(|| Sums::new(self.kinds.len()));
            let (w, v, sampled) = (rows.w[i], rows.v[i], !rows.whole[i]);
            s.rows += 1;
            for j in 0..self.kinds.len() {
                let (y, c) = (rows.y[j][i], rows.c[j][i]);
                s.y[j] += w * y;
                s.y2[j] += v * y * y;
                s.c[j] += w * c;
                s.vy[j] += v * y;
                s.vc[j] += v * c;
                if self.kinds[j].by_values() && c > 0.0 {
                    s.values[j].push(Weighted { value: y, weight: w, sampled });
                }
            }
        }
        sums
    }

    /// SVC+AQP of group `sums` (of the clean sample).
    fn aqp(&self, sums: Option<&Sums>) -> Vec<Estimate> {
        let Some(s) = sums else { return vec![ABSENT; self.kinds.len()] };
        (0..self.kinds.len())
            .map(|j| match self.kinds[j] {
                Kind::Count => Estimate::normal(s.y[j], s.y2[j]),
                Kind::Sum if s.c[j] > 0.0 => Estimate::normal(s.y[j], s.y2[j]),
                Kind::Avg if s.c[j] > 0.0 => {
                    let r = s.y[j] / s.c[j];
                    let residual = s.y2[j] - 2.0 * r * s.vy[j] + r * r * s.vc[j];
                    Estimate::normal(r, residual.max(0.0) / (s.c[j] * s.c[j]))
                }
                Kind::Quantile(q) if !s.values[j].is_empty() => {
                    // In value order, so that the resamples do not depend on the rows' order.
                    let mut values = s.values[j].clone();
                    values.sort_by(|a, b| a.value.total_cmp(&b.value));
                    let values = &values;
                    let value = quantile(&mut values.clone(), q).unwrap_or(f64::NAN);
                    let replicates = (0..REPLICATES)
                        .filter_map(|b| {
                            let drawn = resampled(values, |v| v.sampled, VALUES_STREAM, b);
                            quantile(&mut drawn.into_iter().copied().collect::<Vec<_>>(), q)
                        })
                        .collect();
                    bootstrapped(value, replicates, self.confidence, 0.0)
                }
                Kind::Min | Kind::Max if !s.values[j].is_empty() => {
                    let max = self.kinds[j] == Kind::Max;
                    let bounds = extreme_bounds(&s.values[j], max, self.confidence);
                    let seen = s.values[j].iter().map(|v| v.value);
                    let value =
                        if max { seen.fold(f64::NEG_INFINITY, f64::max) } else { seen.fold(f64::INFINITY, f64::min) };
                    Estimate { value: Some(value), variance: None, interval: bounds }
                }
                _ => ABSENT,
            })
            .collect()
    }

    /// SVC+CORR of every group: `stale` (the stale answer per group) corrected.
    fn corr(&self, stale: &HashMap<OwnedRow, Vec<Option<f64>>>) -> HashMap<OwnedRow, Vec<Estimate>> {
        let n = self.kinds.len();
        let clean_sums = self.sums(self.clean);
        let stale_sums = self.sums(self.stale);
        // The key-matched rows: (clean row, stale row).
        let mut matched: HashMap<&OwnedRow, (Option<usize>, Option<usize>)> = HashMap::new();
        for (i, k) in self.clean.keys.iter().enumerate() {
            matched.entry(k).or_default().0 = Some(i);
        }
        for (i, k) in self.stale.keys.iter().enumerate() {
            matched.entry(k).or_default().1 = Some(i);
        }
        // Per group and aggregate: the weighted sum of differences and the sum of their
        // squares' variances; for AVG the differences are of the linearized ratios.
        let mut diff: HashMap<OwnedRow, (Vec<f64>, Vec<f64>)> = HashMap::new();
        // Per group and quantile, MIN or MAX: each key's clean and stale value that count
        // there.
        let mut pairs: HashMap<(OwnedRow, usize), Vec<Pair>> = HashMap::new();
        let ratio = |sums: &HashMap<OwnedRow, Sums>, g: &OwnedRow, j: usize| {
            sums.get(g).filter(|s| s.c[j] > 0.0).map(|s| (s.y[j] / s.c[j], s.c[j]))
        };
        let term = |rows: &SampleRows, sums: &HashMap<OwnedRow, Sums>, i: usize, j: usize| match self.kinds[j] {
            Kind::Avg => ratio(sums, &rows.groups[i], j).map_or(0.0, |(r, c)| (rows.y[j][i] - r * rows.c[j][i]) / c),
            _ => rows.y[j][i],
        };
        for (clean, stale_row) in matched.values() {
            // A key's weight is the same in both samples: whether it is an outlier is a
            // property of its key.
            let (w, v, sampled) = match (clean, stale_row) {
                (Some(i), _) => (self.clean.w[*i], self.clean.v[*i], !self.clean.whole[*i]),
                (None, Some(s)) => (self.stale.w[*s], self.stale.v[*s], !self.stale.whole[*s]),
                (None, None) => continue,
            };
            let mut add = |g: &OwnedRow, d: Vec<f64>| {
                if !diff.contains_key(g) {
                    diff.insert(g.clone(), (vec![0.0; n], vec![0.0; n]));
                }
                let entry = diff.get_mut(g).expect("inserted");
                for (j, d) in d.into_iter().enumerate() {
                    entry.0[j] += w * d;
                    entry.1[j] += v * d * d;
                }
            };
            for j in (0..n).filter(|&j| self.kinds[j].by_values()) {
                let value = |rows: &SampleRows, i: &Option<usize>| {
                    i.filter(|&i| rows.c[j][i] > 0.0).map(|i| (rows.groups[i].clone(), rows.y[j][i]))
                };
                let pair = |clean, stale| Pair { clean, stale, weight: w, sampled };
                match (value(self.clean, clean), value(self.stale, stale_row)) {
                    (Some((g, a)), Some((h, b))) if g == h => {
                        pairs.entry((g, j)).or_default().push(pair(Some(a), Some(b)))
                    }
                    (a, b) => {
                        if let Some((g, a)) = a {
                            pairs.entry((g, j)).or_default().push(pair(Some(a), None));
                        }
                        if let Some((h, b)) = b {
                            pairs.entry((h, j)).or_default().push(pair(None, Some(b)));
                        }
                    }
                }
            }
            let after = clean.map(|i| (0..n).map(|j| term(self.clean, &clean_sums, i, j)).collect::<Vec<_>>());
            let before = stale_row.map(|i| (0..n).map(|j| term(self.stale, &stale_sums, i, j)).collect::<Vec<_>>());
            match (clean, stale_row, after, before) {
                (Some(i), Some(s), Some(a), Some(b)) if self.clean.groups[*i] == self.stale.groups[*s] => {
                    add(&self.clean.groups[*i], a.iter().zip(&b).map(|(a, b)| a - b).collect())
                }
                (clean, stale_row, a, b) => {
                    if let (Some(i), Some(a)) = (clean, a) {
                        add(&self.clean.groups[*i], a);
                    }
                    if let (Some(s), Some(b)) = (stale_row, b) {
                        add(&self.stale.groups[*s], b.into_iter().map(|b| -b).collect());
                    }
                }
            }
        }
        let mut groups: Vec<&OwnedRow> = stale.keys().chain(clean_sums.keys()).collect();
        groups.sort();
        groups.dedup();
        groups
            .into_iter()
            .map(|g| {
                let evidence = clean_sums.get(g).map_or(0, |s| s.rows) + stale_sums.get(g).map_or(0, |s| s.rows);
                let answer = stale.get(g);
                let aqp = self.aqp(clean_sums.get(g));
                let estimates = (0..n)
                    .map(|j| {
                        let before = answer.and_then(|a| a[j]);
                        let (sum, variance) = diff.get(g).map_or((0.0, 0.0), |(s, q)| (s[j], q[j]));
                        let pairs = pairs.get(&(g.clone(), j));
                        match self.kinds[j] {
                            _ if evidence == 0 => Estimate { value: before, variance: None, interval: None },
                            Kind::Count | Kind::Sum => Estimate::normal(before.unwrap_or(0.0) + sum, variance),
                            Kind::Quantile(q) => match (before, pairs) {
                                (Some(before), Some(pairs)) => {
                                    self.quantile_correction(before, pairs, q).unwrap_or(aqp[j])
                                }
                                _ => aqp[j],
                            },
                            Kind::Min | Kind::Max => match (before, pairs) {
                                (Some(before), Some(pairs)) => extreme_correction(before, pairs, aqp[j], self.kinds[j]),
                                _ => aqp[j],
                            },
                            Kind::Avg => match (before, ratio(&clean_sums, g, j), ratio(&stale_sums, g, j)) {
                                (Some(before), Some((after, _)), Some((was, _))) => {
                                    Estimate::normal(before + after - was, variance)
                                }
                                // A group new to the sample, or gone from it: no stale ratio
                                // to correct.
                                _ => aqp[j],
                            },
                        }
                    })
                    .collect();
                (g.clone(), estimates)
            })
            .collect()
    }

    /// SVC+CORR of a quantile `q`: the stale quantile `before` plus the change of the
    /// quantiles of the keys' clean and stale values `pairs`, resampled by key; `None` if
    /// either side has none.
    fn quantile_correction(&self, before: f64, pairs: &[Pair], q: f64) -> Option<Estimate> {
        let change = |pairs: &mut dyn Iterator<Item = &Pair>| {
            let (mut after, mut was) = (Vec::new(), Vec::new());
            for p in pairs {
                let weighted = |value| Weighted { value, weight: p.weight, sampled: p.sampled };
                after.extend(p.clean.map(weighted));
                was.extend(p.stale.map(weighted));
            }
            Some(quantile(&mut after, q)? - quantile(&mut was, q)?)
        };
        let value = change(&mut pairs.iter())?;
        // In value order, so that the resamples do not depend on the rows' order.
        let mut pairs = pairs.to_vec();
        let order = |p: &Pair| (p.clean.unwrap_or(f64::NAN), p.stale.unwrap_or(f64::NAN));
        pairs.sort_by(|a, b| order(a).0.total_cmp(&order(b).0).then(order(a).1.total_cmp(&order(b).1)));
        let replicates = (0..REPLICATES)
            .filter_map(|b| change(&mut resampled(&pairs, |p| p.sampled, PAIRS_STREAM, b).into_iter()))
            .collect();
        Some(bootstrapped(before + value, replicates, self.confidence, before))
    }
}

/// SVC+CORR of MIN or MAX (`kind`): the stale extreme `before` moved by the largest change
/// (for MIN the smallest) of a key's value over the key-matched `pairs`, kept within the
/// bounds of the clean sample's `aqp` estimate: never short of the extreme the clean sample
/// holds.
fn extreme_correction(before: f64, pairs: &[Pair], aqp: Estimate, kind: Kind) -> Estimate {
    let changes = pairs.iter().filter_map(|p| Some(p.clean? - p.stale?));
    let change = if kind == Kind::Max {
        changes.fold(None, |a: Option<f64>, d| Some(a.map_or(d, |a| a.max(d))))
    } else {
        changes.fold(None, |a: Option<f64>, d| Some(a.map_or(d, |a| a.min(d))))
    };
    let (Some(change), Some(seen)) = (change, aqp.value) else { return aqp };
    let mut value = if kind == Kind::Max { (before + change).max(seen) } else { (before + change).min(seen) };
    if let Some((low, high)) = aqp.interval {
        value = value.clamp(low, high);
    }
    Estimate { value: Some(value), ..aqp }
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
            let ctx = self.plain_context();
            let rows = self.sample_plan(view, sample, stale, sample.outlier_rows.as_ref())?;
            ctx.register_table(key.as_str(), Arc::new(ViewTable::new(rows, None)))?;
            let plan = self.plan_statement(&ctx, &statement)?;
            let (_, aggregate, predicates, input) = analyze(&plan)?;
            samples.push(self.sample_rows(&converter, &shape, aggregate, predicates, input, &sample.sampling)?);
        }
        let confidence = self.settings.confidence;
        let estimator = Estimator { kinds: &shape.kinds, confidence, clean: &samples[0], stale: &samples[1] };
        let corr = estimator.corr(&stale);
        let clean_sums = estimator.sums(&samples[0]);
        let aqp: HashMap<OwnedRow, Vec<Estimate>> =
            stale.keys().chain(clean_sums.keys()).map(|g| (g.clone(), estimator.aqp(clean_sums.get(g)))).collect();
        let chosen = match self.settings.freshness {
            Freshness::Auto => {
                let (corr_score, aqp_score) = (relative_variance(&corr, &aqp), relative_variance(&aqp, &aqp));
                let freshness = if corr_score <= aqp_score { Freshness::SvcCorr } else { Freshness::SvcAqp };
                let why = format!(
                    "auto chose {}: summed relative variance {corr_score:.3e} with the correction, {aqp_score:.3e} from the clean sample alone",
                    freshness.name()
                );
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
                     from the extreme seen to Cantelli's bound on the rows not sampled",
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
                columns.push(column(&|e| bounds(e).map(|b| b.0)));
                fields.push(Field::new(format!("{name}_ci_high"), DataType::Float64, true));
                columns.push(column(&|e| bounds(e).map(|b| b.1)));
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
    fn normal_quantiles_match_the_tables() {
        // Values from the standard normal table (and R's qnorm).
        for (p, z) in [
            (0.975, 1.959963984540054),
            (0.995, 2.5758293035489004),
            (0.5, 0.0),
            (0.8413447460685429, 1.0),
            (0.001, -3.090232306167813),
            (1e-10, -6.361340902404056),
        ] {
            assert!((normal_quantile(p) - z).abs() < 1e-9, "p = {p}: {} against {z}", normal_quantile(p));
        }
    }

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
