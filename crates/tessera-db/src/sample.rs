//! A materialized view's sample (Stale View Cleaning, Section 4): the view's rows whose key
//! hashes into the sampling ratio, `eta(key, m)`, kept clean between refreshes by a cleaning
//! expression that reads only the changes and base rows of sampled keys.
//!
//! - The hash is Spark's `xxhash64` of the key ([`crate::spark_hash`]; integer keys as
//!   BIGINT, so that both sides of a join on columns of different widths agree), and a row is
//!   sampled when the hash's low 32 bits, read unsigned, are below `m * 2^32`: in Spark,
//!   `pmod(xxhash64(CAST(k AS BIGINT)), 4294967296) < floor(m * 4294967296)`. With
//!   `sample_seed = s` the hash is `xxhash64(s, k ...)`, another sample of the same view.
//! - The key is the view's key (Definition 2) made smaller where a key column depends on
//!   others: a column of a table whose primary key is (through equality joins) among the
//!   other key columns is left out, so that the hash can reach that table's side of a join
//!   (`GROUP BY video_id, owner_id, duration` over `log JOIN video USING (video_id)` is
//!   sampled by `video_id`).
//! - The sampling operator is pushed down the view's query (Definition 3) and the cleaning
//!   expression is the view's maintenance plan derived from that pushed-down query (see
//!   [`crate::maintain`]): by Theorem 1 its rows are those of the maintenance plan's rows
//!   sampled, so the stale and the clean sample correspond key by key (Property 1). Where the
//!   hash cannot go further it stays above the operator that blocked it, and the trace says
//!   why.
//!
//! The key's derivation and where the hash can reach from a plan's columns are [`key`]'s.

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    cast, col, lit, BinaryExpr, Distinct, Expr, ExprSchemable, JoinType, LogicalPlan, LogicalPlanBuilder, Operator,
};
use std::sync::Arc;

use crate::maintain::{self, Relations};

mod key;

use key::{at_scan, reduce_key, rows_key};

type Result<T> = std::result::Result<T, String>;

/// `WITH (sample = m, sample_seed = s)` of a materialized view.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOptions {
    /// The sampling ratio, in (0, 1].
    pub ratio: f64,
    pub seed: Option<i32>,
}

/// `WITH (outlier_index = 'table.column', outlier_threshold = v, outlier_k = k)` of a sampled
/// view (Stale View Cleaning, Section 6): the rows of `table` whose `column` is above `v`, at
/// most the `k` largest when the view is refreshed, are outliers, and so are the rows
/// inserted, deleted or replaced since that are above `v` and reach the k-th largest value of
/// the refresh (the paper's bar set at maintenance, the index then kept from the changes); the
/// view's rows they derive, found by the sample's key, are kept whole beside the sample.
///
/// `table` may also be the view itself: then the outliers are the view's own rows whose
/// `column` is above `v`, at most the `k` largest, as the view holds them at its refresh (a
/// grouped view's largest groups, which a base column cannot reach where the hash is blocked
/// at a join). They are picked from the stale view, before the changes and whatever the hash,
/// so the estimates stay unbiased; a row that grows large only after the refresh stays sampled.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OutlierOptions {
    pub table: String,
    pub column: String,
    pub threshold: Option<f64>,
    pub k: Option<u64>,
}

impl OutlierOptions {
    /// The rule, as a user reads it.
    pub fn describe(&self) -> String {
        let above = self.threshold.map(|t| format!(" > {t}"));
        let top = self.k.map(|k| format!("the {k} largest"));
        match (above, top) {
            (Some(above), Some(top)) => format!("{}.{}{above}, {top}", self.table, self.column),
            (Some(above), None) => format!("{}.{}{above}", self.table, self.column),
            (None, Some(top)) => format!("{top} of {}.{}", self.table, self.column),
            (None, None) => unreachable!("an outlier index has a threshold or a size"),
        }
    }
}

