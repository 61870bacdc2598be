//! Keeps a query's expression trees shallow enough to plan and evaluate. The SQL parser
//! accepts a chain of any length (`a OR b OR ... OR z` is a tree as deep as it is long), and
//! DataFusion's planner, its optimizer and the evaluation of physical expressions recurse once
//! per level: a deep enough tree overflows the stack. Chains of `AND` and of `OR` are
//! rebalanced here (both are associative in SQL's three-valued logic, so the answer is the
//! same, and a 10,000-term `OR` becomes 14 levels deep); any other tree deeper than
//! [`MAX_EXPRESSION_DEPTH`] is refused with its position. Planning and evaluation run on threads
//! with stacks sized for that depth ([`crate::exec::THREAD_STACK_BYTES`]).

use std::ops::ControlFlow;

use datafusion_sql::sqlparser::ast::{BinaryOperator, Expr, Spanned, TableFactor, UnaryOperator};

use super::diagnostic::{span_location, ScriptText};
use super::walk::{self, MetMut, NodeMut};
use crate::error::{Location, Result};

/// The deepest expression tree a query may hold once its `AND` and `OR` chains are balanced.
/// Deeper trees come only from chains of other operators (`a + b + ... + z`) a thousand terms
/// long.
pub const MAX_EXPRESSION_DEPTH: usize = 1_000;

/// How deep the SQL parser recurses (sqlparser's default, 50, refuses 49 nested `NOT`s): past
/// the deepest expression planned, so that a deeper one is refused with its position by
/// [`balance_and_check`]. Parsing runs on a thread with a deep stack.
pub const PARSER_RECURSION_LIMIT: usize = MAX_EXPRESSION_DEPTH + 100;

/// Balances the `AND` and `OR` chains of `node` (a query, or any statement), then refuses it if
/// an expression is still nested deeper than [`MAX_EXPRESSION_DEPTH`] or it reads a relation
/// with `TABLESAMPLE` (which nothing would honour). The walk goes top-down:
/// each chain is balanced at its top, before its operands are walked, and the depth is tracked.
pub fn balance_and_check(node: NodeMut<'_>, script: &ScriptText) -> Result<()> {
    let mut depth = 0;
    let mut too_deep = None;
    let mut sampled = None;
    let _ = walk::walk_mut(node, &mut |met| {
        match met {
            MetMut::Entered(expr) => {
                if let Expr::BinaryOp { op: op @ (BinaryOperator::And | BinaryOperator::Or), .. } = expr {
                    let op = op.clone();
                    let mut operands = Vec::new();
                    flatten(
                        std::mem::replace(expr, Expr::value(datafusion_sql::sqlparser::ast::Value::Null)),
                        &op,
                        &mut operands,
                    );
                    *expr = balanced(operands, &op);
                }
                depth += 1;
                if depth > MAX_EXPRESSION_DEPTH {
                    too_deep = Some(first_leaf_location(expr));
                    return ControlFlow::Break(());
                }
            }
            MetMut::Left(_) => depth -= 1,
            MetMut::Relation(_) => {}
            MetMut::Factor(TableFactor::Table { name, sample: Some(_), .. }) => {
                sampled = Some((name.to_string(), span_location(name.span())));
                return ControlFlow::Break(());
            }
            MetMut::Factor(_) => {}
        }
        ControlFlow::Continue(())
    });
    if let Some((name, location)) = sampled {
        return Err(script.error(
            format!(
                "TABLESAMPLE of `{name}` is not supported: a materialized view WITH (sample = ...) keeps a sample \
                 that its queries are estimated from"
            ),
            location,
        ));
    }
    match too_deep {
        None => Ok(()),
        Some(location) => Err(script.error(
            format!(
                "expression nested more than {MAX_EXPRESSION_DEPTH} levels deep (a chain of operators that long): \
                 tessera plans at most {MAX_EXPRESSION_DEPTH}; split it, or use IN (...) for a list of values"
            ),
            location,
        )),
    }
}

/// The operands of the chain of `op` topped by `expr`, left to right (without recursion: the
/// chain may be as deep as it is long). `f AND NOT g` is one operand: in a temporal formula
/// it subtracts, which does not associate with the `AND`s around it.
fn flatten(expr: Expr, op: &BinaryOperator, operands: &mut Vec<Expr>) {
    let mut pending = vec![expr];
    while let Some(expr) = pending.pop() {
        match expr {
            Expr::BinaryOp { left, op: this, right }
                if this == *op
                    && !(this == BinaryOperator::And
                        && matches!(*right, Expr::UnaryOp { op: UnaryOperator::Not, .. })) =>
            {
                pending.push(*right);
                pending.push(*left);
            }
            other => operands.push(other),
        }
    }
}

