//! Binding a parsed query to a [`QueryPlan`]: window TVFs are resolved here, the rest of the
//! `SELECT` is planned by DataFusion's SQL planner (with type coercion from its analyzer) and
//! the resulting logical plan is taken apart into the pieces the streaming runtime executes.
//! The type mismatches refused before DataFusion's planner sees them are [`types`]'s.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion_common::config::ConfigOptions;
use datafusion_common::{DFSchema, DataFusionError, SchemaError, TableReference};
use datafusion_expr::execution_props::ExecutionProps;
use datafusion_expr::logical_plan::builder::LogicalTableSource;
use datafusion_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion_expr::planner::ContextProvider;
use datafusion_expr::simplify::SimplifyContext;
use datafusion_expr::{AggregateUDF, Expr, HigherOrderUDF, LogicalPlan, ScalarUDF, TableSource, WindowUDF};
use datafusion_optimizer::simplify_expressions::ExprSimplifier;
use datafusion_optimizer::Analyzer;
use datafusion_physical_expr::create_physical_expr;
use datafusion_sql::planner::{ParserOptions, SqlToRel};
use datafusion_sql::sqlparser::ast::{
    self, FunctionArg, FunctionArgExpr, GroupByExpr, ObjectName, ObjectNamePart, SelectItem, SetExpr, SetOperator,
    SetQuantifier, Spanned, TableFactor,
};

use super::aggregates::bind_aggregate;
use super::diagnostic::{closest_name, span_location};
use super::{duration_in_units, walk, ScriptText};
use crate::catalog::{Catalog, SourceDef};
use crate::error::{Result, TesseraError};
use crate::plan::{
    emitted_schema, AggregateColumn, BranchPlan, EmitMode, ExprRef, PrefixPlan, QueryPlan, StatelessPlan,
    TemporalStrategy, WindowAggregatePlan,
};
use crate::settings::Settings;
use crate::window::{WindowSpec, MAX_WINDOWS_PER_EVENT};

mod types;

use types::check_types;

pub const WINDOW_START: &str = "window_start";
pub const WINDOW_END: &str = "window_end";
/// Prefix of the internal table name a window TVF is rewritten to.
const WINDOWED_TABLE_PREFIX: &str = "__tessera_windowed_";

/// The functions and tables DataFusion's planner may resolve.
struct StreamContext<'a> {
    catalog: &'a Catalog,
    functions: &'static Functions,
    options: ConfigOptions,
}

/// DataFusion's scalar and aggregate functions by name and alias, made once per process (a
/// script binds each of its queries with them).
struct Functions {
    scalar: HashMap<String, Arc<ScalarUDF>>,
    aggregate: HashMap<String, Arc<AggregateUDF>>,
}

impl Functions {
    fn get() -> &'static Functions {
        static FUNCTIONS: std::sync::OnceLock<Functions> = std::sync::OnceLock::new();
        FUNCTIONS.get_or_init(|| {
            let mut scalar = HashMap::new();
            for f in datafusion_functions::all_default_functions() {
                for alias in f.aliases() {
                    scalar.insert(alias.clone(), Arc::clone(&f));
                }
                scalar.insert(f.name().to_string(), f);
            }
            let mut aggregate = HashMap::new();
            for f in datafusion_functions_aggregate::all_default_aggregate_functions() {
                for alias in f.aliases() {
                    aggregate.insert(alias.clone(), Arc::clone(&f));
                }
                aggregate.insert(f.name().to_string(), f);
            }
            if let Some(approx) = aggregate.get("approx_distinct").cloned() {
                aggregate.insert("approx_count_distinct".into(), approx);
            }
            Functions { scalar, aggregate }
        })
    }
}

impl<'a> StreamContext<'a> {
    fn new(catalog: &'a Catalog) -> Self {
        StreamContext { catalog, functions: Functions::get(), options: ConfigOptions::default() }
    }
}

