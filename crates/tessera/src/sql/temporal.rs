//! Binding continuous temporal queries: a self-join of one source (`FROM events a, events b`
//! or `JOIN ... ON`), whose WHERE says how the aliases' events relate, with `COUNT(*)` grouped
//! by data columns, and `UNION ALL` of such blocks.
//!
//! Every conjunct of WHERE (and of ON) is classified by the aliases it names:
//!
//! | conjunct                              | becomes                                          |
//! |---------------------------------------|--------------------------------------------------|
//! | names one alias (`a.kind = 'login'`)  | a predicate of that alias's atom                 |
//! | `a.col = b.col` (data columns)        | one data variable both aliases bind              |
//! | `a.ts < b.ts` (`<=`, `=`, `>=`, `>`, `<>`) | an order condition between their instants   |
//! | anything else across aliases          | refused: no synopsis bounds it                    |
//!
//! The result is a [`ConjunctiveQuery`] rewritten into a temporal formula and compiled to a
//! [`Program`]; each alias's rows and variable values are a [`StatelessPlan`] bound like any
//! query over the source (DataFusion expressions, errors at their position in the script).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion_sql::sqlparser::ast::{self, GroupByExpr, SelectItem, Spanned, TableFactor};
use datafusion_sql::sqlparser::tokenizer::Span;

use super::binder::{bind_stateless_select, UNBOUNDED};
use super::diagnostic::span_location;
use super::temporal_formula::{bind_formula_block, formula_call};
use super::{walk, ScriptText};
use crate::catalog::{sql_type_name, Catalog, SourceDef};
use crate::error::{Result, TesseraError};
use crate::plan::{emitted_schema, BranchPlan, EmitMode, QueryPlan, TemporalBlock, TemporalColumn, TemporalPlan};
use crate::synopsis::conjunctive::{self, Allowed, Block, ConjunctiveQuery, MAX_ALIASES};
use crate::synopsis::{Atom, Program, Var};

/// Whether `select` is a continuous temporal query: a self-join of its source, or one alias of
/// it (no window) counted with `COUNT(*)` or selected `DISTINCT`.
pub fn is_temporal(select: &ast::Select) -> bool {
    let self_join = select.from.len() > 1 || select.from.iter().any(|f| !f.joins.is_empty());
    let plain = matches!(select.from.as_slice(), [f] if matches!(f.relation, TableFactor::Table { args: None, .. }));
    let counts = select.projection.iter().any(|item| match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => is_count_star(e),
        _ => false,
    });
    self_join || (plain && (counts || select.distinct.is_some())) || formula_call(select).is_some()
}

pub(super) fn is_count_star(expr: &ast::Expr) -> bool {
    matches!(unnest(expr), ast::Expr::Function(f)
        if f.name.to_string().eq_ignore_ascii_case("count")
            && matches!(&f.args, ast::FunctionArguments::List(l)
                if l.duplicate_treatment.is_none()
                    && matches!(l.args.as_slice(), [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)])))
}

/// One alias of a block: its name and relation (as written), and where it is written.
struct Alias {
    name: String,
    relation: TableFactor,
}

/// A column of an alias: `(alias index, lower-cased column name)`.
type AliasColumn = (usize, String);

/// Union-find over the columns that equalities join.
#[derive(Default)]
struct Classes {
    members: Vec<AliasColumn>,
    parent: Vec<usize>,
}

impl Classes {
    fn id(&mut self, column: &AliasColumn) -> usize {
        match self.members.iter().position(|m| m == column) {
            Some(i) => i,
            None => {
                self.members.push(column.clone());
                self.parent.push(self.parent.len());
                self.members.len() - 1
            }
        }
    }

    fn root(&self, mut i: usize) -> usize {
        while self.parent[i] != i {
            i = self.parent[i];
        }
        i
    }

    fn join(&mut self, a: &AliasColumn, b: &AliasColumn) {
        let (a, b) = (self.id(a), self.id(b));
        let (ra, rb) = (self.root(a), self.root(b));
        self.parent[ra] = rb;
    }

    /// The members of the class of member `i`.
    fn class_of(&self, i: usize) -> Vec<usize> {
        let r = self.root(i);
        (0..self.members.len()).filter(|&m| self.root(m) == r).collect()
    }
}

