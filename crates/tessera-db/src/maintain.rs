//! How a materialized view is refreshed: incrementally where its query is a grouped
//! aggregate (COUNT, SUM, AVG) over inner joins of tables, by recomputation otherwise, with
//! the reason.
//!
//! The incremental form is the change-table method (SVC, Section 3): the view stores, per
//! group, the count of rows and each aggregate's sum and count of non-NULL values (the columns
//! users see are computed from them); a refresh aggregates the change of the join since the
//! view's last refresh, and adds it to the stored groups in a full outer join on the group key,
//! dropping the groups left without rows. The change of a join of tables `T1 .. Tn` follows
//! the telescoping sum `sum_i T1' .. T(i-1)' x dTi x T(i+1) .. Tn`: the tables before the
//! changed one as they are now, the changed one's inserted rows counted +1 and deleted rows -1
//! (an update is both), the tables after it as they were at the last refresh (their rows now,
//! their inserted rows -1, their deleted rows +1). A row's count is the product of its parts'.

use datafusion_sql::sqlparser::ast;

/// One table of the view's FROM clause: its name in the database and the name the query
/// calls it by.
#[derive(Debug, Clone)]
pub struct Relation {
    pub table: String,
    pub alias: String,
}

/// A grouped aggregate the view maintains incrementally.
#[derive(Debug, Clone)]
pub struct Aggregation {
    select: ast::Select,
    pub relations: Vec<Relation>,
    /// GROUP BY expressions, as SQL.
    groups: Vec<String>,
    /// Arguments of the SUMs, AVGs and COUNTs of a value, as SQL.
    values: Vec<String>,
    /// The columns users see, over the stored ones.
    visible: Vec<String>,
    /// The output column names of the view's query.
    pub columns: Vec<String>,
}

#[derive(Debug, Clone)]
pub enum Maintenance {
    Incremental(Box<Aggregation>),
    Recompute(String),
}

/// How the view with `query` is refreshed; `is_table` says which names are tables.
pub fn plan(query: &ast::Query, is_table: impl Fn(&str) -> bool) -> Maintenance {
    match aggregation(query, &is_table) {
        Ok(aggregation) => Maintenance::Incremental(Box::new(aggregation)),
        Err(reason) => Maintenance::Recompute(reason),
    }
}

fn aggregation(query: &ast::Query, is_table: &impl Fn(&str) -> bool) -> Result<Aggregation, String> {
    if query.with.is_some() || query.order_by.is_some() || query.limit_clause.is_some() || query.fetch.is_some() {
        return Err("the query has WITH, ORDER BY or LIMIT".into());
    }
    let ast::SetExpr::Select(select) = query.body.as_ref() else {
        return Err("the query is not one SELECT (set operations are recomputed)".into());
    };
    if select.distinct.is_some() || select.having.is_some() || select.qualify.is_some() {
        return Err("the query has DISTINCT, HAVING or QUALIFY".into());
    }
    let groups: Vec<String> = match &select.group_by {
        ast::GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() && !exprs.is_empty() => {
            if exprs.iter().any(|e| matches!(e, ast::Expr::Value(_))) {
                return Err("GROUP BY names a position".into());
            }
            exprs.iter().map(ToString::to_string).collect()
        }
        _ => return Err("the query has no GROUP BY of expressions (a global aggregate is recomputed)".into()),
    };
    let mut relations = Vec::new();
    for from in &select.from {
        relation(&from.relation, is_table, &mut relations)?;
        for join in &from.joins {
            match &join.join_operator {
                ast::JoinOperator::Join(_) | ast::JoinOperator::Inner(_) => {}
                other => return Err(format!("the query has a join other than an inner join ({other:?})")),
            }
            relation(&join.relation, is_table, &mut relations)?;
        }
    }
    let mut values = Vec::new();
    let mut visible = Vec::new();
    let mut columns = Vec::new();
    for item in &select.projection {
        let (expr, name) = match item {
            ast::SelectItem::ExprWithAlias { expr, alias } => (expr, alias.value.clone()),
            ast::SelectItem::UnnamedExpr(expr @ ast::Expr::Identifier(ident)) => (expr, ident.value.clone()),
            ast::SelectItem::UnnamedExpr(expr @ ast::Expr::CompoundIdentifier(parts)) => {
                (expr, parts.last().map(|p| p.value.clone()).unwrap_or_default())
            }
            other => return Err(format!("the output `{other}` has no name: name it with AS")),
        };
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        if let Some(g) = groups.iter().position(|g| *g == expr.to_string()) {
            visible.push(format!("__g{g} AS {quoted}"));
        } else {
            let (function, argument) = aggregate_call(expr)?;
            let j = values.len();
            match (function.as_str(), argument) {
                ("count", None) => visible.push(format!("__n AS {quoted}")),
                ("count", Some(arg)) => {
                    values.push(arg);
                    visible.push(format!("__c{j} AS {quoted}"));
                }
                ("sum", Some(arg)) => {
                    values.push(arg);
                    visible.push(format!("CASE WHEN __c{j} > 0 THEN __s{j} END AS {quoted}"));
                }
                ("avg", Some(arg)) => {
                    values.push(arg);
                    visible.push(format!("CASE WHEN __c{j} > 0 THEN CAST(__s{j} AS DOUBLE) / __c{j} END AS {quoted}"));
                }
                _ => return Err(format!("`{expr}` is not COUNT, SUM or AVG (MIN, MAX and others are recomputed)")),
            }
        }
        columns.push(name);
    }
    Ok(Aggregation { select: (**select).clone(), relations, groups, values, visible, columns })
}

