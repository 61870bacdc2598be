//! `KeyGroupsExec`: the window operator, and the table manager that owns its state. Its keys
//! are split into key groups by interned id (ids `[g * 2^bits, (g + 1) * 2^bits)`), each
//! group evaluated by a [`WindowAggregateExec`] over its keys' rows, whose state is a set of
//! named tables ([`super::state_tables`]: slices, open and kept instances, sliding
//! aggregators' tables) plus scalar progress.
//!
//! Groups stay in memory while their state fits `--state-memory` (no limit with the memory
//! backend); beyond it the least recently used are evicted to the state store: the tables that
//! changed since they were last saved are written, the others are already there, and the
//! progress stays in memory. Rows for an evicted group wait in memory and are applied when the
//! group is loaded: when their number grows, when all waiting rows together outgrow half of
//! `--state-memory` (the group holding the most is loaded), when one of the group's windows is
//! due to close (its next close is remembered: a watermark that closes none of an evicted
//! group's windows is answered from memory), or at the end. `EMIT CHANGES` loads every group
//! a batch touches, so its rows are written after that batch.
//!
//! **Checkpoints are incremental**: a checkpoint writes the tables of the groups in memory
//! that changed since they were last saved, makes the store durable, and its snapshot holds
//! only each group's progress, rows waiting, and the versions of its tables in the store.
//! Tables are versioned by checkpoint epoch ([`Versions`]): a table saved again in a later
//! epoch gets a new version, and the one a committed checkpoint may still need is deleted only
//! after the next checkpoint commits; a resumed run deletes every version its checkpoint does
//! not name.
//!
//! **Output does not depend on memory**: every group closes a window at the same batch
//! whether it is in memory or not, and what the groups emit while one batch is taken is
//! written in group order, so the memory backend, any `--state-memory` and a resumed run write
//! the same bytes (with one worker; workers interleave).
//!
//! A group's operator indexes its states by key id less the group's first id, so its tables
//! are dense over the group's own ids.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::key_interner::SharedKeys;
use super::state_tables::TableName;
use super::versions::Versions;
use super::window_aggregate::WindowAggregateExec;
use super::{CheckpointBytes, EventBatch, OperatorMetrics, Output, SpillCounters, StreamOperator};
use crate::error::{Result, TesseraError};
use crate::plan::{EmitMode, WindowAggregatePlan};
use crate::state::codec::{StateReader, StateWriter};
use crate::state::store::StateStore;

/// Rows waiting for an evicted group before it is loaded to take them.
const PENDING_ROWS: usize = 1 << 16;

/// The encoding of a saved table; one of another format is refused with a message.
const TABLE_FORMAT: u8 = 1;

/// A table's saved version: the checkpoint epoch it was written in, and its encoded bytes.
#[derive(Debug, Clone, Copy)]
struct Saved {
    epoch: u64,
    bytes: u64,
}

struct Group {
    /// In memory, or `None` when evicted (or not made yet).
    operator: Option<WindowAggregateExec>,
    /// The operator's progress while it is evicted (`None` while in memory or never made).
    progress: Option<Vec<u8>>,
    /// The versions of the group's tables in the store.
    saved: BTreeMap<TableName, Saved>,
    /// Rows waiting for the group while evicted.
    pending: Vec<Arc<EventBatch>>,
    pending_rows: usize,
    pending_bytes: u64,
    /// While evicted: the earliest window end not closed yet (to know when the group must
    /// close one).
    next_close: i64,
    /// While evicted or finished: its counters as last seen in memory.
    metrics: Vec<OperatorMetrics>,
    /// Its size in memory as last observed (with a budget).
    state_bytes: u64,
    last_used: u64,
    /// What the group emitted while the current batch was taken.
    out: Output,
}

/// A table's name in the store: its key group and its name within the group.
fn table_name(group: usize, name: TableName) -> Vec<u8> {
    let mut key = (group as u32).to_be_bytes().to_vec();
    name.encode(&mut key);
    key
}

