//! Past temporal formulas under SQL duplicate semantics (the paper's FOTL, Sec. 4.1), and
//! their compilation into a [`Program`]: the nodes a synopsis evaluates, which of them keep
//! counts from instant to instant, how the counts behave through instants without events, the
//! data variables that split the stream into independent partitions, and the space class.
//!
//! A formula is evaluated at an instant `s` for a valuation of its free data variables and
//! yields a number of duplicates (Figure 1): `AND` multiplies, `OR` and `EXISTS` add, `AND NOT`
//! takes `max(0, m - n)`, `DISTINCT` gives 1 for any positive count; `PREVIOUS q` is `q` one
//! instant earlier; `h SINCE q` holds when `q` held at some `s2 < s` and `h` at every instant
//! in `(s2, s]`, counting either how long (`SINCE_DURATION`, the paper's since1: the sum of
//! `h`'s counts over the longest such interval) or how many times (`SINCE_COUNT`, since2: the
//! sum of `q`'s counts over every such `s2`). `ONCE q` is `TRUE SINCE q`.

use std::collections::HashMap;
use std::fmt;

use super::chain::Chains;
use super::form::{Binary, Unary};
use crate::error::{Result, TesseraError};

/// A data variable: an index into [`TemporalQuery::variables`].
pub type Var = usize;

/// How a `SINCE` counts its duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinceCount {
    /// since1: the sum of the left side's counts since the earliest instant the right side
    /// held (with `TRUE` on the left: how many instants ago).
    Duration,
    /// since2: the sum of the right side's counts over the instants it held with the left side
    /// holding ever since (with `TRUE` on the left: how many times so far).
    Occurrences,
}

/// A formula over the atoms and data variables of a [`TemporalQuery`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Formula {
    /// The events of the instant that satisfy atom `i`, counted per valuation of its variables.
    Atom(usize),
    True,
    And(Box<Formula>, Box<Formula>),
    Or(Box<Formula>, Box<Formula>),
    AndNot(Box<Formula>, Box<Formula>),
    /// `TRUE AND NOT q`: allowed where the valuation comes from elsewhere (the left side of a
    /// `SINCE`, the right side of an `AND`).
    Not(Box<Formula>),
    Exists(Vec<Var>, Box<Formula>),
    Distinct(Box<Formula>),
    Previous(Box<Formula>),
    Since {
        count: SinceCount,
        hold: Box<Formula>,
        from: Box<Formula>,
    },
}

impl Formula {
    pub fn and(l: Formula, r: Formula) -> Formula {
        Formula::And(Box::new(l), Box::new(r))
    }

    pub fn or(l: Formula, r: Formula) -> Formula {
        Formula::Or(Box::new(l), Box::new(r))
    }

    pub fn and_not(l: Formula, r: Formula) -> Formula {
        Formula::AndNot(Box::new(l), Box::new(r))
    }

    pub fn since(count: SinceCount, hold: Formula, from: Formula) -> Formula {
        Formula::Since { count, hold: Box::new(hold), from: Box::new(from) }
    }

    /// `ONCE q`: `TRUE SINCE q`.
    pub fn once(count: SinceCount, q: Formula) -> Formula {
        Formula::since(count, Formula::True, q)
    }
}

/// One kind of event a formula counts: a predicate on one event and the columns it binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Atom {
    /// How EXPLAIN names it (for SQL: the alias and its predicate).
    pub label: String,
    /// The variables it binds, without repeats, in the order events supply their values.
    pub vars: Vec<Var>,
}

/// A continuous temporal query: its answer at instant `t` is, per valuation of `group`, the
/// body's count summed over the other variables (made 1 where positive when `distinct`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemporalQuery {
    pub variables: Vec<String>,
    pub atoms: Vec<Atom>,
    pub body: Formula,
    pub group: Vec<Var>,
    pub distinct: bool,
}

/// How a synopsis's state grows with the length of the stream (for a fixed set of data values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpaceClass {
    /// Set semantics throughout: flags, not counts.
    Bounded,
    /// Counters: bits logarithmic in the stream's length.
    LogBounded,
}

impl SpaceClass {
    pub fn name(self) -> &'static str {
        match self {
            SpaceClass::Bounded => "bounded",
            SpaceClass::LogBounded => "log-bounded",
        }
    }
}

