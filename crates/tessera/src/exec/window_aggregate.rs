//! `WindowAggregateExec`: GROUP BY keys and tumbling or hopping windows, evaluated the way the
//! optimizer chose (see [`crate::optimizer::window_strategy`]).
//!
//! One operator evaluates a list of window *nodes* that read rows the same way (same WHERE,
//! keys and aggregates). A node's instances get their partial states from one of three places:
//! the stream (every instance containing a row is updated: the baseline and the roots of a
//! coverage graph), the operator's slices (every row updates exactly one slice of a slicing
//! whose edges are the nodes' boundaries; an instance merges its slices) or the closed
//! instances of a covering node (an instance merges the `M` instances that cover it). An
//! instance is closed once, when the watermark passes its end: its rows go to the node's output
//! slots (query branches; a factor window has none) and, if other nodes read it, its states are
//! kept until no open instance of theirs needs them. Parents close before their children in the
//! same pass, so sharing never delays a result.
//!
//! Lateness stays exact per window: a row is late for the windows that were closed when it
//! arrived and still counts for the open ones. Where an open window reads closed instances of
//! another node, the late row also updates those kept instances, so the open window sees it.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::DataType;

use super::group_table::{GroupTable, TablePool, Tables};
use super::key_interner::SharedKeys;
use super::running_window::Sliding;
use super::state_tables::{TableName, TableRef, TableRole};
use super::time_runs::{ascending_below, rows_within};
use super::two_stacks::{InstanceSlices, TwoStacks};
use super::window_emitter::Emitter;
use super::{EventBatch, OperatorMetrics, Output};
use crate::error::{Result, TesseraError};
use crate::physical::{SlidingAggregator, WindowInput, WindowsPlan};
use crate::plan::{EmitMode, WindowAggregatePlan};
use crate::state::codec::{StateReader, StateWriter};
use crate::window::slicing::Slicing;
use crate::window::{floor_div, WindowSpec};

/// A window node and where its emission stands.
struct Node {
    spec: WindowSpec,
    input: WindowInput,
    slots: Vec<usize>,
    /// Nodes that read this one's closed instances.
    children: Vec<usize>,
    /// The first instance not yet closed: instances before it are emitted or were empty.
    next_window: i64,
    /// The watermark up to which instances are closed.
    closed_through: i64,
    /// Open instances with data (stream input).
    open: Tables,
    /// Closed instances with data that children may still read, from `keep_from` on.
    closed: Tables,
    keep_from: i64,
    /// The sliding aggregator over the slices (input `Slices { sliding: true }`).
    sliding: Sliding,
    /// `EMIT CHANGES`: per open instance, the (slot, key) pairs whose row stands written.
    emitted: BTreeMap<i64, hashbrown::HashSet<(usize, u32)>>,
}

impl Node {
    /// The end of the first instance not closed yet.
    fn next_close(&self) -> i64 {
        self.spec.end(self.next_window)
    }

    fn bytes(&self) -> usize {
        self.open.values().chain(self.closed.values()).map(GroupTable::bytes).sum::<usize>() + self.sliding.bytes()
    }
}

/// Nodes that take an input batch's rows together. A node reading the stream that no other
/// node reads (and no `EMIT CHANGES` tracks by the common slices) takes them alone, cut only
/// where its own instances close and in runs of its own slices; the others take them together,
/// cut wherever any of them closes an instance (with a 1-second window among them, every
/// second) and in runs of the slices all their edges cut.
struct Takers {
    nodes: Vec<usize>,
    /// A node taking rows alone: its own slices.
    own_slices: Option<Slicing>,
}

impl Takers {
    fn of(nodes: &[Node], changes: bool) -> Vec<Takers> {
        let alone = |n: &Node| !changes && n.input == WindowInput::Stream && n.children.is_empty();
        let mut takers: Vec<Takers> = (0..nodes.len())
            .filter(|&i| alone(&nodes[i]))
            .map(|i| Takers { nodes: vec![i], own_slices: Some(Slicing::paired(&nodes[i].spec)) })
            .collect();
        let together: Vec<usize> = (0..nodes.len()).filter(|&i| !alone(&nodes[i])).collect();
        if !together.is_empty() {
            takers.push(Takers { nodes: together, own_slices: None });
        }
        takers
    }
}

