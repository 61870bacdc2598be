//! Turning closed window instances into result rows: the aggregates' final values, HAVING and
//! the SELECT list per output slot, written once per input batch; and `EMIT CHANGES`
//! changelogs of open instances.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, Int64Array, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::group_table::GroupTable;
use super::key_interner::SharedKeys;
use super::{filter_and_project, OperatorMetrics, Output};
use crate::aggregate::GroupStates;
use crate::error::{Result, TesseraError};
use crate::plan::{changelog_schema, AggregateColumn, WindowAggregatePlan};
use crate::window::WindowSpec;

/// An output slot (query branch): its SELECT list and HAVING, and its counters.
pub(super) struct Slot {
    plan: Arc<WindowAggregatePlan>,
    /// The plan's aggregate schema with every column nullable (made once, not per emission).
    aggregate_schema: SchemaRef,
    /// `EMIT CHANGES`: the written columns, `op` first.
    changelog: Option<SchemaRef>,
    pub(super) metrics: OperatorMetrics,
}

/// The aggregated rows of closed instances not written yet, for one slot: keys, window
/// bounds and the aggregates' final values, before HAVING and the SELECT list.
#[derive(Default)]
struct Aggregated {
    /// Interned key ids, with the operator's `key_base` added back.
    keys: Vec<u32>,
    starts: Vec<i64>,
    ends: Vec<i64>,
    /// Per aggregate of the slot's plan, the partial states of each instance in turn,
    /// finalized once per flush (an instance of a few keys finalized alone made arrays of a
    /// few rows, each allocated, concatenated and freed).
    states: Vec<Box<dyn GroupStates>>,
}

impl Aggregated {
    /// Adds the rows of instance `m` of `window`, merged in `table`, for a slot of `plan`
    /// (`key_base`: the operator's first key id).
    fn add(
        &mut self,
        plan: &WindowAggregatePlan,
        key_base: u32,
        window: WindowSpec,
        m: i64,
        table: &GroupTable,
    ) -> Result<()> {
        let n = table.keys.len();
        self.keys.extend(table.keys.iter().map(|&k| k + key_base));
        self.starts.extend(std::iter::repeat_n(window.start(m), n));
        self.ends.extend(std::iter::repeat_n(window.end(m), n));
        debug_assert_eq!(plan.aggregates.len(), table.states.len());
        if self.states.is_empty() {
            self.states = table.states.clone();
            return Ok(());
        }
        for (states, instance) in self.states.iter_mut().zip(&table.states) {
            states.extend_from(instance.as_ref())?;
        }
        Ok(())
    }
}

/// Turns closed instances into result rows. The instances closed while one input batch is
/// processed are written as one batch per slot: an instance holds a row per key, and putting
/// a few rows at a time through HAVING and the SELECT list costs more than the rows.
pub(super) struct Emitter {
    pub(super) slots: Vec<Slot>,
    /// Per slot, the rows of instances closed since the last flush.
    pending: Vec<Aggregated>,
    /// Interned group keys, shared with other operators that group by the same keys.
    pub(super) keys: Arc<SharedKeys>,
    /// Subtracted from interned key ids to index this operator's tables (a key group's first
    /// id; 0 for an operator of all keys).
    key_base: u32,
    event_time_type: DataType,
}

impl Emitter {
    /// An emitter writing `slots` (with `changes`, as `EMIT CHANGES` changelogs), keys
    /// interned in `keys` from `key_base` on, window bounds of `event_time_type`.
    pub(super) fn new(
        slots: Vec<Arc<WindowAggregatePlan>>,
        changes: bool,
        keys: Arc<SharedKeys>,
        key_base: u32,
        event_time_type: DataType,
    ) -> Self {
        Emitter {
            pending: slots.iter().map(|_| Aggregated::default()).collect(),
            slots: slots
                .into_iter()
                .map(|plan| Slot {
                    changelog: changes.then(|| changelog_schema(&plan.output_schema)),
                    aggregate_schema: nullable(&plan.aggregate_schema),
                    plan,
                    metrics: OperatorMetrics::default(),
                })
                .collect(),
            keys,
            key_base,
            event_time_type,
        }
    }