/// How a node's count moves through instants without events, once their transients are over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Growth {
    Zero,
    Constant,
    /// Grows by a fixed amount per instant.
    Linear,
    /// May cross 0 or grow faster than a line: never stored.
    Unknown,
}

#[derive(Debug, Clone)]
pub(crate) enum NodeKind {
    Atom(usize),
    True,
    Binary(Binary, usize, usize),
    Unary(Unary, usize),
    Exists(usize),
    Previous(usize),
    /// `saturate`: under `DISTINCT`, only whether it holds is kept.
    Since {
        count: SinceCount,
        saturate: bool,
        hold: usize,
        from: usize,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub kind: NodeKind,
    /// Free variables, ascending.
    pub vars: Vec<Var>,
    /// Its valuations can be listed (it is range restricted); otherwise it is only asked
    /// about valuations that other nodes list.
    pub listable: bool,
    pub growth: Growth,
    /// For nodes that keep counts between instants (`PREVIOUS`, `SINCE`): their table.
    pub table: Option<usize>,
    /// Some atom lies below.
    pub has_atom: bool,
    /// The subformula, as EXPLAIN shows it.
    pub text: String,
}

/// A compiled temporal query.
#[derive(Debug, Clone)]
pub struct Program {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: usize,
    pub atoms: Vec<Atom>,
    pub variables: Vec<String>,
    pub group: Vec<Var>,
    pub distinct: bool,
    /// Variables every atom binds: their values split the stream into partitions evaluated
    /// independently (empty: one partition).
    pub partition: Vec<Var>,
    pub space: SpaceClass,
    /// A funnel's counter chains, when the formula has their shape (evaluated by
    /// [`super::chain::ChainSynopsis`] instead of the general evaluator).
    pub chains: Option<Chains>,
    /// Nodes keeping counts, by table.
    pub(crate) tables: Vec<usize>,
    /// Whether the formula reads each atom (events of the others are ignored).
    pub(crate) reads_atom: Vec<bool>,
    formula: String,
}

fn plan_error(message: impl Into<String>) -> TesseraError {
    TesseraError::Plan(message.into())
}

/// A temporal operator over no atom would count instants from wherever the stream happens to
/// start.
fn no_events(text: String) -> TesseraError {
    plan_error(format!("`{text}` reads no events: a temporal operator needs an atom below it"))
}

impl Program {
    pub fn compile(query: &TemporalQuery) -> Result<Program> {
        let mut builder = Builder { query, nodes: Vec::new(), shared: HashMap::new() };
        let root = builder.node(&query.body, false)?;
        let nodes = builder.nodes;
        let body = &nodes[root];
        if !body.listable {
            return Err(plan_error(format!(
                "the formula `{}` does not say which valuations it counts: every variable must be bound by an atom \
                 outside NOT",
                Display(query, &query.body)
            )));
        }
        for &g in &query.group {
            if !body.vars.contains(&g) {
                return Err(plan_error(format!(
                    "`{}` is grouped by but not free in the formula",
                    query.variables.get(g).map_or("?", |s| s.as_str())
                )));
            }
        }
        let mut partition: Option<Vec<Var>> = None;
        for node in nodes.iter().filter(|n| n.has_atom) {
            partition = Some(match partition {
                None => node.vars.clone(),
                Some(p) => p.into_iter().filter(|v| node.vars.contains(v)).collect(),
            });
        }
        let tables: Vec<usize> = nodes.iter().enumerate().filter(|(_, n)| n.table.is_some()).map(|(i, _)| i).collect();
        let counts = nodes.iter().any(|n| matches!(n.kind, NodeKind::Since { saturate: false, .. }));
        let reads_atom = (0..query.atoms.len())
            .map(|a| nodes.iter().any(|n| matches!(n.kind, NodeKind::Atom(i) if i == a)))
            .collect();
        let partition = partition.unwrap_or_default();
        Ok(Program {
            chains: Chains::recognize(query, &partition),
            formula: Display(query, &query.body).to_string(),
            reads_atom,
            nodes,
            root,
            atoms: query.atoms.clone(),
            variables: query.variables.clone(),
            group: query.group.clone(),
            distinct: query.distinct,
            partition,
            space: if counts { SpaceClass::LogBounded } else { SpaceClass::Bounded },
            tables,
        })
    }

