//! Counter chains: the synopsis of a funnel, as a fixed array of counters per partition.
//!
//! A union of linear orders (Lemma 4.9) whose every level's atoms bind exactly the partition
//! variables (a funnel: a login, then a view, then a purchase, per user) needs no table per
//! valuation: per partition, the count of every prefix of every order completed so far is the
//! whole state. `F_1 = G_1`, `F_l = G_l AND ONCE_COUNT(F_{l-1})`, and the answer
//! `F_L OR ONCE_COUNT(F_L)` summed over the orders, become, at an instant with events,
//!
//! ```text
//!  for l = L .. 1:  done[l] += g_l(s) * done[l-1]      (done[0] = 1; g_l: the product of the
//!                                                        counts of level l's atoms at s)
//!  answer = Σ_orders done[L]
//! ```
//!
//! each `done[l-1]` read before instant `s` adds to it (`ONCE_COUNT` is strict), so levels run
//! from the latest down. A partition keeps the events of its latest instant apart and folds them
//! in when a later instant arrives (or an answer is read), so each event costs one counter
//! increment and events of one partition need only arrive in time order.
//!
//! [`Chains::recognize`] decides from the formula whether a query has this shape; the general
//! evaluator (`super::evaluator`) answers every other one.

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashMap;

use super::conjunctive::alias_name;
use super::evaluator::{decode_count, encode_count, form_error, Key, Value};
use super::form::{Count, FormError};
use super::formula::{Atom, Formula, Program, SinceCount, TemporalQuery, Var};
use crate::error::{Result, TesseraError};
use crate::state::codec::{StateReader, StateWriter};
use crate::state::memory::{allocation, hash_table};

/// The shape of a funnel program: per linear order, its levels earliest first, each level the
/// atoms that hold at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chains {
    pub orders: Vec<Vec<Vec<usize>>>,
}

impl Chains {
    /// The chains of `query`, when its body is `F OR ONCE_COUNT(F)` for a sum `F` of orders
    /// `G_L AND ONCE_COUNT(... G_2 AND ONCE_COUNT(G_1))`, every `G` a conjunction of atoms each
    /// binding exactly the `partition` variables, and the answer is not `DISTINCT`.
    pub fn recognize(query: &TemporalQuery, partition: &[Var]) -> Option<Chains> {
        if query.distinct {
            return None;
        }
        let Formula::Or(f, once) = &query.body else { return None };
        match &**once {
            Formula::Since { count: SinceCount::Occurrences, hold, from } if **hold == Formula::True && from == f => {}
            _ => return None,
        }
        let mut terms = Vec::new();
        flatten_or(f, &mut terms);
        let mut orders = Vec::with_capacity(terms.len());
        for term in terms {
            let mut levels = Vec::new();
            let mut rest = term;
            loop {
                let (level, earlier) = match rest {
                    Formula::And(g, once) => match &**once {
                        Formula::Since { count: SinceCount::Occurrences, hold, from } if **hold == Formula::True => {
                            (&**g, Some(&**from))
                        }
                        _ => (rest, None),
                    },
                    _ => (rest, None),
                };
                let mut atoms = Vec::new();
                if !conjunction_of_atoms(level, &mut atoms) {
                    return None;
                }
                let binds_partition = |&a: &usize| {
                    let vars = &query.atoms[a].vars;
                    vars.len() == partition.len() && partition.iter().all(|v| vars.contains(v))
                };
                if !atoms.iter().all(binds_partition) {
                    return None;
                }
                levels.push(atoms);
                match earlier {
                    Some(f) => rest = f,
                    None => break,
                }
            }
            levels.reverse();
            orders.push(levels);
        }
        Some(Chains { orders })
    }

    /// The counters a partition keeps: one per level of every order.
    fn counters(&self) -> usize {
        self.orders.iter().map(Vec::len).sum()
    }