impl ContextProvider for StreamContext<'_> {
    fn get_table_source(&self, name: TableReference) -> datafusion_common::Result<Arc<dyn TableSource>> {
        let table = name.table();
        let (source_name, windowed) = match table.strip_prefix(WINDOWED_TABLE_PREFIX) {
            Some(rest) => (rest, true),
            None => (table, false),
        };
        let source = self
            .catalog
            .source(source_name)
            .ok_or_else(|| DataFusionError::Plan(format!("unknown source `{source_name}`")))?;
        let schema = if windowed { windowed_schema(source) } else { Arc::clone(&source.schema) };
        Ok(Arc::new(LogicalTableSource::new(schema)))
    }

    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.functions.scalar.get(name).cloned()
    }

    fn get_higher_order_meta(&self, _name: &str) -> Option<Arc<HigherOrderUDF>> {
        None
    }

    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.functions.aggregate.get(name).cloned()
    }

    fn get_window_meta(&self, _name: &str) -> Option<Arc<WindowUDF>> {
        None
    }

    fn get_variable_type(&self, _variable_names: &[String]) -> Option<DataType> {
        None
    }

    fn options(&self) -> &ConfigOptions {
        &self.options
    }

    fn udf_names(&self) -> Vec<String> {
        self.functions.scalar.keys().cloned().collect()
    }

    fn udaf_names(&self) -> Vec<String> {
        self.functions.aggregate.keys().cloned().collect()
    }

    fn udwf_names(&self) -> Vec<String> {
        vec![]
    }

    fn higher_order_function_names(&self) -> Vec<String> {
        vec![]
    }
}

/// A source's columns followed by `window_start` and `window_end` (typed like event time).
fn windowed_schema(source: &SourceDef) -> SchemaRef {
    let mut fields: Vec<Field> = source.schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let time_type = source.event_time.data_type.clone();
    fields.push(Field::new(WINDOW_START, time_type.clone(), false));
    fields.push(Field::new(WINDOW_END, time_type, false));
    Arc::new(Schema::new(fields))
}

