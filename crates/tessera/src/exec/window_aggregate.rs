//! `WindowAggregateExec`: GROUP BY keys and tumbling or hopping windows, on shared slices.
//!
//! One operator evaluates every window of the query branches that read the same rows the same
//! way (same WHERE, keys and aggregates; each branch is an output *slot*). Every row updates
//! the partial states of exactly one slice, of length the gcd of all the windows' ranges and
//! slides; a window instance is emitted once, when the watermark passes its end, by merging
//! the states of its slices. Slices no open window needs are dropped. A row is late for a
//! window that was already closed when it arrived: it still counts for the windows that are
//! open (their slices are still there), and goes to the late output of each slot it missed.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::key_interner::SharedKeys;
use super::{filter_and_project, EventBatch, OperatorMetrics, Output, StreamOperator};
use crate::aggregate::GroupStates;
use crate::error::{Result, TesseraError};
use crate::plan::{AggregateColumn, WindowAggregatePlan};
use crate::window::{floor_div, gcd, WindowSpec};

const NO_SLOT: u32 = u32::MAX;

/// Partial states of every group seen in one slice (or, while emitting, one window).
struct GroupTable {
    /// Slot of each interned key id, `NO_SLOT` if the key has no state here.
    slot_of_key: Vec<u32>,
    /// Key id of each slot.
    keys: Vec<u32>,
    /// One state column per aggregate.
    states: Vec<GroupStates>,
}

impl GroupTable {
    fn new(plan: &WindowAggregatePlan) -> Self {
        GroupTable {
            slot_of_key: Vec::new(),
            keys: Vec::new(),
            states: plan.aggregates.iter().map(|a| a.new_states()).collect(),
        }
    }

    /// Slots for `key_ids`, creating missing ones.
    fn slots_for(&mut self, key_ids: impl Iterator<Item = u32>, out: &mut Vec<u32>) {
        out.clear();
        for key in key_ids {
            let k = key as usize;
            if k >= self.slot_of_key.len() {
                self.slot_of_key.resize(k + 1, NO_SLOT);
            }
            let mut slot = self.slot_of_key[k];
            if slot == NO_SLOT {
                slot = self.keys.len() as u32;
                self.slot_of_key[k] = slot;
                self.keys.push(key);
            }
            out.push(slot);
        }
        let n = self.keys.len();
        for s in &mut self.states {
            if s.len() < n {
                s.resize(n);
            }
        }
    }

    fn merge_from(&mut self, other: &GroupTable, scratch: &mut Vec<u32>) -> Result<()> {
        self.slots_for(other.keys.iter().copied(), scratch);
        for (mine, theirs) in self.states.iter_mut().zip(&other.states) {
            mine.merge(theirs, scratch)?;
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.slot_of_key.capacity() * 4
            + self.keys.capacity() * 4
            + self.states.iter().map(GroupStates::bytes).sum::<usize>()
    }
}

/// One window of the operator and where its emission stands.
struct WindowOutput {
    plan: Arc<WindowAggregatePlan>,
    /// The first window not yet closed: windows before it are emitted or were empty.
    next_window: i64,
    /// The watermark up to which windows are closed.
    closed_through: i64,
    metrics: OperatorMetrics,
}

impl WindowOutput {
    fn spec(&self) -> WindowSpec {
        self.plan.window
    }

    /// The end of the first window not closed yet.
    fn next_close(&self) -> i64 {
        self.spec().end(self.next_window)
    }
}

pub struct WindowAggregateExec {
    /// The branches, one per output slot; they share WHERE, keys and aggregates.
    outputs: Vec<WindowOutput>,
    event_time_type: DataType,
    /// Interned group keys, shared with other operators that group by the same keys.
    keys: Arc<SharedKeys>,
    slice_len: i64,
    /// Open slices by index (slice `k` covers `[k * slice_len, (k + 1) * slice_len)`).
    slices: BTreeMap<i64, GroupTable>,
    scratch: Vec<u32>,
}

impl WindowAggregateExec {
    /// An operator for `plans`, which must agree on WHERE, keys and aggregates.
    pub fn new(plans: Vec<Arc<WindowAggregatePlan>>, event_time_type: DataType, keys: Arc<SharedKeys>) -> Result<Self> {
        if plans.is_empty() {
            return Err(TesseraError::Internal("a window aggregate without windows".into()));
        }
        let slice_len = plans.iter().fold(0, |acc, p| gcd(acc, p.window.slice_len()));
        let outputs = plans
            .into_iter()
            .map(|plan| WindowOutput {
                next_window: plan.window.first_window_ending_after(i64::MIN),
                closed_through: i64::MIN,
                metrics: OperatorMetrics::default(),
                plan,
            })
            .collect();
        Ok(WindowAggregateExec {
            outputs,
            event_time_type,
            keys,
            slice_len,
            slices: BTreeMap::new(),
            scratch: Vec::new(),
        })
    }

