//! The synopsis of a compiled [`Program`]: the paper's `(initial, delta, answer)`.
//!
//! State is split into partitions by the values of the program's partition variables (every
//! atom binds them, so an event belongs to exactly one). A partition keeps, per node that
//! carries counts between instants (`PREVIOUS`, `SINCE`), a table from valuations to their
//! count and the count of the operand the next instant needs, each as a [`Form`] anchored at
//! the last instant the partition had events; and the forms of the body, from which the answer
//! is read at any later instant. Nothing else of the stream is kept.
//!
//! `delta` (an instant with events for a partition) evaluates every node bottom-up over the
//! valuations it can list: atoms from the events, `AND` as a join, `AND NOT` and the left side
//! of `SINCE` by asking for the valuations the other side lists, and the counting nodes by the
//! identities of Lemma 4.3, reading the previous instant from the old forms. Instants without
//! events for a partition are never visited: its forms already say what they hold.

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashMap;

use super::form::{Binary, Count, Form, FormError, Unary};
use super::formula::{NodeKind, Program, SinceCount, Var};
use crate::error::{Result, TesseraError};
use crate::state::codec::{StateReader, StateWriter};
use crate::state::memory::{allocation, hash_table};

/// A data value, as the operator interns it.
pub type Value = u64;

/// A valuation of a node's variables, in the node's (ascending) variable order.
pub type Key = Box<[Value]>;

/// The events of one instant: per atom, the count of events per valuation of the atom's
/// variables (in [`super::formula::Atom::vars`] order).
pub type InstantEvents = Vec<HashMap<Key, Count>>;

pub(crate) fn form_error(e: FormError) -> TesseraError {
    match e {
        FormError::Overflow => {
            TesseraError::Execution("a count of the synopsis exceeds 128 bits (about 3.4e38 duplicates)".into())
        }
        FormError::Unknown => TesseraError::Internal("a synopsis stored a count that is not a line".into()),
    }
}

/// A valuation's count and the count of the operand the next instant reads.
#[derive(Debug, Clone)]
struct Entry {
    own: Form,
    operand: Form,
}

#[derive(Debug, Clone, Default)]
struct Partition {
    /// The last instant with events, where every form is anchored.
    anchor: i64,
    tables: Vec<HashMap<Key, Entry>>,
    body: HashMap<Key, Form>,
    /// Its heap bytes with its key's, as [`Partition::bytes`] counted them when it was held.
    held: usize,
}

/// What one evaluation produced per node.
enum Values {
    Listed(HashMap<Key, Form>),
    /// Computed per valuation when asked.
    Asked,
}

/// The values of `key` (over `from`) at the variables `to` (a subset).
pub(crate) fn project(key: &[Value], from: &[Var], to: &[Var]) -> Key {
    to.iter().map(|v| key[from.iter().position(|f| f == v).expect("a subset of the variables")]).collect()
}

/// The valuation over `vars` (ascending, the union of `a_vars` and `b_vars`) of two that agree.
fn merge(vars: &[Var], (a, a_vars): (&[Value], &[Var]), (b, b_vars): (&[Value], &[Var])) -> Key {
    vars.iter()
        .map(|v| match a_vars.iter().position(|x| x == v) {
            Some(i) => a[i],
            None => b[b_vars.iter().position(|x| x == v).expect("a variable of one side")],
        })
        .collect()
}

/// The count a `SINCE` has at an instant, from its count and its right side's at the instant
/// before and its left side's now (Lemma 4.3).
fn since_step(count: SinceCount, saturate: bool, own_before: Count, from_before: Count, hold: Count) -> Result<Count> {
    if hold == 0 {
        return Ok(0);
    }
    let v = match count {
        SinceCount::Duration if own_before > 0 => own_before.checked_add(hold).ok_or(FormError::Overflow),
        SinceCount::Duration if from_before > 0 => Ok(hold),
        SinceCount::Duration => Ok(0),
        SinceCount::Occurrences => own_before.checked_add(from_before).ok_or(FormError::Overflow),
    }
    .map_err(form_error)?;
    Ok(if saturate { v.min(1) } else { v })
}