/// `operands` joined by `op` as a balanced tree, in their order.
fn balanced(mut operands: Vec<Expr>, op: &BinaryOperator) -> Expr {
    if operands.len() == 1 {
        return operands.pop().expect("one operand");
    }
    let right = operands.split_off(operands.len() / 2);
    Expr::BinaryOp { left: Box::new(balanced(operands, op)), op: op.clone(), right: Box::new(balanced(right, op)) }
}

/// Where the leftmost operand of `expr` starts (found without recursion).
fn first_leaf_location(expr: &Expr) -> Option<Location> {
    let mut leaf = expr;
    loop {
        leaf = match leaf {
            Expr::BinaryOp { left, .. } => left,
            Expr::Nested(inner) => inner,
            Expr::UnaryOp { expr, .. } => expr,
            Expr::Cast { expr, .. } => expr,
            Expr::IsNull(inner) | Expr::IsNotNull(inner) => inner,
            _ => break,
        };
    }
    span_location(leaf.span())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion_sql::sqlparser::dialect::GenericDialect;
    use datafusion_sql::sqlparser::parser::Parser;

    fn depth(expr: &Expr) -> usize {
        match expr {
            Expr::BinaryOp { left, right, .. } => 1 + depth(left).max(depth(right)),
            Expr::Nested(inner) => 1 + depth(inner),
            _ => 1,
        }
    }

    /// The WHERE clause of `sql`, balanced (on a deep stack, as scripts are planned: the
    /// visitor recurses once per level of the tree it is given).
    fn balanced_where(sql: &str) -> Result<Expr> {
        crate::exec::on_deep_stack("test", || {
            let mut query = Parser::new(&GenericDialect {}).try_with_sql(sql).unwrap().parse_query().unwrap();
            balance_and_check(NodeMut::Query(&mut query), &ScriptText::new(sql))?;
            let datafusion_sql::sqlparser::ast::SetExpr::Select(select) = *query.body else { panic!("a select") };
            Ok(select.selection.expect("a WHERE"))
        })
    }

    #[test]
    fn and_or_chains_are_balanced_in_order() {
        let terms: Vec<String> = (0..10_000).map(|i| format!("x = {i}")).collect();
        let expr = balanced_where(&format!("SELECT x FROM t WHERE {}", terms.join(" OR "))).unwrap();
        assert_eq!(depth(&expr), 16, "14 levels of OR over the comparisons");
        let mut operands = Vec::new();
        flatten(expr, &BinaryOperator::Or, &mut operands);
        assert_eq!(operands.iter().map(ToString::to_string).collect::<Vec<_>>(), terms);
        // A mixed chain keeps AND binding tighter than OR: the OR chain's operands are the ANDs.
        let expr = balanced_where("SELECT x FROM t WHERE a AND b OR c AND d AND e OR f").unwrap();
        let mut operands = Vec::new();
        flatten(expr, &BinaryOperator::Or, &mut operands);
        assert_eq!(operands.iter().map(ToString::to_string).collect::<Vec<_>>(), ["a AND b", "c AND d AND e", "f"]);
        // `f AND NOT g` stays one operand (a temporal formula's subtraction).
        let expr = balanced_where("SELECT x FROM t WHERE a AND NOT b AND c AND d").unwrap();
        let Expr::BinaryOp { left, .. } = &expr else { panic!("{expr}") };
        assert_eq!(left.to_string(), "a AND NOT b");
    }

    #[test]
    fn other_deep_chains_are_refused_with_their_position() {
        let sum: Vec<String> = (0..2_000).map(|i| i.to_string()).collect();
        let sql = format!("SELECT x FROM t\nWHERE x = {}", sum.join(" + "));
        let err = balanced_where(&sql).unwrap_err().to_string();
        assert!(err.contains("nested more than 1000 levels"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        let sum: Vec<String> = (0..(MAX_EXPRESSION_DEPTH - 5)).map(|i| i.to_string()).collect();
        let sql = format!("SELECT x FROM t WHERE x = {}", sum.join(" + "));
        crate::exec::on_deep_stack("test", || balanced_where(&sql).map(|deep| assert_eq!(depth(&deep), 996))).unwrap();
    }
}