    /// The plan whose WHERE, keys and aggregates every slot shares.
    fn shape(&self) -> &Arc<WindowAggregatePlan> {
        &self.outputs[0].plan
    }

    /// The earliest end of a window not closed yet: a row whose watermark reaches it closes
    /// windows.
    fn next_close(&self) -> i64 {
        self.outputs.iter().map(WindowOutput::next_close).min().unwrap_or(i64::MAX)
    }

    /// Aggregates rows that passed the WHERE clause; `key_ids` are their interned keys.
    fn process_filtered(&mut self, input: &EventBatch, key_ids: &[u32], out: &mut Output) -> Result<()> {
        let n = input.len();
        let values = self.shape().aggregates.iter().map(|a| a.evaluate_arg(&input.rows)).collect::<Result<Vec<_>>>()?;
        let mut late_rows: Vec<Vec<u32>> = vec![Vec::new(); self.outputs.len()];
        let mut start = 0;
        while start < n {
            // Take rows up to the first one that meets a watermark closing a window; close
            // windows before taking it.
            let threshold = self.next_close();
            let end = input.watermarks[start..].iter().position(|&w| w >= threshold).map_or(n, |p| start + p);
            if end == start {
                self.close_windows(input.watermarks[start], out)?;
                continue;
            }
            self.update_slices(input, start..end, key_ids, &values, &mut late_rows)?;
            start = end;
        }
        for (slot, rows) in late_rows.into_iter().enumerate() {
            if !rows.is_empty() {
                self.outputs[slot].metrics.late_events += rows.len() as u64;
                out.late.push((slot, input.take(&rows)?.rows));
            }
        }
        Ok(())
    }

    /// Adds rows `rows` to their slices, run by run: consecutive rows in one slice share the
    /// slice lookup and the lateness decision (every time in a slice belongs to the same
    /// windows), and update the states as one contiguous range.
    fn update_slices(
        &mut self,
        input: &EventBatch,
        rows: std::ops::Range<usize>,
        key_ids: &[u32],
        values: &[Option<ArrayRef>],
        late_rows: &mut [Vec<u32>],
    ) -> Result<()> {
        let times = &input.event_times;
        let mut row = rows.start;
        while row < rows.end {
            let slice = floor_div(times[row], self.slice_len);
            let lo = slice.saturating_mul(self.slice_len);
            let hi = lo.saturating_add(self.slice_len);
            let run_end =
                times[row + 1..rows.end].iter().position(|&t| !(lo <= t && t < hi)).map_or(rows.end, |p| row + 1 + p);
            let mut open = false;
            for (output, late) in self.outputs.iter().zip(late_rows.iter_mut()) {
                let (first, last) = output.spec().windows_containing(lo);
                if first < output.next_window {
                    late.extend(row as u32..run_end as u32);
                }
                open |= last >= output.next_window;
            }
            if open {
                let plan = &self.outputs[0].plan;
                let table = self.slices.entry(slice).or_insert_with(|| GroupTable::new(plan));
                table.slots_for(key_ids[row..run_end].iter().copied(), &mut self.scratch);
                for (state, value) in table.states.iter_mut().zip(values) {
                    state.update(value.as_ref(), row, &self.scratch);
                }
                let metrics = &mut self.outputs[0].metrics;
                metrics.store_reads += (run_end - row) as u64;
                metrics.store_writes += (run_end - row) as u64;
            }
            row = run_end;
        }
        Ok(())
    }

    /// Emits, for every slot, each window with data whose end is at or before `watermark`, then
    /// drops the slices no open window needs.
    fn close_windows(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        let g = self.slice_len;
        for slot in 0..self.outputs.len() {
            if watermark <= self.outputs[slot].closed_through {
                continue;
            }
            let window = self.outputs[slot].spec();
            let mut m = self.outputs[slot].next_window;
            // Visit the windows that have data: from the first slice at or after the start of m.
            while let Some((&k, _)) = self.slices.range(floor_div(window.start(m), g)..).next() {
                let slice_start = k.saturating_mul(g);
                if slice_start >= window.end(m) {
                    m = m.max(window.first_window_ending_after(slice_start));
                    continue;
                }
                if window.end(m) > watermark {
                    break;
                }
                self.emit_window(slot, m, out)?;
                m += 1;
            }
            let output = &mut self.outputs[slot];
            output.closed_through = watermark;
            output.next_window = output.next_window.max(window.first_window_ending_after(watermark));
        }
        let keep_from =
            self.outputs.iter().map(|o| floor_div(o.spec().start(o.next_window), g)).min().unwrap_or(i64::MAX);
        if self.slices.first_key_value().is_some_and(|(&k, _)| k < keep_from) {
            self.slices = self.slices.split_off(&keep_from);
        }
        Ok(())
    }

