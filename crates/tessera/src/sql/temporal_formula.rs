//! Binding temporal formulas written in SQL: the atoms are named in `WITH`, each a `SELECT` of
//! one source's events whose columns (named with `AS` where needed) are the data variables it
//! binds, and the formula is read in `FROM TEMPORAL(...)`:
//!
//! ```sql
//! WITH alarm   AS (SELECT device FROM events WHERE kind = 'alarm'),
//!      service AS (SELECT device FROM events WHERE kind = 'service')
//! SELECT device, COUNT(*) AS alarms
//! FROM TEMPORAL(SINCE_COUNT(NOT service, alarm))
//! GROUP BY device
//! ```
//!
//! | formula                     | counts, at the current instant, per valuation              |
//! |-----------------------------|-------------------------------------------------------------|
//! | `atom`                      | the events of the instant the atom selects                  |
//! | `TRUE`                      | 1                                                           |
//! | `f AND g`                   | the product (pairs)                                         |
//! | `f OR g`                    | the sum                                                     |
//! | `f AND NOT g`               | `max(0, f - g)`                                             |
//! | `NOT g`                     | 1 where `g` is 0 (under `AND`, in parentheses, or `SINCE`'s hold) |
//! | `FOR_SOME(x, ..., f)`       | the sum over the values of `x` (the paper's EXISTS)         |
//! | `DISTINCT(f)`               | 1 where `f` is positive                                     |
//! | `PREVIOUS(f)`               | `f` one instant earlier                                     |
//! | `SINCE_COUNT(h, q)`         | how many times `q` held with `h` holding ever since (since2)|
//! | `SINCE_DURATION(h, q)`      | how long `h` has held since the earliest such `q` (since1)  |
//! | `ONCE_COUNT(q)`, `ONCE_DURATION(q)` | `SINCE_*(TRUE, q)`                                  |
//! | `SO_FAR(q)`                 | `q OR ONCE_COUNT(q)`: how many times, this instant included |
//!
//! As in the paper, `SINCE` and `ONCE` look strictly before the current instant (`q` held at
//! some earlier instant); `SO_FAR` is the "up to now" count most questions mean.
//!
//! The query selects grouped variables and `COUNT(*)` (the formula's count, summed over the
//! variables not grouped by), or `SELECT DISTINCT` variables. A variable two atoms share joins
//! them as equal values (never NULL, as in a join).

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion_sql::sqlparser::ast::{self, GroupByExpr, SelectItem, SetExpr, Spanned, TableFactor};
use datafusion_sql::sqlparser::tokenizer::Span;

use super::binder::bind_stateless_select;
use super::temporal::{is_count_star, set_semantics, table_name, unnest, Binder, BlockColumn, BlockPlan};
use crate::catalog::sql_type_name;
use crate::error::{Result, TesseraError};
use crate::plan::TemporalBlock;
use crate::synopsis::{Atom, Formula, Program, SinceCount, TemporalQuery, Var};

/// The formula of `FROM TEMPORAL(formula)`, if that is what `select` reads.
pub(super) fn formula_call(select: &ast::Select) -> Option<&ast::TableFactor> {
    match select.from.as_slice() {
        [from] if from.joins.is_empty() => match &from.relation {
            TableFactor::Table { name, args: Some(_), .. } if name.to_string().eq_ignore_ascii_case("temporal") => {
                Some(&from.relation)
            }
            _ => None,
        },
        _ => None,
    }
}

/// An atom a formula reads: its definition in `WITH` and the variables it binds, each with the
/// expression that gives its value.
struct AtomDefinition {
    name: String,
    select: ast::Select,
    vars: Vec<(Var, ast::Expr)>,
}

struct FormulaBinder<'b, 'a> {
    binder: &'b mut Binder<'a>,
    with: Option<&'b ast::With>,
    variables: Vec<String>,
    atoms: Vec<AtomDefinition>,
}