    /// The temporal formula, as EXPLAIN prints it.
    pub fn formula(&self) -> &str {
        &self.formula
    }

    /// What each table keeps, as EXPLAIN lists the auxiliary counters: the subformula and its
    /// variables.
    pub fn counters(&self) -> Vec<String> {
        self.tables
            .iter()
            .map(|&n| {
                let node = &self.nodes[n];
                let vars: Vec<&str> = node.vars.iter().map(|&v| self.variables[v].as_str()).collect();
                let what = match &node.kind {
                    NodeKind::Since { saturate: true, .. } => "whether it holds",
                    _ => "count",
                };
                let per = if vars.is_empty() { "one".to_string() } else { format!("per ({})", vars.join(", ")) };
                format!("{} ({what}), {per}", node.text)
            })
            .collect()
    }
}

struct Builder<'q> {
    query: &'q TemporalQuery,
    nodes: Vec<Node>,
    /// Subformulas already compiled (a subformula written twice is evaluated and kept once).
    shared: HashMap<(&'q Formula, bool), usize>,
}

fn union(a: &[Var], b: &[Var]) -> Vec<Var> {
    let mut vars: Vec<Var> = a.iter().chain(b).copied().collect();
    vars.sort_unstable();
    vars.dedup();
    vars
}

fn subset(a: &[Var], b: &[Var]) -> bool {
    a.iter().all(|v| b.contains(v))
}

impl<'q> Builder<'q> {
    fn push(&mut self, node: Node) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn names(&self, vars: &[Var]) -> String {
        vars.iter().map(|&v| self.query.variables.get(v).map_or("?", |s| s.as_str())).collect::<Vec<_>>().join(", ")
    }

    fn text(&self, f: &Formula) -> String {
        Display(self.query, f).to_string()
    }

    /// Compiles `f`; `under_distinct`: only whether `f` holds matters above it.
    fn node(&mut self, f: &'q Formula, under_distinct: bool) -> Result<usize> {
        if let Some(&n) = self.shared.get(&(f, under_distinct)) {
            return Ok(n);
        }
        let n = self.compile_node(f, under_distinct)?;
        self.shared.insert((f, under_distinct), n);
        Ok(n)
    }