/// Binds one query statement.
/// A continuous temporal query no bounded synopsis answers runs by keeping every event of its
/// source under `SET allow_unbounded_state = true` instead of being refused; every SQL
/// self-join does under `SET temporal_strategy = 'kept_whole'`.
pub fn bind_query(
    catalog: &Catalog,
    script: &ScriptText,
    query: &ast::Query,
    emit: EmitMode,
    settings: &Settings,
) -> Result<QueryPlan> {
    if let Some(order_by) = &query.order_by {
        return Err(script.at_span(
            "ORDER BY is not supported on a continuous query: rows are emitted as windows close",
            order_by.span(),
        ));
    }
    if let Some(limit) = &query.limit_clause {
        return Err(script.at_span("LIMIT is not supported on a continuous query", limit.span()));
    }
    let selects = branch_selects(query, script)?;
    if query.with.is_some() || selects.iter().any(|(select, _)| super::temporal::is_temporal(select)) {
        let bound =
            super::temporal::bind_temporal(catalog, script, query.with.as_ref(), &selects, query.to_string(), emit);
        let forced = settings.temporal_strategy == TemporalStrategy::KeptWhole;
        return match bound {
            Err(TesseraError::Sql(refused))
                if (settings.allow_unbounded_state || forced) && refused.message.starts_with(UNBOUNDED) =>
            {
                bind_prefix(catalog, script, query, emit, refused.message)
            }
            Ok(_) if forced => {
                if let Some((select, _)) =
                    selects.iter().find(|(s, _)| super::temporal_formula::formula_call(s).is_some())
                {
                    return Err(script.at_span(
                        "temporal_strategy = 'kept_whole' runs SQL self-joins by batch; a TEMPORAL formula has no \
                         batch SQL to run (SET temporal_strategy = 'synopsis')",
                        select.span(),
                    ));
                }
                let because = "SET temporal_strategy = 'kept_whole' asked for it (a synopsis would answer it)";
                bind_prefix(catalog, script, query, emit, because.to_string())
            }
            other => other,
        };
    }
    let context = StreamContext::new(catalog);
    let mut source: Option<String> = None;
    let mut branches = Vec::new();
    let mut output_schema: Option<SchemaRef> = None;
    for (select, window_name) in &selects {
        let (branch, schema, source_name) = bind_select(&context, script, select)?;
        let branch = match branch {
            BranchPlan::WindowAggregate(plan) if window_name.is_some() => {
                BranchPlan::WindowAggregate(Arc::new(WindowAggregatePlan {
                    window_name: window_name.clone(),
                    ..(*plan).clone()
                }))
            }
            other => other,
        };
        match &source {
            None => source = Some(source_name),
            Some(first) if *first != source_name => {
                return Err(script.at_span(
                    format!("all branches of a UNION ALL must read the same source (`{first}` and `{source_name}`)"),
                    select.span(),
                ))
            }
            Some(_) => {}
        }
        if let Some(first) = &output_schema {
            let types = |s: &SchemaRef| s.fields().iter().map(|f| f.data_type().clone()).collect::<Vec<_>>();
            if types(first) != types(&schema) {
                return Err(script.at_span(
                    format!(
                        "UNION ALL branches have different column types: {:?} and {:?}",
                        types(first),
                        types(&schema)
                    ),
                    select.span(),
                ));
            }
        } else {
            output_schema = Some(schema);
        }
        let branch = match (branch, emit) {
            (branch, EmitMode::OnWindowClose) => branch,
            (BranchPlan::WindowAggregate(plan), EmitMode::Changes) => {
                BranchPlan::WindowAggregate(Arc::new(WindowAggregatePlan { emit, ..(*plan).clone() }))
            }
            (BranchPlan::Stateless(_) | BranchPlan::Temporal(_) | BranchPlan::Prefix(_), EmitMode::Changes) => {
                return Err(script.at_span(
                    "EMIT CHANGES applies to window aggregates: a query without a window already emits every row",
                    select.span(),
                ))
            }
        };
        branches.push(branch);
    }
    let output_schema = emitted_schema(&output_schema.unwrap_or_else(|| Arc::new(Schema::empty())), emit);
    Ok(QueryPlan { sql: query.to_string(), source: source.unwrap_or_default(), branches, output_schema, emit })
}

/// The `SELECT`s a query's branches are bound from, in order: the arms of its `UNION ALL`, each
/// compact `WINDOWS(...)` form expanded into one per window (with the window's name).
pub fn branch_selects(query: &ast::Query, script: &ScriptText) -> Result<Vec<(ast::Select, Option<String>)>> {
    let mut written = Vec::new();
    collect_union_branches(&query.body, script, &mut written)?;
    let mut selects = Vec::new();
    for select in written {
        selects.extend(super::multi_window::expand(select.clone(), script)?);
    }
    Ok(selects)
}

fn collect_union_branches<'q>(body: &'q SetExpr, script: &ScriptText, out: &mut Vec<&'q ast::Select>) -> Result<()> {
    match body {
        SetExpr::Select(select) => {
            out.push(select);
            Ok(())
        }
        SetExpr::Query(inner) if inner.order_by.is_none() && inner.limit_clause.is_none() && inner.with.is_none() => {
            collect_union_branches(&inner.body, script, out)
        }
        SetExpr::SetOperation { op: SetOperator::Union, set_quantifier: SetQuantifier::All, left, right } => {
            collect_union_branches(left, script, out)?;
            collect_union_branches(right, script, out)
        }
        SetExpr::SetOperation { op: SetOperator::Union, .. } => Err(script
            .at_span("UNION without ALL would have to remember every row ever emitted; use UNION ALL", body.span())),
        other => Err(script.at_span("only SELECT and UNION ALL of SELECTs are supported on streams", other.span())),
    }
}