/// The sample options and the outlier index among a view's `options` (lower-case names), each
/// `None` if not given; an option not known, a ratio outside (0, 1] or an outlier index
/// without a sample or a rule is an error.
pub fn parse_options(options: &[(String, String)]) -> Result<(Option<SampleOptions>, Option<OutlierOptions>)> {
    let mut ratio = None;
    let mut seed = None;
    let (mut index, mut threshold, mut k) = (None, None, None);
    for (name, value) in options {
        match name.as_str() {
            "sample" => match value.parse::<f64>() {
                Ok(m) if m > 0.0 && m <= 1.0 => ratio = Some(m),
                _ => return Err(format!("sample = {value}: the sampling ratio must be in (0, 1]")),
            },
            "sample_seed" => {
                seed = Some(value.parse::<i32>().map_err(|_| format!("sample_seed = {value}: not an INT"))?)
            }
            "outlier_index" => match value.split_once('.') {
                Some((table, column)) if !table.is_empty() && !column.is_empty() => {
                    index = Some((table.trim().to_lowercase(), column.trim().to_lowercase()))
                }
                _ => return Err(format!("outlier_index = '{value}': name the indexed column as 'table.column'")),
            },
            "outlier_threshold" => match value.parse::<f64>() {
                Ok(t) if t.is_finite() => threshold = Some(t),
                _ => return Err(format!("outlier_threshold = {value}: not a number")),
            },
            "outlier_k" => match value.parse::<u64>() {
                Ok(n) if n > 0 => k = Some(n),
                _ => return Err(format!("outlier_k = {value}: the index's size must be a positive integer")),
            },
            other => {
                return Err(format!(
                    "unknown option `{other}` of a materialized view: it takes sample, sample_seed, outlier_index, \
                     outlier_threshold and outlier_k"
                ))
            }
        }
    }
    let sample = match (ratio, seed) {
        (Some(ratio), seed) => Some(SampleOptions { ratio, seed }),
        (None, Some(_)) => return Err("sample_seed without sample: give the sampling ratio too".into()),
        (None, None) => None,
    };
    let outliers = match (index, threshold, k) {
        (None, None, None) => None,
        (None, _, _) => return Err("outlier_threshold or outlier_k without outlier_index = 'table.column'".into()),
        (Some(_), None, None) => {
            return Err(
                "outlier_index needs outlier_threshold = v (rows above v), outlier_k = k (the k largest), or both"
                    .into(),
            )
        }
        (Some((table, column)), threshold, k) => Some(OutlierOptions { table, column, threshold, k }),
    };
    if outliers.is_some() && sample.is_none() {
        return Err("an outlier index is kept beside a sample: give sample = m too".into());
    }
    Ok((sample, outliers))
}

impl SampleOptions {
    /// The largest unsigned 32-bit hash kept, plus one.
    pub fn threshold(&self) -> i64 {
        (self.ratio * 4_294_967_296.0).floor() as i64
    }

    /// The sample's hash of `key` (expressions over `schema`): Spark's `xxhash64`, integer keys
    /// as BIGINT, the seed first where there is one.
    pub fn hash(&self, key: &[Expr], schema: &DFSchema) -> Result<Expr> {
        let mut args: Vec<Expr> = self.seed.map(lit).into_iter().collect();
        for k in key {
            let data_type = k.get_type(schema).map_err(|e| e.to_string())?;
            args.push(if data_type.is_integer() {
                cast(k.clone(), arrow::datatypes::DataType::Int64)
            } else {
                k.clone()
            });
        }
        Ok(Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(crate::spark_hash::xxhash64()), args)))
    }

    /// `eta(key, m)`: whether the row whose key is `key` (expressions over `schema`) is
    /// sampled.
    pub fn predicate(&self, key: &[Expr], schema: &DFSchema) -> Result<Expr> {
        let hash = self.hash(key, schema)?;
        let low =
            Expr::BinaryExpr(BinaryExpr::new(Box::new(hash), Operator::BitwiseAnd, Box::new(lit(0xFFFF_FFFFi64))));
        Ok(low.lt(lit(self.threshold())))
    }

    /// Whether the hash of `key` (expressions over `schema`) is one of `hashes`.
    pub fn among(&self, key: &[Expr], schema: &DFSchema, hashes: &[i64]) -> Result<Expr> {
        if hashes.is_empty() {
            return Ok(lit(false));
        }
        Ok(self.hash(key, schema)?.in_list(hashes.iter().map(|h| lit(*h)).collect(), false))
    }

    /// The filter on keys a cleaning expression pushes down: the sample's, or, for the
    /// outlier index, the keys of `hashes`.
    fn key_filter(&self, key: &[Expr], schema: &DFSchema, hashes: Option<&[i64]>) -> Result<Expr> {
        match hashes {
            None => self.predicate(key, schema),
            Some(hashes) => self.among(key, schema, hashes),
        }
    }
}