/// The count of a `SINCE` from `s` on, given its count at `s` and its operands' forms at `s`.
fn since_form(count: SinceCount, saturate: bool, now: Count, hold: &Form, from: &Form) -> Result<Form> {
    let steps = hold.next.len().max(from.next.len()) + 1;
    let mut next = Vec::with_capacity(steps);
    let mut v = now;
    for j in 1..=steps as u128 {
        v = since_step(count, saturate, v, from.at(j - 1).map_err(form_error)?, hold.at(j).map_err(form_error)?)?;
        next.push(v);
    }
    // From here on each operand follows a line that keeps its sign (see `Form::aligned`).
    let j = steps as u128;
    let h = hold.at(j + 1).map_err(form_error)?;
    let (f, f_next) = (from.at(j).map_err(form_error)?, from.at(j + 1).map_err(form_error)?);
    let h_next = hold.at(j + 2).map_err(form_error)?;
    let tail = if h == 0 {
        (0, 0)
    } else if saturate {
        (since_step(count, true, v, f, h)?, 0)
    } else {
        match count {
            // Summing a growing left side would not be a line (the compiler refuses it).
            SinceCount::Duration if h_next != h => return Err(form_error(FormError::Unknown)),
            SinceCount::Duration if v > 0 || f > 0 => {
                (v.checked_add(h).ok_or(FormError::Overflow).map_err(form_error)?, h)
            }
            SinceCount::Duration => (0, 0),
            SinceCount::Occurrences if f_next != f => return Err(form_error(FormError::Unknown)),
            SinceCount::Occurrences => (v.checked_add(f).ok_or(FormError::Overflow).map_err(form_error)?, f),
        }
    };
    Ok(Form { now, next, tail: Some(tail) }.normalized())
}

/// One evaluation of a partition at an instant.
struct Step<'a> {
    program: &'a Program,
    instant: i64,
    old: Option<&'a Partition>,
    values: Vec<Values>,
    tables: Vec<HashMap<Key, Entry>>,
}