/// The window TVF of a FROM clause, if any.
struct WindowCall {
    window: WindowSpec,
}

fn bind_select(
    context: &StreamContext,
    script: &ScriptText,
    select: &ast::Select,
) -> Result<(BranchPlan, SchemaRef, String)> {
    let [from] = select.from.as_slice() else {
        return Err(
            script.at_span("a streaming query reads exactly one source (joins are not supported yet)", select.span())
        );
    };
    if !from.joins.is_empty() {
        return Err(script.at_span("joins are not supported on streams yet", from.joins[0].span()));
    }
    if select.distinct.is_some() {
        return Err(
            script.at_span("SELECT DISTINCT is not supported on streams; use GROUP BY with a window", select.span())
        );
    }
    let mut select = select.clone();
    let (source, window) = resolve_from(context.catalog, script, &mut select.from[0].relation)?;

    let mut query = ast::Query {
        with: None,
        body: Box::new(SetExpr::Select(Box::new(select.clone()))),
        order_by: None,
        limit_clause: None,
        fetch: None,
        locks: vec![],
        for_clause: None,
        settings: None,
        format_clause: None,
        pipe_operators: vec![],
    };
    query.body = Box::new(SetExpr::Select(Box::new(select.clone())));
    let options = ParserOptions {
        enable_ident_normalization: true,
        collect_spans: true,
        map_string_types_to_utf8view: false,
        ..ParserOptions::default()
    };
    let planner = SqlToRel::new_with_options(context, options);
    check_types(&planner, context, script, &select)?;
    let plan = planner
        .sql_statement_to_plan(ast::Statement::Query(Box::new(query)))
        .map_err(|e| datafusion_error(script, e))?;
    let plan = Analyzer::new()
        .execute_and_check(plan, context.options(), |_, _| {})
        .map_err(|e| datafusion_error(script, e))?;

    let names = output_names(&select);
    let (branch, schema) = match window {
        Some(call) => bind_window_aggregate(script, &select, &plan, (call.window, &source.event_time.column), names)?,
        None => bind_stateless(script, &select, &plan, names)?,
    };
    Ok((branch, schema, source.name.to_ascii_lowercase()))
}

/// Binds a `SELECT` over one source without a window or aggregate: its WHERE and SELECT list
/// as DataFusion expressions over the source's rows.
pub(super) fn bind_stateless_select(
    catalog: &Catalog,
    script: &ScriptText,
    select: &ast::Select,
) -> Result<StatelessPlan> {
    match bind_select(&StreamContext::new(catalog), script, select)? {
        (BranchPlan::Stateless(plan), _, _) => Ok(plan),
        _ => Err(script.at_span("expected a SELECT without a window or aggregate", select.span())),
    }
}

