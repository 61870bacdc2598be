//! `KeyGroupsExec`: a window operator whose state may exceed memory. Its keys are split into
//! key groups by interned id (ids `[g * 2^bits, (g + 1) * 2^bits)`), each group a complete
//! [`WindowAggregateExec`] over its keys' rows. Groups stay in memory while their state fits
//! `--state-memory`; beyond it the least recently used are encoded (the checkpoint codec) into
//! the spill store on disk. Rows for a spilled group wait in memory and are applied when the
//! group is loaded: when their number grows, when all waiting rows together outgrow half of
//! `--state-memory` (the group holding the most is loaded), when one of the group's windows is
//! due to close (its next close is remembered: a watermark that closes none of a spilled
//! group's windows is answered from memory), or at the end, so rows with random keys do not
//! load every group on every batch. `EMIT CHANGES` loads every group a batch touches, so its rows are
//! written after that batch.
//!
//! A group's operator indexes its states by key id less the group's first id, so its tables
//! are dense over the group's own ids. Results are those of one operator over all keys: a group closes its windows at the
//! watermarks its rows carry, and at the batch's watermark like any operator.

use std::sync::Arc;

use super::key_interner::SharedKeys;
use super::window_aggregate::WindowAggregateExec;
use super::{EventBatch, OperatorMetrics, Output, SpillCounters, StreamOperator};
use crate::error::{Result, TesseraError};
use crate::plan::{EmitMode, WindowAggregatePlan};
use crate::state::codec::{StateReader, StateWriter};
use crate::state::spill::SpillStore;

/// Rows waiting for a spilled group before it is loaded to take them.
const PENDING_ROWS: usize = 1 << 16;

struct Group {
    /// In memory, or `None` when spilled (or not created yet).
    operator: Option<WindowAggregateExec>,
    /// Whether the spill store holds the group's state.
    spilled: bool,
    /// Rows waiting for the group while spilled.
    pending: Vec<Arc<EventBatch>>,
    pending_rows: usize,
    pending_bytes: u64,
    /// The earliest window end not closed yet (to know when a spilled group must close one).
    next_close: i64,
    /// Counters as last seen in memory.
    metrics: Vec<OperatorMetrics>,
    state_bytes: u64,
    last_used: u64,
}

pub struct KeyGroupsExec {
    groups: Vec<Group>,
    /// A new operator for a group, given the group's first key id.
    make: Box<dyn Fn(u32) -> Result<WindowAggregateExec> + Send>,
    shape: Arc<WindowAggregatePlan>,
    keys: Arc<SharedKeys>,
    store: Arc<SpillStore>,
    /// Distinguishes this operator's groups in the store.
    id: u64,
    group_bits: u32,
    memory_budget: u64,
    slots: usize,
    clock: u64,
    spill: SpillCounters,
}

impl KeyGroupsExec {
    pub fn new(
        make: Box<dyn Fn(u32) -> Result<WindowAggregateExec> + Send>,
        shape: Arc<WindowAggregatePlan>,
        keys: Arc<SharedKeys>,
        store: Arc<SpillStore>,
        id: u64,
        group_bits: u32,
        memory_budget: u64,
    ) -> Result<Self> {
        let slots = make(0)?.metrics().len();
        Ok(KeyGroupsExec {
            groups: Vec::new(),
            make,
            shape,
            keys,
            store,
            id,
            group_bits,
            memory_budget,
            slots,
            clock: 0,
            spill: SpillCounters::default(),
        })
    }