    fn compile_node(&mut self, f: &'q Formula, under_distinct: bool) -> Result<usize> {
        let node = match f {
            Formula::Atom(i) => {
                let atom = self.query.atoms.get(*i).ok_or_else(|| plan_error(format!("no atom {i}")))?;
                let mut vars = atom.vars.clone();
                vars.sort_unstable();
                Node {
                    kind: NodeKind::Atom(*i),
                    vars,
                    listable: true,
                    growth: Growth::Zero,
                    table: None,
                    has_atom: true,
                    text: String::new(),
                }
            }
            Formula::True => Node {
                kind: NodeKind::True,
                vars: Vec::new(),
                listable: true,
                growth: Growth::Constant,
                table: None,
                has_atom: false,
                text: String::new(),
            },
            Formula::And(l, r) | Formula::Or(l, r) | Formula::AndNot(l, r) => {
                // Whether a product or a sum is positive depends only on whether its operands
                // are; a difference needs the counts.
                let positivity = under_distinct && !matches!(f, Formula::AndNot(..));
                let (li, ri) = (self.node(l, positivity)?, self.node(r, positivity)?);
                let (ln, rn) = (&self.nodes[li], &self.nodes[ri]);
                let (op, listable, growth) = match f {
                    Formula::And(..) => {
                        let listable = (ln.listable && (rn.listable || subset(&rn.vars, &ln.vars)))
                            || (rn.listable && subset(&ln.vars, &rn.vars));
                        let growth = match (ln.growth, rn.growth) {
                            (Growth::Zero, _) | (_, Growth::Zero) => Growth::Zero,
                            (Growth::Unknown, _) | (_, Growth::Unknown) => Growth::Unknown,
                            (Growth::Linear, Growth::Linear) => Growth::Unknown,
                            (a, b) => a.max(b),
                        };
                        (Binary::Product, listable, growth)
                    }
                    Formula::Or(..) => {
                        if ln.vars != rn.vars {
                            return Err(plan_error(format!(
                                "both sides of OR must have the same free variables: `{}` has ({}), `{}` has ({})",
                                self.text(l),
                                self.names(&ln.vars),
                                self.text(r),
                                self.names(&rn.vars)
                            )));
                        }
                        (Binary::Sum, ln.listable && rn.listable, ln.growth.max(rn.growth))
                    }
                    _ => {
                        if !subset(&rn.vars, &ln.vars) {
                            return Err(plan_error(format!(
                                "the right side of AND NOT may only use variables of its left side: `{}` uses ({})",
                                self.text(r),
                                self.names(&rn.vars)
                            )));
                        }
                        let growth = match (ln.growth, rn.growth) {
                            (Growth::Zero, _) => Growth::Zero,
                            (g, Growth::Zero) => g,
                            (Growth::Constant, Growth::Constant) => Growth::Constant,
                            _ => Growth::Unknown,
                        };
                        (Binary::Monus, ln.listable, growth)
                    }
                };
                Node {
                    kind: NodeKind::Binary(op, li, ri),
                    vars: union(&ln.vars, &rn.vars),
                    listable,
                    growth,
                    table: None,
                    has_atom: ln.has_atom || rn.has_atom,
                    text: String::new(),
                }
            }
            Formula::Not(q) | Formula::Distinct(q) => {
                let qi = self.node(q, true)?;
                let qn = &self.nodes[qi];
                let (op, listable, growth) = match f {
                    Formula::Not(_) => (
                        Unary::Not,
                        qn.vars.is_empty(),
                        if qn.growth == Growth::Unknown { Growth::Unknown } else { Growth::Constant },
                    ),
                    _ => (
                        Unary::Distinct,
                        qn.listable,
                        match qn.growth {
                            Growth::Zero => Growth::Zero,
                            Growth::Unknown => Growth::Unknown,
                            _ => Growth::Constant,
                        },
                    ),
                };
                Node {
                    kind: NodeKind::Unary(op, qi),
                    vars: qn.vars.clone(),
                    listable,
                    growth,
                    table: None,
                    has_atom: qn.has_atom,
                    text: String::new(),
                }
            }
            Formula::Exists(removed, q) => {
                let qi = self.node(q, under_distinct)?;
                let qn = &self.nodes[qi];
                if !qn.listable {
                    return Err(plan_error(format!(
                        "EXISTS needs a formula whose valuations can be listed: `{}`",
                        self.text(q)
                    )));
                }
                if let Some(&v) = removed.iter().find(|v| !qn.vars.contains(v)) {
                    return Err(plan_error(format!(
                        "EXISTS {} over `{}`, where it is not free (it would multiply by the number of values seen)",
                        self.names(&[v]),
                        self.text(q)
                    )));
                }
                Node {
                    kind: NodeKind::Exists(qi),
                    vars: qn.vars.iter().copied().filter(|v| !removed.contains(v)).collect(),
                    listable: true,
                    growth: qn.growth,
                    table: None,
                    has_atom: qn.has_atom,
                    text: String::new(),
                }
            }
            Formula::Previous(q) => {
                let qi = self.node(q, under_distinct)?;
                let qn = &self.nodes[qi];
                if !qn.listable {
                    return Err(plan_error(format!(
                        "PREVIOUS needs a formula whose valuations can be listed: `{}`",
                        self.text(q)
                    )));
                }
                if qn.growth == Growth::Unknown {
                    return Err(plan_error(format!(
                        "PREVIOUS of `{}` would keep a count that is not a line between events",
                        self.text(q)
                    )));
                }
                if !qn.has_atom {
                    return Err(no_events(self.text(f)));
                }
                Node {
                    kind: NodeKind::Previous(qi),
                    vars: qn.vars.clone(),
                    listable: true,
                    growth: qn.growth,
                    table: Some(0),
                    has_atom: qn.has_atom,
                    text: String::new(),
                }
            }
            Formula::Since { count, hold, from } => {
                // Only whether the left side holds matters, except to a how-long SINCE that is
                // not saturated: it sums the left side's counts.
                let hi = self.node(hold, under_distinct || *count == SinceCount::Occurrences)?;
                let fi = self.node(from, under_distinct || *count == SinceCount::Duration)?;
                let (hn, fnode) = (&self.nodes[hi], &self.nodes[fi]);
                if !fnode.listable {
                    return Err(plan_error(format!(
                        "the right side of SINCE must bind its variables with an atom: `{}`",
                        self.text(from)
                    )));
                }
                if !subset(&hn.vars, &fnode.vars) {
                    return Err(plan_error(format!(
                        "the left side of SINCE may only use variables of its right side: `{}` uses ({}), `{}` binds ({})",
                        self.text(hold),
                        self.names(&hn.vars),
                        self.text(from),
                        self.names(&fnode.vars)
                    )));
                }
                if !hn.has_atom && !fnode.has_atom {
                    return Err(no_events(self.text(f)));
                }
                let saturate = under_distinct;
                let growth = match (count, hn.growth, fnode.growth) {
                    (_, Growth::Zero, _) => Growth::Zero,
                    (_, Growth::Unknown, _) | (_, _, Growth::Unknown) => {
                        return Err(plan_error(format!(
                            "`{}` would keep a count that is not a line between events; simplify its operands",
                            self.text(f)
                        )))
                    }
                    _ if saturate => Growth::Constant,
                    (SinceCount::Duration, Growth::Linear, _) | (SinceCount::Occurrences, _, Growth::Linear) => {
                        return Err(plan_error(format!(
                            "`{}` would grow faster than linearly between events (a SINCE over a growing count); \
                             put DISTINCT around it or its operand",
                            self.text(f)
                        )))
                    }
                    (SinceCount::Duration, _, _) => Growth::Linear,
                    (SinceCount::Occurrences, _, Growth::Zero) => Growth::Constant,
                    (SinceCount::Occurrences, _, _) => Growth::Linear,
                };
                Node {
                    kind: NodeKind::Since { count: *count, saturate, hold: hi, from: fi },
                    vars: fnode.vars.clone(),
                    listable: true,
                    growth,
                    table: Some(0),
                    has_atom: hn.has_atom || fnode.has_atom,
                    text: String::new(),
                }
            }
        };
        let table = node.table.map(|_| self.nodes.iter().filter(|n| n.table.is_some()).count());
        let text = self.text(f);
        Ok(self.push(Node { table, text, ..node }))
    }
}

/// A formula as text, with the query's atom labels and variable names.
pub struct Display<'a>(pub &'a TemporalQuery, pub &'a Formula);

impl fmt::Display for Display<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Display(query, formula) = *self;
        fn show<'b>(query: &'b TemporalQuery, g: &'b Formula) -> Display<'b> {
            Display(query, g)
        }
        match formula {
            Formula::Atom(i) => match query.atoms.get(*i) {
                Some(atom) => {
                    let vars: Vec<&str> = atom.vars.iter().map(|&v| query.variables[v].as_str()).collect();
                    write!(f, "{}({})", atom.label, vars.join(", "))
                }
                None => write!(f, "atom{i}"),
            },
            Formula::True => write!(f, "TRUE"),
            Formula::And(l, r) => write!(f, "({} AND {})", show(query, l), show(query, r)),
            Formula::Or(l, r) => write!(f, "({} OR {})", show(query, l), show(query, r)),
            Formula::AndNot(l, r) => write!(f, "({} AND NOT {})", show(query, l), show(query, r)),
            Formula::Not(q) => write!(f, "NOT {}", show(query, q)),
            Formula::Exists(vars, q) => {
                let names: Vec<&str> = vars.iter().map(|&v| query.variables[v].as_str()).collect();
                write!(f, "EXISTS {} ({})", names.join(", "), show(query, q))
            }
            Formula::Distinct(q) => write!(f, "DISTINCT({})", show(query, q)),
            Formula::Previous(q) => write!(f, "PREVIOUS({})", show(query, q)),
            Formula::Since { count, hold, from } => {
                let word = match count {
                    SinceCount::Duration => "DURATION",
                    SinceCount::Occurrences => "COUNT",
                };
                if **hold == Formula::True {
                    write!(f, "ONCE_{word}({})", show(query, from))
                } else {
                    write!(f, "({} SINCE_{word} {})", show(query, hold), show(query, from))
                }
            }
        }
    }
}