/// Writes the tables of `operator` (key group `group`) that changed since they were saved (or
/// never were), and retires the versions of tables it no longer holds; returns the bytes
/// written.
fn save_tables(
    versions: &mut Versions,
    group: usize,
    operator: &mut WindowAggregateExec,
    saved: &mut BTreeMap<TableName, Saved>,
) -> Result<u64> {
    let mut present = Vec::new();
    let mut written = 0;
    operator.visit_tables(&mut |name, mut table| {
        present.push(name);
        if !table.changed() && saved.contains_key(&name) {
            return Ok(());
        }
        let mut w = StateWriter::default();
        w.u8(TABLE_FORMAT);
        table.encode(&mut w);
        let bytes = w.into_bytes();
        let previous = saved.get(&name).map(|p| p.epoch);
        let epoch = versions.put(&table_name(group, name), &bytes, previous)?;
        saved.insert(name, Saved { epoch, bytes: bytes.len() as u64 });
        table.mark_saved();
        written += bytes.len() as u64;
        Ok(())
    })?;
    present.sort_unstable();
    let gone: Vec<(TableName, Saved)> =
        saved.iter().filter(|(name, _)| present.binary_search(name).is_err()).map(|(n, s)| (*n, *s)).collect();
    for (name, version) in gone {
        saved.remove(&name);
        versions.retire(&table_name(group, name), version.epoch)?;
    }
    Ok(written)
}

/// Puts the saved tables of key group `group` back into `operator`; returns the bytes read.
fn load_tables(
    versions: &Versions,
    group: usize,
    operator: &mut WindowAggregateExec,
    saved: &BTreeMap<TableName, Saved>,
) -> Result<u64> {
    let mut read = 0;
    for (&name, version) in saved {
        let bytes = versions
            .get(&table_name(group, name), version.epoch, &|| format!("table {name:?} of key group {group}"))?;
        let mut r = StateReader::new(&bytes);
        r.format("a table", TABLE_FORMAT)?;
        operator.insert_table(name, &mut r)?;
        r.finish()?;
        read += bytes.len() as u64;
    }
    Ok(read)
}

pub struct KeyGroupsExec {
    groups: Vec<Group>,
    /// A new operator for a group, given the group's first key id.
    make: Box<dyn Fn(u32) -> Result<WindowAggregateExec> + Send>,
    shape: Arc<WindowAggregatePlan>,
    keys: Arc<SharedKeys>,
    /// An operator as the plan builds it: its window nodes and output slots.
    probe: WindowAggregateExec,
    tables: Versions,
    group_bits: u32,
    memory_budget: u64,
    slots: usize,
    clock: u64,
    spill: SpillCounters,
}

impl KeyGroupsExec {
    /// The operator `make` evaluates per key group, its tables identified in `store` by `id`,
    /// in memory up to `memory_budget` bytes.
    pub fn new(
        make: Box<dyn Fn(u32) -> Result<WindowAggregateExec> + Send>,
        shape: Arc<WindowAggregatePlan>,
        keys: Arc<SharedKeys>,
        (store, id): (Arc<StateStore>, u64),
        group_bits: u32,
        memory_budget: u64,
    ) -> Result<Self> {
        let probe = make(0)?;
        let slots = probe.metrics().len();
        Ok(KeyGroupsExec {
            groups: Vec::new(),
            make,
            shape,
            keys,
            probe,
            tables: Versions::new(store, id),
            group_bits,
            memory_budget,
            slots,
            clock: 0,
            spill: SpillCounters::default(),
        })
    }

    fn group(&mut self, g: usize) -> &mut Group {
        while self.groups.len() <= g {
            self.groups.push(Group {
                operator: None,
                progress: None,
                saved: BTreeMap::new(),
                pending: Vec::new(),
                pending_rows: 0,
                pending_bytes: 0,
                next_close: i64::MAX,
                metrics: vec![OperatorMetrics::default(); self.slots],
                state_bytes: 0,
                last_used: 0,
                out: Output::default(),
            });
        }
        &mut self.groups[g]
    }