const OPERATORS: &str =
    "AND, OR, AND NOT, NOT, FOR_SOME, DISTINCT, PREVIOUS, SINCE_COUNT, SINCE_DURATION, ONCE_COUNT, \
                         ONCE_DURATION, SO_FAR";

impl FormulaBinder<'_, '_> {
    fn error(&self, message: impl Into<String>, span: Span) -> TesseraError {
        self.binder.script.at_span(message, span)
    }

    fn formula(&mut self, expr: &ast::Expr) -> Result<Formula> {
        Ok(match expr {
            ast::Expr::Nested(inner) => self.formula(inner)?,
            ast::Expr::Identifier(id) => Formula::Atom(self.atom(id)?),
            ast::Expr::Value(v) if matches!(v.value, ast::Value::Boolean(true)) => Formula::True,
            ast::Expr::BinaryOp { left, op: ast::BinaryOperator::And, right } => match right.as_ref() {
                // `f AND NOT g` subtracts; `f AND (NOT g)` keeps f where g is 0.
                ast::Expr::UnaryOp { op: ast::UnaryOperator::Not, expr: negated } => {
                    Formula::and_not(self.formula(left)?, self.formula(negated)?)
                }
                _ => Formula::and(self.formula(left)?, self.formula(right)?),
            },
            ast::Expr::BinaryOp { left, op: ast::BinaryOperator::Or, right } => {
                Formula::or(self.formula(left)?, self.formula(right)?)
            }
            ast::Expr::UnaryOp { op: ast::UnaryOperator::Not, expr } => Formula::Not(Box::new(self.formula(expr)?)),
            ast::Expr::Function(function) => self.operator(function)?,
            other => {
                return Err(self.binder.script.error_with_help(
                    format!("`{other}` is not a temporal formula"),
                    super::diagnostic::span_location(other.span()),
                    Some(format!(
                    "name an atom defined in WITH (put conditions on events there) and combine atoms with {OPERATORS}"
                )),
                ))
            }
        })
    }

    fn operator(&mut self, function: &ast::Function) -> Result<Formula> {
        let name = function.name.to_string().to_ascii_uppercase();
        let args: Vec<&ast::Expr> = match &function.args {
            ast::FunctionArguments::List(list) if list.duplicate_treatment.is_none() && list.clauses.is_empty() => list
                .args
                .iter()
                .map(|a| match a {
                    ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
                    other => Err(self.error(format!("`{other}` is not a temporal formula"), other.span())),
                })
                .collect::<Result<_>>()?,
            _ => return Err(self.error(format!("`{function}`: write {name}(formula, ...)"), function.span())),
        };
        let arity = |n: usize, usage: &str| -> Result<()> {
            if args.len() == n {
                Ok(())
            } else {
                Err(self.error(format!("{name} takes {usage}"), function.span()))
            }
        };
        let since = |count| if name.starts_with("ONCE") { (count, true) } else { (count, false) };
        let (count, once) = match name.as_str() {
            "PREVIOUS" => {
                arity(1, "one formula: PREVIOUS(f) is f one instant earlier")?;
                return Ok(Formula::Previous(Box::new(self.formula(args[0])?)));
            }
            "DISTINCT" => {
                arity(1, "one formula: DISTINCT(f) is 1 where f holds")?;
                return Ok(Formula::Distinct(Box::new(self.formula(args[0])?)));
            }
            "FOR_SOME" => {
                if args.len() < 2 {
                    return Err(self.error(
                        "FOR_SOME takes variables and then a formula: FOR_SOME(device, f) sums f over the devices",
                        function.span(),
                    ));
                }
                let body = self.formula(args[args.len() - 1])?;
                let mut vars = Vec::new();
                for arg in &args[..args.len() - 1] {
                    vars.push(self.variable(arg)?);
                }
                return Ok(Formula::Exists(vars, Box::new(body)));
            }
            "SO_FAR" => {
                arity(1, "one formula: SO_FAR(q) is how many times q has held, this instant included")?;
                let q = self.formula(args[0])?;
                return Ok(Formula::or(q.clone(), Formula::once(SinceCount::Occurrences, q)));
            }
            "ONCE_COUNT" | "SINCE_COUNT" => since(SinceCount::Occurrences),
            "ONCE_DURATION" | "SINCE_DURATION" => since(SinceCount::Duration),
            "ONCE" | "SINCE" => {
                return Err(self.error(
                    format!(
                        "say how {name} counts under duplicate semantics: {name}_COUNT (how many times) or {name}_DURATION \
                         (for how many instants)"
                    ),
                    function.span(),
                ))
            }
            _ => {
                return Err(self.error(
                    format!("`{name}` is not a temporal operator; the operators are {OPERATORS}"),
                    function.name.span(),
                ))
            }
        };
        if once {
            arity(1, &format!("one formula: {name}(q) is SINCE_{}(TRUE, q)", &name[5..]))?;
            return Ok(Formula::once(count, self.formula(args[0])?));
        }
        arity(2, &format!("two formulas: {name}(h, q) holds since q held, with h holding ever since"))?;
        Ok(Formula::since(count, self.formula(args[0])?, self.formula(args[1])?))
    }