/// Whether a block of a continuous temporal query selects `DISTINCT` (set semantics); `HAVING`
/// and `DISTINCT ON` are refused.
pub(super) fn set_semantics(script: &ScriptText, select: &ast::Select) -> Result<bool> {
    if let Some(having) = &select.having {
        return Err(script.at_span("HAVING is not supported on a continuous temporal query", having.span()));
    }
    match &select.distinct {
        None => Ok(false),
        Some(ast::Distinct::Distinct) => Ok(true),
        Some(_) => Err(script.at_span("DISTINCT ON is not supported", select.span())),
    }
}

/// The name a relation's table is written with (its last part).
pub(super) fn table_name(name: &ast::ObjectName) -> String {
    name.0.last().and_then(|p| p.as_ident()).map(|i| i.value.clone()).unwrap_or_default()
}

fn split_and(expr: &ast::Expr, out: &mut Vec<ast::Expr>) {
    match expr {
        ast::Expr::BinaryOp { left, op: ast::BinaryOperator::And, right } => {
            split_and(left, out);
            split_and(right, out);
        }
        ast::Expr::Nested(inner) => split_and(inner, out),
        other => out.push(other.clone()),
    }
}

pub(super) fn unnest(expr: &ast::Expr) -> &ast::Expr {
    match expr {
        ast::Expr::Nested(inner) => unnest(inner),
        other => other,
    }
}

/// What binding a block found.
struct BoundBlock {
    aliases: Vec<Alias>,
    /// Per alias, its own predicates.
    predicates: Vec<Vec<ast::Expr>>,
    conditions: Vec<(usize, usize, Allowed)>,
    classes: Classes,
    /// The SELECT list: a grouped column (a member of `classes`) or the count, with its name.
    columns: Vec<(Option<usize>, String, ast::Expr)>,
    distinct: bool,
}

pub(super) struct Binder<'a> {
    pub catalog: &'a Catalog,
    pub script: &'a ScriptText<'a>,
    source: Option<&'a SourceDef>,
}