pub struct WindowAggregateExec {
    /// Parents before children.
    nodes: Vec<Node>,
    emitter: Emitter,
    /// The plan whose WHERE, keys and aggregates every slot shares.
    shape: Arc<WindowAggregatePlan>,
    /// Cuts time where any node's instances start or end: a run of rows inside one slice
    /// belongs to the same instances of every node.
    slicing: Slicing,
    /// How the nodes take an input batch's rows: each group in turn, cut where its instances
    /// close.
    takers: Vec<Takers>,
    /// Slices with data (for nodes reading slices), by index in `slicing`.
    slices: Tables,
    /// `EMIT CHANGES`: the keys of the rows each slice took since rows were last written.
    changed: Option<BTreeMap<i64, Vec<u32>>>,
    /// State reads and writes of rows updating partial aggregates (one of each per row and
    /// instance or slice updated), and reads of partial aggregates combined to emit rows.
    store_reads: u64,
    store_writes: u64,
    emit_reads: u64,
    scratch: Vec<u32>,
    /// Tables of dropped slices and emitted instances, for the next ones.
    pool: TablePool,
}

impl WindowAggregateExec {
    /// The operator `plan` describes: its nodes (parents before children) feeding its slots,
    /// which must agree on WHERE, keys and aggregates.
    pub fn new(plan: &WindowsPlan, event_time_type: DataType, keys: Arc<SharedKeys>, key_base: u32) -> Result<Self> {
        let (nodes, slots) = (&plan.nodes, plan.slots.clone());
        let shape = slots
            .first()
            .cloned()
            .ok_or_else(|| TesseraError::Internal("a window aggregate without outputs".into()))?;
        let changes = shape.emit == EmitMode::Changes;
        let slicing = plan.slicing();
        let mut built: Vec<Node> = nodes
            .iter()
            .map(|n| Node {
                spec: n.spec,
                input: n.input,
                slots: n.slots.clone(),
                children: Vec::new(),
                next_window: n.spec.first_window_ending_after(i64::MIN),
                closed_through: i64::MIN,
                open: Tables::default(),
                closed: Tables::default(),
                keep_from: i64::MIN,
                // Only a node sliding over the slices uses it.
                sliding: Sliding::new(
                    match n.input {
                        WindowInput::Sliding(aggregator) => aggregator,
                        _ => SlidingAggregator::TwoStacks,
                    },
                    &shape,
                ),
                emitted: BTreeMap::new(),
            })
            .collect();
        for (i, n) in nodes.iter().enumerate() {
            if let WindowInput::Window(p) = n.input {
                if p >= i || !n.spec.is_covered_by(&nodes[p].spec) {
                    return Err(TesseraError::Internal(format!("window node {i} cannot read node {p}")));
                }
                built[p].children.push(i);
            }
        }
        let takers = Takers::of(&built, changes);
        Ok(WindowAggregateExec {
            nodes: built,
            emitter: Emitter::new(slots, changes, keys, key_base, event_time_type),
            shape,
            slicing,
            takers,
            slices: Tables::default(),
            pool: TablePool::default(),
            changed: changes.then(BTreeMap::new),
            store_reads: 0,
            store_writes: 0,
            emit_reads: 0,
            scratch: Vec::new(),
        })
    }

    /// The earliest end of an instance not closed yet: a row whose watermark reaches it closes
    /// instances.
    pub(super) fn next_close(&self) -> i64 {
        self.nodes.iter().map(Node::next_close).min().unwrap_or(i64::MAX)
    }

    /// Aggregates rows that passed the WHERE clause; `key_ids` are their interned keys.
    fn process_filtered(&mut self, input: &EventBatch, key_ids: &[u32], out: &mut Output) -> Result<()> {
        let values = self.shape.aggregates.iter().map(|a| a.evaluate_args(&input.rows)).collect::<Result<Vec<_>>>()?;
        let mut late_rows: Vec<Vec<u32>> = vec![Vec::new(); self.emitter.slots.len()];
        let takers = std::mem::take(&mut self.takers);
        let taken = takers.iter().try_for_each(|t| self.take_rows(input, t, key_ids, &values, &mut late_rows, out));
        self.takers = takers;
        taken?;
        for (slot, rows) in late_rows.into_iter().enumerate() {
            if !rows.is_empty() {
                out.late.push((slot, crate::connectors::declared_rows(input.take(&rows)?.rows)?));
            }
        }
        Ok(())
    }

