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

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    cast, lit, BinaryExpr, Distinct, Expr, ExprSchemable, JoinType, LogicalPlan, LogicalPlanBuilder, Operator,
};
use std::sync::Arc;

use crate::maintain::{self, Relations};

type Result<T> = std::result::Result<T, String>;

/// `WITH (sample = m, sample_seed = s)` of a materialized view.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOptions {
    /// The sampling ratio, in (0, 1].
    pub ratio: f64,
    pub seed: Option<i32>,
}

impl SampleOptions {
    /// The sample options among a view's `options` (lower-case names), `None` if it has no
    /// sample; an option not known or a ratio outside (0, 1] is an error.
    pub fn parse(options: &[(String, String)]) -> Result<Option<SampleOptions>> {
        let mut ratio = None;
        let mut seed = None;
        for (name, value) in options {
            match name.as_str() {
                "sample" => match value.parse::<f64>() {
                    Ok(m) if m > 0.0 && m <= 1.0 => ratio = Some(m),
                    _ => return Err(format!("sample = {value}: the sampling ratio must be in (0, 1]")),
                },
                "sample_seed" => {
                    seed = Some(value.parse::<i32>().map_err(|_| format!("sample_seed = {value}: not an INT"))?)
                }
                other => {
                    return Err(format!(
                        "unknown option `{other}` of a materialized view: it takes sample and sample_seed"
                    ))
                }
            }
        }
        match (ratio, seed) {
            (Some(ratio), seed) => Ok(Some(SampleOptions { ratio, seed })),
            (None, Some(_)) => Err("sample_seed without sample: give the sampling ratio too".into()),
            (None, None) => Ok(None),
        }
    }

    /// The largest unsigned 32-bit hash kept, plus one.
    pub fn threshold(&self) -> i64 {
        (self.ratio * 4_294_967_296.0).floor() as i64
    }

    /// `eta(key, m)`: whether the row whose key is `key` (expressions over `schema`) is
    /// sampled.
    pub fn predicate(&self, key: &[Expr], schema: &DFSchema) -> Result<Expr> {
        let mut args: Vec<Expr> = self.seed.map(lit).into_iter().collect();
        for k in key {
            let data_type = k.get_type(schema).map_err(|e| e.to_string())?;
            args.push(if data_type.is_integer() {
                cast(k.clone(), arrow::datatypes::DataType::Int64)
            } else {
                k.clone()
            });
        }
        let hash = Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(crate::spark_hash::xxhash64()), args));
        let low =
            Expr::BinaryExpr(BinaryExpr::new(Box::new(hash), Operator::BitwiseAnd, Box::new(lit(0xFFFF_FFFFi64))));
        Ok(low.lt(lit(self.threshold())))
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
    /// Whether the hash stays at the view's root: the change is sampled, not the query.
    at_root: bool,
}