impl<'a> Binder<'a> {
    pub(super) fn source(&self) -> &'a SourceDef {
        self.source.expect("the first alias names the source")
    }

    /// The source `table` names: every event a query relates comes from this one source.
    pub(super) fn use_source(&mut self, table: &str, span: Span) -> Result<&'a SourceDef> {
        let source =
            self.catalog.source(table).ok_or_else(|| self.script.at_span(format!("unknown source `{table}`"), span))?;
        match self.source {
            None => self.source = Some(source),
            Some(first) if !first.name.eq_ignore_ascii_case(&source.name) => {
                return Err(self.script.at_span(
                    format!(
                        "a continuous temporal query relates the events of one source; `{}` and `{}` differ",
                        first.name, source.name
                    ),
                    span,
                ))
            }
            Some(_) => {}
        }
        Ok(source)
    }

    fn aliases(&mut self, select: &ast::Select) -> Result<Vec<Alias>> {
        let mut relations = Vec::new();
        for from in &select.from {
            relations.push(&from.relation);
            for join in &from.joins {
                relations.push(&join.relation);
                let constraint = match &join.join_operator {
                    ast::JoinOperator::Join(c) | ast::JoinOperator::Inner(c) | ast::JoinOperator::CrossJoin(c) => c,
                    _ => {
                        return Err(self.script.at_span(
                            "a continuous temporal query joins events with inner joins only",
                            join.relation.span(),
                        ))
                    }
                };
                if !matches!(constraint, ast::JoinConstraint::On(_) | ast::JoinConstraint::None) {
                    return Err(self.script.at_span(
                        "join the aliases with ON or in WHERE (USING and NATURAL are not supported)",
                        join.relation.span(),
                    ));
                }
            }
        }
        self.named_aliases(&relations)
    }

    fn named_aliases(&mut self, relations: &[&TableFactor]) -> Result<Vec<Alias>> {
        let mut aliases: Vec<Alias> = Vec::new();
        for relation in relations {
            if let TableFactor::Derived { .. } = relation {
                // Joining derived tables relates what was computed over whole instants, such as
                // Theorem 3.1's "two instants with the same number of events".
                return Err(self.script.error_with_help(
                    format!(
                        "{UNBOUNDED}: a join of subqueries compares values computed over different instants (such \
                         as their numbers of events); answering it exactly needs a value per past instant, so the \
                         query's state would grow with the stream"
                    ),
                    span_location(relation.span()),
                    Some(
                        "join the source's events themselves (FROM events a, events b), count with COUNT(*), or bound \
                         the state with a window (TUMBLE / HOP); or SET allow_unbounded_state = true to keep every \
                         event and answer by batch"
                            .into(),
                    ),
                ));
            }
            let TableFactor::Table { name, alias, args: None, .. } = relation else {
                return Err(self.script.at_span(
                    "a continuous temporal query joins a source with itself: FROM events a, events b",
                    relation.span(),
                ));
            };
            let table = table_name(name);
            self.use_source(&table, relation.span())?;
            let alias_name = alias.as_ref().map_or(table.clone(), |a| a.name.value.clone()).to_ascii_lowercase();
            if aliases.iter().any(|a| a.name == alias_name) {
                return Err(self.script.at_span(
                    format!("`{alias_name}` names two events of the join; give each its own alias"),
                    relation.span(),
                ));
            }
            aliases.push(Alias { name: alias_name, relation: (*relation).clone() });
        }
        if aliases.len() > MAX_ALIASES {
            return Err(self.script.at_span(
                format!(
                    "a continuous temporal query joins at most {MAX_ALIASES} events (their times have too many orders)"
                ),
                relations[MAX_ALIASES].span(),
            ));
        }
        Ok(aliases)
    }

    /// The alias and column of `expr` if it is `alias.column`.
    fn column(&self, aliases: &[Alias], expr: &ast::Expr) -> Result<Option<AliasColumn>> {
        match unnest(expr) {
            ast::Expr::CompoundIdentifier(parts) if parts.len() == 2 => {
                let alias = parts[0].value.to_ascii_lowercase();
                let Some(a) = aliases.iter().position(|x| x.name == alias) else {
                    return Err(self.script.at_span(format!("unknown alias `{}`", parts[0].value), parts[0].span));
                };
                let column = parts[1].value.to_ascii_lowercase();
                if self.source().schema.fields().iter().all(|f| !f.name().eq_ignore_ascii_case(&column)) {
                    return Err(self.script.at_span(
                        format!("`{}` has no column `{}`", self.source().name, parts[1].value),
                        parts[1].span,
                    ));
                }
                Ok(Some((a, column)))
            }
            _ => Ok(None),
        }
    }

    /// The aliases `expr` names; a bare column is refused (it would be ambiguous).
    fn aliases_named(&self, aliases: &[Alias], expr: &ast::Expr) -> Result<Vec<usize>> {
        let mut named = Vec::new();
        let mut error = None;
        let _ = walk::expressions(walk::Node::Expr(expr), |e| {
            let found = match e {
                ast::Expr::Identifier(id) => Err(self.script.error_with_help(
                    format!("`{}` could be a column of any event of the join", id.value),
                    span_location(id.span),
                    Some(format!("qualify it with an alias, for example `{}.{}`", aliases[0].name, id.value)),
                )),
                ast::Expr::CompoundIdentifier(parts) if parts.len() == 2 => {
                    self.column(aliases, e).map(|c| c.map(|c| c.0))
                }
                _ => Ok(None),
            };
            match found {
                Ok(Some(a)) => {
                    if !named.contains(&a) {
                        named.push(a);
                    }
                    std::ops::ControlFlow::Continue(())
                }
                Ok(None) => std::ops::ControlFlow::Continue(()),
                Err(e) => {
                    error = Some(e);
                    std::ops::ControlFlow::Break(())
                }
            }
        });
        error.map_or(Ok(named), Err)
    }

    fn unbounded(&self, conjunct: &ast::Expr, why: &str) -> TesseraError {
        self.script.error_with_help(
            format!(
                "{UNBOUNDED}: `{conjunct}` {why}, so answering it exactly needs every past event and the \
                 query's state would grow with the stream"
            ),
            span_location(conjunct.span()),
            Some(
                "relate events only by equal data columns (a.user_id = b.user_id) and the order of their times \
                 (a.ts < b.ts); bound the state with a window (TUMBLE / HOP) or drop the condition; or SET \
                 allow_unbounded_state = true to keep every event and answer by batch"
                    .into(),
            ),
        )
    }

    fn block(&mut self, select: &ast::Select) -> Result<BoundBlock> {
        let aliases = self.aliases(select)?;
        let mut conjuncts = Vec::new();
        for from in &select.from {
            for join in &from.joins {
                if let ast::JoinOperator::Join(ast::JoinConstraint::On(e))
                | ast::JoinOperator::Inner(ast::JoinConstraint::On(e)) = &join.join_operator
                {
                    split_and(e, &mut conjuncts);
                }
            }
        }
        if let Some(selection) = &select.selection {
            split_and(selection, &mut conjuncts);
        }
        let distinct = set_semantics(self.script, select)?;
        let time = self.source().event_time.column.to_ascii_lowercase();
        let mut predicates = vec![Vec::new(); aliases.len()];
        let mut conditions = Vec::new();
        let mut classes = Classes::default();
        for conjunct in conjuncts {
            let named = self.aliases_named(&aliases, &conjunct)?;
            match named.as_slice() {
                [] => predicates[0].push(conjunct),
                [a] => predicates[*a].push(conjunct),
                [_, _] => {
                    let ast::Expr::BinaryOp { left, op, right } = unnest(&conjunct) else {
                        return Err(self.unbounded(&conjunct, "relates two events other than by a comparison"));
                    };
                    let (Some(l), Some(r)) = (self.column(&aliases, left)?, self.column(&aliases, right)?) else {
                        return Err(
                            self.unbounded(&conjunct, "computes on the columns of two events before comparing them")
                        );
                    };
                    match (l.1 == time, r.1 == time) {
                        (true, true) => {
                            let allowed = Allowed::from_sql(&op.to_string()).ok_or_else(|| {
                                self.unbounded(&conjunct, "compares two events' times other than by their order")
                            })?;
                            conditions.push((l.0, r.0, allowed));
                        }
                        (false, false) if *op == ast::BinaryOperator::Eq => {
                            let (lt, rt) = (self.column_type(&l.1), self.column_type(&r.1));
                            if lt != rt {
                                return Err(self.script.at_span(
                                    format!(
                                        "cannot join `{left}` ({}) with `{right}` ({})",
                                        sql_type_name(&lt),
                                        sql_type_name(&rt)
                                    ),
                                    conjunct.span(),
                                ));
                            }
                            classes.join(&l, &r);
                        }
                        (false, false) => {
                            return Err(self.unbounded(
                                &conjunct,
                                "compares the data values of two events other than by equality (a synopsis keeps counts per value, \
                                 not the values themselves)",
                            ))
                        }
                        _ => return Err(self.unbounded(&conjunct, "compares an event's time with another's data")),
                    }
                }
                _ => return Err(self.unbounded(&conjunct, "relates more than two events in one condition")),
            }
        }
        let mut group = Vec::new();
        match &select.group_by {
            GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => {
                for e in exprs {
                    match self.column(&aliases, e)? {
                        Some(c) if c.1 != time => group.push(classes.id(&c)),
                        _ => {
                            return Err(self.script.at_span(
                                "a continuous temporal query groups by data columns of its events (a.user_id)",
                                e.span(),
                            ))
                        }
                    }
                }
            }
            other => return Err(self.script.at_span("GROUP BY ALL and grouping sets are not supported", other.span())),
        }
        let mut columns = Vec::new();
        for item in &select.projection {
            let (expr, name) = match item {
                SelectItem::UnnamedExpr(e) => (e, None),
                SelectItem::ExprWithAlias { expr, alias } => (expr, Some(alias.value.clone())),
                other => {
                    return Err(self.script.at_span(
                        "select grouped columns (a.user_id) and COUNT(*) from a continuous temporal query",
                        other.span(),
                    ))
                }
            };
            if let Some(c) = self.column(&aliases, expr)? {
                if c.1 == time {
                    return Err(self.script.at_span(
                        "a continuous temporal query selects grouped data columns and COUNT(*), not event times",
                        expr.span(),
                    ));
                }
                let id = classes.id(&c);
                if !distinct && !group.iter().any(|&g| classes.root(g) == classes.root(id)) {
                    return Err(self
                        .script
                        .at_span(format!("`{expr}` is selected but not grouped by: add it to GROUP BY"), expr.span()));
                }
                if distinct && !group.contains(&id) {
                    group.push(id);
                }
                columns.push((Some(id), name.unwrap_or(c.1.clone()), expr.clone()));
                continue;
            }
            if !is_count_star(expr) || distinct {
                return Err(self.script.at_span(
                    if distinct {
                        "SELECT DISTINCT on a continuous temporal query takes grouped columns only"
                    } else {
                        "a continuous temporal query counts its joined events with COUNT(*); other expressions are not \
                         supported"
                    },
                    expr.span(),
                ));
            }
            columns.push((None, name.unwrap_or_else(|| "count".into()), expr.clone()));
        }
        Ok(BoundBlock { aliases, predicates, conditions, classes, columns, distinct })
    }

    pub(super) fn column_type(&self, column: &str) -> DataType {
        let schema = &self.source().schema;
        schema
            .fields()
            .iter()
            .find(|f| f.name().eq_ignore_ascii_case(column))
            .map_or(DataType::Null, |f| f.data_type().clone())
    }
}