    fn variable(&self, expr: &ast::Expr) -> Result<Var> {
        let ast::Expr::Identifier(id) = expr else {
            return Err(self.error(format!("`{expr}` is not a variable: name a column an atom selects"), expr.span()));
        };
        let name = id.value.to_ascii_lowercase();
        self.variables.iter().position(|v| *v == name).ok_or_else(|| {
            self.error(
                format!(
                    "`{}` is not a variable of the formula's atoms (they bind: {})",
                    id.value,
                    self.variables.join(", ")
                ),
                id.span,
            )
        })
    }

    /// The atom `id` names, bound on first use from its definition in WITH.
    fn atom(&mut self, id: &ast::Ident) -> Result<usize> {
        let name = id.value.to_ascii_lowercase();
        if let Some(i) = self.atoms.iter().position(|a| a.name == name) {
            return Ok(i);
        }
        let defined = self.with.map(|w| w.cte_tables.as_slice()).unwrap_or_default();
        let Some(cte) = defined.iter().find(|c| c.alias.name.value.eq_ignore_ascii_case(&name)) else {
            let names: Vec<&str> = defined.iter().map(|c| c.alias.name.value.as_str()).collect();
            return Err(self.binder.script.error_with_help(
                format!("unknown atom `{}`", id.value),
                super::diagnostic::span_location(id.span),
                Some(match super::diagnostic::closest_name(&id.value, names) {
                    Some(close) => format!("did you mean `{close}`?"),
                    None => format!(
                        "name it in WITH: WITH {} AS (SELECT device FROM events WHERE kind = '{}')",
                        id.value, id.value
                    ),
                }),
            ));
        };
        if !cte.alias.columns.is_empty() {
            return Err(self.error("name an atom's variables in its SELECT list (with AS)", cte.alias.span()));
        }
        let query = &cte.query;
        let select = match query.body.as_ref() {
            SetExpr::Select(select)
                if query.with.is_none() && query.order_by.is_none() && query.limit_clause.is_none() =>
            {
                select
            }
            _ => return Err(self.atom_shape(query.span())),
        };
        let relation = match select.from.as_slice() {
            [from] if from.joins.is_empty() => &from.relation,
            _ => return Err(self.atom_shape(select.span())),
        };
        let TableFactor::Table { name: table, args: None, .. } = relation else {
            return Err(self.atom_shape(relation.span()));
        };
        if select.distinct.is_some()
            || select.having.is_some()
            || !matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty())
        {
            return Err(self.atom_shape(select.span()));
        }
        let table = table_name(table);
        let source = self.binder.use_source(&table, relation.span())?;
        let time = source.event_time.column.to_ascii_lowercase();
        let mut vars: Vec<(Var, ast::Expr)> = Vec::new();
        for item in &select.projection {
            let (expr, var_name) = match item {
                SelectItem::UnnamedExpr(ast::Expr::Value(_)) => continue,
                SelectItem::UnnamedExpr(e @ ast::Expr::Identifier(column)) => (e, column.value.to_ascii_lowercase()),
                SelectItem::ExprWithAlias { expr, alias } => (expr, alias.value.to_ascii_lowercase()),
                other => {
                    return Err(self.binder.script.error_with_help(
                        format!("`{other}`: an atom selects the columns it binds as variables"),
                        super::diagnostic::span_location(other.span()),
                        Some(
                            "select columns (device), name expressions (lower(kind) AS k), or SELECT 1 for an atom \
                             that binds no variable"
                                .into(),
                        ),
                    ))
                }
            };
            if matches!(unnest(expr), ast::Expr::Identifier(c) if c.value.eq_ignore_ascii_case(&time)) {
                return Err(self.error(
                    format!("`{expr}` is the event time: it is the instant of the formula, not a data variable"),
                    expr.span(),
                ));
            }
            let var = match self.variables.iter().position(|v| *v == var_name) {
                Some(v) => v,
                None => {
                    self.variables.push(var_name);
                    self.variables.len() - 1
                }
            };
            if vars.iter().any(|(v, _)| *v == var) {
                return Err(self.error(format!("the atom `{name}` binds `{expr}` twice"), expr.span()));
            }
            vars.push((var, expr.clone()));
        }
        self.atoms.push(AtomDefinition { name, select: (**select).clone(), vars });
        Ok(self.atoms.len() - 1)
    }

    fn atom_shape(&self, span: Span) -> TesseraError {
        self.error(
            "an atom is a SELECT of one source's events: WITH alarm AS (SELECT device FROM events WHERE kind = 'alarm')",
            span,
        )
    }
}