    fn every_node(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// Adds the batch's rows to the nodes of `takers`, closing their instances as the rows'
    /// watermark reaches their ends.
    fn take_rows(
        &mut self,
        input: &EventBatch,
        takers: &Takers,
        key_ids: &[u32],
        values: &[Vec<ArrayRef>],
        late_rows: &mut [Vec<u32>],
        out: &mut Output,
    ) -> Result<()> {
        let n = input.len();
        let mut start = 0;
        while start < n {
            // Take rows up to the first one that meets a watermark closing an instance; close
            // instances before taking it.
            // Watermarks never decrease along a batch: a binary search, not a scan per row.
            let threshold = takers.nodes.iter().map(|&i| self.nodes[i].next_close()).min().unwrap_or(i64::MAX);
            let end = input.watermarks.first_reaching(threshold, start, n);
            if end == start {
                self.close_windows(input.watermarks.at(start), &takers.nodes, out)?;
                continue;
            }
            self.update(input, start..end, takers, key_ids, values, late_rows)?;
            start = end;
        }
        Ok(())
    }

    /// Adds `rows` to the instances and slices of the nodes of `takers`, run by run:
    /// consecutive rows in one slice belong to the same instances of every node, so they share
    /// the lookups and the lateness decision, and update the states as one contiguous range. A
    /// node taking rows alone cuts them by its own slices, which are longer.
    fn update(
        &mut self,
        input: &EventBatch,
        rows: std::ops::Range<usize>,
        takers: &Takers,
        key_ids: &[u32],
        values: &[Vec<ArrayRef>],
        late_rows: &mut [Vec<u32>],
    ) -> Result<()> {
        let cut = takers.own_slices.as_ref().unwrap_or(&self.slicing);
        let WindowAggregateExec { nodes, shape, slices, scratch, changed, pool, emit_reads, .. } = self;
        let times = &input.event_times;
        let mut updates = 0u64;
        let mut add = |table: &mut GroupTable, run: std::ops::Range<usize>, scratch: &mut Vec<u32>| {
            table.add_rows(&key_ids[run.clone()], run.start, values, scratch);
            updates += run.len() as u64;
        };
        let mut row = rows.start;
        while row < rows.end {
            let slice = cut.slice_of(times[row]);
            let (lo, hi) = (cut.start(slice), cut.end(slice));
            let later = &times[row + 1..rows.end];
            let run_end =
                row + 1 + if input.times_ascend { ascending_below(later, hi) } else { rows_within(later, lo, hi) };
            let run = row..run_end;
            let mut to_slice = false;
            for &i in &takers.nodes {
                let node = &mut nodes[i];
                let (first, last) = node.spec.windows_containing(lo);
                if first > last {
                    continue;
                }
                if first < node.next_window {
                    for &slot in &node.slots {
                        late_rows[slot].extend(run.start as u32..run.end as u32);
                    }
                    // Closed instances that an open child still reads take the late row too.
                    if !node.children.is_empty() {
                        for m in first.max(node.keep_from)..=last.min(node.next_window - 1) {
                            add(node.closed.get_or_insert_with(m, || GroupTable::new(shape)), run.clone(), scratch);
                        }
                    }
                }
                if last >= node.next_window {
                    match node.input {
                        WindowInput::Stream => {
                            for m in first.max(node.next_window)..=last {
                                add(node.open.get_or_insert_with(m, || pool.take(shape)), run.clone(), scratch);
                            }
                        }
                        WindowInput::Slices | WindowInput::Sliding(_) => to_slice = true,
                        WindowInput::Window(_) => {}
                    }
                }
            }
            if let Some(changed) = changed.as_mut() {
                changed.entry(slice).or_default().extend_from_slice(&key_ids[run.clone()]);
            }
            if to_slice {
                let table = slices.get_or_insert_with(slice, || pool.take(shape));
                let keys = &key_ids[run.clone()];
                for node in nodes.iter_mut() {
                    node.sliding.before_rows((slice, table, keys), scratch, emit_reads);
                }
                add(table, run.clone(), scratch);
                for node in nodes.iter_mut() {
                    node.sliding.after_rows((slice, table, keys), scratch, emit_reads);
                }
            }
            row = run_end;
        }
        // Each row of a run updated costs one state read and one write.
        self.store_reads += updates;
        self.store_writes += updates;
        Ok(())
    }

    /// Closes, node by node (parents first), every instance whose end is at or before
    /// `watermark`, then drops the slices and kept instances nothing open needs.
    fn close_windows(&mut self, watermark: i64, which: &[usize], out: &mut Output) -> Result<()> {
        for &i in which {
            if watermark <= self.nodes[i].closed_through {
                continue;
            }
            let spec = self.nodes[i].spec;
            let mut m = self.nodes[i].next_window;
            while let Some(candidate) = self.next_instance_with_data(i, m) {
                if spec.end(candidate) > watermark {
                    break;
                }
                self.write_changes(Some((i, candidate)), out)?;
                self.close_instance(i, candidate)?;
                m = candidate + 1;
            }
            let node = &mut self.nodes[i];
            node.closed_through = watermark;
            node.next_window = node.next_window.max(spec.first_window_ending_after(watermark));
        }
        // Only slices and instances kept for children are dropped.
        if which.iter().any(|&i| !self.nodes[i].children.is_empty() || self.nodes[i].input != WindowInput::Stream) {
            self.drop_unneeded_state();
        }
        Ok(())
    }

    /// The first instance at or after `m` of node `i` that may have data (`None`: no data
    /// from `m` on yet).
    fn next_instance_with_data(&self, i: usize, m: i64) -> Option<i64> {
        let node = &self.nodes[i];
        let spec = node.spec;
        // The end of the first unit of input data at or after the start of `m`; the first
        // instance containing that unit is the candidate.
        let data_end = match node.input {
            WindowInput::Stream => return node.open.range(m..).next().map(|(k, _)| k),
            WindowInput::Slices | WindowInput::Sliding(_) => {
                let (k, _) = self.slices.range(self.slicing.slice_of(spec.start(m))..).next()?;
                self.slicing.end(k)
            }
            WindowInput::Window(p) => {
                let parent = self.nodes[p].spec;
                let (j, _) = self.nodes[p].closed.range(floor_div(spec.start(m), parent.slide)..).next()?;
                parent.end(j)
            }
        };
        Some(m.max(spec.first_window_ending_after(data_end - 1)))
    }

    /// Merges instance `m` of node `i` from its input, emits it to the node's slots (written at
    /// the next flush) and keeps it for the node's children.
    fn close_instance(&mut self, i: usize, m: i64) -> Result<()> {
        let WindowAggregateExec { nodes, emitter, shape, slicing, slices, scratch, emit_reads, changed, pool, .. } =
            self;
        let (parents, rest) = nodes.split_at_mut(i);
        let node = &mut rest[0];
        if changed.is_some() {
            // Its rows were written as they changed.
            node.open.remove(m);
            node.emitted.remove(&m);
            return Ok(());
        }
        let spec = node.spec;
        let mut reads = 0u64;
        let table = match node.input {
            WindowInput::Stream => match node.open.remove(m) {
                Some(table) => table,
                None => return Ok(()),
            },
            WindowInput::Sliding(_) => {
                let range = slicing.slices_between(spec.start(m), spec.end(m));
                let new_table = || GroupTable::new(shape);
                let instance =
                    InstanceSlices { first: *range.start(), last: *range.end(), slices, new_table: &new_table };
                let window = node.sliding.window(&instance, scratch, emit_reads)?;
                let Some(window) = window else { return Ok(()) };
                emitter.emit(&node.slots, spec, m, &window)?;
                if !node.children.is_empty() {
                    node.closed.insert(m, window.into_owned());
                }
                return Ok(());
            }
            WindowInput::Slices => {
                let mut parts = slices.range(slicing.slices_between(spec.start(m), spec.end(m)));
                match (parts.next(), parts.next()) {
                    (None, _) => return Ok(()),
                    // One slice and nobody reading the instance: emit straight from the slice.
                    (Some((_, only)), None) if node.children.is_empty() => {
                        *emit_reads += only.keys.len() as u64;
                        return emitter.emit(&node.slots, spec, m, only);
                    }
                    (first, second) => {
                        let mut merged = pool.take(shape);
                        for (_, part) in first.into_iter().chain(second).chain(parts) {
                            merged.merge_from(part, scratch)?;
                            reads += part.keys.len() as u64;
                        }
                        merged
                    }
                }
            }
            WindowInput::Window(p) => {
                let parent = &parents[p];
                let (from, to) =
                    (spec.start(m) / parent.spec.slide, (spec.end(m) - parent.spec.range) / parent.spec.slide);
                let mut any = false;
                let mut merged = pool.take(shape);
                for (_, part) in parent.closed.range(from..=to) {
                    merged.merge_from(part, scratch)?;
                    reads += part.keys.len() as u64;
                    any = true;
                }
                if !any {
                    pool.give(merged);
                    return Ok(());
                }
                merged
            }
        };
        *emit_reads += reads;
        emitter.emit(&node.slots, spec, m, &table)?;
        if node.children.is_empty() {
            pool.give(table);
        } else {
            node.closed.insert(m, table);
        }
        Ok(())
    }

    /// `EMIT CHANGES`: writes the current rows of the changed keys of every open instance
    /// (`only`: of one node's instance, about to close) and, for all, forgets the changes.
    fn write_changes(&mut self, only: Option<(usize, i64)>, out: &mut Output) -> Result<()> {
        let WindowAggregateExec { nodes, emitter, shape, slicing, slices, scratch, emit_reads, changed, .. } = self;
        let Some(changed) = changed.as_mut().filter(|c| !c.is_empty()) else { return Ok(()) };
        for (i, node) in nodes.iter_mut().enumerate() {
            if node.slots.is_empty() || only.is_some_and(|(n, _)| n != i) {
                continue;
            }
            // The open instances containing a changed slice, with the changed keys.
            let mut instances: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
            for (&k, keys) in changed.iter() {
                let (mut first, mut last) = node.spec.windows_containing(slicing.start(k));
                first = first.max(node.next_window);
                if let Some((_, m)) = only {
                    (first, last) = (first.max(m), last.min(m));
                }
                for m in first..=last {
                    instances.entry(m).or_default().extend_from_slice(keys);
                }
            }
            for keys in instances.values_mut() {
                keys.sort_unstable();
                keys.dedup();
            }
            let new_table = || GroupTable::new(shape);
            let mut tables: Vec<(i64, GroupTable)> = Vec::with_capacity(instances.len());
            match node.input {
                WindowInput::Stream => {
                    for (&m, keys) in &instances {
                        let mut table = new_table();
                        if let Some(open) = node.open.get(m) {
                            *emit_reads += table.merge_keys_from(open, keys, scratch)? as u64;
                        }
                        tables.push((m, table));
                    }
                }
                WindowInput::Slices | WindowInput::Sliding(_) => {
                    let (Some((&first, _)), Some((&last, _))) =
                        (instances.first_key_value(), instances.last_key_value())
                    else {
                        continue;
                    };
                    // Each slice the instances span is read once, for the changed keys; a
                    // sliding sweep over those partials gives every instance's value.
                    let mut changed_keys: Vec<u32> = instances.values().flatten().copied().collect();
                    changed_keys.sort_unstable();
                    changed_keys.dedup();
                    let span = slicing.slice_of(node.spec.start(first))..=slicing.slice_of(node.spec.end(last) - 1);
                    let mut partials = Tables::default();
                    for (k, slice) in slices.range(span) {
                        let mut partial = new_table();
                        *emit_reads += partial.merge_keys_from(slice, &changed_keys, scratch)? as u64;
                        partials.insert(k, partial);
                    }
                    let mut sweep = TwoStacks::default();
                    let mut partial_reads = 0;
                    for (&m, keys) in &instances {
                        let range = slicing.slices_between(node.spec.start(m), node.spec.end(m));
                        let mut table = new_table();
                        let instance = InstanceSlices {
                            first: *range.start(),
                            last: *range.end(),
                            slices: &partials,
                            new_table: &new_table,
                        };
                        let window = sweep.window(&instance, scratch, &mut partial_reads)?;
                        if let Some(window) = window {
                            table.merge_keys_from(&window, keys, scratch)?;
                        }
                        tables.push((m, table));
                    }
                }
                WindowInput::Window(_) => {
                    return Err(TesseraError::Internal("EMIT CHANGES over a covering window's instances".into()))
                }
            }
            for (m, table) in tables {
                let written = node.emitted.entry(m).or_default();
                emitter.emit_changes(&node.slots, node.spec, m, &table, written, out)?;
            }
        }
        if only.is_none() {
            changed.clear();
        }
        Ok(())
    }

    /// Drops slices before the first one an open instance reads (or a running window has yet
    /// to subtract), and kept instances no open child instance reads.
    fn drop_unneeded_state(&mut self) {
        let slicing = &self.slicing;
        let keep_slices_from = self
            .nodes
            .iter()
            .filter(|n| n.input.reads_slices())
            .map(|n| {
                let open = slicing.slice_of(n.spec.start(n.next_window));
                n.sliding.oldest_needed().map_or(open, |counted| counted.min(open))
            })
            .min()
            .unwrap_or(i64::MAX);
        while let Some(table) = self.slices.pop_below(keep_slices_from) {
            self.pool.give(table);
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].children.is_empty() {
                continue;
            }
            let slide = self.nodes[i].spec.slide;
            let keep_from = self.nodes[i]
                .children
                .iter()
                .map(|&c| floor_div(self.nodes[c].spec.start(self.nodes[c].next_window), slide))
                .min()
                .unwrap_or(i64::MAX);
            let node = &mut self.nodes[i];
            node.keep_from = keep_from;
            while let Some(table) = node.closed.pop_below(keep_from) {
                self.pool.give(table);
            }
        }
    }
}

