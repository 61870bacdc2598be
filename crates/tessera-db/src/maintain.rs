//! How a materialized view is refreshed: incrementally, from the changes of the tables it
//! reads, wherever its query allows, by recomputation otherwise, with the reason.
//!
//! The maintenance plans are DataFusion logical plans derived from the plan DataFusion made of
//! the view's query. Every relation is *counted*: a plan's rows carry a count `m` (SVC,
//! Section 3; DBSP's Z-sets), +1 for a row that is there, -1 for one taken away. A table is
//! read in three versions: as it is now (every row +1), as it was at the view's last refresh
//! (its rows now, the rows inserted since -1, the rows deleted since +1) and its change (the
//! rows inserted since +1, those deleted -1; an update is both). The change of a query is
//! derived operator by operator:
//!
//! - selection, projection and UNION ALL apply to the change as they apply to rows;
//! - an inner join's change is `dA x B(now) + A(then) x dB`, counts multiplied;
//! - the other operators (outer, semi and anti joins, so INTERSECT and EXCEPT, DISTINCT and
//!   UNION, aggregates inside the query) are recomputed for the *affected keys* only: the
//!   join keys, rows or groups the changes of their inputs touch. Their change is their
//!   result now minus their result then, both restricted to those keys.
//!
//! The view stores what its root needs (SVC's Definition 2 gives the key):
//!
//! - a grouped aggregate or DISTINCT stores, per group key, the count of rows and each
//!   aggregate's state (sums and counts of values, sums of squares, extremes); a refresh
//!   aggregates the query's change per group and adds it to the stored groups in a full outer
//!   join on the group key, dropping groups left without rows. MIN and MAX are recomputed
//!   for the groups whose current extreme was deleted, from those groups' rows only;
//! - any other query stores its rows with their key (the keys of the base rows they come
//!   from, a branch number for UNION ALL, the rows themselves after DISTINCT); a refresh
//!   deletes the keys whose rows the change takes away and inserts the rows it adds.
//!
//! Window functions, ORDER BY and LIMIT, subqueries in expressions and global aggregates are
//! recomputed. A view over a view reads the inner view's stored rows and their change as it
//! reads a table's.
//!
//! One file of about a thousand lines: the change rules, the affected-key restriction and the
//! roots' stored state rely on the same counted-relation conventions and are read together.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::table::POSITION;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, NullEquality, ScalarValue};
use datafusion::functions_aggregate::expr_fn::{max, min, sum};
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    cast, col, lit, when, Distinct, Expr, Join, JoinType, LogicalPlan, LogicalPlanBuilder, Operator, Union,
};

/// A reason the query cannot be maintained incrementally, or a plan that could not be built.
type Result<T> = std::result::Result<T, String>;

/// Which version of a table a plan reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// As it is now.
    New,
    /// As it was at the view's last refresh.
    Old,
    /// What changed in between.
    Delta,
}

/// The tables a maintenance plan reads.
pub trait Relations {
    /// The rows of table `table` at `version`: its declared columns, its hidden row id if it
    /// has one, and a count `__m`.
    fn scan(&self, table: &str, version: Version) -> Result<LogicalPlan>;
    /// The names of the key columns of `table`.
    fn key(&self, table: &str) -> Vec<String>;
    /// Whether `table` changed since the view's last refresh.
    fn changed(&self, table: &str) -> bool;
}

#[derive(Debug, Clone)]
pub enum Maintenance {
    Incremental(Box<Incremental>),
    Recompute(String),
}

/// A view maintained from the tables' changes.
#[derive(Debug, Clone)]
pub struct Incremental {
    /// The query's plan below the stored root: the grouped input, or the whole query.
    body: LogicalPlan,
    pub root: Root,
    /// The tables the query reads.
    pub tables: BTreeSet<String>,
    /// The columns users see, over the stored ones, after `having`.
    visible: Vec<Expr>,
    having: Option<Expr>,
    /// The columns users see.
    pub schema: SchemaRef,
}

/// What the view stores.
#[derive(Debug, Clone)]
pub enum Root {
    /// Per group (`__g0` ..): its rows `__n` and each aggregate's state.
    Grouped { groups: Vec<Expr>, states: Vec<State> },
    /// Its rows (`__v0` ..) with their key (`__k0` ..).
    Rows { values: usize, keys: Vec<String> },
}

/// One stored column of a grouped view: its name, how it is computed from the counted rows,
/// and how a change is added to it.
#[derive(Debug, Clone)]
pub struct State {
    pub name: String,
    expr: Expr,
    combine: Combine,
}

#[derive(Debug, Clone, PartialEq)]
enum Combine {
    Add,
    /// The least (`true`) or greatest value; a change also gives the extreme of its deleted
    /// values (`deleted`).
    Extreme {
        least: bool,
        deleted: Expr,
    },
}

/// How the view with query plan `plan` is refreshed.
pub fn plan(plan: &LogicalPlan, relations: &dyn Relations) -> Maintenance {
    match incremental(plan, relations) {
        Ok(incremental) => Maintenance::Incremental(Box::new(incremental)),
        Err(reason) => Maintenance::Recompute(reason),
    }
}