impl Sampling {
    /// How the sample of the view maintained by `incremental` is cleaned.
    pub fn plan(
        options: SampleOptions,
        incremental: &maintain::Incremental,
        relations: &dyn Relations,
    ) -> Result<Self> {
        let body = incremental.body();
        match &incremental.root {
            maintain::Root::Grouped { groups, .. } => {
                let (kept, left_out) = reduce_key(body, groups, relations);
                let key_columns: Vec<String> = kept.iter().map(|g| format!("__g{g}")).collect();
                let key_exprs: Vec<Expr> = kept.iter().map(|&g| groups[g].clone()).collect();
                let mut pusher =
                    Pusher { options, trace: vec!["through the GROUP BY: the key is in the group".into()] };
                let pushed = pusher.push(body, key_exprs.clone(), &[])?;
                let described = key_exprs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ");
                let key = if left_out.is_empty() {
                    format!("({described})")
                } else {
                    format!("({described}); {}", left_out.join("; "))
                };
                let cleaning = incremental.with_body(pushed, relations)?;
                Ok(Sampling { options, key_columns, key, cleaning, trace: pusher.trace, at_root: false })
            }
            maintain::Root::Rows { keys, .. } => match rows_key(body, keys.len(), relations) {
                Ok((scan, range, table, notes)) => {
                    let key_columns: Vec<String> = range.clone().map(|k| format!("__k{k}")).collect();
                    let mut described = format!("({})", keys[range].join(", "));
                    if !notes.is_empty() {
                        described = format!("{described}; {}", notes.join("; "));
                    }
                    let pushed = at_scan(body, scan, &relations.key(&table), options)?;
                    let trace = vec![format!(
                        "to `{table}`: the key of every row of the view is the key of a row of `{table}`, \
                         on the side of every join that keeps its rows (a foreign-key join to the fact side)"
                    )];
                    let cleaning = incremental.with_body(pushed, relations)?;
                    Ok(Sampling { options, key_columns, key: described, cleaning, trace, at_root: false })
                }
                Err(reason) => Ok(Sampling {
                    options,
                    key_columns: (0..keys.len()).map(|k| format!("__k{k}")).collect(),
                    key: format!("({})", keys.join(", ")),
                    cleaning: incremental.clone(),
                    trace: vec![format!(
                        "blocked at the view's root: {reason}; the change is computed whole and sampled before it is applied"
                    )],
                    at_root: true,
                }),
            },
        }
    }

    /// Whether the hash stays at the view's root (the change is sampled, not the query).
    pub fn sampled_at_root(&self) -> bool {
        self.at_root
    }

    /// `eta` over the view's stored rows of `schema`.
    pub fn stored_predicate(&self, schema: &DFSchema) -> Result<Expr> {
        let key: Vec<Expr> =
            self.key_columns.iter().map(|c| Expr::Column(Column::new_unqualified(c.as_str()))).collect();
        self.options.predicate(&key, schema)
    }

    /// `plan` (stored rows of the view) sampled.
    pub fn sample_stored(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        let predicate = self.stored_predicate(plan.schema())?;
        LogicalPlanBuilder::from(plan).filter(predicate).and_then(|b| b.build()).map_err(|e| e.to_string())
    }
}

/// Pushes the sampling operator down a query.
struct Pusher {
    options: SampleOptions,
    trace: Vec<String>,
}

impl Pusher {
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
        let predicate = self.options.predicate(key, plan.schema())?;
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

/// A column of a scanned table: the scan (numbered in the plan) and the column's name.
type Origin = (usize, String);

/// Where the columns of a plan come from, and which of them are equal on every row.
#[derive(Default)]
struct Provenance {
    /// The table of each scan.
    tables: Vec<String>,
    /// The columns each scan reads.
    columns: Vec<Vec<String>>,
    equal: Vec<(Origin, Origin)>,
}

impl Provenance {
    /// The origin of each column of `plan`, `None` where it is computed.
    fn origins(&mut self, plan: &LogicalPlan) -> Vec<Option<Origin>> {
        let column_origin = |origins: &[Option<Origin>], input: &LogicalPlan, e: &Expr| match e.clone().unalias() {
            Expr::Column(c) => input.schema().index_of_column(&c).ok().and_then(|i| origins[i].clone()),
            _ => None,
        };
        match plan {
            LogicalPlan::TableScan(scan) => {
                let scan_number = self.tables.len();
                self.tables.push(scan.table_name.table().to_lowercase());
                self.columns.push(scan.projected_schema.fields().iter().map(|f| f.name().clone()).collect());
                scan.projected_schema.fields().iter().map(|f| Some((scan_number, f.name().clone()))).collect()
            }
            LogicalPlan::Projection(projection) => {
                let inner = self.origins(&projection.input);
                projection.expr.iter().map(|e| column_origin(&inner, &projection.input, e)).collect()
            }
            LogicalPlan::Filter(filter) => {
                let inner = self.origins(&filter.input);
                for (a, b) in equalities(&filter.predicate) {
                    if let (Some(a), Some(b)) =
                        (column_origin(&inner, &filter.input, &a), column_origin(&inner, &filter.input, &b))
                    {
                        self.equal.push((a, b));
                    }
                }
                inner
            }
            LogicalPlan::SubqueryAlias(alias) => self.origins(&alias.input),
            LogicalPlan::Join(join) => {
                let left = self.origins(&join.left);
                let right = self.origins(&join.right);
                if join.join_type == JoinType::Inner {
                    let mut pairs = join.on.clone();
                    if let Some(filter) = &join.filter {
                        pairs.extend(equalities(filter));
                    }
                    let both: Vec<Option<Origin>> = left.iter().chain(&right).cloned().collect();
                    for (a, b) in pairs {
                        if let (Some(a), Some(b)) = (column_origin(&both, plan, &a), column_origin(&both, plan, &b)) {
                            self.equal.push((a, b));
                        }
                    }
                }
                match join.join_type {
                    JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
                        left.into_iter().chain(right).collect()
                    }
                    JoinType::LeftSemi | JoinType::LeftAnti => left,
                    JoinType::RightSemi | JoinType::RightAnti => right,
                    _ => vec![None; plan.schema().fields().len()],
                }
            }
            other => vec![None; other.schema().fields().len()],
        }
    }