    fn store_key(&self, group: usize) -> [u8; 16] {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&self.id.to_be_bytes());
        key[8..].copy_from_slice(&(group as u64).to_be_bytes());
        key
    }

    fn group(&mut self, g: usize) -> &mut Group {
        while self.groups.len() <= g {
            self.groups.push(Group {
                operator: None,
                spilled: false,
                pending: Vec::new(),
                pending_rows: 0,
                pending_bytes: 0,
                next_close: i64::MAX,
                metrics: vec![OperatorMetrics::default(); self.slots],
                state_bytes: 0,
                last_used: 0,
            });
        }
        &mut self.groups[g]
    }

    /// Brings group `g` into memory and applies its waiting rows.
    fn load(&mut self, g: usize, out: &mut Output) -> Result<()> {
        self.clock += 1;
        let clock = self.clock;
        if self.group(g).operator.is_none() {
            let operator = if self.groups[g].spilled {
                let key = self.store_key(g);
                let bytes = self
                    .store
                    .get(&key)?
                    .ok_or_else(|| TesseraError::Internal(format!("key group {g} is missing from the spill store")))?;
                let operator = self.decode_group(g, &bytes)?;
                self.store.remove(&key)?;
                self.spill.group_reads += 1;
                self.spill.bytes_read += bytes.len() as u64;
                self.groups[g].spilled = false;
                operator
            } else {
                (self.make)((g as u32) << self.group_bits)?
            };
            self.groups[g].operator = Some(operator);
        }
        let group = &mut self.groups[g];
        group.last_used = clock;
        let operator = group.operator.as_mut().expect("loaded above");
        for batch in std::mem::take(&mut group.pending) {
            operator.process(&batch, out)?;
        }
        group.pending_rows = 0;
        group.pending_bytes = 0;
        Ok(())
    }

    /// Group `g`'s operator from its encoded state.
    fn decode_group(&self, g: usize, bytes: &[u8]) -> Result<WindowAggregateExec> {
        let mut operator = (self.make)((g as u32) << self.group_bits)?;
        let mut r = StateReader::new(bytes);
        operator.restore(&mut r)?;
        r.finish()?;
        Ok(operator)
    }

    /// Notes a resident group's counters, size and next close.
    fn observe(&mut self, g: usize) {
        let group = &mut self.groups[g];
        if let Some(operator) = &group.operator {
            group.metrics = operator.metrics();
            group.state_bytes = group.metrics.first().map_or(0, |m| m.state_bytes);
            group.next_close = operator.next_close();
        }
    }

    /// Keeps the rows waiting for spilled groups within half the budget (loading the group
    /// that holds the most), then spills the least recently used groups until the resident
    /// ones fit the budget.
    fn fit_budget(&mut self, out: &mut Output) -> Result<()> {
        loop {
            let waiting: u64 = self.groups.iter().map(|g| g.pending_bytes).sum();
            if waiting <= self.memory_budget / 2 {
                break;
            }
            let g = (0..self.groups.len()).max_by_key(|&g| self.groups[g].pending_bytes).expect("rows wait");
            self.spill.pending_flushes += 1;
            self.load(g, out)?;
            self.observe(g);
        }
        loop {
            let resident: u64 = self.groups.iter().filter(|g| g.operator.is_some()).map(|g| g.state_bytes).sum();
            if resident <= self.memory_budget {
                return Ok(());
            }
            let Some(g) = (0..self.groups.len())
                .filter(|&g| self.groups[g].operator.is_some())
                .min_by_key(|&g| self.groups[g].last_used)
            else {
                return Ok(());
            };
            let operator = self.groups[g].operator.take().expect("resident");
            let mut w = StateWriter::default();
            operator.snapshot(&mut w)?;
            let bytes = w.into_bytes();
            self.store.put(&self.store_key(g), &bytes)?;
            self.spill.group_writes += 1;
            self.spill.bytes_written += bytes.len() as u64;
            self.groups[g].spilled = true;
        }
    }
}