fn incremental(plan: &LogicalPlan, relations: &dyn Relations) -> Result<Incremental> {
    let tables = scanned_tables(plan)?;
    let schema = Arc::new(plan.schema().as_arrow().clone());
    // The projection and HAVING above a grouped node, if the root is one.
    let (projection, rest) = match plan {
        LogicalPlan::Projection(p) => (Some(&p.expr), p.input.as_ref()),
        other => (None, other),
    };
    let (having, rest) = match rest {
        LogicalPlan::Filter(f) if projection.is_some() => (Some(&f.predicate), f.input.as_ref()),
        other => (None, other),
    };
    let grouped = match rest {
        LogicalPlan::Aggregate(aggregate) => {
            if aggregate.group_expr.is_empty() {
                return Err("a global aggregate (no GROUP BY) is recomputed".into());
            }
            let mut states = Vec::new();
            let mut outputs: Vec<Expr> =
                (0..aggregate.group_expr.len()).map(|g| col(Column::new_unqualified(format!("__g{g}")))).collect();
            for (j, expr) in aggregate.aggr_expr.iter().enumerate() {
                let out = aggregate.schema.field(aggregate.group_expr.len() + j).data_type().clone();
                outputs.push(aggregate_state(expr, j, &out, &mut states)?);
            }
            Some((aggregate.input.as_ref(), aggregate.group_expr.clone(), states, aggregate.schema.columns(), outputs))
        }
        LogicalPlan::Distinct(Distinct::All(input)) => {
            let columns = input.schema().columns();
            let groups: Vec<Expr> = columns.iter().cloned().map(Expr::Column).collect();
            let outputs = (0..groups.len()).map(|g| col(Column::new_unqualified(format!("__g{g}")))).collect();
            Some((input.as_ref(), groups, Vec::new(), columns, outputs))
        }
        _ => None,
    };
    let incremental = match grouped {
        Some((body, groups, states, columns, outputs)) => {
            // The root's columns as the stored ones.
            let stored = |expr: &Expr| -> Result<Expr> {
                expr.clone()
                    .transform(|e| match &e {
                        Expr::Column(c) => match columns.iter().position(|x| x == c) {
                            Some(i) => Ok(Transformed::yes(outputs[i].clone())),
                            None => Ok(Transformed::no(e)),
                        },
                        _ => Ok(Transformed::no(e)),
                    })
                    .map(|t| t.data)
                    .map_err(|e| e.to_string())
            };
            let names = plan.schema().fields().iter().map(|f| f.name().clone());
            let visible = match projection {
                Some(exprs) => exprs
                    .iter()
                    .zip(names)
                    .map(|(e, n)| Ok(stored(&e.clone().unalias())?.alias(n)))
                    .collect::<Result<Vec<_>>>(),
                None => Ok(outputs.iter().zip(names).map(|(e, n)| e.clone().alias(n)).collect()),
            }?;
            let having = having.map(&stored).transpose()?;
            let root = Root::Grouped { groups, states };
            Incremental { body: body.clone(), root, tables, visible, having, schema }
        }
        None => {
            let rewriter = Rewriter::new(relations, true);
            let counted = rewriter.counted(plan, Version::New)?;
            let keys = counted.keys.iter().map(|(_, described)| described.clone()).collect();
            let visible = plan
                .schema()
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| col(Column::new_unqualified(format!("__v{i}"))).alias(f.name()))
                .collect();
            let root = Root::Rows { values: plan.schema().fields().len(), keys };
            Incremental { body: plan.clone(), root, tables, visible, having: None, schema }
        }
    };
    // Every table changed: the change plan builds, or says why it cannot.
    let everything = Everything(relations);
    incremental.change(&everything)?;
    Ok(incremental)
}

/// `relations` with every table changed.
struct Everything<'a>(&'a dyn Relations);

impl Relations for Everything<'_> {
    fn scan(&self, table: &str, version: Version) -> Result<LogicalPlan> {
        self.0.scan(table, version)
    }
    fn key(&self, table: &str) -> Vec<String> {
        self.0.key(table)
    }
    fn changed(&self, _: &str) -> bool {
        true
    }
}

/// The state columns of aggregate `expr` (the `j`th, of type `out`) added to `states`, and
/// the expression of its value over them.
fn aggregate_state(expr: &Expr, j: usize, out: &DataType, states: &mut Vec<State>) -> Result<Expr> {
    let unsupported = || format!("`{expr}` is not COUNT, SUM, AVG, VAR, STDDEV, MIN or MAX of one value");
    let Expr::AggregateFunction(AggregateFunction { func, params }) = expr.clone().unalias() else {
        return Err(unsupported());
    };
    if params.distinct || params.filter.is_some() || !params.order_by.is_empty() {
        return Err(format!("`{expr}` has DISTINCT, FILTER or ORDER BY (recomputed)"));
    }
    let [x] = params.args.as_slice() else { return Err(unsupported()) };
    let m = || col(Column::new_unqualified("__m"));
    let stored = |name: &str| col(Column::new_unqualified(name));
    let add = |states: &mut Vec<State>, name: String, expr: Expr| {
        states.push(State { name, expr, combine: Combine::Add });
    };
    let count = format!("__c{j}");
    let counted = when(x.clone().is_not_null(), m()).otherwise(lit(0i64)).map_err(|e| e.to_string())?;
    let positive = |e: Expr| when(stored(&count).gt(lit(0i64)), e).end().map_err(|e| e.to_string());
    let value = match func.name() {
        "count" => {
            add(states, count.clone(), sum(counted));
            stored(&count)
        }
        "sum" | "avg" => {
            let s = format!("__s{j}");
            add(states, s.clone(), sum(x.clone() * m()));
            add(states, count.clone(), sum(counted));
            if func.name() == "sum" {
                positive(stored(&s))?
            } else if matches!(out, DataType::Decimal128(..) | DataType::Decimal256(..)) {
                positive(cast(stored(&s), out.clone()) / cast(stored(&count), out.clone()))?
            } else {
                positive(cast(stored(&s), DataType::Float64) / cast(stored(&count), DataType::Float64))?
            }
        }
        name @ ("var" | "var_pop" | "stddev" | "stddev_pop") => {
            let (s, q) = (format!("__s{j}"), format!("__q{j}"));
            let x = cast(x.clone(), DataType::Float64);
            add(states, s.clone(), sum(x.clone() * m()));
            add(states, q.clone(), sum(x.clone() * x * m()));
            add(states, count.clone(), sum(counted));
            let n = cast(stored(&count), DataType::Float64);
            let spread = stored(&q) - stored(&s) * stored(&s) / n.clone();
            let population = name.ends_with("_pop");
            let divisor = if population { n } else { n - lit(1.0) };
            let variance =
                when(spread.clone().lt(lit(0.0)), lit(0.0)).otherwise(spread).map_err(|e| e.to_string())? / divisor;
            let variance = if name.starts_with("stddev") {
                datafusion::functions::math::expr_fn::sqrt(variance)
            } else {
                variance
            };
            let least = if population { 0i64 } else { 1 };
            when(stored(&count).gt(lit(least)), variance).end().map_err(|e| e.to_string())?
        }
        name @ ("min" | "max") => {
            let least = name == "min";
            let extreme = |e: Expr| if least { min(e) } else { max(e) };
            let kept = when(m().gt(lit(0i64)), x.clone()).end().map_err(|e| e.to_string())?;
            let gone = when(m().lt(lit(0i64)), x.clone()).end().map_err(|e| e.to_string())?;
            let name = format!("__x{j}");
            states.push(State {
                name: name.clone(),
                expr: extreme(kept),
                combine: Combine::Extreme { least, deleted: extreme(gone) },
            });
            stored(&name)
        }
        _ => return Err(unsupported()),
    };
    Ok(cast(value, out.clone()))
}