    /// Brings group `g` into memory (from the store, or new) and applies its waiting rows.
    fn load(&mut self, g: usize) -> Result<()> {
        self.clock += 1;
        let clock = self.clock;
        if self.group(g).operator.is_none() {
            if self.groups[g].progress.is_some() {
                // Room first, so memory stays within the budget while the group comes in.
                self.evict_until(self.room().saturating_sub(self.groups[g].state_bytes))?;
            }
            let mut operator = (self.make)((g as u32) << self.group_bits)?;
            if let Some(progress) = self.groups[g].progress.take() {
                let mut r = StateReader::new(&progress);
                operator.decode_progress(&mut r)?;
                r.finish()?;
                let read = load_tables(&self.tables, g, &mut operator, &self.groups[g].saved)?;
                self.spill.group_reads += 1;
                self.spill.bytes_read += read;
            }
            self.groups[g].operator = Some(operator);
        }
        let group = &mut self.groups[g];
        group.last_used = clock;
        let operator = group.operator.as_mut().expect("loaded above");
        for batch in std::mem::take(&mut group.pending) {
            let ids = self.keys.ids_for(&batch, &self.shape.keys)?;
            operator.process(&batch, &ids, &mut group.out)?;
        }
        group.pending_rows = 0;
        group.pending_bytes = 0;
        Ok(())
    }

    /// Notes a resident group's size, for the budget (with no budget, nothing is evicted:
    /// summing the sizes of every table after every batch would be wasted).
    fn observe(&mut self, g: usize) {
        if self.memory_budget == u64::MAX {
            return;
        }
        let group = &mut self.groups[g];
        if let Some(operator) = &group.operator {
            group.state_bytes = operator.metrics().first().map_or(0, |m| m.state_bytes);
        }
    }

    /// Writes group `g`'s changed tables to the store and keeps only its progress in memory.
    fn evict(&mut self, g: usize) -> Result<()> {
        let mut operator = self.groups[g].operator.take().expect("resident");
        self.groups[g].metrics = operator.metrics();
        self.groups[g].next_close = operator.next_close();
        let written = save_tables(&mut self.tables, g, &mut operator, &mut self.groups[g].saved)?;
        let mut w = StateWriter::default();
        operator.encode_progress(&mut w);
        self.groups[g].progress = Some(w.into_bytes());
        self.spill.group_writes += 1;
        self.spill.bytes_written += written;
        Ok(())
    }

    /// The bytes of the rows waiting for evicted groups.
    fn waiting_bytes(&self) -> u64 {
        self.groups.iter().map(|g| g.pending_bytes).sum()
    }

    /// The memory the groups in memory may take: the budget less the interned keys and the
    /// rows waiting for evicted groups.
    fn room(&self) -> u64 {
        self.memory_budget.saturating_sub(self.keys.bytes() as u64 + self.waiting_bytes())
    }

    /// Keeps the rows waiting for evicted groups within a quarter of the budget (loading the
    /// group that holds the most), then evicts the least recently used groups until the
    /// resident ones, the waiting rows and the interned keys fit the budget together.
    fn fit_budget(&mut self) -> Result<()> {
        while self.waiting_bytes() > self.memory_budget / 4 {
            let g = (0..self.groups.len()).max_by_key(|&g| self.groups[g].pending_bytes).expect("rows wait");
            self.spill.pending_flushes += 1;
            self.load(g)?;
            self.observe(g);
        }
        self.evict_until(self.room())
    }

    /// Evicts the least recently used resident groups until the resident state is within
    /// `bytes`.
    fn evict_until(&mut self, bytes: u64) -> Result<()> {
        loop {
            let resident: u64 = self.groups.iter().filter(|g| g.operator.is_some()).map(|g| g.state_bytes).sum();
            if resident <= bytes {
                return Ok(());
            }
            let Some(g) = (0..self.groups.len())
                .filter(|&g| self.groups[g].operator.is_some())
                .min_by_key(|&g| self.groups[g].last_used)
            else {
                return Ok(());
            };
            self.evict(g)?;
        }
    }