/// The operator's interface to the key-group table manager ([`super::key_groups`]), which
/// owns the operator: rows arrive filtered with their interned keys, and the state is saved as
/// scalar progress plus tables the manager stores one by one.
impl WindowAggregateExec {
    /// Aggregates rows that passed the WHERE clause, whose interned keys are `key_ids`.
    pub(super) fn process(&mut self, input: &EventBatch, key_ids: &[u32], out: &mut Output) -> Result<()> {
        let key_ids = self.emitter.local_ids(key_ids);
        self.process_filtered(input, &key_ids, out)?;
        self.emitter.flush(out)?;
        self.write_changes(None, out)
    }

    pub(super) fn advance_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        if watermark >= self.next_close() {
            self.close_windows(watermark, &self.every_node(), out)?;
        }
        self.emitter.flush(out)
    }

    /// Closes the instances with data in the order of their ends, emitting after each step.
    pub(super) fn finish(&mut self, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        loop {
            let next = (0..self.nodes.len())
                .filter_map(|i| {
                    let node = &self.nodes[i];
                    self.next_instance_with_data(i, node.next_window).map(|m| node.spec.end(m))
                })
                .min();
            let mut out = Output::default();
            let Some(end) = next else {
                self.close_windows(i64::MAX, &self.every_node(), &mut out)?;
                self.emitter.flush(&mut out)?;
                return emit(out);
            };
            self.close_windows(end, &self.every_node(), &mut out)?;
            self.emitter.flush(&mut out)?;
            emit(out)?;
        }
    }

    /// Writes what is not a table: counters, where each node's emission stands, the sliding
    /// aggregators' positions and the rows `EMIT CHANGES` stands by.
    pub(super) fn encode_progress(&self, w: &mut StateWriter) {
        w.u64(self.store_reads);
        w.u64(self.store_writes);
        w.u64(self.emit_reads);
        w.len(self.emitter.slots.len());
        self.emitter.slots.iter().for_each(|slot| slot.metrics.encode(w));
        w.len(self.nodes.len());
        for node in &self.nodes {
            for v in [node.next_window, node.closed_through, node.keep_from] {
                w.i64(v);
            }
            node.sliding.encode_progress(w);
            w.len(node.emitted.len());
            for (&m, written) in &node.emitted {
                w.i64(m);
                w.len(written.len());
                for &(slot, key) in written {
                    w.u32(slot as u32);
                    w.u32(key);
                }
            }
        }
    }

    /// Takes back what [`encode_progress`](Self::encode_progress) wrote, before the tables.
    pub(super) fn decode_progress(&mut self, r: &mut StateReader) -> Result<()> {
        let mismatch = || TesseraError::Checkpoint("the state snapshot does not match the plan's windows".into());
        self.store_reads = r.u64()?;
        self.store_writes = r.u64()?;
        self.emit_reads = r.u64()?;
        if r.len(1)? != self.emitter.slots.len() {
            return Err(mismatch());
        }
        for slot in &mut self.emitter.slots {
            slot.metrics = OperatorMetrics::decode(r)?;
        }
        if r.len(1)? != self.nodes.len() {
            return Err(mismatch());
        }
        for node in &mut self.nodes {
            node.next_window = r.i64()?;
            node.closed_through = r.i64()?;
            node.keep_from = r.i64()?;
            node.sliding = Sliding::decode_progress(&self.shape, r)?;
            let instances = r.len(16)?;
            node.emitted = (0..instances)
                .map(|_| {
                    let m = r.i64()?;
                    let n = r.len(8)?;
                    let written = (0..n).map(|_| Ok((r.u32()? as usize, r.u32()?))).collect::<Result<_>>()?;
                    Ok((m, written))
                })
                .collect::<Result<_>>()?;
        }
        Ok(())
    }

    /// Hands `visit` every table of the state with its name: slices, open and kept closed
    /// instances, the sliding aggregators' tables.
    pub(super) fn visit_tables(&mut self, visit: &mut dyn FnMut(TableName, TableRef<'_>) -> Result<()>) -> Result<()> {
        for (index, table) in self.slices.iter_mut() {
            visit(TableName { role: TableRole::Slice, node: 0, index }, TableRef::Table(table))?;
        }
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let node_index = i as u16;
            for (index, table) in node.open.iter_mut() {
                visit(TableName { role: TableRole::Open, node: node_index, index }, TableRef::Table(table))?;
            }
            for (index, table) in node.closed.iter_mut() {
                visit(TableName { role: TableRole::Closed, node: node_index, index }, TableRef::Table(table))?;
            }
            node.sliding.visit_tables(node_index, visit)?;
        }
        Ok(())
    }

    /// Puts back a table [`visit_tables`](Self::visit_tables) named, from its encoding.
    pub(super) fn insert_table(&mut self, name: TableName, r: &mut StateReader) -> Result<()> {
        let shape = Arc::clone(&self.shape);
        if name.role == TableRole::Slice {
            self.slices.insert(name.index, GroupTable::decode(&shape, r)?);
            return Ok(());
        }
        let node = self.nodes.get_mut(usize::from(name.node)).ok_or_else(|| {
            TesseraError::Checkpoint("the state store holds a table of a window node the plan lacks".into())
        })?;
        match name.role {
            TableRole::Open => node.open.insert(name.index, GroupTable::decode(&shape, r)?),
            TableRole::Closed => node.closed.insert(name.index, GroupTable::decode(&shape, r)?),
            _ => node.sliding.insert_table(name, &shape, r)?,
        }
        Ok(())
    }

    pub(super) fn window_nodes(&self) -> Vec<(WindowSpec, WindowInput)> {
        let nodes = self.nodes.iter().map(|node| {
            let input = match node.input {
                WindowInput::Sliding(_) => WindowInput::Sliding(node.sliding.aggregator()),
                other => other,
            };
            (node.spec, input)
        });
        nodes.collect()
    }

    /// Counters per output slot; `state_bytes` (on slot 0) is the size of the tables (with the
    /// spare ones kept for reuse).
    pub(super) fn metrics(&self) -> Vec<OperatorMetrics> {
        let state = self.slices.values().map(GroupTable::bytes).sum::<usize>()
            + self.nodes.iter().map(Node::bytes).sum::<usize>()
            + self.pool.bytes();
        let mut metrics: Vec<OperatorMetrics> = self.emitter.slots.iter().map(|s| s.metrics).collect();
        metrics[0].state_bytes = state as u64;
        metrics[0].store_reads += self.store_reads + self.emit_reads;
        metrics[0].store_writes += self.store_writes;
        metrics[0].emit_reads += self.emit_reads;
        metrics
    }
}