impl StreamOperator for KeyGroupsExec {
    fn name(&self) -> &'static str {
        "KeyGroupsExec"
    }

    fn process(&mut self, input: &Arc<EventBatch>, out: &mut Output) -> Result<()> {
        let shape = Arc::clone(&self.shape);
        let ids = self.keys.ids_for(input, &shape.keys)?;
        let mut rows_of: Vec<Vec<u32>> = Vec::new();
        for (row, &id) in ids.iter().enumerate() {
            let g = (id >> self.group_bits) as usize;
            if rows_of.len() <= g {
                rows_of.resize(g + 1, Vec::new());
            }
            rows_of[g].push(row as u32);
        }
        let changes = shape.emit == EmitMode::Changes;
        for (g, rows) in rows_of.into_iter().enumerate().filter(|(_, rows)| !rows.is_empty()) {
            let mut part = input.take(&rows)?;
            part.key_ids = vec![(self.keys.id(), Arc::new(rows.iter().map(|&r| ids[r as usize]).collect()))];
            // No window holding a waiting row closes before the watermark passes the row.
            let earliest = part.event_times.iter().copied().min().unwrap_or(i64::MAX);
            let group = self.group(g);
            group.next_close = group.next_close.min(earliest);
            group.pending_rows += part.len();
            group.pending_bytes += part.memory_bytes();
            group.pending.push(Arc::new(part));
            if group.operator.is_some() || changes || group.pending_rows >= PENDING_ROWS {
                self.load(g, out)?;
                self.observe(g);
            }
        }
        self.fit_budget(out)
    }

    fn advance_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        for g in 0..self.groups.len() {
            let group = &self.groups[g];
            let holds_data = group.operator.is_some() || group.spilled || !group.pending.is_empty();
            if !holds_data {
                continue;
            }
            if group.operator.is_none() && group.next_close > watermark {
                self.spill.lookups_in_memory += u64::from(group.spilled);
                continue;
            }
            self.load(g, out)?;
            self.groups[g].operator.as_mut().expect("loaded").advance_watermark(watermark, out)?;
            self.observe(g);
            self.fit_budget(out)?;
        }
        Ok(())
    }

    /// Loads, finishes and drops each group in turn: its state is not needed afterwards.
    fn finish(&mut self, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        for g in 0..self.groups.len() {
            let mut out = Output::default();
            self.load(g, &mut out)?;
            emit(out)?;
            self.groups[g].operator.as_mut().expect("loaded").finish(emit)?;
            self.observe(g);
            self.groups[g].operator = None;
            self.groups[g].state_bytes = 0;
        }
        Ok(())
    }

    /// Every group: its state (from memory or the spill store), whether it is in memory, when
    /// it was last used, its waiting rows and its next close. A resumed run keeps the same groups
    /// in memory and evicts in the same order, so it applies rows at the same points and merges
    /// partial aggregates in the same order as an uninterrupted run.
    fn snapshot(&self, w: &mut StateWriter) -> Result<()> {
        w.u64(self.clock);
        w.len(self.groups.len());
        for (g, group) in self.groups.iter().enumerate() {
            let state = match (&group.operator, group.spilled) {
                (Some(operator), _) => {
                    let mut own = StateWriter::default();
                    operator.snapshot(&mut own)?;
                    own.into_bytes()
                }
                (None, true) => self
                    .store
                    .get(&self.store_key(g))?
                    .ok_or_else(|| TesseraError::Internal(format!("key group {g} is missing from the spill store")))?,
                (None, false) => Vec::new(),
            };
            w.bytes(&state);
            w.bool(group.operator.is_some());
            w.u64(group.last_used);
            w.i64(group.next_close);
            w.len(group.pending.len());
            for batch in &group.pending {
                batch.encode(w)?;
            }
        }
        Ok(())
    }

    fn restore(&mut self, r: &mut StateReader) -> Result<()> {
        self.clock = r.u64()?;
        let n = r.len(27)?;
        for g in 0..n {
            let state = r.bytes()?.to_vec();
            let resident = r.bool()?;
            let last_used = r.u64()?;
            let next_close = r.i64()?;
            let waiting = r.len(17)?;
            let pending = (0..waiting).map(|_| EventBatch::decode(r).map(Arc::new)).collect::<Result<Vec<_>>>()?;
            let operator = if resident {
                Some(self.decode_group(g, &state)?)
            } else {
                if !state.is_empty() {
                    self.store.put(&self.store_key(g), &state)?;
                }
                None
            };
            let group = self.group(g);
            group.spilled = !resident && !state.is_empty();
            group.operator = operator;
            group.last_used = last_used;
            group.next_close = next_close;
            group.pending_rows = pending.iter().map(|b| b.len()).sum();
            group.pending_bytes = pending.iter().map(|b| b.memory_bytes()).sum();
            group.pending = pending;
            self.observe(g);
        }
        Ok(())
    }

    fn metrics(&self) -> Vec<OperatorMetrics> {
        let mut total = vec![OperatorMetrics::default(); self.slots];
        for group in &self.groups {
            let metrics = match &group.operator {
                Some(operator) => operator.metrics(),
                None => group.metrics.clone(),
            };
            for (sum, m) in total.iter_mut().zip(&metrics) {
                sum.add(m);
            }
        }
        // State in memory (with the rows waiting for spilled groups); spilled groups are on disk.
        if let Some(first) = total.first_mut() {
            first.state_bytes = self
                .groups
                .iter()
                .map(|g| if g.operator.is_some() { g.state_bytes } else { 0 } + g.pending_bytes)
                .sum::<u64>();
            first.spill = self.spill;
        }
        total
    }
}