/// Checks the FROM item and rewrites a window TVF into a scan of the windowed table.
fn resolve_from<'c>(
    catalog: &'c Catalog,
    script: &ScriptText,
    relation: &mut TableFactor,
) -> Result<(&'c SourceDef, Option<WindowCall>)> {
    let TableFactor::Table { name, alias, args, .. } = relation else {
        return Err(script.at_span("expected a source or TUMBLE(...) / HOP(...) in FROM", relation.span()));
    };
    let lookup = |ident: &ast::Ident| -> Result<&'c SourceDef> {
        catalog.source(&ident.value).ok_or_else(|| {
            script.error_with_help(
                format!("unknown source `{}`", ident.value),
                span_location(ident.span),
                closest_name(&ident.value, catalog.source_names()).map(|c| format!("did you mean `{c}`?")),
            )
        })
    };
    let Some(call_args) = args.take() else {
        let source = lookup(last_ident(name, script)?)?;
        return Ok((source, None));
    };
    let function = last_ident(name, script)?.clone();
    let kind = function.value.to_ascii_uppercase();
    let expected = match kind.as_str() {
        "TUMBLE" => 3,
        "HOP" => 4,
        _ => {
            return Err(script.at_span(
                format!("unknown table function `{}` (supported: TUMBLE, HOP, WINDOWS)", function.value),
                function.span,
            ))
        }
    };
    let exprs: Vec<&ast::Expr> = call_args
        .args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
            other => Err(script.at_span(format!("unexpected argument `{other}`"), function.span)),
        })
        .collect::<Result<_>>()?;
    if exprs.len() != expected {
        let usage =
            if expected == 3 { "TUMBLE(source, time_column, size)" } else { "HOP(source, time_column, slide, size)" };
        return Err(script.at_span(format!("{kind} takes {expected} arguments: {usage}"), function.span));
    }
    let source_ident = match exprs[0] {
        ast::Expr::Identifier(id) => id,
        other => return Err(script.at_span("expected a source name", other.span())),
    };
    let source = lookup(source_ident)?;
    let time_column = match exprs[1] {
        ast::Expr::Identifier(id) => id,
        other => return Err(script.at_span("expected the event-time column", other.span())),
    };
    if !time_column.value.eq_ignore_ascii_case(&source.event_time.column) {
        return Err(script.error_with_help(
            format!("`{}` is not the event-time column of `{}`", time_column.value, source.name),
            span_location(time_column.span),
            Some(format!("windows are defined on `{}` (the column of its WATERMARK)", source.event_time.column)),
        ));
    }
    let unit = source.event_time.unit;
    let window = if expected == 3 {
        WindowSpec::tumbling(duration_in_units(exprs[2], unit, script)?)
    } else {
        let slide = duration_in_units(exprs[2], unit, script)?;
        let range = duration_in_units(exprs[3], unit, script)?;
        if slide > range {
            return Err(script.at_span(
                "HOP slide must not be larger than its size (HOP(source, time, slide, size))",
                exprs[2].span(),
            ));
        }
        let windows_per_event = (range + slide - 1) / slide;
        if windows_per_event > MAX_WINDOWS_PER_EVENT {
            return Err(script.error_with_help(
                format!(
                    "HOP puts every event into {windows_per_event} windows (size / slide); \
                     tessera refuses more than {MAX_WINDOWS_PER_EVENT} (2^20)"
                ),
                span_location(exprs[2].span()),
                Some("use a longer slide or a shorter size".into()),
            ));
        }
        WindowSpec::hopping(slide, range)
    };
    let table_alias = alias.clone().unwrap_or_else(|| ast::TableAlias {
        explicit: false,
        name: source_ident.clone(),
        columns: vec![],
        at: None,
    });
    *name = ObjectName(vec![ObjectNamePart::Identifier(ast::Ident::new(format!(
        "{WINDOWED_TABLE_PREFIX}{}",
        source.name
    )))]);
    *alias = Some(table_alias);
    Ok((source, Some(WindowCall { window })))
}

fn last_ident<'n>(name: &'n ObjectName, script: &ScriptText) -> Result<&'n ast::Ident> {
    match name.0.last() {
        Some(ObjectNamePart::Identifier(id)) => Ok(id),
        _ => Err(script.at_span(format!("invalid name `{name}`"), name.span())),
    }
}

/// Column names as written in the SELECT list (aliases, or the expression's text); `None` when
/// a wildcard leaves the naming to the planner.
fn output_names(select: &ast::Select) -> Option<Vec<String>> {
    select
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(ast::Expr::Identifier(id)) => Some(id.value.clone()),
            SelectItem::UnnamedExpr(ast::Expr::CompoundIdentifier(ids)) => ids.last().map(|id| id.value.clone()),
            SelectItem::UnnamedExpr(expr) => Some(expr.to_string()),
            SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
            _ => None,
        })
        .collect()
}