    /// The origins `known` determine: those equal to them, and every column of a scan whose
    /// table's primary key they hold.
    fn closure(&self, known: &[Origin], relations: &dyn Relations) -> (Vec<Origin>, Vec<bool>) {
        let mut origins: Vec<Origin> = known.to_vec();
        let mut whole = vec![false; self.tables.len()];
        loop {
            let before = (origins.len(), whole.iter().filter(|w| **w).count());
            for (a, b) in &self.equal {
                let has = |o: &Origin, origins: &[Origin]| origins.contains(o) || whole[o.0];
                if has(a, &origins) && !has(b, &origins) {
                    origins.push(b.clone());
                } else if has(b, &origins) && !has(a, &origins) {
                    origins.push(a.clone());
                }
            }
            for (scan, table) in self.tables.iter().enumerate() {
                let key = relations.key(table);
                if !whole[scan] && !key.is_empty() && key.iter().all(|k| origins.contains(&(scan, k.clone()))) {
                    whole[scan] = true;
                }
            }
            if (origins.len(), whole.iter().filter(|w| **w).count()) == before {
                return (origins, whole);
            }
        }
    }
}

/// The group expressions of `groups` (over `body`'s columns) the sample's key keeps, and a
/// note for each one left out because the others determine it.
fn reduce_key(body: &LogicalPlan, groups: &[Expr], relations: &dyn Relations) -> (Vec<usize>, Vec<String>) {
    let mut provenance = Provenance::default();
    let origins = provenance.origins(body);
    let origin_of = |e: &Expr| match e.clone().unalias() {
        Expr::Column(c) => body.schema().index_of_column(&c).ok().and_then(|i| origins[i].clone()),
        _ => None,
    };
    let group_origins: Vec<Option<Origin>> = groups.iter().map(origin_of).collect();
    let mut kept: Vec<usize> = (0..groups.len()).collect();
    let mut notes = Vec::new();
    for g in (0..groups.len()).rev() {
        let Some(origin) = &group_origins[g] else { continue };
        let others: Vec<Origin> = kept.iter().filter(|&&k| k != g).filter_map(|&k| group_origins[k].clone()).collect();
        let (determined, whole) = provenance.closure(&others, relations);
        if determined.contains(origin) || whole[origin.0] {
            let table = &provenance.tables[origin.0];
            let reason = if whole[origin.0] {
                format!(
                    "{} left out: the primary key of `{table}` ({}) is in the key",
                    groups[g],
                    relations.key(table).join(", ")
                )
            } else {
                format!("{} left out: it equals a column of the key", groups[g])
            };
            notes.push(reason);
            kept.retain(|&k| k != g);
        }
    }
    notes.reverse();
    (kept, notes)
}