/// How a view's sample is cleaned: its key, the view's query with the sampling operator
/// pushed down, and where it went.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub options: SampleOptions,
    /// The stored columns the hash reads.
    pub key_columns: Vec<String>,
    /// The key, described, with the columns left out and why.
    pub key: String,
    /// The maintenance of the sample: the view's, derived from the pushed-down query.
    pub cleaning: maintain::Incremental,
    /// Where the hash went, operator by operator, and where it was blocked and why.
    pub trace: Vec<String>,
    /// The outlier index, where the view has one.
    pub outliers: Option<OutlierIndex>,
    /// Whether the hash stays at the view's root: the change is sampled, not the query.
    at_root: bool,
}

/// An outlier index (Stale View Cleaning, Definition 5): its rows are outliers by the rule of
/// `options`, and the view's outlier rows are those whose key is the key of an outlier row.
#[derive(Debug, Clone)]
pub struct OutlierIndex {
    pub options: OutlierOptions,
    pub indexed: Indexed,
}

/// The rows an outlier index ranks.
#[derive(Debug, Clone)]
pub enum Indexed {
    /// A table's, pushed up to the view through the sample's key as the hash sees it where it
    /// reaches the table: the key over the table's columns (unqualified).
    Table { key: Vec<Expr> },
    /// The view's own rows as they are at its refresh, their key's hash in [`VIEW_KEY_HASH`].
    View,
}

/// The column of the hash of a view row's key, beside the view's columns, that an outlier
/// index on the view's own column ranks.
const VIEW_KEY_HASH: &str = "__key_hash";

impl OutlierIndex {
    /// The indexed table's columns the sample's key is, `None` where it is not plain columns;
    /// empty for an index on the view's own column.
    pub fn key_columns(&self) -> Option<Vec<String>> {
        match &self.indexed {
            Indexed::Table { key } => {
                key.iter().map(|k| if let Expr::Column(c) = k { Some(c.name.clone()) } else { None }).collect()
            }
            Indexed::View => Some(Vec::new()),
        }
    }
}

/// The view's query with a filter on keys pushed down, and where it went.
struct Pushed {
    /// `None`: blocked at the view's root, for the reason in the trace.
    body: Option<LogicalPlan>,
    key_columns: Vec<String>,
    key: String,
    trace: Vec<String>,
    /// The scans the filter reached: the table and the key over its columns.
    reached: Vec<(String, Vec<Expr>)>,
}

impl Sampling {
    /// How the sample of the view `view` maintained by `incremental` is cleaned, with the
    /// outlier index `outliers`, which must be on a table the hash reaches or on the view's
    /// own column with the hash below its root.
    pub fn plan(
        options: SampleOptions,
        outliers: Option<OutlierOptions>,
        view: &str,
        incremental: &maintain::Incremental,
        relations: &dyn Relations,
    ) -> Result<Self> {
        let pushed = push(options, None, incremental, relations)?;
        let outliers = match outliers {
            None => None,
            Some(index) if index.table.eq_ignore_ascii_case(view) => {
                if pushed.body.is_none() {
                    return Err(format!(
                        "the outlier index on the view's column `{}` is cleaned by the view's maintenance with the \
                         filter on its keys pushed down where the sample's hash goes, and the hash stays at the \
                         view's root: {}",
                        index.column,
                        pushed.trace.join("; ")
                    ));
                }
                Some(OutlierIndex { options: index, indexed: Indexed::View })
            }
            Some(index) => {
                let at_table = pushed.reached.iter().find(|(table, _)| table.eq_ignore_ascii_case(&index.table));
                let Some((_, key)) = at_table else {
                    return Err(format!(
                        "the outlier index on `{}.{}` is kept on a table the sample's hash reaches (Definition 5), \
                         and it reaches {}: {}",
                        index.table,
                        index.column,
                        if pushed.reached.is_empty() {
                            "none".to_string()
                        } else {
                            pushed.reached.iter().map(|(t, _)| format!("`{t}`")).collect::<Vec<_>>().join(", ")
                        },
                        pushed.trace.join("; ")
                    ));
                };
                let key = key.iter().map(|k| unqualified(k.clone())).collect::<Result<Vec<_>>>()?;
                Some(OutlierIndex { options: index, indexed: Indexed::Table { key } })
            }
        };
        let (cleaning, at_root) = match pushed.body {
            Some(body) => (incremental.with_body(body, relations)?, false),
            None => (incremental.clone(), true),
        };
        Ok(Sampling {
            options,
            key_columns: pushed.key_columns,
            key: pushed.key,
            cleaning,
            trace: pushed.trace,
            outliers,
            at_root,
        })
    }

