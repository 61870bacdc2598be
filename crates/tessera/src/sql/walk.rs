//! Walks over sqlparser's syntax trees: every walk of the workspace (here and in tessera-db)
//! goes through the one visitor type of each kind defined here, with its callback as a trait
//! object. sqlparser's traversal is a generic function per node type of its syntax tree, compiled
//! again for every visitor type: each closure handed to `ast::visit_expressions` and its siblings
//! was one, and its copy of the traversal was about an eighth of all the code the optimizer
//! compiled for the crate (`cargo llvm-lines`). The functions below are not generic, so a crate
//! that calls them compiles no traversal of its own.

use std::ops::ControlFlow;

use datafusion_sql::sqlparser::ast::{
    Expr, ObjectName, Query, Select, SelectItem, Statement, TableFactor, Visit, VisitMut, Visitor, VisitorMut,
};

/// A tree to walk.
#[derive(Clone, Copy)]
pub enum Node<'a> {
    Query(&'a Query),
    Select(&'a Select),
    Expr(&'a Expr),
    /// A SELECT list.
    Items(&'a [SelectItem]),
}

/// A tree to walk and change.
pub enum NodeMut<'a> {
    Statement(&'a mut Statement),
    Query(&'a mut Query),
    Select(&'a mut Select),
    Expr(&'a mut Expr),
    /// A SELECT list.
    Items(&'a mut [SelectItem]),
}

/// What a walk meets, each before what is under it.
pub enum Met<'a> {
    Expr(&'a Expr),
    /// A table, view or source a query reads (`FROM name`).
    Relation(&'a ObjectName),
}

/// What a changing walk meets: an expression when it enters it (before its operands) and when
/// it leaves it (after them), a relation after what is under it, and what a FROM reads (a table
/// with its alias and sample, a table function, a subquery) before it.
pub enum MetMut<'a> {
    Factor(&'a mut TableFactor),
    Entered(&'a mut Expr),
    Left(&'a mut Expr),
    Relation(&'a mut ObjectName),
}

/// Walks `node` top-down until `each` breaks.
pub fn walk(node: Node<'_>, each: &mut dyn FnMut(Met<'_>) -> ControlFlow<()>) -> ControlFlow<()> {
    let walker = &mut Walker(each);
    match node {
        Node::Query(query) => query.visit(walker),
        Node::Select(select) => select.visit(walker),
        Node::Expr(expr) => expr.visit(walker),
        Node::Items(items) => items.iter().try_for_each(|item| item.visit(walker)),
    }
}

/// Walks `node` until `each` breaks; what `each` changes is walked as changed.
pub fn walk_mut(node: NodeMut<'_>, each: &mut dyn FnMut(MetMut<'_>) -> ControlFlow<()>) -> ControlFlow<()> {
    let walker = &mut WalkerMut(each);
    match node {
        NodeMut::Statement(statement) => statement.visit(walker),
        NodeMut::Query(query) => query.visit(walker),
        NodeMut::Select(select) => select.visit(walker),
        NodeMut::Expr(expr) => expr.visit(walker),
        NodeMut::Items(items) => items.iter_mut().try_for_each(|item| item.visit(walker)),
    }
}

/// Calls `each` on every expression of `node`, each before its operands, until it breaks.
pub fn expressions(node: Node<'_>, mut each: impl FnMut(&Expr) -> ControlFlow<()>) -> ControlFlow<()> {
    walk(node, &mut |met| match met {
        Met::Expr(expr) => each(expr),
        Met::Relation(_) => ControlFlow::Continue(()),
    })
}

/// Calls `each` on every expression of `node`, each after its operands, until it breaks.
pub fn expressions_mut(node: NodeMut<'_>, mut each: impl FnMut(&mut Expr) -> ControlFlow<()>) -> ControlFlow<()> {
    walk_mut(node, &mut |met| match met {
        MetMut::Left(expr) => each(expr),
        MetMut::Entered(_) | MetMut::Relation(_) | MetMut::Factor(_) => ControlFlow::Continue(()),
    })
}

/// Calls `each` on every relation `query` reads, until it breaks.
pub fn relations(query: &Query, mut each: impl FnMut(&ObjectName) -> ControlFlow<()>) -> ControlFlow<()> {
    walk(Node::Query(query), &mut |met| match met {
        Met::Relation(name) => each(name),
        Met::Expr(_) => ControlFlow::Continue(()),
    })
}

/// Calls `each` on every relation `query` reads, until it breaks.
pub fn relations_mut(query: &mut Query, mut each: impl FnMut(&mut ObjectName) -> ControlFlow<()>) -> ControlFlow<()> {
    walk_mut(NodeMut::Query(query), &mut |met| match met {
        MetMut::Relation(name) => each(name),
        MetMut::Entered(_) | MetMut::Left(_) | MetMut::Factor(_) => ControlFlow::Continue(()),
    })
}

struct Walker<'f>(&'f mut dyn FnMut(Met<'_>) -> ControlFlow<()>);

impl Visitor for Walker<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        (self.0)(Met::Expr(expr))
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<()> {
        (self.0)(Met::Relation(relation))
    }
}

struct WalkerMut<'f>(&'f mut dyn FnMut(MetMut<'_>) -> ControlFlow<()>);

impl VisitorMut for WalkerMut<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        (self.0)(MetMut::Entered(expr))
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        (self.0)(MetMut::Left(expr))
    }

    fn post_visit_relation(&mut self, relation: &mut ObjectName) -> ControlFlow<()> {
        (self.0)(MetMut::Relation(relation))
    }

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        (self.0)(MetMut::Factor(factor))
    }
}

#[cfg(test)]
mod tests {
    use datafusion_sql::sqlparser::dialect::GenericDialect;
    use datafusion_sql::sqlparser::parser::Parser;

    use super::*;

    fn query(sql: &str) -> Query {
        match Parser::parse_sql(&GenericDialect {}, sql).unwrap().remove(0) {
            datafusion_sql::sqlparser::ast::Statement::Query(query) => *query,
            other => panic!("not a query: {other}"),
        }
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the reference the walker is checked against
    fn walks_meet_what_sqlparsers_own_visitors_meet_in_the_same_order() {
        use datafusion_sql::sqlparser::ast::{visit_expressions, visit_expressions_mut, visit_relations};
        let sql = "SELECT a + b * 2, f(c) FROM t JOIN (SELECT x FROM u WHERE x IN (SELECT y FROM v)) s ON t.a = s.x \
                   WHERE NOT (a > 1 OR b < 2) GROUP BY 1, 2 HAVING COUNT(*) > 3";
        let q = query(sql);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        let _ = expressions(Node::Query(&q), |e| {
            ours.push(e.to_string());
            ControlFlow::Continue(())
        });
        let _ = visit_expressions(&q, |e| {
            theirs.push(e.to_string());
            ControlFlow::<()>::Continue(())
        });
        assert_eq!(ours, theirs);
        assert!(ours.len() > 10, "{ours:?}");

        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        let _ = relations(&q, |name| {
            ours.push(name.to_string());
            ControlFlow::Continue(())
        });
        let _ = visit_relations(&q, |name| {
            theirs.push(name.to_string());
            ControlFlow::<()>::Continue(())
        });
        assert_eq!(ours, ["t", "u", "v"]);
        assert_eq!(ours, theirs);

        let (mut ours, mut theirs) = (q.clone(), q.clone());
        let (mut left, mut left_theirs) = (Vec::new(), Vec::new());
        let _ = expressions_mut(NodeMut::Query(&mut ours), |e| {
            left.push(e.to_string());
            ControlFlow::Continue(())
        });
        let _ = visit_expressions_mut(&mut theirs, |e| {
            left_theirs.push(e.to_string());
            ControlFlow::<()>::Continue(())
        });
        assert_eq!(left, left_theirs);
        assert_eq!(left.first().map(String::as_str), Some("a"), "operands first: {left:?}");
    }

    #[test]
    fn a_changing_walk_renames_relations_and_stops_where_its_callback_breaks() {
        let mut q = query("SELECT * FROM t JOIN u ON t.a = u.a");
        let _ = relations_mut(&mut q, |name| {
            *name = ObjectName::from(vec![datafusion_sql::sqlparser::ast::Ident::new(format!("{name}_1"))]);
            ControlFlow::Continue(())
        });
        assert_eq!(q.to_string(), "SELECT * FROM t_1 JOIN u_1 ON t.a = u.a");

        let mut met = 0;
        let flow = walk(Node::Query(&q), &mut |_| {
            met += 1;
            if met == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!((flow, met), (ControlFlow::Break(()), 2));
    }
}