impl Step<'_> {
    /// The count of node `n` for `key` (over its variables).
    fn ask(&self, n: usize, key: &[Value]) -> Result<Form> {
        if let Values::Listed(map) = &self.values[n] {
            return Ok(map.get(key).cloned().unwrap_or_else(Form::zero));
        }
        let node = &self.program.nodes[n];
        match node.kind {
            NodeKind::Binary(op, l, r) => {
                let (lv, rv) = (&self.program.nodes[l].vars, &self.program.nodes[r].vars);
                let lf = self.ask(l, &project(key, &node.vars, lv))?;
                if lf.is_zero() && op != Binary::Sum {
                    return Ok(lf);
                }
                let rf = self.ask(r, &project(key, &node.vars, rv))?;
                Form::binary(op, &lf, &rf).map_err(form_error)
            }
            NodeKind::Unary(op, q) => Form::unary(op, &self.ask(q, key)?).map_err(form_error),
            NodeKind::True => Ok(Form::constant(1)),
            _ => Err(TesseraError::Internal("a listed node was not evaluated".into())),
        }
    }

    /// The count at the instant before this one of table `t`'s entry for `key`: its own count
    /// and its operand's.
    fn before(&self, t: usize, key: &[Value]) -> Result<(Count, Count)> {
        let Some(old) = self.old else { return Ok((0, 0)) };
        match old.tables[t].get(key) {
            None => Ok((0, 0)),
            Some(entry) => {
                let j = (self.instant - 1 - old.anchor) as u128;
                Ok((entry.own.at(j).map_err(form_error)?, entry.operand.at(j).map_err(form_error)?))
            }
        }
    }

    fn listed(&self, n: usize) -> &HashMap<Key, Form> {
        match &self.values[n] {
            Values::Listed(map) => map,
            Values::Asked => unreachable!("the compiler lists the operands of a listed node"),
        }
    }

    /// The keys of table `t` before this instant and of `operand`'s listing now.
    fn candidates(&self, t: usize, operand: usize) -> Vec<Key> {
        let mut keys: Vec<Key> = self.listed(operand).keys().cloned().collect();
        if let Some(old) = self.old {
            keys.extend(old.tables[t].keys().filter(|k| !self.listed(operand).contains_key(*k)).cloned());
        }
        keys
    }

    fn evaluate(&mut self, n: usize, events: &InstantEvents) -> Result<()> {
        let program = self.program;
        let node = &program.nodes[n];
        if !node.listable {
            self.values.push(Values::Asked);
            return Ok(());
        }
        let mut out: HashMap<Key, Form> = HashMap::new();
        let put = |out: &mut HashMap<Key, Form>, key: Key, form: Form| {
            if !form.is_zero() {
                out.insert(key, form);
            }
        };
        match node.kind {
            NodeKind::Atom(a) => {
                let atom_vars = &program.atoms[a].vars;
                for (key, &c) in &events[a] {
                    put(&mut out, project(key, atom_vars, &node.vars), Form::event(c));
                }
            }
            NodeKind::True => put(&mut out, Key::default(), Form::constant(1)),
            NodeKind::Binary(op, l, r) => {
                let (ln, rn) = (&program.nodes[l], &program.nodes[r]);
                let subset = |a: &[Var], b: &[Var]| a.iter().all(|v| b.contains(v));
                match op {
                    Binary::Sum => {
                        out = self.listed(l).clone();
                        for (key, f) in self.listed(r) {
                            let sum = match out.get(key) {
                                Some(g) => Form::binary(Binary::Sum, g, f).map_err(form_error)?,
                                None => f.clone(),
                            };
                            out.insert(key.clone(), sum);
                        }
                    }
                    _ if ln.listable && (op == Binary::Monus || subset(&rn.vars, &ln.vars)) => {
                        for (key, f) in self.listed(l) {
                            let g = self.ask(r, &project(key, &node.vars, &rn.vars))?;
                            put(&mut out, key.clone(), Form::binary(op, f, &g).map_err(form_error)?);
                        }
                    }
                    _ if rn.listable && subset(&ln.vars, &rn.vars) => {
                        for (key, g) in self.listed(r) {
                            let f = self.ask(l, &project(key, &node.vars, &ln.vars))?;
                            put(&mut out, key.clone(), Form::binary(op, &f, g).map_err(form_error)?);
                        }
                    }
                    _ => {
                        // A join of two listings on their shared variables.
                        let shared: Vec<Var> = ln.vars.iter().copied().filter(|v| rn.vars.contains(v)).collect();
                        let mut index: HashMap<Key, Vec<(&Key, &Form)>> = HashMap::new();
                        for (key, g) in self.listed(r) {
                            index.entry(project(key, &rn.vars, &shared)).or_default().push((key, g));
                        }
                        for (lk, f) in self.listed(l) {
                            for (rk, g) in index.get(&project(lk, &ln.vars, &shared)).into_iter().flatten() {
                                let key = merge(&node.vars, (lk, &ln.vars), (rk, &rn.vars));
                                put(&mut out, key, Form::binary(op, f, g).map_err(form_error)?);
                            }
                        }
                    }
                }
            }
            NodeKind::Unary(Unary::Not, q) => {
                put(&mut out, Key::default(), Form::unary(Unary::Not, &self.ask(q, &[])?).map_err(form_error)?)
            }
            NodeKind::Unary(op, q) => {
                for (key, f) in self.listed(q) {
                    put(&mut out, key.clone(), Form::unary(op, f).map_err(form_error)?);
                }
            }
            NodeKind::Exists(q) => {
                let qv = &program.nodes[q].vars;
                for (key, f) in self.listed(q) {
                    let key = project(key, qv, &node.vars);
                    let sum = match out.get(&key) {
                        Some(g) => Form::binary(Binary::Sum, g, f).map_err(form_error)?,
                        None => f.clone(),
                    };
                    out.insert(key, sum);
                }
                out.retain(|_, f| !f.is_zero());
            }
            NodeKind::Previous(q) => {
                let t = node.table.expect("a counting node has a table");
                for key in self.candidates(t, q) {
                    let (_, q_before) = self.before(t, &key)?;
                    let now = self.listed(q).get(&key).cloned().unwrap_or_else(Form::zero);
                    // The operand's count at this instant is this node's at the next.
                    let own = now.delayed(q_before);
                    if !own.is_zero() {
                        self.tables[t].insert(key.clone(), Entry { own: own.clone(), operand: now });
                        out.insert(key, own);
                    }
                }
            }
            NodeKind::Since { count, saturate, hold, from } => {
                let t = node.table.expect("a counting node has a table");
                let hold_vars = &program.nodes[hold].vars;
                for key in self.candidates(t, from) {
                    let (own_before, from_before) = self.before(t, &key)?;
                    let hold_form = self.ask(hold, &project(&key, &node.vars, hold_vars))?;
                    let from_form = self.listed(from).get(&key).cloned().unwrap_or_else(Form::zero);
                    let now = since_step(count, saturate, own_before, from_before, hold_form.now)?;
                    let own = since_form(count, saturate, now, &hold_form, &from_form)?;
                    if !own.is_zero() || !from_form.is_zero() {
                        self.tables[t].insert(key.clone(), Entry { own: own.clone(), operand: from_form });
                    }
                    put(&mut out, key, own);
                }
            }
        }
        self.values.push(Values::Listed(out));
        Ok(())
    }
}

