//! Conjunctive queries with order conditions on event time (Sec. 4.2), and their unions: a
//! self-join of one stream whose aliases share data variables and compare their event times.
//!
//! Lemma 4.8 splits a block into the linear orders of its aliases' times that its conditions
//! allow (ties included: `a = b > c` is one); no valuation satisfies two of them, so the block
//! counts the sum of theirs. Lemma 4.9 turns each order into a formula: the aliases of the
//! latest instant, joined, and (`ONCE_COUNT`, strictly earlier) the formula of the rest.
//!
//! ```text
//!  a.ts < b.ts < c.ts   ⟶   F = c ∧ ONCE_COUNT(b ∧ ONCE_COUNT(a))
//!  answer at t = Σ_{s ≤ t} F(s)  =  F OR ONCE_COUNT(F)
//! ```
//!
//! Variables no later level needs are summed out before each `ONCE_COUNT`, so each counter is
//! kept per valuation of the variables that still join (for a funnel: per user).

use super::formula::{Atom, Formula, SinceCount, TemporalQuery, Var};
use crate::error::{Result, TesseraError};

/// How the event time of one alias may compare with another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    pub before: bool,
    pub same: bool,
    pub after: bool,
}

impl Allowed {
    pub const ANY: Allowed = Allowed { before: true, same: true, after: true };

    /// The orders SQL's comparison `op` allows (`<`, `<=`, `=`, `>=`, `>`, `<>`).
    pub fn from_sql(op: &str) -> Option<Allowed> {
        let (before, same, after) = match op {
            "<" => (true, false, false),
            "<=" => (true, true, false),
            "=" => (false, true, false),
            ">=" => (false, true, true),
            ">" => (false, false, true),
            "<>" | "!=" => (true, false, true),
            _ => return None,
        };
        Some(Allowed { before, same, after })
    }

    fn and(self, other: Allowed) -> Allowed {
        Allowed { before: self.before && other.before, same: self.same && other.same, after: self.after && other.after }
    }

    fn reversed(self) -> Allowed {
        Allowed { before: self.after, same: self.same, after: self.before }
    }
}

/// One block of a union: its aliases (each an atom of the query) and the conditions between
/// their times, `(i, j, allowed)` saying how alias `i`'s time may compare with alias `j`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub aliases: Vec<usize>,
    pub conditions: Vec<(usize, usize, Allowed)>,
}

/// A union of conjunctive queries over one stream, counted per valuation of `group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConjunctiveQuery {
    pub variables: Vec<String>,
    /// One per alias of every block.
    pub atoms: Vec<Atom>,
    pub blocks: Vec<Block>,
    pub group: Vec<Var>,
    pub distinct: bool,
}

/// The most aliases one block may have: 6 aliases have 4,683 orders of their times.
pub const MAX_ALIASES: usize = 6;

/// The linear orders (latest level first, each level the aliases at one instant) of `k`
/// aliases' times that `conditions` allow.
pub fn linear_orders(k: usize, conditions: &[(usize, usize, Allowed)]) -> Vec<Vec<Vec<usize>>> {
    let mut allowed = vec![vec![Allowed::ANY; k]; k];
    for &(i, j, a) in conditions {
        allowed[i][j] = allowed[i][j].and(a);
        allowed[j][i] = allowed[j][i].and(a.reversed());
    }
    let mut orders = Vec::new();
    let mut levels: Vec<Vec<usize>> = Vec::new();
    place(&allowed, &(0..k).collect::<Vec<_>>(), &mut levels, &mut orders);
    orders
}

/// Extends `levels` (latest first) with every nonempty set of `left` as the next, earlier level.
fn place(allowed: &[Vec<Allowed>], left: &[usize], levels: &mut Vec<Vec<usize>>, out: &mut Vec<Vec<Vec<usize>>>) {
    if left.is_empty() {
        out.push(levels.clone());
        return;
    }
    let n = left.len();
    for mask in 1u32..(1 << n) {
        let level: Vec<usize> = (0..n).filter(|b| mask & (1 << b) != 0).map(|b| left[b]).collect();
        let same_ok = level.iter().all(|&i| level.iter().all(|&j| i == j || allowed[i][j].same));
        // Every alias already placed is later than this level's.
        let after_ok = levels.iter().flatten().all(|&i| level.iter().all(|&j| allowed[i][j].after));
        if !(same_ok && after_ok) {
            continue;
        }
        let rest: Vec<usize> = left.iter().copied().filter(|i| !level.contains(i)).collect();
        levels.push(level);
        place(allowed, &rest, levels, out);
        levels.pop();
    }
}

/// What the rewriting produced, for EXPLAIN.
#[derive(Debug, Clone)]
pub struct Rewritten {
    pub query: TemporalQuery,
    /// Per block, its linear orders as text (`c > b = a`, latest first).
    pub orders: Vec<Vec<String>>,
}

fn vars_of(atoms: &[Atom], aliases: &[usize]) -> Vec<Var> {
    let mut vars: Vec<Var> = aliases.iter().flat_map(|&a| atoms[a].vars.iter().copied()).collect();
    vars.sort_unstable();
    vars.dedup();
    vars
}

/// `EXISTS` over the variables of `f` (which has `vars`) outside `keep`, or `f` itself.
fn keep_only(f: Formula, vars: &[Var], keep: &[Var]) -> Formula {
    let dropped: Vec<Var> = vars.iter().copied().filter(|v| !keep.contains(v)).collect();
    if dropped.is_empty() {
        f
    } else {
        Formula::Exists(dropped, Box::new(f))
    }
}