/// The tables `plan` scans, lower-case; a view or a subquery in an expression is refused.
fn scanned_tables(plan: &LogicalPlan) -> Result<BTreeSet<String>> {
    let mut tables = BTreeSet::new();
    let mut refused = None;
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            tables.insert(scan.table_name.table().to_lowercase());
        }
        if node.expressions().iter().any(has_subquery) {
            refused = Some(format!("`{}` has a subquery in an expression (recomputed)", node.display()));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| e.to_string())?;
    match refused {
        Some(reason) => Err(reason),
        None => Ok(tables),
    }
}

fn has_subquery(expr: &Expr) -> bool {
    expr.exists(|e| Ok(matches!(e, Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)))).unwrap_or(true)
}

impl Incremental {
    /// The query's plan below the stored root.
    pub fn body(&self) -> &LogicalPlan {
        &self.body
    }

    /// The same view over `body` (of the same columns) instead, checked to be maintained as
    /// this one is: a sample's cleaning expression (see [`crate::sample`]).
    pub fn with_body(&self, body: LogicalPlan, relations: &dyn Relations) -> Result<Incremental> {
        let incremental = Incremental { body, ..self.clone() };
        incremental.change(&Everything(relations))?;
        Ok(incremental)
    }

    /// The stored rows computed from the tables as they are now.
    pub fn stored(&self, relations: &dyn Relations) -> Result<LogicalPlan> {
        let rewriter = Rewriter::new(relations, matches!(self.root, Root::Rows { .. }));
        let counted = rewriter.counted(&self.body, Version::New)?;
        self.store(counted, false)
    }

    /// The change of the stored rows since the last refresh (with a count `__m` for stored
    /// rows, the deleted extremes `__d0` .. for grouped views), or `None` if nothing changed.
    pub fn change(&self, relations: &dyn Relations) -> Result<Option<LogicalPlan>> {
        let rewriter = Rewriter::new(relations, matches!(self.root, Root::Rows { .. }));
        match rewriter.delta(&self.body)? {
            // A row inserted and deleted again since the refresh is no insertion of an
            // extreme: the change is netted before the extremes are taken.
            Some(delta) if self.has_extremes() => self.store(rewriter.netted(delta)?, true).map(Some),
            Some(delta) => self.store(delta, true).map(Some),
            None => Ok(None),
        }
    }

    /// Whether it stores a MIN or MAX.
    fn has_extremes(&self) -> bool {
        matches!(&self.root, Root::Grouped { states, .. } if states.iter().any(|s| matches!(s.combine, Combine::Extreme { .. })))
    }

    /// The stored rows of the groups in table `groups` (columns `__g0` ..), from the tables as
    /// they are now.
    pub fn regrouped(&self, relations: &dyn Relations, groups: LogicalPlan) -> Result<LogicalPlan> {
        let Root::Grouped { groups: exprs, .. } = &self.root else { return Err("not a grouped view".into()) };
        let rewriter = Rewriter::new(relations, false);
        let counted = rewriter.counted(&self.body, Version::New)?;
        let keys = (0..exprs.len()).map(|g| format!("__g{g}")).collect::<Vec<_>>();
        let groups = project(groups, keys.iter().map(|k| col(Column::new_unqualified(k)).alias(k)).collect())?;
        let restricted = rewriter.restrict(counted, exprs, groups, &keys)?;
        self.store(restricted, false)
    }

    /// Counted rows as the view stores them: aggregated per group, or with their values and
    /// keys renamed (`with_count`: and their count).
    fn store(&self, counted: Counted, with_count: bool) -> Result<LogicalPlan> {
        let m = Expr::Column(counted.m.clone());
        let builder = LogicalPlanBuilder::from(counted.plan);
        let plan = match &self.root {
            Root::Grouped { groups, states } => {
                let groups: Vec<Expr> =
                    groups.iter().enumerate().map(|(g, e)| e.clone().alias(format!("__g{g}"))).collect();
                let named_m = |e: &Expr| -> Result<Expr> {
                    e.clone()
                        .transform(|e| match &e {
                            Expr::Column(c) if c.relation.is_none() && c.name == "__m" => {
                                Ok(Transformed::yes(m.clone()))
                            }
                            _ => Ok(Transformed::no(e)),
                        })
                        .map(|t| t.data)
                        .map_err(|e| e.to_string())
                };
                let mut aggregates = vec![sum(m.clone()).alias("__n")];
                for state in states {
                    aggregates.push(named_m(&state.expr)?.alias(&state.name));
                }
                if with_count {
                    for (j, state) in states.iter().enumerate() {
                        if let Combine::Extreme { deleted, .. } = &state.combine {
                            aggregates.push(named_m(deleted)?.alias(format!("__d{j}")));
                        }
                    }
                }
                builder.aggregate(groups, aggregates)
            }
            Root::Rows { values, .. } => {
                let columns = self.body.schema().columns();
                let mut exprs: Vec<Expr> = columns
                    .iter()
                    .take(*values)
                    .enumerate()
                    .map(|(i, c)| Expr::Column(c.clone()).alias(format!("__v{i}")))
                    .collect();
                exprs.extend(
                    counted.keys.iter().enumerate().map(|(i, (k, _))| Expr::Column(k.clone()).alias(format!("__k{i}"))),
                );
                if with_count {
                    exprs.push(m.alias("__m"));
                }
                builder.project(exprs)
            }
        };
        plan.and_then(LogicalPlanBuilder::build).map_err(|e| e.to_string())
    }