/// For a view of rows (of `keys` key columns) with query `body`: the scan (numbered in
/// traversal order) whose table's key determines every row's key, the range of the view's key
/// columns that are that table's key, the table, and a note for each other table's key left
/// out; or why there is none.
fn rows_key(
    body: &LogicalPlan,
    keys: usize,
    relations: &dyn Relations,
) -> Result<(usize, std::ops::Range<usize>, String, Vec<String>)> {
    // Only selections, projections and joins: the view's key is the scans' keys in order.
    let mut unsupported = None;
    body.apply(|node| {
        if !matches!(
            node,
            LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::TableScan(_)
        ) && !matches!(node, LogicalPlan::Join(j) if matches!(j.join_type, JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full))
        {
            unsupported = Some(node.display().to_string());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| e.to_string())?;
    if let Some(node) = unsupported {
        return Err(format!(
            "a view of rows is sampled below its root through selections, projections and joins, not `{node}`"
        ));
    }
    let mut provenance = Provenance::default();
    provenance.origins(body);
    let table_keys: Vec<Vec<String>> = provenance.tables.iter().map(|t| relations.key(t)).collect();
    if table_keys.iter().map(Vec::len).sum::<usize>() != keys {
        return Err("the view's key is not its tables' keys".into());
    }
    let preserved = preserved_scans(body);
    let mut start = 0;
    for (scan, key) in table_keys.iter().enumerate() {
        let range = start..start + key.len();
        start = range.end;
        // A table without a declared key has a hidden row id, which the query does not read.
        if !preserved[scan] || key.is_empty() || !key.iter().all(|k| provenance.columns[scan].contains(k)) {
            continue;
        }
        let known: Vec<Origin> = key.iter().map(|k| (scan, k.clone())).collect();
        let (_, whole) = provenance.closure(&known, relations);
        if (0..whole.len()).all(|other| other == scan || whole[other]) {
            let table = provenance.tables[scan].clone();
            let notes = (0..whole.len())
                .filter(|&other| other != scan)
                .map(|other| {
                    format!(
                        "the key of `{}` left out: the key of `{table}` determines it through the join",
                        provenance.tables[other]
                    )
                })
                .collect();
            return Ok((scan, range, table, notes));
        }
    }
    Err("no table's key determines the other tables' keys (the view is not a foreign-key join of one fact table)"
        .into())
}

/// Per scan of `plan` (in traversal order): whether every row of it is kept by the joins
/// above it (not on the side an outer join pads).
fn preserved_scans(plan: &LogicalPlan) -> Vec<bool> {
    fn walk(plan: &LogicalPlan, kept: bool, out: &mut Vec<bool>) {
        match plan {
            LogicalPlan::TableScan(_) => out.push(kept),
            LogicalPlan::Join(join) => {
                let (left, right) = match join.join_type {
                    JoinType::Inner => (true, true),
                    JoinType::Left => (true, false),
                    JoinType::Right => (false, true),
                    _ => (false, false),
                };
                walk(&join.left, kept && left, out);
                walk(&join.right, kept && right, out);
            }
            other => other.inputs().into_iter().for_each(|input| walk(input, kept, out)),
        }
    }
    let mut out = Vec::new();
    walk(plan, true, &mut out);
    out
}

/// `plan` with the rows of its `scan`th scan sampled by its key columns `key`.
fn at_scan(plan: &LogicalPlan, scan: usize, key: &[String], options: SampleOptions) -> Result<LogicalPlan> {
    let mut seen = 0;
    plan.clone()
        .transform_down(|node| {
            if let LogicalPlan::TableScan(t) = &node {
                seen += 1;
                if seen - 1 == scan {
                    let columns: Vec<Expr> =
                        key.iter().map(|k| Expr::Column(Column::new(Some(t.table_name.clone()), k.as_str()))).collect();
                    let predicate =
                        options.predicate(&columns, node.schema()).map_err(datafusion::error::DataFusionError::Plan)?;
                    let filtered = LogicalPlanBuilder::from(node).filter(predicate)?.build()?;
                    return Ok(Transformed::new(filtered, true, TreeNodeRecursion::Jump));
                }
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
        .map_err(|e| e.to_string())
}