/// Removes the aliases DataFusion puts around table scans.
fn skip_aliases(plan: &LogicalPlan) -> &LogicalPlan {
    match plan {
        LogicalPlan::SubqueryAlias(alias) => skip_aliases(&alias.input),
        other => other,
    }
}

fn output_schema(plan: &LogicalPlan, names: Option<Vec<String>>) -> SchemaRef {
    let fields = plan.schema().fields();
    let names = names.filter(|n| n.len() == fields.len());
    Arc::new(Schema::new(
        fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let name = names.as_ref().map_or_else(|| f.name().clone(), |n| n[i].clone());
                Field::new(name, f.data_type().clone(), true)
            })
            .collect::<Vec<_>>(),
    ))
}

/// The physical expression of `expr` over rows of `schema`, simplified first as DataFusion's
/// own planner does: some functions exist only to be rewritten there (`COALESCE` becomes a
/// `CASE`) and have no physical form of their own.
pub(super) fn physical(script: &ScriptText, expr: &Expr, schema: &DFSchema) -> Result<ExprRef> {
    let context = SimplifyContext::builder().with_schema(Arc::new(schema.clone())).build();
    let simplified = ExprSimplifier::new(context).simplify(expr.clone()).map_err(|e| datafusion_error(script, e))?;
    create_physical_expr(&simplified, schema, &ExecutionProps::new(), &PhysicalPlanningContext::default())
        .map_err(|e| datafusion_error(script, e))
}

fn split_projection(plan: &LogicalPlan) -> (Option<&[Expr]>, &LogicalPlan) {
    match plan {
        LogicalPlan::Projection(p) => (Some(&p.expr), p.input.as_ref()),
        other => (None, other),
    }
}

fn split_filter(plan: &LogicalPlan) -> (Option<&Expr>, &LogicalPlan) {
    match plan {
        LogicalPlan::Filter(f) => (Some(&f.predicate), f.input.as_ref()),
        other => (None, other),
    }
}

fn unsupported_node(script: &ScriptText, select: &ast::Select, plan: &LogicalPlan) -> TesseraError {
    let what = match plan {
        LogicalPlan::Window(_) => "window functions (OVER ...)".to_string(),
        LogicalPlan::Distinct(_) => "DISTINCT".to_string(),
        LogicalPlan::Join(_) => "joins".to_string(),
        LogicalPlan::Subquery(_) | LogicalPlan::SubqueryAlias(_) => "subqueries".to_string(),
        other => format!("this query shape ({})", other.display()),
    };
    script.at_span(format!("{what} are not supported on streams yet"), select.span())
}

fn bind_stateless(
    script: &ScriptText,
    select: &ast::Select,
    plan: &LogicalPlan,
    names: Option<Vec<String>>,
) -> Result<(BranchPlan, SchemaRef)> {
    let (projection, input) = split_projection(plan);
    let (filter, scan) = split_filter(input);
    let scan = skip_aliases(scan);
    if let LogicalPlan::Aggregate(_) = scan {
        return Err(script.at_span(
            "aggregates on a stream need a window: FROM TUMBLE(source, time, size) or HOP(...) and GROUP BY window_start, window_end",
            select.span(),
        ));
    }
    if !matches!(scan, LogicalPlan::TableScan(_)) {
        return Err(unsupported_node(script, select, scan));
    }
    let input_schema = input.schema();
    let filter = filter.map(|f| physical(script, f, input_schema)).transpose()?;
    let projection = match projection {
        Some(exprs) => exprs.iter().map(|e| physical(script, e, input_schema)).collect::<Result<_>>()?,
        None => (0..input_schema.fields().len())
            .map(|i| physical(script, &Expr::Column(input_schema.columns()[i].clone()), input_schema))
            .collect::<Result<_>>()?,
    };
    let output_schema = output_schema(plan, names);
    Ok((
        BranchPlan::Stateless(StatelessPlan { filter, projection, output_schema: Arc::clone(&output_schema) }),
        output_schema,
    ))
}

