//! Binding an aggregate call of a window query: the registered function that answers it
//! ([`crate::aggregate::lookup`]) is asked for the domain of its value and its literal
//! parameters; functions ordered by event time get the event-time column as an argument.

use arrow::datatypes::DataType;
use datafusion_common::DFSchema;
use datafusion_expr::{Expr, ExprSchemable};
use datafusion_sql::sqlparser::ast::{self, Spanned};

use super::binder::{mentions_window_column, physical};
use super::ScriptText;
use crate::aggregate::{self, AggregateSpec};
use crate::catalog::sql_type_name;
use crate::error::Result;

/// One aggregate call of a window query: the function that answers it, asked for the domain of
/// its value and its parameters; functions ordered by event time get the event-time column as
/// a second argument.
pub(super) fn bind_aggregate(
    script: &ScriptText,
    select: &ast::Select,
    call: &datafusion_expr::expr::AggregateFunction,
    (display, output_type): (String, DataType),
    (input_schema, event_time): (&DFSchema, &str),
) -> Result<AggregateSpec> {
    let params = &call.params;
    let refused = |message: String| script.at_span(message, select.span());
    if params.distinct {
        return Err(refused(format!(
            "{display}: DISTINCT aggregates are not supported yet (APPROX_COUNT_DISTINCT is)"
        )));
    }
    if params.filter.is_some() {
        return Err(refused(format!("{display}: FILTER inside aggregates is not supported yet")));
    }
    let counts_rows = match params.args.as_slice() {
        [] => true,
        #[allow(deprecated)]
        [Expr::Wildcard { .. }] => true,
        [Expr::Literal(value, _)] => !value.is_null(),
        _ => false,
    };
    let Some(function) = aggregate::lookup(call.func.name(), counts_rows) else {
        return Err(refused(format!(
            "aggregate `{}` is not supported on streams (supported: {})",
            call.func.name(),
            aggregate::supported_names()
        )));
    };
    let time_column = || -> Result<Expr> {
        let (qualifier, field) = input_schema.qualified_field_with_unqualified_name(event_time)?;
        Ok(Expr::Column(datafusion_common::Column::new(qualifier.cloned(), field.name())))
    };
    // ORDER BY inside the call: the event time for functions ordered by it (their order
    // anyway), the value itself for percentiles (`WITHIN GROUP (ORDER BY x)`).
    for sort in &params.order_by {
        let allowed = if function.orders_by_event_time() {
            sort.asc && sort.expr == time_column()?
        } else {
            params.args.first() == Some(&sort.expr) && sort.asc
        };
        if !allowed {
            let order = if function.orders_by_event_time() {
                format!("orders by the event time `{event_time}` ascending")
            } else {
                "takes no ORDER BY other than WITHIN GROUP (ORDER BY its value)".to_string()
            };
            return Err(refused(format!("{display}: {} {order}", function.name().to_ascii_uppercase())));
        }
    }
    let (value, rest) = match params.args.split_first() {
        _ if counts_rows && function.domain(None).is_ok() => (None, &[][..]),
        Some((value, rest)) => (Some(value), rest),
        None => (None, &[][..]),
    };
    if value.is_some_and(mentions_window_column) {
        return Err(refused(format!("{display}: aggregates cannot read window_start or window_end")));
    }
    let value_type = value.map(|v| v.get_type(input_schema)).transpose()?;
    let name = function.name().to_ascii_uppercase();
    let kind = function.domain(value_type.as_ref()).map_err(|needs| {
        let got = match (value, &value_type) {
            (Some(value), Some(t)) => format!("`{value}` is {}", sql_type_name(t)),
            _ => "it has none".to_string(),
        };
        refused(format!("{name} needs {needs}, {got}"))
    })?;
    let literals: Vec<_> = rest.iter().map(literal_value).collect();
    let parameter = function.parameter(&literals).map_err(|problem| refused(format!("{display}: {name} {problem}")))?;
    let mut args = value.map(|v| physical(script, v, input_schema)).into_iter().collect::<Result<Vec<_>>>()?;
    if function.orders_by_event_time() {
        args.push(physical(script, &time_column()?, input_schema)?);
    }
    Ok(AggregateSpec { function, args, kind, parameter, output_type, display })
}

/// The value of a literal argument, also one DataFusion's coercion wrapped in a cast.
fn literal_value(expr: &Expr) -> Option<datafusion_common::ScalarValue> {
    match expr {
        Expr::Literal(value, _) => Some(value.clone()),
        Expr::Cast(cast) => literal_value(&cast.expr)?.cast_to(cast.field.data_type()).ok(),
        Expr::TryCast(cast) => literal_value(&cast.expr)?.cast_to(cast.field.data_type()).ok(),
        _ => None,
    }
}