/// A synopsis: the state of one continuous temporal query.
#[derive(Debug, Clone)]
pub struct Synopsis {
    program: Arc<Program>,
    partitions: HashMap<Key, Partition>,
    /// The last instant applied.
    last: Option<i64>,
    /// The bytes the partitions take (kept as they change).
    bytes: usize,
}

/// The encoding of a saved synopsis (its partitions).
const SYNOPSIS_FORMAT: u8 = 1;

pub(crate) fn encode_count(w: &mut StateWriter, c: Count) {
    w.u64((c >> 64) as u64);
    w.u64(c as u64);
}

pub(crate) fn decode_count(r: &mut StateReader) -> Result<Count> {
    Ok((Count::from(r.u64()?) << 64) | Count::from(r.u64()?))
}

fn encode_form(w: &mut StateWriter, f: &Form) {
    encode_count(w, f.now);
    w.len(f.next.len());
    f.next.iter().for_each(|&v| encode_count(w, v));
    match f.tail {
        Some((a, b)) => {
            w.bool(true);
            encode_count(w, a);
            encode_count(w, b);
        }
        None => w.bool(false),
    }
}

fn decode_form(r: &mut StateReader) -> Result<Form> {
    let now = decode_count(r)?;
    let next = (0..r.len(16)?).map(|_| decode_count(r)).collect::<Result<Vec<_>>>()?;
    let tail = if r.bool()? { Some((decode_count(r)?, decode_count(r)?)) } else { None };
    Ok(Form { now, next, tail })
}

pub fn encode_key(w: &mut StateWriter, key: &[Value]) {
    w.u64s(key.iter().copied());
}

pub fn decode_key(r: &mut StateReader) -> Result<Key> {
    Ok(r.u64s()?.into())
}

impl Partition {
    fn encode(&self, w: &mut StateWriter) {
        w.i64(self.anchor);
        w.len(self.tables.len());
        for table in &self.tables {
            w.len(table.len());
            for (key, entry) in table {
                encode_key(w, key);
                encode_form(w, &entry.own);
                encode_form(w, &entry.operand);
            }
        }
        w.len(self.body.len());
        for (key, form) in &self.body {
            encode_key(w, key);
            encode_form(w, form);
        }
    }