fn is_window_column(expr: &Expr) -> Option<AggregateColumn> {
    match expr {
        Expr::Column(c) if c.name == WINDOW_START => Some(AggregateColumn::WindowStart),
        Expr::Column(c) if c.name == WINDOW_END => Some(AggregateColumn::WindowEnd),
        _ => None,
    }
}

pub(super) fn mentions_window_column(expr: &Expr) -> bool {
    expr.column_refs().iter().any(|c| c.name == WINDOW_START || c.name == WINDOW_END)
}

fn bind_window_aggregate(
    script: &ScriptText,
    select: &ast::Select,
    plan: &LogicalPlan,
    (window, event_time): (WindowSpec, &str),
    names: Option<Vec<String>>,
) -> Result<(BranchPlan, SchemaRef)> {
    let (projection, rest) = split_projection(plan);
    let (having, rest) = split_filter(rest);
    let LogicalPlan::Aggregate(aggregate) = skip_aliases(rest) else {
        return Err(script.at_span(
            "a window query must aggregate: GROUP BY window_start, window_end (and any keys) with aggregate functions",
            select.span(),
        ));
    };
    let (where_clause, scan) = split_filter(aggregate.input.as_ref());
    if !matches!(skip_aliases(scan), LogicalPlan::TableScan(_)) {
        return Err(unsupported_node(script, select, skip_aliases(scan)));
    }
    let input_schema = aggregate.input.schema();
    let group_by_span = match &select.group_by {
        GroupByExpr::Expressions(exprs, _) if !exprs.is_empty() => exprs[0].span(),
        _ => select.span(),
    };
    if let Some(predicate) = where_clause {
        if mentions_window_column(predicate) {
            return Err(
                script.at_span("WHERE cannot use window_start or window_end; filter on them in HAVING", select.span())
            );
        }
    }
    let filter = where_clause.map(|f| physical(script, f, input_schema)).transpose()?;

    let mut keys = Vec::new();
    let mut columns = Vec::new();
    for expr in &aggregate.group_expr {
        if let Some(window_column) = is_window_column(expr) {
            columns.push(window_column);
        } else if mentions_window_column(expr) {
            return Err(script
                .at_span(format!("GROUP BY `{expr}`: group by window_start or window_end themselves"), group_by_span));
        } else {
            columns.push(AggregateColumn::Key(keys.len()));
            keys.push(physical(script, expr, input_schema)?);
        }
    }
    if !columns.iter().any(|c| matches!(c, AggregateColumn::WindowStart | AggregateColumn::WindowEnd)) {
        return Err(script.at_span("a window query must GROUP BY window_start or window_end", group_by_span));
    }
    let aggregate_fields = aggregate.schema.fields();
    let mut aggregates = Vec::new();
    for (i, expr) in aggregate.aggr_expr.iter().enumerate() {
        let call = match expr {
            Expr::AggregateFunction(call) => call,
            Expr::Alias(alias) => match alias.expr.as_ref() {
                Expr::AggregateFunction(call) => call,
                other => return Err(TesseraError::Internal(format!("aggregate expression {other}"))),
            },
            other => return Err(TesseraError::Internal(format!("aggregate expression {other}"))),
        };
        let display = expr.schema_name().to_string();
        let output_type = aggregate_fields[aggregate.group_expr.len() + i].data_type().clone();
        let spec = bind_aggregate(script, select, call, (display, output_type), (input_schema, event_time))?;
        columns.push(AggregateColumn::Aggregate(aggregates.len()));
        aggregates.push(spec);
    }
    let aggregate_schema: SchemaRef = Arc::new(aggregate.schema.as_arrow().clone());
    let after_aggregate = rest.schema();
    let having = having.map(|h| physical(script, h, after_aggregate)).transpose()?;
    let projection = match projection {
        Some(exprs) => exprs.iter().map(|e| physical(script, e, after_aggregate)).collect::<Result<_>>()?,
        None => (0..after_aggregate.fields().len())
            .map(|i| physical(script, &Expr::Column(after_aggregate.columns()[i].clone()), after_aggregate))
            .collect::<Result<_>>()?,
    };
    let output_schema = output_schema(plan, names);
    let plan = WindowAggregatePlan {
        window,
        filter,
        keys,
        aggregates,
        aggregate_columns: columns,
        aggregate_schema,
        having,
        projection,
        output_schema: Arc::clone(&output_schema),
        emit: EmitMode::OnWindowClose,
        window_name: None,
    };
    Ok((BranchPlan::WindowAggregate(Arc::new(plan)), output_schema))
}