fn compound(alias: &str, column: &str) -> ast::Expr {
    ast::Expr::CompoundIdentifier(vec![ast::Ident::new(alias), ast::Ident::new(column)])
}

/// A block bound to its synopsis: the plan and its SELECT list, each column a grouped variable
/// (with its type) or the count.
pub(super) struct BlockPlan {
    pub block: TemporalBlock,
    pub columns: Vec<BlockColumn>,
}

pub(super) struct BlockColumn {
    pub name: String,
    /// `Some(type)` for a grouped variable, `None` for `COUNT(*)`.
    pub group_type: Option<DataType>,
    pub span: Span,
}

/// Binds a query whose branches are continuous temporal queries of one source: self-joins, or
/// temporal formulas over the atoms `with` names.
pub fn bind_temporal(
    catalog: &Catalog,
    script: &ScriptText,
    with: Option<&ast::With>,
    selects: &[(ast::Select, Option<String>)],
    sql: String,
    emit: EmitMode,
) -> Result<QueryPlan> {
    let mut binder = Binder { catalog, script, source: None };
    // Each block is answered by a synopsis of its own (UNION ALL writes the rows of each).
    let mut plans = Vec::new();
    for (select, _) in selects {
        plans.push(match formula_call(select) {
            Some(call) => bind_formula_block(&mut binder, with, select, call)?,
            None if with.is_some() => {
                return Err(script.at_span(
                    "WITH names the atoms of a temporal formula, read in FROM TEMPORAL(...); other common table \
                     expressions are not supported",
                    select.span(),
                ))
            }
            None => {
                let block = binder.block(select)?;
                binder.join_block_plan(&block, select)?
            }
        });
    }
    let source = binder.source();
    let first = &plans[0];
    let kinds = |p: &BlockPlan| p.columns.iter().map(|c| c.group_type.is_some()).collect::<Vec<_>>();
    for (plan, (select, _)) in plans.iter().zip(selects).skip(1) {
        if kinds(plan) != kinds(first) {
            return Err(
                script.at_span("every branch of the UNION ALL selects the same kinds of columns", select.span())
            );
        }
        for (column, expected) in plan.columns.iter().zip(&first.columns) {
            if column.group_type != expected.group_type {
                return Err(script.at_span("UNION ALL branches select columns of different types", column.span));
            }
        }
    }
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    let mut group_types = Vec::new();
    for column in &first.columns {
        match &column.group_type {
            Some(t) => {
                fields.push(Field::new(&column.name, t.clone(), true));
                columns.push(TemporalColumn::Group(group_types.len()));
                group_types.push(t.clone());
            }
            None => {
                fields.push(Field::new(&column.name, DataType::Int64, false));
                columns.push(TemporalColumn::Count);
            }
        }
    }
    let columns_schema = Arc::new(Schema::new(fields));
    let output_schema = emitted_schema(&columns_schema, emit);
    let blocks = plans.into_iter().map(|p| p.block).collect();
    let plan = TemporalPlan { blocks, columns, group_types, columns_schema, emit };
    Ok(QueryPlan {
        sql,
        source: source.name.to_ascii_lowercase(),
        branches: vec![BranchPlan::Temporal(Arc::new(plan))],
        output_schema,
        emit,
    })
}