    fn decode(r: &mut StateReader, tables: usize) -> Result<Partition> {
        let anchor = r.i64()?;
        if r.len(8)? != tables {
            return Err(TesseraError::Checkpoint("a saved synopsis partition does not match the query".into()));
        }
        let mut partition = Partition { anchor, tables: Vec::with_capacity(tables), body: HashMap::new(), held: 0 };
        for _ in 0..tables {
            let mut table = HashMap::new();
            for _ in 0..r.len(8)? {
                let key = decode_key(r)?;
                table.insert(key, Entry { own: decode_form(r)?, operand: decode_form(r)? });
            }
            partition.tables.push(table);
        }
        for _ in 0..r.len(8)? {
            let key = decode_key(r)?;
            partition.body.insert(key, decode_form(r)?);
        }
        Ok(partition)
    }
}

/// The heap bytes of a valuation.
fn key_bytes(k: &Key) -> usize {
    allocation(k.len() * std::mem::size_of::<Value>())
}

/// The heap bytes of a form.
fn form_bytes(f: &Form) -> usize {
    allocation(f.next.capacity() * std::mem::size_of::<Count>())
}

impl Partition {
    /// The heap bytes it and its key take (its entry in the synopsis's table aside).
    fn bytes(&self, key: &Key) -> usize {
        let body = hash_table::<(Key, Form)>(self.body.capacity())
            + self.body.iter().map(|(k, f)| key_bytes(k) + form_bytes(f)).sum::<usize>();
        let tables = allocation(self.tables.capacity() * std::mem::size_of::<HashMap<Key, Entry>>())
            + self
                .tables
                .iter()
                .map(|t| {
                    hash_table::<(Key, Entry)>(t.capacity())
                        + t.iter()
                            .map(|(k, e)| key_bytes(k) + form_bytes(&e.own) + form_bytes(&e.operand))
                            .sum::<usize>()
                })
                .sum::<usize>();
        key_bytes(key) + body + tables
    }
}

impl Synopsis {
    pub fn new(program: Arc<Program>) -> Self {
        Synopsis { program, partitions: HashMap::new(), last: None, bytes: 0 }
    }

    /// Every partition and the last instant applied.
    pub fn encode(&self, w: &mut StateWriter) {
        w.u8(SYNOPSIS_FORMAT);
        w.bool(self.last.is_some());
        w.i64(self.last.unwrap_or(0));
        w.len(self.partitions.len());
        for (key, partition) in &self.partitions {
            encode_key(w, key);
            partition.encode(w);
        }
    }

    /// Takes back what [`encode`](Self::encode) wrote.
    pub fn decode(program: Arc<Program>, r: &mut StateReader) -> Result<Self> {
        r.format("a synopsis", SYNOPSIS_FORMAT)?;
        let mut synopsis = Synopsis::new(program);
        let (has_last, last) = (r.bool()?, r.i64()?);
        synopsis.last = has_last.then_some(last);
        for _ in 0..r.len(16)? {
            let key = decode_key(r)?;
            let mut partition = Partition::decode(r, synopsis.program.tables.len())?;
            partition.held = partition.bytes(&key);
            synopsis.bytes += partition.held;
            synopsis.partitions.insert(key, partition);
        }
        Ok(synopsis)
    }

    /// Evaluates partition `old` (none: a new one) at `instant` with `events`.
    fn step(&self, old: Option<&Partition>, instant: i64, events: &InstantEvents) -> Result<Partition> {
        let program = &*self.program;
        let mut step = Step {
            program,
            instant,
            old,
            values: Vec::with_capacity(program.nodes.len()),
            tables: vec![HashMap::new(); program.tables.len()],
        };
        for n in 0..program.nodes.len() {
            step.evaluate(n, events)?;
        }
        let body = match step.values.swap_remove(program.root) {
            Values::Listed(map) => map,
            Values::Asked => return Err(TesseraError::Internal("the body of a synopsis is not listed".into())),
        };
        Ok(Partition { anchor: instant, tables: step.tables, body, held: 0 })
    }

