//! The compact multi-window form: one `SELECT` over several windows of one source,
//!
//! ```sql
//! SELECT device_id, window_name, window_start, window_end, MIN(temperature)
//! FROM WINDOWS(readings, ts,
//!              ten => TUMBLE(INTERVAL '10' MINUTE),
//!              sliding => HOP(INTERVAL '1' MINUTE, INTERVAL '30' MINUTE))
//! GROUP BY device_id, window_name, window_start, window_end;
//! ```
//!
//! is the `UNION ALL` of the same `SELECT` over each window, with `window_name` (the name
//! before `=>`, or `w1`, `w2`, ... for unnamed windows) a constant string per branch. The
//! branches read rows the same way, so the optimizer plans them together like any other
//! `UNION ALL` of windows.

use std::ops::ControlFlow;

use datafusion_sql::sqlparser::ast::{self, FunctionArg, FunctionArgExpr, FunctionArguments, Spanned, TableFactor};

use super::{walk, ScriptText};
use crate::error::Result;

/// The column naming the window a row belongs to.
pub const WINDOW_NAME: &str = "window_name";

/// The branches `select` stands for: itself, or one per window of its `WINDOWS(...)` with the
/// window's name.
pub fn expand(select: ast::Select, script: &ScriptText) -> Result<Vec<(ast::Select, Option<String>)>> {
    let Some(TableFactor::Table { name, args: Some(call), .. }) = select.from.first().map(|f| &f.relation) else {
        return Ok(vec![(select, None)]);
    };
    let Some(function) = name.0.last().and_then(|part| part.as_ident()) else { return Ok(vec![(select, None)]) };
    if !function.value.eq_ignore_ascii_case("WINDOWS") {
        return Ok(vec![(select, None)]);
    }
    let usage = "WINDOWS(source, time_column, [name =>] TUMBLE(size) | HOP(slide, size), ...)";
    if call.args.len() < 3 {
        return Err(
            script.at_span(format!("WINDOWS needs a source, its time column and windows: {usage}"), function.span)
        );
    }
    let mut branches = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (i, arg) in call.args[2..].iter().enumerate() {
        let (window_name, expr) = match arg {
            FunctionArg::Named { name, arg: FunctionArgExpr::Expr(e), .. } => (name.value.clone(), e),
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => (format!("w{}", i + 1), e),
            other => return Err(script.at_span(format!("expected a window, got `{other}`: {usage}"), function.span)),
        };
        if names.contains(&window_name) {
            return Err(script.at_span(format!("window name `{window_name}` is used twice"), expr.span()));
        }
        let ast::Expr::Function(window) = expr else {
            return Err(script.at_span(format!("expected TUMBLE(size) or HOP(slide, size): {usage}"), expr.span()));
        };
        let FunctionArguments::List(window_args) = &window.args else {
            return Err(script.at_span(format!("expected TUMBLE(size) or HOP(slide, size): {usage}"), expr.span()));
        };
        // TUMBLE(size) becomes TUMBLE(source, time, size); HOP likewise. Argument counts and
        // kinds are checked where the window call is resolved.
        let mut branch = select.clone();
        if let TableFactor::Table { name, args: Some(call), .. } = &mut branch.from[0].relation {
            *name = window.name.clone();
            call.args = call.args[..2].iter().cloned().chain(window_args.args.iter().cloned()).collect();
        }
        name_window(&mut branch, &window_name);
        names.push(window_name.clone());
        branches.push((branch, Some(window_name)));
    }
    Ok(branches)
}

/// Makes `window_name` the constant `name` in one branch: an output column of that name, no
/// longer a group key (it is constant within the branch, and branches that differ only in it
/// must share their input work).
fn name_window(select: &mut ast::Select, name: &str) {
    let is_window_name =
        |e: &ast::Expr| matches!(e, ast::Expr::Identifier(id) if id.value.eq_ignore_ascii_case(WINDOW_NAME));
    let literal = || ast::Expr::Value(ast::Value::SingleQuotedString(name.to_string()).into());
    for item in &mut select.projection {
        if let ast::SelectItem::UnnamedExpr(e) = item {
            if is_window_name(e) {
                *item = ast::SelectItem::ExprWithAlias { expr: literal(), alias: ast::Ident::new(WINDOW_NAME) };
            }
        }
    }
    if let ast::GroupByExpr::Expressions(keys, _) = &mut select.group_by {
        keys.retain(|k| !is_window_name(k));
    }
    let _ = walk::expressions_mut(walk::NodeMut::Select(select), |e| {
        if is_window_name(e) {
            *e = literal();
        }
        ControlFlow::<()>::Continue(())
    });
}
