//! The key a view's sample hashes, and where the hash can reach: where the columns of a plan
//! come from and which are equal on every row ([`Provenance`]), the view's key made smaller
//! where a key column depends on others, the key of a plan's rows, and the sampling operator
//! placed at a table's scan.

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan, LogicalPlanBuilder};

use super::{equalities, Result};
use crate::maintain::Relations;

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
pub(super) fn reduce_key(body: &LogicalPlan, groups: &[Expr], relations: &dyn Relations) -> (Vec<usize>, Vec<String>) {
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
pub(super) fn rows_key(
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

/// `plan` with the rows of its `scan`th scan filtered by `filter` of its key columns `key`.
pub(super) fn at_scan(
    plan: &LogicalPlan,
    scan: usize,
    key: &[String],
    filter: impl Fn(&[Expr], &DFSchema) -> Result<Expr>,
) -> Result<LogicalPlan> {
    let mut seen = 0;
    plan.clone()
        .transform_down(|node| {
            if let LogicalPlan::TableScan(t) = &node {
                seen += 1;
                if seen - 1 == scan {
                    let columns: Vec<Expr> =
                        key.iter().map(|k| Expr::Column(Column::new(Some(t.table_name.clone()), k.as_str()))).collect();
                    let predicate =
                        filter(&columns, node.schema()).map_err(datafusion::error::DataFusionError::Plan)?;
                    let filtered = LogicalPlanBuilder::from(node).filter(predicate)?.build()?;
                    return Ok(Transformed::new(filtered, true, TreeNodeRecursion::Jump));
                }
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
        .map_err(|e| e.to_string())
}