impl Binder<'_> {
    /// The synopsis of a self-join block: its conjunctive query rewritten into a temporal formula.
    fn join_block_plan(&self, block: &BoundBlock, select: &ast::Select) -> Result<BlockPlan> {
        let (catalog, script, source) = (self.catalog, self.script, self.source());
        let classes = &block.classes;
        // Variables: the grouped columns by position, then the block's other joined columns.
        let mut variables = Vec::new();
        let mut columns = Vec::new();
        let mut var_of: Vec<Option<Var>> = vec![None; classes.members.len()];
        for (member, name, expr) in &block.columns {
            let group_type = match member {
                Some(member) => {
                    let root = classes.root(*member);
                    if var_of[root].is_some() {
                        return Err(script.at_span("the same joined column is selected twice", expr.span()));
                    }
                    var_of[root] = Some(variables.len());
                    variables.push(name.clone());
                    Some(self.column_type(&classes.members[root].1))
                }
                None => None,
            };
            columns.push(BlockColumn { name: name.clone(), group_type, span: expr.span() });
        }
        let group_width = variables.len();
        for m in 0..classes.members.len() {
            let root = classes.root(m);
            if var_of[root].is_none() {
                let (a, column) = &classes.members[root];
                var_of[root] = Some(variables.len());
                variables.push(format!("{}.{column}", block.aliases[*a].name));
            }
        }
        let mut atoms: Vec<Atom> = Vec::new();
        let mut atom_plans = Vec::new();
        for (a, alias) in block.aliases.iter().enumerate() {
            // The variables this alias binds, each from its first column; a second column of
            // the same variable must hold the same value, and a joined column is never NULL.
            let mut bound: Vec<(Var, String)> = Vec::new();
            let mut predicates = block.predicates[a].clone();
            for (m, (ma, column)) in classes.members.iter().enumerate() {
                if *ma != a {
                    continue;
                }
                let var = var_of[classes.root(m)].expect("every class has a variable");
                let joined = classes.class_of(m).len() > 1;
                if joined {
                    predicates.push(ast::Expr::IsNotNull(Box::new(compound(&alias.name, column))));
                }
                match bound.iter().find(|(v, _)| *v == var) {
                    Some((_, first)) => predicates.push(ast::Expr::BinaryOp {
                        left: Box::new(compound(&alias.name, first)),
                        op: ast::BinaryOperator::Eq,
                        right: Box::new(compound(&alias.name, column)),
                    }),
                    None => bound.push((var, column.clone())),
                }
            }
            let label = if block.predicates[a].is_empty() {
                alias.name.clone()
            } else {
                let text: Vec<String> = block.predicates[a].iter().map(|p| p.to_string()).collect();
                format!("{}[{}]", alias.name, text.join(" AND "))
            };
            // The alias's rows, projected to its event time and its variables' values.
            let mut alias_select = select.clone();
            alias_select.from = vec![ast::TableWithJoins { relation: alias.relation.clone(), joins: vec![] }];
            alias_select.selection = predicates.into_iter().reduce(|l, r| ast::Expr::BinaryOp {
                left: Box::new(l),
                op: ast::BinaryOperator::And,
                right: Box::new(r),
            });
            alias_select.projection = std::iter::once(&source.event_time.column)
                .chain(bound.iter().map(|(_, c)| c))
                .map(|c| SelectItem::UnnamedExpr(compound(&alias.name, c)))
                .collect();
            alias_select.group_by = GroupByExpr::Expressions(vec![], vec![]);
            alias_select.distinct = None;
            alias_select.having = None;
            atom_plans.push(bind_stateless_select(catalog, script, &alias_select)?);
            atoms.push(Atom { label, vars: bound.iter().map(|(v, _)| *v).collect() });
        }
        let conjunctive = ConjunctiveQuery {
            variables,
            blocks: vec![Block { aliases: (0..atoms.len()).collect(), conditions: block.conditions.clone() }],
            atoms,
            group: (0..group_width).collect(),
            distinct: block.distinct,
        };
        let planned = |e: TesseraError| match e {
            TesseraError::Plan(m) => script.at_span(m, select.span()),
            other => other,
        };
        let rewritten = conjunctive::to_temporal(&conjunctive).map_err(planned)?;
        let program = Program::compile(&rewritten.query).map_err(planned)?;
        let block = TemporalBlock {
            program: Arc::new(program),
            orders: rewritten.orders.into_iter().next().unwrap_or_default(),
            atoms: atom_plans,
        };
        Ok(BlockPlan { block, columns })
    }
}