    /// `delta`: applies the events of `instant`, later than every instant applied before;
    /// `events` lists `(atom, valuation in the atom's variable order, count)`. Every instant
    /// with events of the stream is applied, even when no atom takes one of them.
    pub fn apply(&mut self, instant: i64, events: impl IntoIterator<Item = (usize, Key, Count)>) -> Result<()> {
        if self.last.is_some_and(|last| instant <= last) {
            return Err(TesseraError::Internal(format!("instant {instant} applied after {:?}", self.last)));
        }
        let program = Arc::clone(&self.program);
        let mut by_partition: HashMap<Key, InstantEvents> = HashMap::new();
        for (atom, key, count) in events {
            if count == 0 || !program.reads_atom[atom] {
                continue;
            }
            let atom_vars = &program.atoms[atom].vars;
            let partition = project(&key, atom_vars, &program.partition);
            let per_atom = by_partition.entry(partition).or_insert_with(|| vec![HashMap::new(); program.atoms.len()]);
            let c = per_atom[atom].entry(key).or_insert(0);
            *c = c.checked_add(count).ok_or(FormError::Overflow).map_err(form_error)?;
        }
        if program.partition.is_empty() {
            // One partition, which starts with the stream (a NOT holds before the first event
            // it denies).
            by_partition.entry(Key::default()).or_insert_with(|| vec![HashMap::new(); program.atoms.len()]);
        }
        for (partition, events) in by_partition {
            let old = self.partitions.get(&partition);
            let mut next = self.step(old, instant, &events)?;
            self.bytes -= old.map_or(0, |p| p.held);
            if next.body.is_empty() && next.tables.iter().all(|t| t.is_empty()) {
                self.partitions.remove(&partition);
            } else {
                next.held = next.bytes(&partition);
                self.bytes += next.held;
                self.partitions.insert(partition, next);
            }
        }
        self.last = Some(instant);
        Ok(())
    }

    /// `answer`: the query's answer at `instant` (not before the last instant applied), per
    /// valuation of the group variables, ascending, without zeros.
    pub fn answer(&self, instant: i64) -> Result<Vec<(Key, Count)>> {
        let mut answer = BTreeMap::new();
        self.answer_into(instant, &mut answer)?;
        Ok(answer.into_iter().map(|(k, c)| (k, if self.program.distinct { c.min(1) } else { c })).collect())
    }

    /// Adds every partition's count at `instant` to `answer`, per valuation of the group
    /// variables, before `DISTINCT` (the caller caps the sums of every part at 1).
    pub fn answer_into(&self, instant: i64, answer: &mut BTreeMap<Key, Count>) -> Result<()> {
        let program = &*self.program;
        let no_events: InstantEvents = vec![HashMap::new(); program.atoms.len()];
        let body_vars = &program.nodes[program.root].vars;
        for partition in self.partitions.values() {
            let j = (instant - partition.anchor) as u128;
            let mut add = |key: &Key, c: Count| -> Result<()> {
                if c > 0 {
                    let total = answer.entry(project(key, body_vars, &program.group)).or_insert(0);
                    *total = total.checked_add(c).ok_or(FormError::Overflow).map_err(form_error)?;
                }
                Ok(())
            };
            if partition.body.values().all(|f| f.at(j).is_ok()) {
                for (key, form) in &partition.body {
                    add(key, form.at(j).map_err(form_error)?)?;
                }
            } else {
                // A count that is no line between events: evaluate the instant itself.
                let at = self.step(Some(partition), instant, &no_events)?;
                for (key, form) in &at.body {
                    add(key, form.now)?;
                }
            }
        }
        Ok(())
    }

    /// The bytes the state takes: keys and forms of every partition.
    pub fn state_bytes(&self) -> usize {
        self.bytes + hash_table::<(Key, Partition)>(self.partitions.capacity())
    }
}
