//! The type mismatches the binder refuses itself, at their position in the script, where
//! DataFusion would report them without one or only while reading input.

use arrow::datatypes::DataType;
use datafusion_common::{DFSchema, TableReference};
use datafusion_expr::planner::ContextProvider;
use datafusion_expr::ExprSchemable;
use datafusion_sql::planner::{PlannerContext, SqlToRel};
use datafusion_sql::sqlparser::ast::{self, FunctionArg, FunctionArgExpr, Spanned, TableFactor};

use super::{last_ident, Functions, StreamContext};
use crate::aggregate;
use crate::catalog::sql_type_name;
use crate::error::{Result, TesseraError};
use crate::sql::diagnostic::span_location;
use crate::sql::{walk, ScriptText};

/// Refuses, at their position, the type mismatches DataFusion reports without one or only
/// while reading input: an aggregate of numbers over strings (`SUM(device)`), and a string
/// column compared with a number (`device > 5`, which casts every value and fails on the
/// first that is not a number). `select` reads one source, its FROM already resolved.
pub(super) fn check_types(
    planner: &SqlToRel<StreamContext>,
    context: &StreamContext,
    script: &ScriptText,
    select: &ast::Select,
) -> Result<()> {
    let TableFactor::Table { name, alias, .. } = &select.from[0].relation else {
        return Ok(());
    };
    let table = alias
        .as_ref()
        .map_or_else(|| last_ident(name, script).map(|id| id.value.clone()), |a| Ok(a.name.value.clone()))?;
    let Ok(source) = context.get_table_source(TableReference::bare(name.to_string())) else {
        return Ok(());
    };
    let schema = DFSchema::try_from_qualified_schema(table.as_str(), &source.schema())?;
    // The type of an expression, where the planner can tell it alone (not for a SELECT alias).
    let type_of = |expr: &ast::Expr| {
        let expr = planner.sql_to_expr(expr.clone(), &schema, &mut PlannerContext::new()).ok()?;
        expr.get_type(&schema).ok()
    };
    let is_string = |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    // A string compared with a number: a column or expression, not a literal that is a number.
    let mismatch = |text: &ast::Expr, number: &ast::Expr| -> Option<TesseraError> {
        if let ast::Expr::Value(value) = text {
            if let ast::Value::SingleQuotedString(s) = &value.value {
                if s.trim().parse::<f64>().is_ok() {
                    return None;
                }
            }
        }
        let (text_type, number_type) = (type_of(text)?, type_of(number)?);
        (is_string(&text_type) && number_type.is_numeric()).then(|| {
            script.error_with_help(
                format!(
                    "cannot compare `{text}` ({}) with `{number}` ({})",
                    sql_type_name(&text_type),
                    sql_type_name(&number_type)
                ),
                span_location(text.span()),
                Some(format!(
                    "compare with a string, or CAST({text} AS {}) if every value is a number",
                    sql_type_name(&number_type)
                )),
            )
        })
    };
    let compared = |a: &ast::Expr, b: &ast::Expr| mismatch(a, b).or_else(|| mismatch(b, a));
    let mut refused = None;
    let _ = walk::expressions(walk::Node::Select(select), |expr| {
        refused = match expr {
            ast::Expr::BinaryOp {
                left,
                op:
                    ast::BinaryOperator::Eq
                    | ast::BinaryOperator::NotEq
                    | ast::BinaryOperator::Lt
                    | ast::BinaryOperator::LtEq
                    | ast::BinaryOperator::Gt
                    | ast::BinaryOperator::GtEq,
                right,
            } => compared(left, right),
            ast::Expr::Between { expr, low, high, .. } => compared(expr, low).or_else(|| compared(expr, high)),
            ast::Expr::InList { expr, list, .. } => list.iter().find_map(|item| compared(expr, item)),
            ast::Expr::Function(call) => argument_type_refused(call, script, &type_of),
            _ => None,
        };
        match refused {
            Some(_) => std::ops::ControlFlow::Break(()),
            None => std::ops::ControlFlow::Continue(()),
        }
    });
    refused.map_or(Ok(()), Err)
}

/// The error for an aggregate whose value argument has a type the function does not take
/// (`SUM(device)` over a VARCHAR), if `call` is one: the function says which types it takes.
fn argument_type_refused(
    call: &ast::Function,
    script: &ScriptText,
    type_of: &dyn Fn(&ast::Expr) -> Option<DataType>,
) -> Option<TesseraError> {
    let name = call.name.to_string().to_ascii_lowercase();
    let udf = Functions::get().aggregate.get(&name)?;
    let function = aggregate::lookup(udf.name(), false)?;
    let ast::FunctionArguments::List(list) = &call.args else {
        return None;
    };
    let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))) = list.args.first() else {
        return None;
    };
    let data_type = type_of(arg)?;
    let needs = function.domain(Some(&data_type)).err()?;
    Some(script.at_span(
        format!("{} needs {needs}, `{arg}` is {}", name.to_ascii_uppercase(), sql_type_name(&data_type)),
        arg.span(),
    ))
}