    /// Rows for group `g`, with their keys interned: taken now if the group is in memory (or
    /// was never evicted), waiting otherwise.
    fn take_rows(&mut self, g: usize, part: Arc<EventBatch>, ids: &[u32]) -> Result<()> {
        let changes = self.shape.emit == EmitMode::Changes;
        let evicted = self.group(g).operator.is_none() && self.groups[g].progress.is_some();
        if evicted && !changes {
            // The rows wait until a window holding one of them is due to close, unless one
            // is late for a window: then they are taken now, so the late row is written with
            // this batch, as from a group in memory.
            let (earliest, late) = self.first_closes(&part);
            let group = &mut self.groups[g];
            if !late {
                group.next_close = group.next_close.min(earliest);
                group.pending_rows += part.len();
                group.pending_bytes += part.memory_bytes();
                group.pending.push(part);
                if group.pending_rows < PENDING_ROWS {
                    return Ok(());
                }
                return self.load(g).map(|()| self.observe(g));
            }
        }
        self.load(g)?;
        let group = &mut self.groups[g];
        group.operator.as_mut().expect("loaded").process(&part, ids, &mut group.out)?;
        self.observe(g);
        Ok(())
    }

    /// The earliest end of a window holding one of `part`'s rows, and whether a row arrives
    /// late for one (its watermark has passed that window's end).
    fn first_closes(&self, part: &EventBatch) -> (i64, bool) {
        let specs: Vec<_> = self.probe.window_nodes().into_iter().map(|(spec, _)| spec).collect();
        let watermarks = part.watermarks.per_row(part.len());
        let mut earliest = i64::MAX;
        for (&t, &watermark) in part.event_times.iter().zip(&watermarks) {
            let close = specs.iter().map(|s| s.end(s.first_window_ending_after(t))).min().unwrap_or(i64::MAX);
            if close <= watermark {
                return (close, true);
            }
            earliest = earliest.min(close);
        }
        (earliest, false)
    }

    /// A group's saved state as the snapshot holds it: whether it is in memory, its progress,
    /// its tables' versions, when it was last used, its next close and its waiting rows.
    fn encode_group(&self, g: usize, w: &mut StateWriter) -> Result<()> {
        let group = &self.groups[g];
        w.bool(group.operator.is_some());
        match (&group.operator, &group.progress) {
            (Some(operator), _) => {
                let mut own = StateWriter::default();
                operator.encode_progress(&mut own);
                w.bool(true);
                w.bytes(&own.into_bytes());
            }
            (None, Some(progress)) => {
                w.bool(true);
                w.bytes(progress);
            }
            (None, None) => w.bool(false),
        }
        w.len(group.saved.len());
        for (name, version) in &group.saved {
            let mut key = Vec::new();
            name.encode(&mut key);
            w.bytes(&key);
            w.u64(version.epoch);
            w.u64(version.bytes);
        }
        w.u64(group.last_used);
        w.i64(group.next_close);
        w.len(group.pending.len());
        for batch in &group.pending {
            batch.encode(w)?;
        }
        Ok(())
    }