    /// Whether the hash stays at the view's root (the change is sampled, not the query).
    pub fn sampled_at_root(&self) -> bool {
        self.at_root
    }

    /// `eta` over the view's stored rows of `schema`.
    pub fn stored_predicate(&self, schema: &DFSchema) -> Result<Expr> {
        self.options.predicate(&self.stored_key(), schema)
    }

    /// Whether a stored row's key is among `hashes` (of the outlier index's keys).
    pub fn stored_among(&self, schema: &DFSchema, hashes: &[i64]) -> Result<Expr> {
        self.options.among(&self.stored_key(), schema, hashes)
    }

    fn stored_key(&self) -> Vec<Expr> {
        self.key_columns.iter().map(|c| Expr::Column(Column::new_unqualified(c.as_str()))).collect()
    }

    /// `plan` (stored rows of the view) sampled.
    pub fn sample_stored(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        let predicate = self.stored_predicate(plan.schema())?;
        LogicalPlanBuilder::from(plan).filter(predicate).and_then(|b| b.build()).map_err(|e| e.to_string())
    }

    /// The rows an outlier index on the view's own column ranks: the visible rows of
    /// `stored` (the view's stored rows, of the view maintained by `incremental`), with their
    /// key's hash.
    pub fn view_ranked(&self, stored: LogicalPlan, incremental: &maintain::Incremental) -> Result<LogicalPlan> {
        let hash = self.options.hash(&self.stored_key(), stored.schema())?;
        incremental.visible_with(stored, vec![hash.alias(VIEW_KEY_HASH)])
    }

    /// The rows of `rows` (the indexed table's, by name, or the view's of
    /// [`Sampling::view_ranked`]) that the outlier index's rule picks: above its threshold,
    /// the `k` largest where `top` (ties broken by the key's hash, so that the pick repeats),
    /// and at least `at_least`; as the hash of their key (`__hash`) and their value
    /// (`__value`, DOUBLE), largest first. `None` without an index.
    pub fn outlier_rows_plan(
        &self,
        rows: LogicalPlan,
        top: bool,
        at_least: Option<f64>,
    ) -> Result<Option<LogicalPlan>> {
        let Some(index) = &self.outliers else { return Ok(None) };
        let error = |e: datafusion::error::DataFusionError| e.to_string();
        let column = Expr::Column(Column::new_unqualified(index.options.column.as_str()));
        let mut builder = LogicalPlanBuilder::from(rows).filter(column.clone().is_not_null()).map_err(error)?;
        if let Some(threshold) = index.options.threshold {
            builder = builder.filter(column.clone().gt(lit(threshold))).map_err(error)?;
        }
        if let Some(bound) = at_least {
            builder = builder.filter(column.clone().gt_eq(lit(bound))).map_err(error)?;
        }
        let plan = builder.build().map_err(error)?;
        let hash = match &index.indexed {
            Indexed::Table { key } => self.options.hash(key, plan.schema())?,
            Indexed::View => col(VIEW_KEY_HASH),
        };
        let value = cast(column, arrow::datatypes::DataType::Float64);
        let (hash_column, value_column) = (col("__hash"), col("__value"));
        let mut builder = LogicalPlanBuilder::from(plan)
            .project(vec![hash.alias("__hash"), value.alias("__value")])
            .and_then(|b| b.sort(vec![value_column.sort(false, false), hash_column.sort(true, false)]))
            .map_err(error)?;
        if let (Some(k), true) = (index.options.k, top) {
            builder = builder.limit(0, Some(k as usize)).map_err(error)?;
        }
        builder.build().map(Some).map_err(error)
    }

