//! The sliding aggregator of a hopping window over slices ([`Sliding`]): a running value
//! where the aggregates have an exact inverse, two stacks ([`TwoStacks`]) otherwise.
//!
//! A [`RunningWindow`] keeps the states of the last instance and moves to the next by adding
//! the slices that enter it and subtracting those that leave: two merges a slide, whatever
//! the range, and no stacks of partial aggregates to build and keep. It serves COUNT, SUM and
//! AVG. Subtracting must not drift, so the states are added and taken away exactly
//! ([`GroupStates::add_exactly`](crate::aggregate::GroupStates::add_exactly): float sums in
//! fixed point beside the float value), and an instance's value is the exact sum of its
//! slices, rounded once. A float sum with no exact fixed-point form (values below 2^-64's
//! resolution, beyond 2^56, not finite) ends the running value: the window goes on with two
//! stacks, which merge partial aggregates as they are.
//!
//! A key stays in the running states while any counted slice holds it; keys that left every
//! counted slice are dropped before an instance is returned.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};

use super::group_table::GroupTable;
use super::two_stacks::TwoStacks;
use crate::aggregate::slides_on_running_value;
use crate::error::{Result, TesseraError};
use crate::plan::WindowAggregatePlan;
use crate::state::codec::{StateReader, StateWriter};

/// The instances of one hopping window, combined from its slices as it slides.
pub(super) enum Sliding {
    Running(RunningWindow),
    Stacks(TwoStacks),
}

impl Sliding {
    /// A running value if every aggregate of `plan` has an exact inverse, else two stacks.
    pub(super) fn for_plan(plan: &WindowAggregatePlan) -> Self {
        if slides_on_running_value(&plan.aggregates) {
            Sliding::Running(RunningWindow::new(GroupTable::new(plan)))
        } else {
            Sliding::Stacks(TwoStacks::default())
        }
    }

    /// A row changed slice `slice`: forget what includes it.
    pub(super) fn invalidate(&mut self, slice: i64) {
        match self {
            Sliding::Running(running) => running.invalidate(slice),
            Sliding::Stacks(stacks) => stacks.invalidate(slice),
        }
    }

    /// The merge of the slices `first..=last` with data (`slices`), `None` if all are empty;
    /// `slice_reads` counts the slices' group states read. Instances come in order (`first`
    /// and `last` never decrease; one ending before the last one is rebuilt).
    pub(super) fn window<'a>(
        &'a mut self,
        first: i64,
        last: i64,
        slices: &BTreeMap<i64, GroupTable>,
        new_table: &dyn Fn() -> GroupTable,
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) -> Result<Option<Cow<'a, GroupTable>>> {
        if let Sliding::Running(running) = self {
            if !running.slide(first, last, slices, new_table, scratch, slice_reads)? {
                tracing::debug!("a float sum has no exact fixed-point form: the window goes on with two stacks");
                *self = Sliding::Stacks(TwoStacks::default());
            }
        }
        match self {
            Sliding::Running(running) => Ok(running.current().map(Cow::Borrowed)),
            Sliding::Stacks(stacks) => stacks.window(first, last, slices, new_table, scratch, slice_reads),
        }
    }

    /// The first slice a later instance may need to read again (`None`: none), besides the
    /// slices of the open instances: a running value subtracts the slices it counted.
    pub(super) fn oldest_needed(&self) -> Option<i64> {
        match self {
            Sliding::Running(running) => running.counted.front().copied(),
            Sliding::Stacks(_) => None,
        }
    }

    pub(super) fn encode(&self, w: &mut StateWriter) {
        match self {
            Sliding::Running(running) => {
                w.bool(true);
                running.encode(w);
            }
            Sliding::Stacks(stacks) => {
                w.bool(false);
                stacks.encode(w);
            }
        }
    }

    pub(super) fn decode(plan: &WindowAggregatePlan, r: &mut StateReader) -> Result<Self> {
        Ok(if r.bool()? {
            Sliding::Running(RunningWindow::decode(plan, r)?)
        } else {
            Sliding::Stacks(TwoStacks::decode(plan, r)?)
        })
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Sliding::Running(running) => running.bytes(),
            Sliding::Stacks(stacks) => stacks.bytes(),
        }
    }
}