    /// How the change in `__change` edits the stored rows in `__stored` (with their
    /// positions): rows of the stored columns, then `__insert` (the row is to be inserted),
    /// `__dirty` (its group's extreme was deleted: the group is to be computed again with
    /// [`Incremental::regrouped`]) and `__position` (the stored row it replaces or deletes).
    pub fn merge_query(&self) -> String {
        match &self.root {
            Root::Grouped { groups, states } => {
                let g: Vec<String> = (0..groups.len()).map(|g| format!("__g{g}")).collect();
                let mut select: Vec<String> =
                    g.iter().map(|g| format!("CASE WHEN o.__n IS NULL THEN d.{g} ELSE o.{g} END AS {g}")).collect();
                let rows = "COALESCE(o.__n, 0) + COALESCE(d.__n, 0)";
                select.push(format!("{rows} AS __n"));
                let mut dirty = Vec::new();
                for (j, state) in states.iter().enumerate() {
                    let s = &state.name;
                    select.push(match &state.combine {
                        Combine::Add => format!("COALESCE(o.{s}, 0) + COALESCE(d.{s}, 0) AS {s}"),
                        Combine::Extreme { least, .. } => {
                            let (better, worse) = if *least { ("<", "<=") } else { (">", ">=") };
                            dirty.push(format!(
                                "(d.__d{j} IS NOT NULL AND o.{s} IS NOT NULL AND d.__d{j} {worse} o.{s})"
                            ));
                            format!(
                                "CASE WHEN o.{s} IS NULL THEN d.{s} WHEN d.{s} IS NULL THEN o.{s} \
                                 WHEN d.{s} {better} o.{s} THEN d.{s} ELSE o.{s} END AS {s}"
                            )
                        }
                    });
                }
                let dirty = if dirty.is_empty() { "false".to_string() } else { format!("({})", dirty.join(" OR ")) };
                select.push(format!("{rows} > 0 AND NOT {dirty} AS __insert"));
                select.push(format!("{rows} > 0 AND {dirty} AS __dirty"));
                select.push(format!("o.{POSITION} AS __position"));
                let on: Vec<String> = g.iter().map(|g| format!("(o.{g} IS NOT DISTINCT FROM d.{g})")).collect();
                // Only the groups the change touches.
                format!(
                    "SELECT {} FROM __change AS d LEFT JOIN __stored AS o ON {}",
                    select.join(", "),
                    on.join(" AND ")
                )
            }
            Root::Rows { values, keys } => {
                let v: Vec<String> = (0..*values).map(|i| format!("__v{i}")).collect();
                let k: Vec<String> = (0..keys.len()).map(|i| format!("__k{i}")).collect();
                let all = v.iter().chain(&k).cloned().collect::<Vec<_>>().join(", ");
                let on = k.iter().map(|k| format!("(s.{k} IS NOT DISTINCT FROM g.{k})")).collect::<Vec<_>>();
                let stored = v.iter().chain(&k).map(|c| format!("s.{c}")).collect::<Vec<_>>().join(", ");
                format!(
                    "WITH c AS (SELECT {all}, SUM(__m) AS __m FROM __change GROUP BY {all}), \
                     gone AS (SELECT DISTINCT {} FROM c WHERE __m < 0) \
                     SELECT {all}, true AS __insert, false AS __dirty, CAST(NULL AS BIGINT) AS __position FROM c WHERE __m > 0 \
                     UNION ALL SELECT {stored}, false, false, s.{POSITION} FROM __stored AS s JOIN gone AS g ON {}",
                    k.join(", "),
                    if on.is_empty() { "true".into() } else { on.join(" AND ") }
                )
            }
        }
    }

    /// The view's key (SVC's Definition 2), described.
    pub fn key(&self) -> String {
        match &self.root {
            Root::Grouped { groups, .. } => {
                format!("({}): the group key", groups.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(", "))
            }
            Root::Rows { keys, .. } => format!("({}): the keys of the rows it comes from", keys.join(", ")),
        }
    }

    /// How a refresh works, in a sentence.
    pub fn strategy(&self) -> &'static str {
        match self.root {
            Root::Grouped { .. } => {
                "incremental: the query's change per group since the last refresh, added to the stored groups"
            }
            Root::Rows { .. } => {
                "incremental: the query's change since the last refresh; rows taken away deleted by key, rows added inserted"
            }
        }
    }

    /// The columns users see over counted stored rows `stored`, with their count `__m` and
    /// key columns `keys`.
    pub fn visible_counted(&self, stored: LogicalPlan, keys: &[String]) -> Result<LogicalPlan> {
        let extra = keys.iter().map(String::as_str).chain(["__m"]).map(|k| col(Column::new_unqualified(k)));
        self.visible_with(stored, extra.collect())
    }

    /// The column users see that shows the stored key column `stored` (`__g0` .., or `__k0`
    /// .. of a view of rows, shown by the column of the key's name), with its type.
    pub fn visible_key(&self, stored: &str) -> Option<(String, DataType)> {
        let shows = |e: &Expr, name: &str| matches!(e.clone().unalias(), Expr::Column(c) if c.name == name);
        let column = match (&self.root, stored.strip_prefix("__k")) {
            (Root::Rows { keys, .. }, Some(index)) => {
                let described = keys.get(index.parse::<usize>().ok()?)?;
                let name = described.rsplit('.').next()?;
                self.schema.fields().iter().position(|f| f.name() == name)
            }
            _ => self.visible.iter().position(|e| shows(e, stored)),
        }?;
        let field = self.schema.field(column);
        Some((field.name().clone(), field.data_type().clone()))
    }

    /// The columns users see, over the stored rows read by `stored`.
    pub fn visible(&self, stored: LogicalPlan) -> Result<LogicalPlan> {
        self.visible_with(stored, Vec::new())
    }

    /// The columns users see over the stored rows read by `stored`, then `extra`.
    pub fn visible_with(&self, stored: LogicalPlan, extra: Vec<Expr>) -> Result<LogicalPlan> {
        let mut builder = LogicalPlanBuilder::from(stored);
        if let Some(having) = &self.having {
            builder = builder.filter(having.clone()).map_err(plan_error)?;
        }
        let mut exprs = self.visible.clone();
        exprs.extend(extra);
        builder.project(exprs).and_then(LogicalPlanBuilder::build).map_err(plan_error)
    }
}

/// A counted plan: its rows with a count column `m` and key columns, each key described.
#[derive(Clone)]
struct Counted {
    plan: LogicalPlan,
    m: Column,
    keys: Vec<(Column, String)>,
}