    /// The ids this operator's tables use for interned `ids`.
    pub(super) fn local_ids<'a>(&self, ids: &'a [u32]) -> std::borrow::Cow<'a, [u32]> {
        if self.key_base == 0 {
            std::borrow::Cow::Borrowed(ids)
        } else {
            std::borrow::Cow::Owned(ids.iter().map(|&k| k - self.key_base).collect())
        }
    }

    /// Adds the rows of instance `m` of `window` to those its slots write at the next flush.
    pub(super) fn emit(&mut self, node_slots: &[usize], window: WindowSpec, m: i64, table: &GroupTable) -> Result<()> {
        for &slot in node_slots {
            self.pending[slot].add(&self.slots[slot].plan, self.key_base, window, m, table)?;
            let metrics = &mut self.slots[slot].metrics;
            metrics.windows_out += 1;
            metrics.window_keys += table.keys.len() as u64;
        }
        Ok(())
    }

    /// Writes the rows of the instances emitted since the last flush, one batch per slot.
    pub(super) fn flush(&mut self, out: &mut Output) -> Result<()> {
        for slot in 0..self.slots.len() {
            if self.pending[slot].keys.is_empty() {
                continue;
            }
            let aggregated = std::mem::take(&mut self.pending[slot]);
            let batch = self.aggregate(slot, aggregated)?;
            let plan = &self.slots[slot].plan;
            let batch = filter_and_project(&batch, plan.having.as_ref(), &plan.projection, &plan.output_schema)?;
            if batch.num_rows() > 0 {
                out.rows.push((slot, batch));
            }
        }
        Ok(())
    }

    /// `EMIT CHANGES`: the current rows of instance `m` for the keys of `table` (the changed
    /// ones), as upserts: `+I` for a group's first row in the instance, `+U` after that, and
    /// `-D` when a group written before no longer passes HAVING. `written` holds the (slot,
    /// key) pairs whose row stands.
    pub(super) fn emit_changes(
        &mut self,
        node_slots: &[usize],
        window: WindowSpec,
        m: i64,
        table: &GroupTable,
        written: &mut hashbrown::HashSet<(usize, u32)>,
        out: &mut Output,
    ) -> Result<()> {
        for &slot in node_slots {
            let mut rows = Aggregated::default();
            rows.add(&self.slots[slot].plan, self.key_base, window, m, table)?;
            let aggregated = self.aggregate(slot, rows)?;
            let plan = &self.slots[slot].plan;
            let passes = match &plan.having {
                Some(having) => {
                    let mask = having.evaluate(&aggregated)?.into_array(aggregated.num_rows())?;
                    let mask = arrow::array::AsArray::as_boolean_opt(&mask)
                        .ok_or_else(|| TesseraError::Plan(format!("HAVING `{having}` is not a boolean expression")))?
                        .clone();
                    (0..mask.len()).map(|i| mask.is_valid(i) && mask.value(i)).collect()
                }
                None => vec![true; table.keys.len()],
            };
            let mut keep = Vec::with_capacity(passes.len());
            let mut ops = Vec::new();
            for (&key, pass) in table.keys.iter().zip(passes) {
                let op = match (pass, written.contains(&(slot, key))) {
                    (true, false) => Some("+I"),
                    (true, true) => Some("+U"),
                    (false, true) => Some("-D"),
                    (false, false) => None,
                };
                if pass {
                    written.insert((slot, key));
                } else {
                    written.remove(&(slot, key));
                }
                keep.push(op.is_some());
                ops.extend(op);
            }
            let kept = arrow::compute::filter_record_batch(&aggregated, &BooleanArray::from(keep))?;
            let projected = filter_and_project(&kept, None, &plan.projection, &plan.output_schema)?;
            let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(ops))];
            columns.extend(projected.columns().iter().cloned());
            let schema = self.slots[slot].changelog.clone().expect("a changelog schema in EMIT CHANGES");
            let batch = RecordBatch::try_new(schema, columns)?;
            if batch.num_rows() > 0 {
                out.rows.push((slot, batch));
            }
        }
        Ok(())
    }

    /// The aggregate's result rows: keys, window bounds and the aggregates' final values, before
    /// HAVING and the SELECT list.
    fn aggregate(&self, slot: usize, rows: Aggregated) -> Result<RecordBatch> {
        let Slot { plan, aggregate_schema, .. } = &self.slots[slot];
        let key_columns = self.keys.columns(&rows.keys)?;
        let bound = |values: Vec<i64>| -> Result<ArrayRef> {
            let array: ArrayRef = Arc::new(Int64Array::from(values));
            Ok(if self.event_time_type == DataType::Int64 { array } else { cast(&array, &self.event_time_type)? })
        };
        let (starts, ends) = (bound(rows.starts)?, bound(rows.ends)?);
        let values = plan
            .aggregates
            .iter()
            .zip(&rows.states)
            .map(|(aggregate, states)| aggregate.finalize(states.as_ref()))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let columns = plan
            .aggregate_columns
            .iter()
            .map(|column| match column {
                AggregateColumn::Key(i) => Arc::clone(&key_columns[*i]),
                AggregateColumn::WindowStart => Arc::clone(&starts),
                AggregateColumn::WindowEnd => Arc::clone(&ends),
                AggregateColumn::Aggregate(i) => Arc::clone(&values[*i]),
            })
            .collect::<Vec<_>>();
        Ok(RecordBatch::try_new(aggregate_schema.clone(), columns)?)
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