    fn emit_window(&mut self, slot: usize, m: i64, out: &mut Output) -> Result<()> {
        let window = self.outputs[slot].spec();
        let g = self.slice_len;
        let (first, last) = (floor_div(window.start(m), g), floor_div(window.end(m) - 1, g));
        let batch = if first == last {
            match self.slices.get(&first) {
                Some(table) => self.finalize(slot, m, table)?,
                None => return Ok(()),
            }
        } else {
            let mut merged = GroupTable::new(&self.outputs[slot].plan);
            let mut reads = 0;
            for (_, table) in self.slices.range(first..=last) {
                merged.merge_from(table, &mut self.scratch)?;
                reads += table.keys.len() as u64;
            }
            self.outputs[slot].metrics.store_reads += reads;
            self.finalize(slot, m, &merged)?
        };
        self.outputs[slot].metrics.rows_out += batch.num_rows() as u64;
        if batch.num_rows() > 0 {
            out.rows.push((slot, batch));
        }
        Ok(())
    }

    /// The result rows of window `m` of `slot` from its merged states: aggregate, HAVING,
    /// SELECT list.
    fn finalize(&self, slot: usize, m: i64, table: &GroupTable) -> Result<RecordBatch> {
        let plan = &self.outputs[slot].plan;
        let n = table.keys.len();
        let key_columns = self.keys.columns(&table.keys)?;
        let bound = |value: i64| -> Result<ArrayRef> {
            let array: ArrayRef = Arc::new(Int64Array::from_value(value, n));
            Ok(if self.event_time_type == DataType::Int64 { array } else { cast(&array, &self.event_time_type)? })
        };
        let columns = plan
            .aggregate_columns
            .iter()
            .map(|column| match column {
                AggregateColumn::Key(i) => Ok(key_columns[*i].clone()),
                AggregateColumn::WindowStart => bound(plan.window.start(m)),
                AggregateColumn::WindowEnd => bound(plan.window.end(m)),
                AggregateColumn::Aggregate(i) => plan.aggregates[*i].finalize(&table.states[*i]),
            })
            .collect::<Result<Vec<_>>>()?;
        let aggregated = RecordBatch::try_new(nullable(&plan.aggregate_schema), columns)?;
        filter_and_project(&aggregated, plan.having.as_ref(), &plan.projection, &plan.output_schema)
    }
}

/// The schema with every field nullable (aggregates of empty inputs and NULL keys are NULL).
fn nullable(schema: &SchemaRef) -> SchemaRef {
    if schema.fields().iter().all(|f| f.is_nullable()) {
        return schema.clone();
    }
    Arc::new(arrow::datatypes::Schema::new(
        schema.fields().iter().map(|f| f.as_ref().clone().with_nullable(true)).collect::<Vec<_>>(),
    ))
}

impl StreamOperator for WindowAggregateExec {
    fn name(&self) -> &'static str {
        "WindowAggregateExec"
    }

    fn process(&mut self, input: &Arc<EventBatch>, out: &mut Output) -> Result<()> {
        for output in &mut self.outputs {
            output.metrics.rows_in += input.len() as u64;
        }
        let shape = Arc::clone(self.shape());
        match &shape.filter {
            None => {
                let key_ids = self.keys.ids_for(input, &shape.keys)?;
                self.process_filtered(input, &key_ids, out)
            }
            Some(predicate) => {
                let mask = predicate.evaluate(&input.rows)?.into_array(input.len())?;
                let mask = arrow::array::AsArray::as_boolean_opt(&mask)
                    .ok_or_else(|| TesseraError::Plan(format!("WHERE `{predicate}` is not a boolean expression")))?
                    .clone();
                let filtered = input.filter(&mask)?;
                let key_ids = self.keys.intern(&filtered.rows, &shape.keys)?;
                self.process_filtered(&filtered, &key_ids, out)
            }
        }
    }

    fn advance_watermark(&mut self, watermark: i64, out: &mut Output) -> Result<()> {
        if watermark >= self.next_close() {
            self.close_windows(watermark, out)?;
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Output) -> Result<()> {
        self.close_windows(i64::MAX, out)
    }

    fn metrics(&self) -> Vec<OperatorMetrics> {
        let state: usize = self.slices.values().map(GroupTable::bytes).sum();
        let mut metrics: Vec<OperatorMetrics> = self.outputs.iter().map(|o| o.metrics).collect();
        metrics[0].state_bytes = state as u64;
        metrics
    }
}