/// Derives counted plans from a query's plan.
struct Rewriter<'a> {
    relations: &'a dyn Relations,
    /// Whether counted plans carry their rows' keys.
    keys: bool,
    next: Cell<usize>,
}

fn plan_error(e: impl std::fmt::Display) -> String {
    format!("cannot plan the maintenance: {e}")
}

impl<'a> Rewriter<'a> {
    fn new(relations: &'a dyn Relations, keys: bool) -> Self {
        Rewriter { relations, keys, next: Cell::new(0) }
    }

    /// A column name not used elsewhere.
    fn fresh(&self, prefix: &str) -> String {
        let n = self.next.get();
        self.next.set(n + 1);
        format!("{prefix}{n}")
    }

    fn changed(&self, plan: &LogicalPlan) -> bool {
        plan.exists(|node| Ok(matches!(node, LogicalPlan::TableScan(s) if self.relations.changed(&s.table_name.table().to_lowercase()))))
            .unwrap_or(true)
    }

    /// `plan` over the tables at `version` (new or old), counted.
    fn counted(&self, plan: &LogicalPlan, version: Version) -> Result<Counted> {
        let version = if version == Version::Old && !self.changed(plan) { Version::New } else { version };
        if let LogicalPlan::TableScan(_) = plan {
            return self.scan(plan, version);
        }
        let linear = is_linear(plan);
        let inputs = plan
            .inputs()
            .into_iter()
            .map(|input| {
                let counted = self.counted(input, version)?;
                // Operators other than the linear ones need the rows there, once each.
                if version == Version::Old && !linear && self.changed(input) {
                    self.consolidated(counted)
                } else {
                    Ok(counted)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        self.apply(plan, inputs)
    }

    /// The change of `plan`, or `None` if none of the tables it reads changed.
    fn delta(&self, plan: &LogicalPlan) -> Result<Option<Counted>> {
        if !self.changed(plan) {
            return Ok(None);
        }
        match plan {
            LogicalPlan::TableScan(_) => self.scan(plan, Version::Delta).map(Some),
            LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) => {
                let input = self.delta(plan.inputs()[0])?.ok_or("a changed input has no change")?;
                self.apply(plan, vec![input]).map(Some)
            }
            LogicalPlan::Join(join) if join.join_type == JoinType::Inner => {
                let (left, right) = (join.left.as_ref(), join.right.as_ref());
                let mut terms = Vec::new();
                if let Some(d) = self.delta(left)? {
                    terms.push(self.apply(plan, vec![d, self.counted(right, Version::New)?])?);
                }
                if let Some(d) = self.delta(right)? {
                    terms.push(self.apply(plan, vec![self.counted(left, Version::Old)?, d])?);
                }
                self.union_all(plan, terms).map(Some)
            }
            LogicalPlan::Union(union) => {
                let mut branches = Vec::new();
                for (b, input) in union.inputs.iter().enumerate() {
                    if let Some(d) = self.delta(input)? {
                        branches.push((b, d));
                    }
                }
                self.union_branches(plan, branches).map(Some)
            }
            _ if is_keyed(plan) => self.affected(plan).map(Some),
            other => Err(refusal(other)),
        }
    }

    /// The change of a keyed operator: its result now minus its result then, both for the
    /// keys its inputs' changes touch.
    fn affected(&self, plan: &LogicalPlan) -> Result<Counted> {
        let inputs = plan.inputs();
        let partitions = partition_keys(plan)?;
        // The touched keys: each changed input's change, projected on its key expressions.
        let names: Vec<String> = (0..partitions[0].len()).map(|_| self.fresh("__a")).collect();
        let mut touched = Vec::new();
        for (input, exprs) in inputs.iter().zip(&partitions) {
            if let Some(d) = self.delta(input)? {
                let projected = exprs.iter().zip(&names).map(|(e, n)| e.clone().alias(n)).collect::<Vec<_>>();
                touched.push(project(d.plan, projected)?);
            }
        }
        let mut keys = touched.remove(0);
        for other in touched {
            keys = LogicalPlan::Union(
                Union::try_new_with_loose_types(vec![Arc::new(keys), Arc::new(other)]).map_err(plan_error)?,
            );
        }
        let keys = LogicalPlanBuilder::from(keys).distinct().and_then(|b| b.build()).map_err(plan_error)?;
        let mut versions = Vec::new();
        for version in [Version::New, Version::Old] {
            let restricted = inputs
                .iter()
                .zip(&partitions)
                .map(|(input, exprs)| {
                    let mut counted = self.counted(input, version)?;
                    if version == Version::Old && self.changed(input) {
                        counted = self.consolidated(counted)?;
                    }
                    self.restrict(counted, exprs, keys.clone(), &names)
                })
                .collect::<Result<Vec<_>>>()?;
            versions.push(self.apply(plan, restricted)?);
        }
        let old = versions.pop().expect("two versions");
        let old = self.with_count(old, |m| Expr::Negative(Box::new(m)))?;
        let new = versions.pop().expect("two versions");
        self.union_all(plan, vec![new, old])
    }

    /// `counted` with only the rows whose `exprs` equal a row of `keys` (columns `names`),
    /// NULL equal to NULL.
    fn restrict(&self, counted: Counted, exprs: &[Expr], keys: LogicalPlan, names: &[String]) -> Result<Counted> {
        let on = exprs.iter().zip(names).map(|(e, n)| (e.clone(), col(Column::new_unqualified(n)))).collect();
        let join = Join::try_new(
            Arc::new(counted.plan),
            Arc::new(keys),
            on,
            None,
            JoinType::LeftSemi,
            datafusion::logical_expr::JoinConstraint::On,
            NullEquality::NullEqualsNull,
            false,
        )
        .map_err(plan_error)?;
        Ok(Counted { plan: LogicalPlan::Join(join), ..counted })
    }

    /// `counted` with each distinct row once, with its total count, rows counted 0 or less
    /// dropped.
    fn consolidated(&self, counted: Counted) -> Result<Counted> {
        self.summed(counted, |m| m.gt(lit(0i64)))
    }

    /// A counted change with each row once, its counts summed, and the rows whose inserts and
    /// deletes cancel left out.
    fn netted(&self, counted: Counted) -> Result<Counted> {
        self.summed(counted, |m| m.not_eq(lit(0i64)))
    }

    /// `counted` with each row once and its counts summed, the rows whose sum meets `keep`.
    fn summed(&self, counted: Counted, keep: impl Fn(Expr) -> Expr) -> Result<Counted> {
        let m = self.fresh("__m");
        let groups: Vec<Expr> =
            counted.plan.schema().columns().into_iter().filter(|c| *c != counted.m).map(Expr::Column).collect();
        let plan = LogicalPlanBuilder::from(counted.plan)
            .aggregate(groups, vec![sum(Expr::Column(counted.m.clone())).alias(&m)])
            .and_then(|b| b.filter(keep(col(Column::new_unqualified(&m)))))
            .and_then(|b| b.build())
            .map_err(plan_error)?;
        Ok(Counted { plan, m: Column::new_unqualified(m), keys: counted.keys })
    }

    /// A table scan read at `version`: its columns, key columns and count.
    fn scan(&self, plan: &LogicalPlan, version: Version) -> Result<Counted> {
        let LogicalPlan::TableScan(scan) = plan else { return Err(refusal(plan)) };
        if scan.projection.is_some() || !scan.filters.is_empty() || scan.fetch.is_some() {
            return Err(refusal(plan));
        }
        let table = scan.table_name.table().to_lowercase();
        let source = self.relations.scan(&table, version)?;
        let m = self.fresh("__m");
        let mut exprs: Vec<Expr> =
            scan.projected_schema.fields().iter().map(|f| col(Column::new_unqualified(f.name()))).collect();
        let mut keys = Vec::new();
        if self.keys {
            for key in self.relations.key(&table) {
                let name = self.fresh("__k");
                exprs.push(col(Column::new_unqualified(&key)).alias(&name));
                keys.push((Column::new(Some(scan.table_name.clone()), name), format!("{}.{key}", scan.table_name)));
            }
        }
        exprs.push(col(Column::new_unqualified("__m")).alias(&m));
        let plan = LogicalPlanBuilder::from(source)
            .project(exprs)
            .and_then(|b| b.alias(scan.table_name.clone()))
            .and_then(|b| b.build())
            .map_err(plan_error)?;
        Ok(Counted { plan, m: Column::new(Some(scan.table_name.clone()), m), keys })
    }

    /// Operator `plan` applied to counted `inputs` (in its inputs' order).
    fn apply(&self, plan: &LogicalPlan, mut inputs: Vec<Counted>) -> Result<Counted> {
        match plan {
            LogicalPlan::Projection(projection) => {
                let input = inputs.remove(0);
                let mut exprs = projection.expr.clone();
                let m = self.fresh("__m");
                exprs.push(Expr::Column(input.m.clone()).alias(&m));
                let mut keys = Vec::new();
                for (key, described) in input.keys {
                    let name = self.fresh("__k");
                    exprs.push(Expr::Column(key).alias(&name));
                    keys.push((Column::new_unqualified(name), described));
                }
                let plan = project(input.plan, exprs)?;
                Ok(Counted { plan, m: Column::new_unqualified(m), keys })
            }
            LogicalPlan::Filter(filter) => {
                let input = inputs.remove(0);
                let plan = LogicalPlanBuilder::from(input.plan)
                    .filter(filter.predicate.clone())
                    .and_then(|b| b.build())
                    .map_err(plan_error)?;
                Ok(Counted { plan, ..input })
            }
            LogicalPlan::SubqueryAlias(alias) => {
                let input = inputs.remove(0);
                let plan = LogicalPlanBuilder::from(input.plan)
                    .alias(alias.alias.clone())
                    .and_then(|b| b.build())
                    .map_err(plan_error)?;
                let requalified = |c: Column| Column::new(Some(alias.alias.clone()), c.name);
                Ok(Counted {
                    plan,
                    m: requalified(input.m),
                    keys: input.keys.into_iter().map(|(k, d)| (requalified(k), d)).collect(),
                })
            }
            LogicalPlan::Join(join) => {
                let right = inputs.pop().ok_or("a join without inputs")?;
                let left = inputs.pop().ok_or("a join without inputs")?;
                if join.null_aware || matches!(join.join_type, JoinType::LeftMark | JoinType::RightMark) {
                    return Err(refusal(plan));
                }
                let joined = Join::try_new(
                    Arc::new(left.plan),
                    Arc::new(right.plan),
                    join.on.clone(),
                    join.filter.clone(),
                    join.join_type,
                    join.join_constraint,
                    join.null_equality,
                    false,
                )
                .map_err(plan_error)?;
                let (l, r) = (Expr::Column(left.m.clone()), Expr::Column(right.m.clone()));
                let padded = |e: Expr| datafusion::functions::core::expr_fn::coalesce(vec![e, lit(1i64)]);
                let (m, keys) = match join.join_type {
                    JoinType::Inner => (l * r, [left.keys, right.keys].concat()),
                    JoinType::Left => (l * padded(r), [left.keys, right.keys].concat()),
                    JoinType::Right => (padded(l) * r, [left.keys, right.keys].concat()),
                    JoinType::Full => (padded(l) * padded(r), [left.keys, right.keys].concat()),
                    JoinType::LeftSemi | JoinType::LeftAnti => {
                        return Ok(Counted { plan: LogicalPlan::Join(joined), m: left.m, keys: left.keys })
                    }
                    JoinType::RightSemi | JoinType::RightAnti => {
                        return Ok(Counted { plan: LogicalPlan::Join(joined), m: right.m, keys: right.keys })
                    }
                    _ => return Err(refusal(plan)),
                };
                let counted = Counted { plan: LogicalPlan::Join(joined), m: left.m.clone(), keys };
                let dropped = [left.m, right.m];
                self.replace_count(counted, &dropped, m)
            }
            LogicalPlan::Union(_) => self.union_branches(plan, inputs.into_iter().enumerate().collect()),
            LogicalPlan::Distinct(Distinct::All(input)) => {
                let counted = inputs.remove(0);
                let groups: Vec<Expr> = input.schema().columns().into_iter().map(Expr::Column).collect();
                self.grouped(counted, groups.clone(), Vec::new(), input.schema().columns())
            }
            LogicalPlan::Aggregate(aggregate) => {
                let counted = inputs.remove(0);
                if aggregate.group_expr.is_empty() {
                    return Err("a global aggregate inside the query is recomputed".into());
                }
                let m = Expr::Column(counted.m.clone());
                let mut values = Vec::new();
                for (j, expr) in aggregate.aggr_expr.iter().enumerate() {
                    let name = aggregate.schema.field(aggregate.group_expr.len() + j).name().clone();
                    values.push(aggregate_value(expr, &m)?.alias(name));
                }
                let group_columns = aggregate.schema.columns()[..aggregate.group_expr.len()].to_vec();
                self.grouped(counted, aggregate.group_expr.clone(), values, group_columns)
            }
            other => Err(refusal(other)),
        }
    }

    /// Rows of `counted` grouped by `groups`, with aggregate `values`, each group once (count
    /// 1) if its rows count more than 0; the group columns are its key.
    fn grouped(
        &self,
        counted: Counted,
        groups: Vec<Expr>,
        values: Vec<Expr>,
        group_columns: Vec<Column>,
    ) -> Result<Counted> {
        let rows = self.fresh("__n");
        let mut aggregates = values.clone();
        aggregates.push(sum(Expr::Column(counted.m.clone())).alias(&rows));
        let m = self.fresh("__m");
        let mut exprs: Vec<Expr> = group_columns.iter().cloned().map(Expr::Column).collect();
        exprs.extend(values.iter().map(|v| col(Column::new_unqualified(v.schema_name().to_string()))));
        exprs.push(lit(1i64).alias(&m));
        let plan = LogicalPlanBuilder::from(counted.plan)
            .aggregate(groups, aggregates)
            .and_then(|b| b.filter(col(Column::new_unqualified(&rows)).gt(lit(0i64))))
            .and_then(|b| b.project(exprs))
            .and_then(|b| b.build())
            .map_err(plan_error)?;
        let keys = group_columns.into_iter().map(|c| (c.clone(), c.flat_name())).collect();
        Ok(Counted { plan, m: Column::new_unqualified(m), keys })
    }

    /// `counted` with its count computed by `count` from the present one.
    fn with_count(&self, counted: Counted, count: impl Fn(Expr) -> Expr) -> Result<Counted> {
        let m = count(Expr::Column(counted.m.clone()));
        let dropped = [counted.m.clone()];
        self.replace_count(counted, &dropped, m)
    }

    /// `counted` without the columns `dropped`, with a count column computed by `m`.
    fn replace_count(&self, counted: Counted, dropped: &[Column], m: Expr) -> Result<Counted> {
        let name = self.fresh("__m");
        let mut exprs: Vec<Expr> =
            counted.plan.schema().columns().into_iter().filter(|c| !dropped.contains(c)).map(Expr::Column).collect();
        exprs.push(m.alias(&name));
        let plan = project(counted.plan, exprs)?;
        Ok(Counted { plan, m: Column::new_unqualified(name), keys: counted.keys })
    }

    /// Counted `terms` of `plan`'s rows, one after the other.
    fn union_all(&self, plan: &LogicalPlan, mut terms: Vec<Counted>) -> Result<Counted> {
        if terms.len() == 1 {
            return Ok(terms.remove(0));
        }
        // A union's columns have no qualifiers: the terms' columns go through it by position
        // and get their qualifiers back after it.
        let columns = plan.schema().columns();
        let positions: Vec<String> = columns.iter().map(|_| self.fresh("__c")).collect();
        let width = terms.first().map_or(0, |t| t.keys.len());
        let m = self.fresh("__m");
        let names: Vec<String> = (0..width).map(|_| self.fresh("__k")).collect();
        let mut plans = Vec::new();
        let mut described = Vec::new();
        for term in terms {
            let mut exprs: Vec<Expr> =
                columns.iter().zip(&positions).map(|(c, p)| Expr::Column(c.clone()).alias(p)).collect();
            exprs.extend(term.keys.iter().zip(&names).map(|((k, _), n)| Expr::Column(k.clone()).alias(n)));
            exprs.push(Expr::Column(term.m.clone()).alias(&m));
            described = term.keys.iter().map(|(_, d)| d.clone()).collect();
            plans.push(project(term.plan, exprs)?);
        }
        let union = self.union(plans, &m, names.into_iter().zip(described).collect())?;
        let mut exprs: Vec<Expr> = columns
            .iter()
            .zip(&positions)
            .map(|(c, p)| col(Column::new_unqualified(p)).alias_qualified(c.relation.clone(), &c.name))
            .collect();
        exprs.extend(union.keys.iter().map(|(k, _)| Expr::Column(k.clone())));
        exprs.push(Expr::Column(union.m.clone()));
        Ok(Counted { plan: project(union.plan, exprs)?, ..union })
    }

    /// The counted branches (numbered) of UNION ALL `plan`, each row keyed by its branch and
    /// its key in that branch.
    fn union_branches(&self, plan: &LogicalPlan, branches: Vec<(usize, Counted)>) -> Result<Counted> {
        let LogicalPlan::Union(union) = plan else { return Err(refusal(plan)) };
        let names: Vec<String> = plan.schema().fields().iter().map(|f| f.name().clone()).collect();
        let m = self.fresh("__m");
        // Key slots: the branch number, then each branch's keys in slots of their own.
        let mut slots: Vec<(String, String, DataType)> = Vec::new();
        let mut owned: Vec<std::ops::Range<usize>> = Vec::new();
        if self.keys {
            slots.push((self.fresh("__k"), "branch of UNION ALL".into(), DataType::Int64));
            for (b, input) in union.inputs.iter().enumerate() {
                let start = slots.len();
                for (described, data_type) in self.counted_keys(input)? {
                    slots.push((self.fresh("__k"), format!("{described} (branch {b})"), data_type));
                }
                owned.push(start..slots.len());
            }
        }
        let mut plans = Vec::new();
        for (b, counted) in branches {
            let input = &union.inputs[b];
            let mut exprs: Vec<Expr> =
                input.schema().columns().into_iter().zip(&names).map(|(c, n)| Expr::Column(c).alias(n)).collect();
            if self.keys {
                exprs.push(lit(b as i64).alias(&slots[0].0));
                for (s, (name, _, data_type)) in slots.iter().enumerate().skip(1) {
                    let value = if owned[b].contains(&s) {
                        Expr::Column(counted.keys[s - owned[b].start].0.clone())
                    } else {
                        lit(ScalarValue::try_from(data_type).map_err(plan_error)?)
                    };
                    exprs.push(value.alias(name));
                }
            }
            exprs.push(Expr::Column(counted.m.clone()).alias(&m));
            plans.push(project(counted.plan, exprs)?);
        }
        self.union(plans, &m, slots.into_iter().map(|(n, d, _)| (n, d)).collect())
    }

    /// The described key columns of `plan` and their types.
    fn counted_keys(&self, plan: &LogicalPlan) -> Result<Vec<(String, DataType)>> {
        let counted = self.counted(plan, Version::New)?;
        counted
            .keys
            .iter()
            .map(|(k, d)| {
                Ok((
                    d.clone(),
                    counted
                        .plan
                        .schema()
                        .qualified_field_from_column(k)
                        .map(|(_, f)| f)
                        .map_err(plan_error)?
                        .data_type()
                        .clone(),
                ))
            })
            .collect()
    }

    /// `plans` (of equal columns) one after the other, with count column `m` and key columns
    /// `keys` (name, description).
    fn union(&self, mut plans: Vec<LogicalPlan>, m: &str, keys: Vec<(String, String)>) -> Result<Counted> {
        let plan = if plans.len() == 1 {
            plans.remove(0)
        } else {
            LogicalPlan::Union(
                Union::try_new_with_loose_types(plans.into_iter().map(Arc::new).collect()).map_err(plan_error)?,
            )
        };
        Ok(Counted {
            plan,
            m: Column::new_unqualified(m),
            keys: keys.into_iter().map(|(n, d)| (Column::new_unqualified(n), d)).collect(),
        })
    }
}

/// `plan` projected on `exprs`.
fn project(plan: LogicalPlan, exprs: Vec<Expr>) -> Result<LogicalPlan> {
    LogicalPlanBuilder::from(plan).project(exprs).and_then(|b| b.build()).map_err(plan_error)
}

/// Whether the change of `plan` is `plan` applied to its inputs' changes.
fn is_linear(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Join(join) => join.join_type == JoinType::Inner,
        other => matches!(
            other,
            LogicalPlan::Projection(_) | LogicalPlan::Filter(_) | LogicalPlan::SubqueryAlias(_) | LogicalPlan::Union(_)
        ),
    }
}

/// Whether `plan`'s rows for one key depend on its inputs' rows of that key only.
fn is_keyed(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::Join(_) | LogicalPlan::Distinct(Distinct::All(_)) | LogicalPlan::Aggregate(_))
}