    /// The maintenance of the rows of the view maintained by `view` whose keys hash to
    /// `hashes` (the outlier index's rows): the view's, derived from its query with that filter
    /// pushed down where the sample's hash goes.
    pub fn outliers_cleaning(
        &self,
        view: &maintain::Incremental,
        hashes: &[i64],
        relations: &dyn Relations,
    ) -> Result<maintain::Incremental> {
        let pushed = push(self.options, Some(hashes), view, relations)?;
        let body = pushed.body.ok_or("the outlier index is kept on a sample pushed below the view's root")?;
        view.with_body(body, relations)
    }
}

/// `expr` with its columns unqualified.
fn unqualified(expr: Expr) -> Result<Expr> {
    expr.transform(|e| match &e {
        Expr::Column(c) => Ok(Transformed::yes(Expr::Column(Column::new_unqualified(c.name.as_str())))),
        _ => Ok(Transformed::no(e)),
    })
    .map(|t| t.data)
    .map_err(|e| e.to_string())
}

/// The query of the view maintained by `incremental` with its rows filtered by key (the
/// sample's hash, or the keys of `hashes`) as far down as the filter goes.
fn push(
    options: SampleOptions,
    hashes: Option<&[i64]>,
    incremental: &maintain::Incremental,
    relations: &dyn Relations,
) -> Result<Pushed> {
    let body = incremental.body();
    match &incremental.root {
        maintain::Root::Grouped { groups, .. } => {
            let (kept, left_out) = reduce_key(body, groups, relations);
            let key_columns: Vec<String> = kept.iter().map(|g| format!("__g{g}")).collect();
            let key_exprs: Vec<Expr> = kept.iter().map(|&g| groups[g].clone()).collect();
            let mut pusher = Pusher {
                options,
                hashes,
                trace: vec!["through the GROUP BY: the key is in the group".into()],
                reached: Vec::new(),
            };
            let pushed = pusher.push(body, key_exprs.clone(), &[])?;
            let described = key_exprs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ");
            let key = if left_out.is_empty() {
                format!("({described})")
            } else {
                format!("({described}); {}", left_out.join("; "))
            };
            Ok(Pushed { body: Some(pushed), key_columns, key, trace: pusher.trace, reached: pusher.reached })
        }
        maintain::Root::Rows { keys, .. } => match rows_key(body, keys.len(), relations) {
            Ok((scan, range, table, notes)) => {
                let key_columns: Vec<String> = range.clone().map(|k| format!("__k{k}")).collect();
                let mut described = format!("({})", keys[range].join(", "));
                if !notes.is_empty() {
                    described = format!("{described}; {}", notes.join("; "));
                }
                let table_key = relations.key(&table);
                let pushed = at_scan(body, scan, &table_key, |key, schema| options.key_filter(key, schema, hashes))?;
                let trace = vec![format!(
                    "to `{table}`: the key of every row of the view is the key of a row of `{table}`, \
                     on the side of every join that keeps its rows (a foreign-key join to the fact side)"
                )];
                let reached_key = table_key.iter().map(|k| Expr::Column(Column::new_unqualified(k.as_str()))).collect();
                Ok(Pushed {
                    body: Some(pushed),
                    key_columns,
                    key: described,
                    trace,
                    reached: vec![(table, reached_key)],
                })
            }
            Err(reason) => Ok(Pushed {
                body: None,
                key_columns: (0..keys.len()).map(|k| format!("__k{k}")).collect(),
                key: format!("({})", keys.join(", ")),
                trace: vec![format!(
                    "blocked at the view's root: {reason}; the change is computed whole and sampled before it is applied"
                )],
                reached: Vec::new(),
            }),
        },
    }
}

/// Pushes the sampling operator down a query.
struct Pusher<'h> {
    options: SampleOptions,
    /// The keys' hashes the filter keeps, instead of the sample's (the outlier index).
    hashes: Option<&'h [i64]>,
    trace: Vec<String>,
    /// The tables the filter reached, with the key over their columns.
    reached: Vec<(String, Vec<Expr>)>,
}

