//! The reference evaluator of continuous temporal queries: it keeps the whole prefix of the
//! stream and applies the duplicate semantics of the paper's Figure 1 literally at every
//! instant, empty instants included. The synopsis tests compare with it, and the
//! `synopsis_reference` benchmark times it (how far keeping everything goes).

use std::collections::{BTreeMap, HashMap};

use tessera::synopsis::{Count, Formula, SinceCount, TemporalQuery, Value, Var};

/// An event: its instant, its kind (atom `kind` matches it) and its columns, one per
/// variable: an atom binding variable `v` reads column `v`.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    pub t: i64,
    pub kind: usize,
    pub cols: [Value; 3],
}

/// A subformula, the values of its free variables, and an instant.
type Memo = (usize, Vec<(Var, Value)>, i64);

/// Figure 1, literally: the count of `f` for `theta` at instant `s` over the prefix `events`
/// (starting at the first event's instant), memoised per subformula, valuation and instant.
pub struct Reference<'a> {
    query: &'a TemporalQuery,
    /// The prefix's events by instant and kind.
    events: HashMap<(i64, usize), Vec<&'a Event>>,
    start: i64,
    domain: Vec<Value>,
    memo: HashMap<Memo, Count>,
    /// Subformulas by address, so the memo can name them.
    ids: HashMap<*const Formula, usize>,
}

impl<'a> Reference<'a> {
    pub fn new(query: &'a TemporalQuery, events: &'a [Event], upto: i64) -> Self {
        let prefix: Vec<&Event> = events.iter().filter(|e| e.t <= upto).collect();
        let mut domain: Vec<Value> = prefix.iter().flat_map(|e| e.cols).collect();
        domain.sort_unstable();
        domain.dedup();
        let mut by_instant: HashMap<(i64, usize), Vec<&Event>> = HashMap::new();
        for e in prefix {
            by_instant.entry((e.t, e.kind)).or_default().push(e);
        }
        Reference {
            query,
            events: by_instant,
            start: events.first().map_or(0, |e| e.t),
            domain,
            memo: HashMap::new(),
            ids: HashMap::new(),
        }
    }

    fn id(&mut self, f: &Formula) -> usize {
        let n = self.ids.len();
        *self.ids.entry(f as *const Formula).or_insert(n)
    }

    pub fn free(&self, f: &Formula) -> Vec<Var> {
        let mut vars = match f {
            Formula::Atom(a) => self.query.atoms[*a].vars.clone(),
            Formula::True => Vec::new(),
            Formula::And(l, r) | Formula::Or(l, r) | Formula::AndNot(l, r) => {
                let mut v = self.free(l);
                v.extend(self.free(r));
                v
            }
            Formula::Not(q) | Formula::Distinct(q) | Formula::Previous(q) => self.free(q),
            Formula::Exists(vs, q) => self.free(q).into_iter().filter(|v| !vs.contains(v)).collect(),
            Formula::Since { hold, from, .. } => {
                let mut v = self.free(hold);
                v.extend(self.free(from));
                v
            }
        };
        vars.sort_unstable();
        vars.dedup();
        vars
    }

    fn eval(&mut self, f: &Formula, theta: &BTreeMap<Var, Value>, s: i64) -> Count {
        if s < self.start {
            return 0;
        }
        let free = self.free(f);
        let bound: Vec<(Var, Value)> = free.iter().map(|v| (*v, theta[v])).collect();
        let key = (self.id(f), bound, s);
        if let Some(&c) = self.memo.get(&key) {
            return c;
        }
        let c = match f {
            Formula::Atom(a) => {
                let vars = &self.query.atoms[*a].vars;
                self.events
                    .get(&(s, *a))
                    .map_or(0, |at| at.iter().filter(|e| vars.iter().all(|v| e.cols[*v] == theta[v])).count() as Count)
            }
            Formula::True => 1,
            Formula::And(l, r) => self.eval(l, theta, s) * self.eval(r, theta, s),
            Formula::Or(l, r) => self.eval(l, theta, s) + self.eval(r, theta, s),
            Formula::AndNot(l, r) => self.eval(l, theta, s).saturating_sub(self.eval(r, theta, s)),
            Formula::Not(q) => Count::from(self.eval(q, theta, s) == 0),
            Formula::Distinct(q) => self.eval(q, theta, s).min(1),
            Formula::Previous(q) => {
                if s > self.start {
                    self.eval(q, theta, s - 1)
                } else {
                    0
                }
            }
            Formula::Exists(vs, q) => {
                let mut total = 0;
                for assignment in assignments(vs, &self.domain) {
                    let mut t = theta.clone();
                    t.extend(assignment);
                    total += self.eval(q, &t, s);
                }
                total
            }
            Formula::Since { count, hold, from } => {
                // The instants s2 < s where `from` held with `hold` holding on (s2, s].
                let mut valid = Vec::new();
                let mut holds_since = true;
                for s2 in (self.start..s).rev() {
                    holds_since = holds_since && self.eval(hold, theta, s2 + 1) > 0;
                    if !holds_since {
                        break;
                    }
                    if self.eval(from, theta, s2) > 0 {
                        valid.push(s2);
                    }
                }
                match count {
                    SinceCount::Occurrences => valid.iter().map(|&s2| self.eval(from, theta, s2)).sum(),
                    SinceCount::Duration => match valid.last() {
                        Some(&earliest) => (earliest + 1..=s).map(|s1| self.eval(hold, theta, s1)).sum(),
                        None => 0,
                    },
                }
            }
        };
        self.memo.insert(key, c);
        c
    }

    /// The query's answer at `t`: per valuation of the group variables, the body summed over
    /// the other variables, without zeros.
    pub fn answer(&mut self, t: i64) -> Vec<(Vec<Value>, Count)> {
        let body_vars = self.free(&self.query.body);
        let mut answer: BTreeMap<Vec<Value>, Count> = BTreeMap::new();
        for assignment in assignments(&body_vars, &self.domain.clone()) {
            let theta: BTreeMap<Var, Value> = assignment.into_iter().collect();
            let c = self.eval(&self.query.body, &theta, t);
            if c > 0 {
                *answer.entry(self.query.group.iter().map(|g| theta[g]).collect()).or_insert(0) += c;
            }
        }
        answer.into_iter().map(|(k, c)| (k, if self.query.distinct { c.min(1) } else { c })).collect()
    }
}

/// Every assignment of `vars` to values of `domain`.
pub fn assignments(vars: &[Var], domain: &[Value]) -> Vec<Vec<(Var, Value)>> {
    let mut out = vec![Vec::new()];
    for &v in vars {
        out = out
            .into_iter()
            .flat_map(|a| {
                domain.iter().map(move |&d| {
                    let mut a = a.clone();
                    a.push((v, d));
                    a
                })
            })
            .collect();
    }
    out
}