/// The states of the current instance, kept up to date as slices enter and leave.
pub(super) struct RunningWindow {
    /// The window's states; a slot per key some counted slice held since the last compaction.
    table: GroupTable,
    /// Per aggregate, the exact fixed-point sums of a float SUM or AVG, per slot (empty for
    /// other aggregates).
    fixed: Vec<Vec<i128>>,
    /// Per slot, how many counted slices hold the key.
    holders: Vec<u32>,
    /// Slots no counted slice holds.
    absent: usize,
    /// The slices with data counted, oldest first.
    counted: VecDeque<i64>,
    /// The slices up to this one have been counted (or were empty).
    counted_through: Option<i64>,
}

impl RunningWindow {
    fn new(table: GroupTable) -> Self {
        RunningWindow {
            fixed: vec![Vec::new(); table.states.len()],
            table,
            holders: Vec::new(),
            absent: 0,
            counted: VecDeque::new(),
            counted_through: None,
        }
    }

    /// Counts nothing any more, keeping the buffers.
    fn clear(&mut self) {
        self.table.clear();
        self.fixed.iter_mut().for_each(Vec::clear);
        self.holders.clear();
        self.absent = 0;
        self.counted.clear();
        self.counted_through = None;
    }

    fn invalidate(&mut self, slice: i64) {
        if self.counted_through.is_some_and(|c| slice <= c) {
            self.clear();
        }
    }

    /// Moves to the instance of slices `first..=last`: subtracts the counted slices before
    /// `first`, adds those after the last counted up to `last`, and drops the keys no counted
    /// slice holds. False if a float sum has no exact form (the states are then unusable).
    fn slide(
        &mut self,
        first: i64,
        last: i64,
        slices: &BTreeMap<i64, GroupTable>,
        new_table: &dyn Fn() -> GroupTable,
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) -> Result<bool> {
        if self.counted_through.is_some_and(|c| last < c) {
            self.clear();
        }
        if self.counted.back().is_some_and(|&k| k < first) {
            // Every counted slice leaves: start afresh rather than subtract them all.
            let through = self.counted_through;
            self.clear();
            self.counted_through = through;
        }
        while let Some(&k) = self.counted.front().filter(|&&k| k < first) {
            // A counted slice is kept until it is subtracted (see `oldest_needed`); should one
            // be gone, count the instance afresh.
            let Some(slice) = slices.get(&k) else {
                self.clear();
                break;
            };
            if !self.count(slice, true, scratch) {
                return Ok(false);
            }
            *slice_reads += slice.keys.len() as u64;
            self.counted.pop_front();
        }
        let from = self.counted_through.map_or(first, |c| first.max(c + 1));
        if from <= last {
            for (&k, slice) in slices.range(from..=last) {
                if !self.count(slice, false, scratch) {
                    return Ok(false);
                }
                *slice_reads += slice.keys.len() as u64;
                self.counted.push_back(k);
            }
        }
        self.counted_through = Some(self.counted_through.map_or(last, |c| c.max(last)));
        for (states, fixed) in self.table.states.iter_mut().zip(&self.fixed) {
            states.round_exact(fixed);
        }
        if self.absent > 0 {
            self.compact(new_table, scratch)?;
        }
        Ok(true)
    }

    /// Adds (or subtracts) a slice's states and who holds each key.
    fn count(&mut self, slice: &GroupTable, subtract: bool, scratch: &mut Vec<u32>) -> bool {
        let before = self.table.keys.len();
        self.table.slots_for(&slice.keys, scratch);
        let RunningWindow { table, fixed, holders, absent, .. } = self;
        for ((mine, theirs), fixed) in table.states.iter_mut().zip(&slice.states).zip(fixed.iter_mut()) {
            if !mine.add_exactly(theirs, scratch, fixed, subtract) {
                return false;
            }
        }
        // New slots are held by no slice until this one is counted.
        *absent += table.keys.len() - before;
        holders.resize(table.keys.len(), 0);
        for &slot in scratch.iter() {
            let held = &mut holders[slot as usize];
            if subtract {
                *held -= 1;
                *absent += usize::from(*held == 0);
            } else {
                *absent -= usize::from(*held == 0);
                *held += 1;
            }
        }
        true
    }