    /// Takes back what [`encode_group`](Self::encode_group) wrote for group `g`; loads it if
    /// it was in memory.
    fn decode_group(&mut self, g: usize, r: &mut StateReader) -> Result<()> {
        let resident = r.bool()?;
        let progress = if r.bool()? { Some(r.bytes()?.to_vec()) } else { None };
        let tables = r.len(TableName::BYTES + 24)?;
        let mut saved = BTreeMap::new();
        for _ in 0..tables {
            let name = TableName::decode(r.bytes()?)?;
            saved.insert(name, Saved { epoch: r.u64()?, bytes: r.u64()? });
        }
        let last_used = r.u64()?;
        let next_close = r.i64()?;
        let waiting = r.len(17)?;
        let pending = (0..waiting).map(|_| EventBatch::decode(r).map(Arc::new)).collect::<Result<Vec<_>>>()?;
        let group = self.group(g);
        group.progress = progress;
        group.saved = saved;
        group.next_close = next_close;
        group.pending_rows = pending.iter().map(|b| b.len()).sum();
        group.pending_bytes = pending.iter().map(|b| b.memory_bytes()).sum();
        group.pending = pending;
        if resident {
            // Reading a resident group's tables back is recovery, not spilling: the clock and
            // the counters stay as saved. (A group in memory has no waiting rows to apply.)
            let (clock, spill) = (self.clock, self.spill);
            self.load(g)?;
            self.observe(g);
            (self.clock, self.spill) = (clock, spill);
        }
        self.groups[g].last_used = last_used;
        Ok(())
    }
}