fn relation(
    factor: &ast::TableFactor,
    is_table: &impl Fn(&str) -> bool,
    out: &mut Vec<Relation>,
) -> Result<(), String> {
    let ast::TableFactor::Table { name, alias, args: None, .. } = factor else {
        return Err(format!("`{factor}` is not a table (subqueries and views are recomputed)"));
    };
    let [part] = name.0.as_slice() else { return Err(format!("`{name}` is not a table of the database")) };
    let table = part.as_ident().map(|i| i.value.clone()).unwrap_or_else(|| part.to_string());
    if !is_table(&table) {
        return Err(format!("`{table}` is not a table (a view over a view is recomputed)"));
    }
    let alias = alias.as_ref().map_or_else(|| table.clone(), |a| a.name.value.clone());
    out.push(Relation { table: table.to_lowercase(), alias });
    Ok(())
}

/// `COUNT(*)`, `COUNT(x)`, `SUM(x)` or `AVG(x)`: the function's lower-case name and argument.
fn aggregate_call(expr: &ast::Expr) -> Result<(String, Option<String>), String> {
    let unsupported = || format!("`{expr}` is neither a GROUP BY expression nor COUNT, SUM or AVG of one value");
    let ast::Expr::Function(function) = expr else { return Err(unsupported()) };
    let ast::FunctionArguments::List(list) = &function.args else { return Err(unsupported()) };
    if function.filter.is_some() || function.over.is_some() || !function.within_group.is_empty() {
        return Err(unsupported());
    }
    if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
        return Err(format!("`{expr}` has DISTINCT or clauses (recomputed)"));
    }
    let name = function.name.to_string().to_lowercase();
    let argument = match list.args.as_slice() {
        [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)] => None,
        [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(arg))] => Some(arg.to_string()),
        _ => return Err(unsupported()),
    };
    Ok((name, argument))
}

impl Aggregation {
    /// The query whose rows the view stores: per group, its key (`__g0` ..), its rows
    /// (`__n`), and each value's sum and count of non-NULL values (`__s0`, `__c0` ..).
    pub fn stored_query(&self) -> String {
        self.grouped(&self.from(&[]), "1")
    }

    /// The view's key (SVC's Definition 2: a grouped aggregate's is its group key).
    pub fn key(&self) -> String {
        format!("({})", self.groups.join(", "))
    }

    /// The columns users see, computed from the stored ones (a SELECT list over them).
    pub fn visible(&self) -> String {
        self.visible.join(", ")
    }