/// The conjunction of the aliases of one level (one instant).
fn level_formula(level: &[usize], block: &Block) -> Formula {
    let mut atoms = level.iter().map(|&i| Formula::Atom(block.aliases[i]));
    let first = atoms.next().expect("a level has an alias");
    atoms.fold(first, Formula::and)
}

/// Lemma 4.9 for one order: `F_r = G_r`, `F_i = G_i AND ONCE_COUNT(F_{i+1})`, each `F_{i+1}`
/// summed down to the variables `keep` and the earlier levels need.
fn order_formula(order: &[Vec<usize>], block: &Block, atoms: &[Atom], keep: &[Var]) -> Formula {
    let alias_vars = |level: &[usize]| vars_of(atoms, &level.iter().map(|&i| block.aliases[i]).collect::<Vec<_>>());
    let mut formula: Option<(Formula, Vec<Var>)> = None;
    for (depth, level) in order.iter().enumerate().rev() {
        let g = level_formula(level, block);
        let g_vars = alias_vars(level);
        formula = Some(match formula {
            None => (g, g_vars),
            Some((inner, inner_vars)) => {
                // What the later levels (and the answer) still need of the earlier ones.
                let mut needed: Vec<Var> = keep.to_vec();
                for later in &order[..=depth] {
                    needed.extend(alias_vars(later));
                }
                let inner = keep_only(inner, &inner_vars, &needed);
                let inner_vars: Vec<Var> = inner_vars.into_iter().filter(|v| needed.contains(v)).collect();
                let vars = {
                    let mut v: Vec<Var> = g_vars.iter().chain(&inner_vars).copied().collect();
                    v.sort_unstable();
                    v.dedup();
                    v
                };
                (Formula::and(g, Formula::once(SinceCount::Occurrences, inner)), vars)
            }
        });
    }
    let (formula, vars) = formula.expect("an order has a level");
    keep_only(formula, &vars, keep)
}

/// An atom's alias: its label up to its conditions (`a[a.kind = 'login']` is `a`).
pub(crate) fn alias_name(label: &str) -> &str {
    label.split('[').next().unwrap_or(label)
}

/// Rewrites `q` into one temporal query (Lemmas 4.8 and 4.9): per block, the sum over its
/// linear orders; the blocks' sum; the answer at `t` counts every instant up to `t`.
pub fn to_temporal(q: &ConjunctiveQuery) -> Result<Rewritten> {
    // The variables every alias binds (they partition the synopsis) and the grouped ones.
    let mut keep: Vec<Var> = q.group.clone();
    let all: Vec<usize> = q.blocks.iter().flat_map(|b| b.aliases.iter().copied()).collect();
    if let Some(&first) = all.first() {
        keep.extend(q.atoms[first].vars.iter().copied().filter(|v| all.iter().all(|&a| q.atoms[a].vars.contains(v))));
    }
    keep.sort_unstable();
    keep.dedup();
    let mut body: Option<Formula> = None;
    let mut orders_text = Vec::new();
    for block in &q.blocks {
        if block.aliases.len() > MAX_ALIASES {
            return Err(TesseraError::Plan(format!(
                "a block joins {} aliases of the stream; at most {MAX_ALIASES} are supported (their times have too \
                 many orders)",
                block.aliases.len()
            )));
        }
        let orders = linear_orders(block.aliases.len(), &block.conditions);
        if orders.is_empty() {
            return Err(TesseraError::Plan(
                "the conditions on event time contradict each other: no events can satisfy them".into(),
            ));
        }
        orders_text.push(
            orders
                .iter()
                .map(|order| {
                    order
                        .iter()
                        .map(|level| {
                            level
                                .iter()
                                .map(|&i| alias_name(&q.atoms[block.aliases[i]].label))
                                .collect::<Vec<_>>()
                                .join(" = ")
                        })
                        .collect::<Vec<_>>()
                        .join(" > ")
                })
                .collect(),
        );
        for order in &orders {
            let f = order_formula(order, block, &q.atoms, &keep);
            body = Some(match body {
                None => f,
                Some(b) => Formula::or(b, f),
            });
        }
    }
    let f = body.ok_or_else(|| TesseraError::Plan("a query needs at least one block".into()))?;
    let body = Formula::or(f.clone(), Formula::once(SinceCount::Occurrences, f));
    let body = if q.distinct { Formula::Distinct(Box::new(body)) } else { body };
    Ok(Rewritten {
        query: TemporalQuery {
            variables: q.variables.clone(),
            atoms: q.atoms.clone(),
            body,
            group: q.group.clone(),
            distinct: q.distinct,
        },
        orders: orders_text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fubini(n: usize) -> usize {
        [1, 1, 3, 13, 75, 541, 4683][n]
    }

    #[test]
    fn unconstrained_aliases_have_every_weak_order() {
        for k in 0..=6 {
            assert_eq!(linear_orders(k, &[]).len(), fubini(k), "{k} aliases");
        }
    }

    #[test]
    fn conditions_prune_orders() {
        let lt = Allowed::from_sql("<").unwrap();
        // a < b < c: one order, c latest.
        assert_eq!(linear_orders(3, &[(0, 1, lt), (1, 2, lt)]), vec![vec![vec![2], vec![1], vec![0]]]);
        // a <= b: b later, or both at once.
        let le = Allowed::from_sql("<=").unwrap();
        assert_eq!(linear_orders(2, &[(0, 1, le)]), vec![vec![vec![1], vec![0]], vec![vec![0, 1]]]);
        // a < b and b < a: none.
        assert!(linear_orders(2, &[(0, 1, lt), (1, 0, lt)]).is_empty());
    }
}