/// The expressions each input of keyed operator `plan` is partitioned by.
fn partition_keys(plan: &LogicalPlan) -> Result<Vec<Vec<Expr>>> {
    match plan {
        LogicalPlan::Distinct(Distinct::All(input)) => {
            Ok(vec![input.schema().columns().into_iter().map(Expr::Column).collect()])
        }
        LogicalPlan::Aggregate(aggregate) if !aggregate.group_expr.is_empty() => Ok(vec![aggregate.group_expr.clone()]),
        LogicalPlan::Join(join) => {
            let mut pairs: Vec<(Expr, Expr)> = join.on.clone();
            if let Some(filter) = &join.filter {
                for conjunct in datafusion::logical_expr::utils::split_conjunction(filter) {
                    if let Expr::BinaryExpr(b) = conjunct {
                        if b.op == Operator::Eq {
                            let on = |e: &Expr, plan: &LogicalPlan| {
                                let columns = e.column_refs();
                                !columns.is_empty() && columns.iter().all(|c| plan.schema().has_column(c))
                            };
                            if on(&b.left, &join.left) && on(&b.right, &join.right) {
                                pairs.push((*b.left.clone(), *b.right.clone()));
                            } else if on(&b.right, &join.left) && on(&b.left, &join.right) {
                                pairs.push((*b.right.clone(), *b.left.clone()));
                            }
                        }
                    }
                }
            }
            if pairs.is_empty() {
                return Err(format!("the {} join has no equality between its sides (recomputed)", join.join_type));
            }
            Ok(vec![pairs.iter().map(|(l, _)| l.clone()).collect(), pairs.into_iter().map(|(_, r)| r).collect()])
        }
        other => Err(refusal(other)),
    }
}