/// A DataFusion planning error as a SQL diagnostic, with its span and a suggestion for unknown
/// names.
fn datafusion_error(script: &ScriptText, error: DataFusionError) -> TesseraError {
    let location = error.diagnostic().and_then(|d| d.span).and_then(|span| {
        (span.start.line > 0).then_some(crate::error::Location { line: span.start.line, column: span.start.column })
    });
    let root = error.find_root();
    if let DataFusionError::SchemaError(schema_error, _) = root {
        if let SchemaError::FieldNotFound { field, valid_fields } = schema_error.as_ref() {
            let candidates: Vec<String> = valid_fields.iter().map(|c| c.name.clone()).collect();
            let help = closest_name(&field.name, candidates.iter().map(String::as_str))
                .map(|c| format!("did you mean `{c}`?"));
            return script.error_with_help(format!("unknown column `{}`", field.name), location, help);
        }
    }
    match root {
        DataFusionError::Internal(message) => TesseraError::Internal(message.clone()),
        root => {
            let message = root.to_string();
            let message = message.strip_prefix("Error during planning: ").unwrap_or(&message).to_string();
            script.error(message.replace(WINDOWED_TABLE_PREFIX, ""), location)
        }
    }
}

/// How the refusal of a query whose state would grow with the stream begins.
pub const UNBOUNDED: &str = "space class unbounded";

/// A continuous query that no bounded synopsis answers, kept whole: it reads one source, and a
/// batch engine answers it over that source's events so far. Its columns are planned here.
fn bind_prefix(
    catalog: &Catalog,
    script: &ScriptText,
    query: &ast::Query,
    emit: EmitMode,
    kept_because: String,
) -> Result<QueryPlan> {
    let mut sources: Vec<String> = Vec::new();
    let _ = walk::relations(query, |name| {
        let name = name.to_string().to_ascii_lowercase();
        if !sources.contains(&name) {
            sources.push(name);
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    let source = match sources.as_slice() {
        [one] => catalog.source(one).ok_or_else(|| script.at_span(format!("unknown source `{one}`"), query.span()))?,
        _ => return Err(script.at_span("a query kept whole reads one source", query.span())),
    };
    let context = StreamContext::new(catalog);
    let options = ParserOptions { enable_ident_normalization: true, ..ParserOptions::default() };
    let planner = SqlToRel::new_with_options(&context, options);
    let plan = planner
        .sql_statement_to_plan(ast::Statement::Query(Box::new(query.clone())))
        .map_err(|e| datafusion_error(script, e))?;
    let columns_schema = Arc::new(plan.schema().as_arrow().clone());
    let output_schema = emitted_schema(&columns_schema, emit);
    let prefix = PrefixPlan {
        sql: query.to_string(),
        source: source.name.to_ascii_lowercase(),
        source_schema: Arc::clone(&source.schema),
        kept_because,
        columns_schema,
        emit,
    };
    let source = source.name.to_ascii_lowercase();
    Ok(QueryPlan {
        sql: query.to_string(),
        source,
        branches: vec![BranchPlan::Prefix(Arc::new(prefix))],
        output_schema,
        emit,
    })
}