    /// The stored columns' change from the changes of the tables: relation `i`'s term with
    /// `__delta{i}` for it and `__old{j}` for the relations after it.
    pub fn delta_query(&self, changed: &[usize]) -> String {
        let terms: Vec<String> = changed
            .iter()
            .map(|&i| {
                let replaced: Vec<(usize, String)> = std::iter::once((i, format!("__delta{i}")))
                    .chain((i + 1..self.relations.len()).map(|j| (j, format!("__old{j}"))))
                    .collect();
                let count = replaced.iter().map(|(j, _)| format!("__m{j}")).collect::<Vec<_>>().join(" * ");
                self.grouped(&self.from(&replaced), &count)
            })
            .collect();
        let groups = (0..self.groups.len()).map(|g| format!("__g{g}")).collect::<Vec<_>>().join(", ");
        let sums = (0..self.values.len())
            .map(|j| format!(", SUM(__s{j}) AS __s{j}, SUM(__c{j}) AS __c{j}"))
            .collect::<String>();
        format!(
            "SELECT {groups}, SUM(__n) AS __n{sums} FROM ({}) AS terms GROUP BY {groups}",
            terms.join(" UNION ALL ")
        )
    }

    /// The stored rows after a refresh: those of `__stored` plus the change in `__change`,
    /// groups left without rows dropped.
    pub fn merge_query(&self) -> String {
        let groups: Vec<String> = (0..self.groups.len())
            .map(|g| format!("CASE WHEN o.__n IS NULL THEN d.__g{g} ELSE o.__g{g} END AS __g{g}"))
            .collect();
        let on: Vec<String> =
            (0..self.groups.len()).map(|g| format!("(o.__g{g} IS NOT DISTINCT FROM d.__g{g})")).collect();
        let sums: String = (0..self.values.len())
            .map(|j| format!(", COALESCE(o.__s{j}, 0) + COALESCE(d.__s{j}, 0) AS __s{j}, COALESCE(o.__c{j}, 0) + COALESCE(d.__c{j}, 0) AS __c{j}"))
            .collect();
        format!(
            "SELECT {}, COALESCE(o.__n, 0) + COALESCE(d.__n, 0) AS __n{sums} FROM __stored AS o FULL OUTER JOIN __change AS d ON {} \
             WHERE COALESCE(o.__n, 0) + COALESCE(d.__n, 0) > 0",
            groups.join(", "),
            on.join(" AND ")
        )
    }

    /// The view's FROM clause and WHERE, the relations of `replaced` read from other tables
    /// under their own names.
    fn from(&self, replaced: &[(usize, String)]) -> String {
        let mut index = 0;
        let mut from = self.select.from.clone();
        for item in &mut from {
            let factors = std::iter::once(&mut item.relation).chain(item.joins.iter_mut().map(|j| &mut j.relation));
            for factor in factors {
                let alias = format!("\"{}\"", self.relations[index].alias.replace('"', "\"\""));
                if let Some((_, table)) = replaced.iter().find(|(j, _)| *j == index) {
                    *factor = table_factor(&format!("{table} AS {alias}"));
                } else if let ast::TableFactor::Table { name, .. } = factor {
                    *factor = table_factor(&format!("{name} AS {alias}"));
                }
                index += 1;
            }
        }
        let mut sql = format!("FROM {}", from.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "));
        if let Some(selection) = &self.select.selection {
            sql.push_str(&format!(" WHERE {selection}"));
        }
        sql
    }

    /// The grouped aggregation of the stored columns over `from`, each row counted `count`
    /// times.
    fn grouped(&self, from: &str, count: &str) -> String {
        let groups: Vec<String> = self.groups.iter().enumerate().map(|(g, e)| format!("{e} AS __g{g}")).collect();
        let values: String = self
            .values
            .iter()
            .enumerate()
            .map(|(j, v)| {
                format!(", SUM(({v}) * ({count})) AS __s{j}, SUM(CASE WHEN ({v}) IS NOT NULL THEN {count} ELSE 0 END) AS __c{j}")
            })
            .collect();
        format!("SELECT {}, SUM({count}) AS __n{values} {from} GROUP BY {}", groups.join(", "), self.groups.join(", "))
    }
}

/// `text` (`name AS alias`) as a FROM item.
fn table_factor(text: &str) -> ast::TableFactor {
    let dialect = datafusion_sql::sqlparser::dialect::GenericDialect {};
    let mut parser =
        datafusion_sql::sqlparser::parser::Parser::new(&dialect).try_with_sql(text).expect("a table name parses");
    parser.parse_table_factor().expect("a table name parses")
}