/// The final value of aggregate `expr` over counted rows with count `m` (positive).
fn aggregate_value(expr: &Expr, m: &Expr) -> Result<Expr> {
    let unsupported =
        || format!("`{expr}` inside the query is not COUNT, SUM, AVG, MIN or MAX of one value (recomputed)");
    let Expr::AggregateFunction(AggregateFunction { func, params }) = expr.clone().unalias() else {
        return Err(unsupported());
    };
    if params.distinct || params.filter.is_some() || !params.order_by.is_empty() {
        return Err(unsupported());
    }
    let [x] = params.args.as_slice() else { return Err(unsupported()) };
    let count = sum(when(x.clone().is_not_null(), m.clone()).otherwise(lit(0i64)).map_err(|e| e.to_string())?);
    let total = sum(x.clone() * m.clone());
    Ok(match func.name() {
        "count" => count,
        "sum" => when(count.gt(lit(0i64)), total).end().map_err(|e| e.to_string())?,
        "avg" => when(count.clone().gt(lit(0i64)), cast(total, DataType::Float64) / cast(count, DataType::Float64))
            .end()
            .map_err(|e| e.to_string())?,
        "min" => min(x.clone()),
        "max" => max(x.clone()),
        _ => return Err(unsupported()),
    })
}

/// Why operator `plan` makes the view recomputed.
fn refusal(plan: &LogicalPlan) -> String {
    let what = match plan {
        LogicalPlan::Sort(_) => "ORDER BY".to_string(),
        LogicalPlan::Limit(_) => "LIMIT".to_string(),
        LogicalPlan::Window(_) => "a window function".to_string(),
        LogicalPlan::Join(join) if join.null_aware => "NOT IN".to_string(),
        other => format!("`{}`", other.display()),
    };
    format!("the query has {what}, which is recomputed")
}