impl Pusher<'_> {
    /// `plan` with only the rows whose `key` (expressions over its columns) is sampled, the
    /// sampling as far down as it goes; `equal`: pairs of expressions the rows above equate.
    fn push(&mut self, plan: &LogicalPlan, key: Vec<Expr>, equal: &[(Expr, Expr)]) -> Result<LogicalPlan> {
        match plan {
            LogicalPlan::Filter(filter) => {
                self.trace.push(format!("through the selection `{}`", filter.predicate));
                let mut equal = equal.to_vec();
                equal.extend(equalities(&filter.predicate));
                let input = self.push(&filter.input, key, &equal)?;
                rebuild(plan, vec![input])
            }
            LogicalPlan::Projection(projection) => {
                let key = key
                    .into_iter()
                    .map(|k| {
                        substitute(k, |c| {
                            projection.schema.index_of_column(c).ok().map(|i| projection.expr[i].clone().unalias())
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.trace.push("through the projection, which keeps the key".into());
                let input = self.push(&projection.input, key, &[])?;
                rebuild(plan, vec![input])
            }
            LogicalPlan::SubqueryAlias(alias) => {
                let inner = alias.input.schema().columns();
                let key = key
                    .into_iter()
                    .map(|k| {
                        substitute(k, |c| alias.schema.index_of_column(c).ok().map(|i| Expr::Column(inner[i].clone())))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let input = self.push(&alias.input, key, &[])?;
                rebuild(plan, vec![input])
            }
            LogicalPlan::Distinct(Distinct::All(input)) => {
                self.trace.push("through DISTINCT: the key is in every row".into());
                let input = self.push(input, key, &[])?;
                rebuild(plan, vec![input])
            }
            LogicalPlan::Aggregate(aggregate) => {
                let groups = aggregate.group_expr.len();
                let mapped: Option<Vec<Expr>> = key
                    .iter()
                    .map(|k| {
                        substitute(k.clone(), |c| {
                            aggregate
                                .schema
                                .index_of_column(c)
                                .ok()
                                .filter(|&i| i < groups)
                                .map(|i| aggregate.group_expr[i].clone())
                        })
                        .ok()
                    })
                    .collect();
                match mapped {
                    Some(key) => {
                        self.trace.push("through an inner GROUP BY: the key is in its group".into());
                        let input = self.push(&aggregate.input, key, &[])?;
                        rebuild(plan, vec![input])
                    }
                    None => self.block(plan, &key, "an inner GROUP BY whose group does not hold the key"),
                }
            }
            LogicalPlan::Union(union) => {
                self.trace.push("to every branch of the UNION".into());
                let mut inputs = Vec::new();
                for input in &union.inputs {
                    let columns = input.schema().columns();
                    let branch_key = key
                        .iter()
                        .map(|k| {
                            substitute(k.clone(), |c| {
                                union.schema.index_of_column(c).ok().map(|i| Expr::Column(columns[i].clone()))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    inputs.push(self.push(input, branch_key, &[])?);
                }
                rebuild(plan, inputs)
            }
            LogicalPlan::Join(join) => {
                let mut pairs: Vec<(Expr, Expr)> = join.on.clone();
                if let Some(filter) = &join.filter {
                    pairs.extend(equalities(filter));
                }
                pairs.extend(equal.iter().cloned());
                let left = on_side(&key, join.left.schema(), &pairs);
                let right = on_side(&key, join.right.schema(), &pairs);
                let (to_left, to_right) = match join.join_type {
                    JoinType::Inner => (left, right),
                    JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti if left.is_some() => (left, right),
                    JoinType::Right | JoinType::RightSemi | JoinType::RightAnti if right.is_some() => (left, right),
                    JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti => {
                        return self.block(plan, &key, "the key is not on the side the join keeps every row of")
                    }
                    JoinType::Right | JoinType::RightSemi | JoinType::RightAnti => {
                        return self.block(plan, &key, "the key is not on the side the join keeps every row of")
                    }
                    other => {
                        return self.block(plan, &key, &format!("a {other} join keeps the rows of either side alone"))
                    }
                };
                let side = |p: &LogicalPlan| tables_of(p).join(", ");
                match (&to_left, &to_right) {
                    (None, None) => {
                        return self.block(plan, &key, "the key has columns of both sides that no equality of the join links")
                    }
                    (Some(_), Some(_)) => {
                        self.trace.push(format!("to both sides of the {} join on the key (an equality join)", join.join_type))
                    }
                    (Some(_), None) => self.trace.push(format!(
                        "to the left side ({}) of the {} join only: the key is its columns (a foreign-key join to the fact side)",
                        side(&join.left),
                        join.join_type
                    )),
                    (None, Some(_)) => self.trace.push(format!(
                        "to the right side ({}) of the {} join only: the key is its columns (a foreign-key join to the fact side)",
                        side(&join.right),
                        join.join_type
                    )),
                }
                let new_left = match to_left {
                    Some(k) => self.push(&join.left, k, &[])?,
                    None => join.left.as_ref().clone(),
                };
                let new_right = match to_right {
                    Some(k) => self.push(&join.right, k, &[])?,
                    None => join.right.as_ref().clone(),
                };
                rebuild(plan, vec![new_left, new_right])
            }
            LogicalPlan::TableScan(scan) => {
                self.trace.push(format!("reaches `{}`: only its sampled keys are read", scan.table_name));
                self.reached.push((scan.table_name.table().to_lowercase(), key.clone()));
                self.filter(plan, &key)
            }
            other => {
                let what = other.display().to_string();
                self.block(plan, &key, &format!("`{what}` is not one the hash goes through"))
            }
        }
    }

    /// `plan` sampled above it, blocked for `reason`.
    fn block(&mut self, plan: &LogicalPlan, key: &[Expr], reason: &str) -> Result<LogicalPlan> {
        self.trace.push(format!("blocked at `{}`: {reason}; sampled above it", plan.display()));
        self.filter(plan, key)
    }

    fn filter(&self, plan: &LogicalPlan, key: &[Expr]) -> Result<LogicalPlan> {
        let predicate = self.options.key_filter(key, plan.schema(), self.hashes)?;
        LogicalPlanBuilder::from(plan.clone()).filter(predicate).and_then(|b| b.build()).map_err(|e| e.to_string())
    }
}

/// `plan` with `inputs` in place of its inputs.
fn rebuild(plan: &LogicalPlan, inputs: Vec<LogicalPlan>) -> Result<LogicalPlan> {
    plan.with_new_exprs(plan.expressions(), inputs).map_err(|e| e.to_string())
}

/// `expr` with each column replaced by `replace`'s expression; an error if one has none.
fn substitute(expr: Expr, replace: impl Fn(&Column) -> Option<Expr>) -> Result<Expr> {
    let mut missing = None;
    let result = expr
        .transform(|e| match &e {
            Expr::Column(c) => match replace(c) {
                Some(r) => Ok(Transformed::yes(r)),
                None => {
                    missing = Some(c.flat_name());
                    Ok(Transformed::no(e))
                }
            },
            _ => Ok(Transformed::no(e)),
        })
        .map_err(|e| e.to_string())?
        .data;
    match missing {
        Some(c) => Err(format!("the key column `{c}` is not an input column")),
        None => Ok(result),
    }
}

/// The pairs of expressions the conjuncts of `predicate` equate.
fn equalities(predicate: &Expr) -> Vec<(Expr, Expr)> {
    datafusion::logical_expr::utils::split_conjunction(predicate)
        .into_iter()
        .filter_map(|c| match c {
            Expr::BinaryExpr(b) if b.op == Operator::Eq => Some((*b.left.clone(), *b.right.clone())),
            _ => None,
        })
        .collect()
}

/// `key` as expressions over the columns of `schema` (one side of a join), through the
/// equalities `pairs`, if every part of it can be.
fn on_side(key: &[Expr], schema: &DFSchema, pairs: &[(Expr, Expr)]) -> Option<Vec<Expr>> {
    let within = |e: &Expr| e.column_refs().iter().all(|c| schema.has_column(c));
    key.iter()
        .map(|k| {
            if within(k) {
                return Some(k.clone());
            }
            pairs.iter().find_map(|(a, b)| {
                if a == k && within(b) {
                    Some(b.clone())
                } else if b == k && within(a) {
                    Some(a.clone())
                } else {
                    None
                }
            })
        })
        .collect()
}

/// The tables `plan` scans.
fn tables_of(plan: &LogicalPlan) -> Vec<String> {
    let mut tables = Vec::new();
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            tables.push(scan.table_name.to_string());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    tables
}