/// Binds `SELECT ... FROM TEMPORAL(formula)` over the atoms `with` names.
pub(super) fn bind_formula_block(
    binder: &mut Binder,
    with: Option<&ast::With>,
    select: &ast::Select,
    call: &TableFactor,
) -> Result<BlockPlan> {
    let script = binder.script;
    let formula_expr = match call {
        TableFactor::Table { args: Some(args), alias: None, .. } => match args.args.as_slice() {
            [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e))] => e,
            _ => {
                return Err(script.at_span(
                    "TEMPORAL takes one formula: TEMPORAL(ONCE_COUNT(failure) AND NOT ONCE_COUNT(success))",
                    call.span(),
                ))
            }
        },
        _ => return Err(script.at_span("TEMPORAL(...) takes no alias: select its variables by name", call.span())),
    };
    if let Some(selection) = &select.selection {
        return Err(script.at_span(
            "a temporal formula has no WHERE: put conditions on events in the atoms' WHERE",
            selection.span(),
        ));
    }
    let distinct = set_semantics(script, select)?;
    let mut formula = FormulaBinder { binder, with, variables: Vec::new(), atoms: Vec::new() };
    let body = formula.formula(formula_expr)?;
    if formula.atoms.is_empty() {
        return Err(script.at_span(
            "the formula reads no events: name an atom defined in WITH, such as ONCE_COUNT(alarm)",
            formula_expr.span(),
        ));
    }
    let mut group = Vec::new();
    match &select.group_by {
        GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => {
            for e in exprs {
                group.push(formula.variable(e)?);
            }
        }
        other => return Err(script.at_span("GROUP BY ALL and grouping sets are not supported", other.span())),
    }
    // The SELECT list: grouped variables (all of them under DISTINCT) and the count.
    let mut selected: Vec<(Option<Var>, String, Span)> = Vec::new();
    for item in &select.projection {
        let (expr, alias) = match item {
            SelectItem::UnnamedExpr(e) => (e, None),
            SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
            other => {
                return Err(script.at_span("select grouped variables and COUNT(*) from TEMPORAL(...)", other.span()))
            }
        };
        if is_count_star(expr) && !distinct {
            selected.push((None, alias.unwrap_or_else(|| "count".into()), expr.span()));
            continue;
        }
        let var = formula.variable(expr)?;
        if distinct && !group.contains(&var) {
            group.push(var);
        }
        if !group.contains(&var) {
            return Err(
                script.at_span(format!("`{expr}` is selected but not grouped by: add it to GROUP BY"), expr.span())
            );
        }
        selected.push((Some(var), alias.unwrap_or_else(|| formula.variables[var].clone()), expr.span()));
    }
    // The program's group lists the selected variables in their order, then any others grouped.
    let mut ordered: Vec<Var> = selected.iter().filter_map(|c| c.0).collect();
    ordered.extend(group.iter().filter(|g| !ordered.contains(g)).copied().collect::<Vec<_>>());
    // Atoms bind their variables' values; one shared by two atoms is never NULL (a join).
    let mut shared = vec![0usize; formula.variables.len()];
    for atom in &formula.atoms {
        for (v, _) in &atom.vars {
            shared[*v] += 1;
        }
    }
    let source = formula.binder.source();
    let mut var_types: Vec<Option<(DataType, Span)>> = vec![None; formula.variables.len()];
    let mut atoms = Vec::new();
    let mut atom_plans = Vec::new();
    for atom in &formula.atoms {
        let mut atom_select = atom.select.clone();
        let not_null =
            atom.vars.iter().filter(|(v, _)| shared[*v] > 1).map(|(_, e)| ast::Expr::IsNotNull(Box::new(e.clone())));
        atom_select.selection = atom_select
            .selection
            .take()
            .into_iter()
            .chain(not_null)
            .reduce(|l, r| ast::Expr::BinaryOp { left: Box::new(l), op: ast::BinaryOperator::And, right: Box::new(r) });
        atom_select.projection = std::iter::once(ast::Expr::Identifier(ast::Ident::new(&source.event_time.column)))
            .chain(atom.vars.iter().map(|(_, e)| e.clone()))
            .map(SelectItem::UnnamedExpr)
            .collect();
        let plan = bind_stateless_select(formula.binder.catalog, script, &atom_select)?;
        for (i, (v, expr)) in atom.vars.iter().enumerate() {
            let t = plan.output_schema.field(i + 1).data_type().clone();
            match &var_types[*v] {
                None => var_types[*v] = Some((t, expr.span())),
                Some((first, _)) if *first != t => {
                    return Err(script.at_span(
                        format!(
                            "`{}` is {} in the atom `{}` but {} in another atom",
                            formula.variables[*v],
                            sql_type_name(&t),
                            atom.name,
                            sql_type_name(first)
                        ),
                        expr.span(),
                    ))
                }
                Some(_) => {}
            }
        }
        let predicate = atom.select.selection.as_ref().map_or(String::new(), |p| format!("[{p}]"));
        atoms.push(Atom {
            label: format!("{}{predicate}", atom.name),
            vars: atom.vars.iter().map(|(v, _)| *v).collect(),
        });
        atom_plans.push(plan);
    }
    let query = TemporalQuery { variables: formula.variables.clone(), atoms, body, group: ordered.clone(), distinct };
    let program = Program::compile(&query).map_err(|e| match e {
        TesseraError::Plan(m) => script.at_span(m, formula_expr.span()),
        other => other,
    })?;
    let columns = selected
        .into_iter()
        .map(|(var, name, span)| BlockColumn {
            name,
            group_type: var.map(|v| var_types[v].as_ref().map_or(DataType::Null, |(t, _)| t.clone())),
            span,
        })
        .collect();
    let block = TemporalBlock { program: Arc::new(program), orders: Vec::new(), atoms: atom_plans };
    Ok(BlockPlan { block, columns })
}