    /// How EXPLAIN describes them, e.g. `a → b | a = b` with the atoms' aliases.
    pub fn describe(&self, atoms: &[Atom]) -> String {
        let label = |a: usize| alias_name(&atoms[a].label);
        self.orders
            .iter()
            .map(|levels| {
                levels
                    .iter()
                    .map(|level| level.iter().map(|&a| label(a)).collect::<Vec<_>>().join(" = "))
                    .collect::<Vec<_>>()
                    .join(" → ")
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

fn flatten_or<'f>(f: &'f Formula, out: &mut Vec<&'f Formula>) {
    match f {
        Formula::Or(l, r) => {
            flatten_or(l, out);
            flatten_or(r, out);
        }
        other => out.push(other),
    }
}

fn conjunction_of_atoms(f: &Formula, out: &mut Vec<usize>) -> bool {
    match f {
        Formula::Atom(a) => {
            out.push(*a);
            true
        }
        Formula::And(l, r) => conjunction_of_atoms(l, out) && conjunction_of_atoms(r, out),
        _ => false,
    }
}

/// Dense ids for the partitions of a program (the values of its partition variables).
pub enum PartitionIds {
    /// One partition variable: the value's own id.
    One,
    /// None (one partition) or several: ids in the order first seen.
    Interned { ids: HashMap<Key, u32>, keys: Vec<Key> },
}

impl PartitionIds {
    /// The ids of the partitions of `program`.
    pub fn new(program: &Program) -> Self {
        match program.partition.len() {
            1 => PartitionIds::One,
            _ => PartitionIds::Interned { ids: HashMap::new(), keys: Vec::new() },
        }
    }

    /// The id of the partition whose partition variables have `key` (in
    /// [`Program::partition`] order), given one if new.
    pub fn id(&mut self, key: &[Value]) -> Result<u32> {
        let too_many = || TesseraError::Execution("a synopsis holds at most 2^32 partitions".into());
        match self {
            PartitionIds::One => u32::try_from(key[0]).map_err(|_| too_many()),
            PartitionIds::Interned { ids, keys } => match ids.get(key) {
                Some(&id) => Ok(id),
                None => {
                    let id = u32::try_from(keys.len()).map_err(|_| too_many())?;
                    ids.insert(key.into(), id);
                    keys.push(key.into());
                    Ok(id)
                }
            },
        }
    }

    /// The partition variables' values of partition `id`.
    pub fn key(&self, id: u32) -> Key {
        match self {
            PartitionIds::One => Box::new([Value::from(id)]),
            PartitionIds::Interned { keys, .. } => keys[id as usize].clone(),
        }
    }

    /// The keys interned (none for one partition variable, whose ids are its values').
    pub fn interned(&self) -> &[Key] {
        match self {
            PartitionIds::One => &[],
            PartitionIds::Interned { keys, .. } => keys,
        }
    }

    /// Takes back keys [`interned`](Self::interned) listed, the next id first.
    pub fn restore(&mut self, key: Key) -> Result<()> {
        match self {
            PartitionIds::One => Err(TesseraError::Checkpoint("a saved partition key does not match the query".into())),
            PartitionIds::Interned { ids, keys } => {
                ids.insert(key.clone(), keys.len() as u32);
                keys.push(key);
                Ok(())
            }
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            PartitionIds::One => 0,
            PartitionIds::Interned { ids, keys } => {
                hash_table::<(Key, u32)>(ids.capacity())
                    + allocation(keys.capacity() * std::mem::size_of::<Key>())
                    + keys.iter().map(|k| 2 * allocation(8 * k.len())).sum::<usize>()
            }
        }
    }
}

/// The encoding of a saved group of counter chains.
const GROUP_FORMAT: u8 = 1;

/// The counter chains of one program over a group of partitions, each indexed by its id
/// within the group (the caller maps partitions to groups and ids).
pub struct ChainSynopsis {
    program: Arc<Program>,
    chains: Chains,
    /// Per partition, the counters' layout: the events of its latest instant per atom, then per
    /// level of every order the count of that prefix completed before the latest instant.
    stride: usize,
    counts: Vec<Count>,
    /// Per partition, its latest instant with events (`i64::MIN`: none yet).
    instants: Vec<i64>,
}

impl ChainSynopsis {
    /// The synopsis of `program`, which must have counter chains.
    pub fn new(program: Arc<Program>) -> Result<Self> {
        let chains = program
            .chains
            .clone()
            .ok_or_else(|| TesseraError::Internal("a counter-chain synopsis of a program without chains".into()))?;
        Ok(ChainSynopsis {
            stride: program.atoms.len() + chains.counters(),
            program,
            chains,
            counts: Vec::new(),
            instants: Vec::new(),
        })
    }

    /// Adds `n` events of `atom` at `instant` to partition `id`; a partition's events must
    /// come in time order.
    #[inline]
    pub fn add(&mut self, instant: i64, id: u32, atom: usize, n: Count) -> Result<()> {
        let p = id as usize;
        if p >= self.instants.len() {
            self.instants.resize(p + 1, i64::MIN);
            self.counts.resize((p + 1) * self.stride, 0);
        }
        if self.instants[p] != instant {
            if instant < self.instants[p] {
                return Err(TesseraError::Internal(format!(
                    "instant {instant} applied after {} in a counter chain",
                    self.instants[p]
                )));
            }
            fold(&self.chains, &mut self.counts[p * self.stride..(p + 1) * self.stride], self.program.atoms.len())?;
            self.instants[p] = instant;
        }
        let event = &mut self.counts[p * self.stride + atom];
        *event = event.checked_add(n).ok_or(FormError::Overflow).map_err(form_error)?;
        Ok(())
    }

    /// The partition's count of every order completed, its latest instant folded in.
    fn total(&self, p: usize) -> Result<Count> {
        let atoms = self.program.atoms.len();
        let mut counts = self.counts[p * self.stride..(p + 1) * self.stride].to_vec();
        fold(&self.chains, &mut counts, atoms)?;
        let mut total: Count = 0;
        let mut end = atoms;
        for levels in &self.chains.orders {
            end += levels.len();
            total = total.checked_add(counts[end - 1]).ok_or(FormError::Overflow).map_err(form_error)?;
        }
        Ok(total)
    }

    /// Adds the answer of every partition to `answer`, per valuation of the group variables
    /// (`key`: the partition variables' values of a partition id), without zeros.
    pub fn answer_into(&self, key: &dyn Fn(u32) -> Key, answer: &mut BTreeMap<Key, Count>) -> Result<()> {
        let program = &*self.program;
        let positions: Vec<usize> = program
            .group
            .iter()
            .map(|g| program.partition.iter().position(|v| v == g).expect("group variables partition a chain"))
            .collect();
        for (p, &instant) in self.instants.iter().enumerate() {
            if instant == i64::MIN {
                continue;
            }
            let c = self.total(p)?;
            if c == 0 {
                continue;
            }
            let key = key(p as u32);
            let group: Key = positions.iter().map(|&i| key[i]).collect();
            let total = answer.entry(group).or_insert(0);
            *total = total.checked_add(c).ok_or(FormError::Overflow).map_err(form_error)?;
        }
        Ok(())
    }

    /// Every partition's latest instant and counters.
    pub fn encode(&self, w: &mut StateWriter) {
        w.u8(GROUP_FORMAT);
        w.len(self.stride);
        w.len(self.instants.len());
        for (p, &instant) in self.instants.iter().enumerate() {
            w.i64(instant);
            for &c in &self.counts[p * self.stride..(p + 1) * self.stride] {
                encode_count(w, c);
            }
        }
    }

    /// Takes back what [`encode`](Self::encode) wrote.
    pub fn decode(program: Arc<Program>, r: &mut StateReader) -> Result<Self> {
        let mut synopsis = ChainSynopsis::new(program)?;
        r.format("a group of counter chains", GROUP_FORMAT)?;
        if r.len(8)? != synopsis.stride {
            return Err(TesseraError::Checkpoint("saved counter chains do not match the query".into()));
        }
        let partitions = r.len(8 + 16 * synopsis.stride)?;
        synopsis.instants.reserve_exact(partitions);
        synopsis.counts.reserve_exact(partitions * synopsis.stride);
        for _ in 0..partitions {
            synopsis.instants.push(r.i64()?);
            for _ in 0..synopsis.stride {
                synopsis.counts.push(decode_count(r)?);
            }
        }
        Ok(synopsis)
    }

    /// The bytes the state takes: every partition's counters and instant.
    pub fn state_bytes(&self) -> usize {
        allocation(self.counts.capacity() * std::mem::size_of::<Count>()) + allocation(self.instants.capacity() * 8)
    }
}

/// Folds a partition's events of its latest instant into its prefix counters.
fn fold(chains: &Chains, counts: &mut [Count], atoms: usize) -> Result<()> {
    let (events, done) = counts.split_at_mut(atoms);
    if events.iter().all(|&e| e == 0) {
        return Ok(());
    }
    let mut start = 0;
    for levels in &chains.orders {
        for l in (0..levels.len()).rev() {
            let mut g: Count = 1;
            for &a in &levels[l] {
                g = g.checked_mul(events[a]).ok_or(FormError::Overflow).map_err(form_error)?;
            }
            if g == 0 {
                continue;
            }
            let before = if l == 0 { 1 } else { done[start + l - 1] };
            let add = g.checked_mul(before).ok_or(FormError::Overflow).map_err(form_error)?;
            done[start + l] = done[start + l].checked_add(add).ok_or(FormError::Overflow).map_err(form_error)?;
        }
        start += levels.len();
    }
    events.fill(0);
    Ok(())
}