    /// Rebuilds the states with the held keys only, in the same order.
    fn compact(&mut self, new_table: &dyn Fn() -> GroupTable, scratch: &mut Vec<u32>) -> Result<()> {
        let held: Vec<usize> = (0..self.holders.len()).filter(|&s| self.holders[s] > 0).collect();
        let keys: Vec<u32> = held.iter().map(|&s| self.table.keys[s]).collect();
        let mut compacted = new_table();
        if compacted.merge_keys_from(&self.table, &keys, scratch)? != keys.len() {
            return Err(TesseraError::Internal("a running window lost a key while compacting".into()));
        }
        for fixed in self.fixed.iter_mut().filter(|f| !f.is_empty()) {
            *fixed = held.iter().map(|&s| fixed[s]).collect();
        }
        self.holders = held.iter().map(|&s| self.holders[s]).collect();
        self.absent = 0;
        self.table = compacted;
        Ok(())
    }

    /// The current instance's states, `None` if no counted slice has data.
    fn current(&self) -> Option<&GroupTable> {
        (!self.table.keys.is_empty()).then_some(&self.table)
    }

    /// Writes the states with their exact sums (so a resumed run goes on from the same exact
    /// values, and its results are the same to the bit).
    fn encode(&self, w: &mut StateWriter) {
        self.table.encode(w);
        for fixed in &self.fixed {
            w.len(fixed.len());
            for &v in fixed {
                w.u64(v as u64);
                w.u64((v >> 64) as u64);
            }
        }
        w.u32s(&self.holders);
        w.i64s(&self.counted.iter().copied().collect::<Vec<_>>());
        w.bool(self.counted_through.is_some());
        w.i64(self.counted_through.unwrap_or(0));
    }

    fn decode(plan: &WindowAggregatePlan, r: &mut StateReader) -> Result<Self> {
        let table = GroupTable::decode(plan, r)?;
        let fixed = (0..table.states.len())
            .map(|_| {
                let n = r.len(16)?;
                (0..n).map(|_| Ok(i128::from(r.u64()?) | (i128::from(r.u64()? as i64) << 64))).collect()
            })
            .collect::<Result<Vec<Vec<i128>>>>()?;
        let holders = r.u32s()?;
        let counted = r.i64s()?.into();
        let counted_through = if r.bool()? { Some(r.i64()?) } else { r.i64().map(|_| None)? };
        let slots = table.keys.len();
        if holders.len() != slots || fixed.iter().any(|f| !f.is_empty() && f.len() != slots) {
            return Err(TesseraError::Checkpoint("a saved running window is inconsistent".into()));
        }
        let absent = holders.iter().filter(|&&h| h == 0).count();
        Ok(RunningWindow { table, fixed, holders, absent, counted, counted_through })
    }