impl StreamOperator for KeyGroupsExec {
    fn name(&self) -> &'static str {
        "KeyGroupsExec"
    }

    /// Takes the batch's rows group by group; what they emit is written at the batch's
    /// watermark, in group order (see [`advance_watermark`](Self::advance_watermark)).
    fn process(&mut self, input: &Arc<EventBatch>, _out: &mut Output) -> Result<()> {
        let shape = Arc::clone(&self.shape);
        // WHERE first: the keys of rows it drops are not interned.
        let (batch, ids) = match &shape.filter {
            None => (Arc::clone(input), self.keys.ids_for(input, &shape.keys)?),
            Some(predicate) => {
                let mask = predicate.evaluate(&input.rows)?.into_array(input.len())?;
                let mask = arrow::array::AsArray::as_boolean_opt(&mask)
                    .ok_or_else(|| TesseraError::Plan(format!("WHERE `{predicate}` is not a boolean expression")))?
                    .clone();
                let mut filtered = input.filter(&mask)?;
                let ids = Arc::new(self.keys.intern(&filtered.rows, &shape.keys)?);
                filtered.key_ids = vec![(self.keys.id(), Arc::clone(&ids))];
                (Arc::new(filtered), ids)
            }
        };
        if !batch.is_empty() {
            // Every id is below the number of keys interned.
            let last_group = self.keys.len().saturating_sub(1) >> self.group_bits;
            if last_group == 0 {
                // One group takes the whole batch.
                self.take_rows(0, batch, &ids)?;
            } else {
                let mut rows_of: Vec<Vec<u32>> = vec![Vec::new(); last_group + 1];
                for (row, &id) in ids.iter().enumerate() {
                    rows_of[(id >> self.group_bits) as usize].push(row as u32);
                }
                for (g, rows) in rows_of.into_iter().enumerate().filter(|(_, rows)| !rows.is_empty()) {
                    let mut part = batch.take(&rows)?;
                    let part_ids: Arc<Vec<u32>> = Arc::new(rows.iter().map(|&r| ids[r as usize]).collect());
                    part.key_ids = vec![(self.keys.id(), Arc::clone(&part_ids))];
                    self.take_rows(g, Arc::new(part), &part_ids)?;
                }
            }
        }
        self.fit_budget()
    }

    /// Closes what the watermark closes group by group, and hands `emit` what each group
    /// emitted while the batch was taken, in group order: a group's rows are written once
    /// every group before it is done with the batch (loading a group for its waiting rows
    /// emits nothing: they wait only while none of their windows is due).
    fn advance_watermark(&mut self, watermark: i64, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        for g in 0..self.groups.len() {
            let group = &self.groups[g];
            let holds_data = group.operator.is_some() || group.progress.is_some() || !group.pending.is_empty();
            if holds_data && group.operator.is_none() && group.next_close > watermark {
                self.spill.lookups_in_memory += 1;
            } else if holds_data {
                self.load(g)?;
                let group = &mut self.groups[g];
                group.operator.as_mut().expect("loaded").advance_watermark(watermark, &mut group.out)?;
                self.observe(g);
                self.fit_budget()?;
            }
            let out = std::mem::take(&mut self.groups[g].out);
            if !out.rows.is_empty() || !out.late.is_empty() {
                emit(out)?;
            }
        }
        Ok(())
    }

    /// Loads, finishes and drops each group in turn: its state is not needed afterwards.
    fn finish(&mut self, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        for g in 0..self.groups.len() {
            self.load(g)?;
            emit(std::mem::take(&mut self.groups[g].out))?;
            let mut operator = self.groups[g].operator.take().expect("loaded");
            operator.finish(emit)?;
            self.groups[g].metrics = operator.metrics();
            self.groups[g].state_bytes = 0;
        }
        Ok(())
    }

    /// Deletes the versions the previous checkpoint made unneeded, saves the changed tables
    /// of the groups in memory (the worker then makes the store durable), and writes every
    /// group's progress,
    /// waiting rows and table versions. A resumed run keeps the same groups in memory and
    /// evicts in the same order, so it applies rows at the same points as an uninterrupted run.
    fn checkpoint(&mut self, w: &mut StateWriter) -> Result<CheckpointBytes> {
        self.tables.begin_checkpoint()?;
        let epoch = self.tables.epoch();
        let mut written = 0;
        for g in 0..self.groups.len() {
            let group = &mut self.groups[g];
            if let Some(operator) = group.operator.as_mut() {
                written += save_tables(&mut self.tables, g, operator, &mut group.saved)?;
            }
        }
        w.u64(epoch);
        w.u64(self.clock);
        w.len(self.groups.len());
        for g in 0..self.groups.len() {
            self.encode_group(g, w)?;
        }
        Ok(CheckpointBytes {
            tables_written: written,
            tables_changed: self.tables.end_checkpoint(),
            tables_stored: self.groups.iter().flat_map(|g| g.saved.values()).map(|s| s.bytes).sum(),
        })
    }

    /// Takes back a checkpoint's groups and deletes the versions in the store it does not
    /// name (written after it, or retired before it).
    fn restore(&mut self, r: &mut StateReader) -> Result<()> {
        let epoch = r.u64()?;
        self.clock = r.u64()?;
        let n = r.len(27)?;
        for g in 0..n {
            self.decode_group(g, r)?;
        }
        let groups = &self.groups;
        self.tables.restore(epoch, &mut |name, version| {
            let corrupt = || TesseraError::Checkpoint("the state store holds a key tessera did not write".into());
            let group: [u8; 4] = name.get(..4).and_then(|g| g.try_into().ok()).ok_or_else(corrupt)?;
            if name.len() != 4 + TableName::BYTES {
                return Err(corrupt());
            }
            let table = TableName::decode(&name[4..])?;
            let saved = groups.get(u32::from_be_bytes(group) as usize).and_then(|g| g.saved.get(&table));
            Ok(saved.is_some_and(|s| s.epoch == version))
        })
    }

    fn metrics(&self) -> Vec<OperatorMetrics> {
        let mut total = vec![OperatorMetrics::default(); self.slots];
        // State in memory: the resident groups' tables and the rows waiting for evicted
        // groups (whose tables are in the store).
        let mut state = 0;
        for group in &self.groups {
            let metrics = match &group.operator {
                Some(operator) => operator.metrics(),
                None => group.metrics.clone(),
            };
            if group.operator.is_some() {
                state += metrics.first().map_or(0, |m| m.state_bytes);
            }
            state += group.pending_bytes;
            for (sum, m) in total.iter_mut().zip(&metrics) {
                sum.add(m);
            }
        }
        if let Some(first) = total.first_mut() {
            first.state_bytes = state;
            first.spill = self.spill;
        }
        total
    }

    fn window_nodes(&self) -> Vec<(crate::window::WindowSpec, crate::physical::WindowInput)> {
        self.probe.window_nodes()
    }
}