    fn bytes(&self) -> usize {
        self.table.bytes()
            + self.fixed.iter().map(|f| f.capacity() * 16).sum::<usize>()
            + self.holders.capacity() * 4
            + self.counted.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use arrow::array::{Array, AsArray, Float64Array, Int64Array};
    use arrow::datatypes::{DataType, Field, Float64Type, Schema};
    use arrow::record_batch::RecordBatch;
    use proptest::prelude::*;

    use super::*;
    use crate::exec::group_table::tests::plan_of;

    /// A slice holding `rows` (key id, value).
    fn slice(plan: &WindowAggregatePlan, rows: &[(u32, f64)]) -> GroupTable {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Float64, true),
            Field::new("ts", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| i64::from(r.0)))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|_| 0))),
            ],
        )
        .unwrap();
        let values: Vec<_> = plan.aggregates.iter().map(|a| a.evaluate_arg(&batch).unwrap()).collect();
        let mut table = GroupTable::new(plan);
        let keys: Vec<u32> = rows.iter().map(|r| r.0).collect();
        table.add_rows(&keys, 0, &values, &mut Vec::new());
        table
    }

    /// Each key's aggregate values, as floats.
    fn values(table: Option<&GroupTable>) -> BTreeMap<u32, Vec<Option<f64>>> {
        let Some(table) = table else { return BTreeMap::new() };
        let columns: Vec<_> = table
            .states
            .iter()
            .map(|s| arrow::compute::cast(&s.finalize().unwrap(), &DataType::Float64).unwrap())
            .collect();
        let value = |c: &Arc<dyn Array>, i: usize| c.is_valid(i).then(|| c.as_primitive::<Float64Type>().value(i));
        table.keys.iter().enumerate().map(|(i, &k)| (k, columns.iter().map(|c| value(c, i)).collect())).collect()
    }

    fn close(a: &BTreeMap<u32, Vec<Option<f64>>>, b: &BTreeMap<u32, Vec<Option<f64>>>) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|((ka, va), (kb, vb))| {
                ka == kb
                    && va.iter().zip(vb).all(|(x, y)| match (x, y) {
                        (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
                        _ => x == y,
                    })
            })
    }

    proptest! {
        /// Sliding over slices with keys coming and going, empty slices, rows arriving in a
        /// slice already counted, slices dropped as soon as the operator may drop them, and
        /// the state saved and restored between instances: every instance equals its slices
        /// merged afresh, to the bit while the running value holds; a value with no exact
        /// fixed-point form hands the window to two stacks.
        #[test]
        fn every_instance_equals_its_slices_merged_afresh(
            rows in prop::collection::vec(prop::collection::vec((0u32..6, -40i32..40), 0..6), 1..40),
            width in 1i64..8,
            late in prop::collection::vec((0usize..40, 0u32..6, -40i32..40), 0..6),
            saves in prop::collection::vec(any::<bool>(), 40),
            tiny in prop::option::of(0usize..40),
        ) {
            let plan = plan_of("SUM(v), COUNT(*), AVG(v), COUNT(v)");
            let new_table = || GroupTable::new(&plan);
            let mut pending: Vec<Vec<(u32, f64)>> =
                rows.iter().map(|r| r.iter().map(|&(k, v)| (k, f64::from(v) / 4.0)).collect()).collect();
            let tiny_slice = tiny.filter(|&t| pending.get(t).is_some_and(|r| !r.is_empty()));
            if let Some(t) = tiny_slice {
                // Alone in its slice, or a larger value would absorb it in the slice's sum.
                pending[t] = vec![(pending[t][0].0, 1e-30)];
            }
            let mut slices: BTreeMap<i64, Vec<(u32, f64)>> = BTreeMap::new();
            let mut tables: BTreeMap<i64, GroupTable> = BTreeMap::new();
            let mut sliding = Sliding::for_plan(&plan);
            prop_assert!(matches!(sliding, Sliding::Running(_)));
            let (mut scratch, mut reads) = (Vec::new(), 0);
            let instances = pending.len() as i64;
            for m in 0..instances {
                let (first, last) = (m - width + 1, m);
                // Slice `m` fills before its first instance closes.
                if !pending[m as usize].is_empty() {
                    slices.insert(m, pending[m as usize].clone());
                    tables.insert(m, slice(&plan, &pending[m as usize]));
                }
                // A late row for a slice already counted.
                for &(at, key, v) in late.iter().filter(|l| l.0 as i64 == m) {
                    let target = first.max(0) + (at as i64 % width).min(m - first.max(0));
                    if tiny_slice == Some(target as usize) {
                        continue;
                    }
                    let rows = slices.entry(target).or_default();
                    rows.push((key, f64::from(v) / 4.0));
                    tables.insert(target, slice(&plan, rows));
                    sliding.invalidate(target);
                }
                let got = values(sliding.window(first, last, &tables, &new_table, &mut scratch, &mut reads).unwrap().as_deref());
                let mut fresh: Option<GroupTable> = None;
                for (_, table) in tables.range(first..=last) {
                    fresh.get_or_insert_with(new_table).merge_from(table, &mut scratch).unwrap();
                }
                let want = values(fresh.as_ref());
                match &sliding {
                    // Multiples of 1/4 in a few slices: float sums merged afresh are exact too.
                    Sliding::Running(_) => prop_assert_eq!(&got, &want, "instance {}", m),
                    Sliding::Stacks(_) => prop_assert!(close(&got, &want), "instance {}: {:?} against {:?}", m, got, want),
                }
                // What the operator drops before the next instance.
                let keep_from = sliding.oldest_needed().map_or(first + 1, |k| k.min(first + 1));
                tables.retain(|&k, _| k >= keep_from);
                slices.retain(|&k, _| k >= keep_from);
                if saves[m as usize] {
                    let mut w = StateWriter::default();
                    sliding.encode(&mut w);
                    let bytes = w.into_bytes();
                    sliding = Sliding::decode(&plan, &mut StateReader::new(&bytes)).unwrap();
                }
            }
            prop_assert_eq!(matches!(sliding, Sliding::Stacks(_)), tiny_slice.is_some());
        }
    }
}
