//! The sliding aggregator of a hopping window over slices ([`Sliding`]): a running value
//! where the aggregates have an exact inverse, two stacks ([`TwoStacks`]) otherwise.
//!
//! A [`RunningWindow`] keeps the states of the last instance and moves to the next by adding
//! the slices that enter it and subtracting those that leave: two merges a slide, whatever
//! the range, and no stacks of partial aggregates to build and keep. It serves COUNT and
//! SUM and AVG. Subtracting must not drift, so the states are added and taken away exactly
//! ([`InvertibleStates::add_exactly`](crate::aggregate::InvertibleStates::add_exactly): float sums are
//! exact sums rounded once when read), and an instance's value is the exact sum of its
//! slices, the same bits as two stacks or any other plan give.
//!
//! A key stays in the running states while any counted slice holds it; keys that left every
//! counted slice are dropped before an instance is returned. Rows arriving late in a slice the
//! running value counts take their keys' states out and back in (two merges a key), where
//! two stacks rebuild the next instance from all its slices. Where late rows between two
//! instances would cost more than counting the next one afresh, it is counted afresh; where
//! that goes on instance after instance, the window goes on with two stacks (exact merges
//! cost about twice float ones, and such a window is rebuilt at every instance anyway).

use std::borrow::Cow;
use std::collections::VecDeque;

use super::group_table::GroupTable;
use super::state_tables::{decode_running, TableName, TableRef, TableRole};
use super::two_stacks::{InstanceSlices, TwoStacks};
use crate::error::{Result, TesseraError};
use crate::physical::SlidingAggregator;
use crate::plan::WindowAggregatePlan;
use crate::state::codec::{StateReader, StateWriter};

/// Why a running value gives up (logged).
const NO_INVERSE: &str = "an aggregate's states cannot be taken away again";
const LATE: &str = "late rows cost a running value more than counting instances afresh";
/// Late rows may always merge this many keys' worth between two instances.
const LATE_FLOOR: u64 = 1024;

/// The instances of one hopping window, combined from its slices as it slides.
pub(super) enum Sliding {
    Running(RunningWindow),
    Stacks(TwoStacks),
}

impl Sliding {
    /// The `aggregator` the physical plan chose, for windows of `plan`.
    pub(super) fn new(aggregator: SlidingAggregator, plan: &WindowAggregatePlan) -> Self {
        match aggregator {
            SlidingAggregator::RunningValue => Sliding::Running(RunningWindow::new(GroupTable::new(plan))),
            SlidingAggregator::TwoStacks => Sliding::Stacks(TwoStacks::default()),
        }
    }

    /// The aggregator this is.
    pub(super) fn aggregator(&self) -> SlidingAggregator {
        match self {
            Sliding::Running(_) => SlidingAggregator::RunningValue,
            Sliding::Stacks(_) => SlidingAggregator::TwoStacks,
        }
    }

    /// Rows with `keys` (ids, repeats allowed) are about to be added to slice `slice`, now
    /// `table`: a running value that counted the slice takes those keys' states out; two
    /// stacks forget the aggregates that include the slice.
    pub(super) fn before_rows(
        &mut self,
        (slice, table, keys): (i64, &GroupTable, &[u32]),
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) {
        match self {
            Sliding::Running(running) => {
                if let Err(reason) = running.late_rows((slice, table, keys), true, scratch, slice_reads) {
                    self.give_up(reason);
                }
            }
            Sliding::Stacks(stacks) => stacks.invalidate(slice),
        }
    }

    /// ... and were added: a running value whose instance spans the slice counts those keys'
    /// states again (a slice that had no data is counted from now on), so a late row costs
    /// two merges of its key's state, not a rebuild of the instance (see the module's notes
    /// on many late rows).
    pub(super) fn after_rows(
        &mut self,
        (slice, table, keys): (i64, &GroupTable, &[u32]),
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) {
        if let Sliding::Running(running) = self {
            if let Err(reason) = running.late_rows((slice, table, keys), false, scratch, slice_reads) {
                self.give_up(reason);
            }
        }
    }

    /// The window goes on with two stacks, built afresh, for `reason`.
    fn give_up(&mut self, reason: &str) {
        tracing::debug!("{reason}: the window goes on with two stacks");
        *self = Sliding::Stacks(TwoStacks::default());
    }

    /// The merge of the instance's slices with data, `None` if all are empty; `slice_reads`
    /// counts the slices' group states read. Instances come in order (`first` and `last`
    /// never decrease; one ending before the last one is rebuilt).
    pub(super) fn window<'a>(
        &'a mut self,
        instance: &InstanceSlices,
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) -> Result<Option<Cow<'a, GroupTable>>> {
        if let Sliding::Running(running) = self {
            if !running.slide(instance, scratch, slice_reads)? {
                self.give_up(NO_INVERSE);
            }
        }
        match self {
            Sliding::Running(running) => Ok(running.current().map(Cow::Borrowed)),
            Sliding::Stacks(stacks) => stacks.window(instance, scratch, slice_reads),
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

    /// Writes the aggregator's kind and position; its tables are saved one by one.
    pub(super) fn encode_progress(&self, w: &mut StateWriter) {
        match self {
            Sliding::Running(running) => {
                w.bool(true);
                running.encode_progress(w);
            }
            Sliding::Stacks(stacks) => {
                w.bool(false);
                stacks.encode_progress(w);
            }
        }
    }

    /// The aggregator [`encode_progress`](Self::encode_progress) wrote, its tables to come.
    pub(super) fn decode_progress(plan: &WindowAggregatePlan, r: &mut StateReader) -> Result<Self> {
        Ok(if r.bool()? {
            let mut running = RunningWindow::new(GroupTable::new(plan));
            running.decode_progress(r)?;
            Sliding::Running(running)
        } else {
            Sliding::Stacks(TwoStacks::decode_progress(r)?)
        })
    }

    /// Hands `visit` the aggregator's tables (see [`WindowAggregateExec::visit_tables`]).
    ///
    /// [`WindowAggregateExec::visit_tables`]: super::window_aggregate::WindowAggregateExec::visit_tables
    pub(super) fn visit_tables(
        &mut self,
        node: u16,
        visit: &mut dyn FnMut(TableName, TableRef<'_>) -> Result<()>,
    ) -> Result<()> {
        match self {
            Sliding::Running(running) => visit(
                TableName { role: TableRole::Running, node, index: 0 },
                TableRef::Running { table: &mut running.table, holders: &running.holders },
            ),
            Sliding::Stacks(stacks) => stacks.visit_tables(node, visit),
        }
    }

    /// Puts back a table [`visit_tables`](Self::visit_tables) named.
    pub(super) fn insert_table(
        &mut self,
        name: TableName,
        plan: &WindowAggregatePlan,
        r: &mut StateReader,
    ) -> Result<()> {
        match (self, name.role) {
            (Sliding::Running(running), TableRole::Running) => {
                let (table, holders) = decode_running(plan, r)?;
                running.absent = holders.iter().filter(|&&h| h == 0).count();
                running.held = holders.iter().map(|&h| u64::from(h)).sum();
                running.table = table;
                running.holders = holders;
                Ok(())
            }
            (Sliding::Stacks(stacks), TableRole::StackBack | TableRole::StackFront) => {
                stacks.insert_table(name, GroupTable::decode(plan, r)?);
                Ok(())
            }
            _ => Err(TesseraError::Checkpoint(format!(
                "the state store holds a {:?} table for a window sliding otherwise",
                name.role
            ))),
        }
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
    /// Per slot, how many counted slices hold the key.
    holders: Vec<u32>,
    /// Slots no counted slice holds.
    absent: usize,
    /// The sum of `holders`: the key states counting the instance afresh would merge.
    held: u64,
    /// What merging late rows cost since the last instance (see `afford`).
    late_merges: u64,
    /// Instances in a row whose late rows cost more than counting them afresh.
    strikes: u32,
    /// A late run's distinct keys held by its slice, and their slots there (kept for reuse).
    late_keys: Vec<u32>,
    late_slots: Vec<u32>,
    /// The slices with data counted, oldest first.
    counted: VecDeque<i64>,
    /// The slices the states stand for, `from..=through`: those of the last instance, and up
    /// to `through` those with data are counted.
    span: Option<(i64, i64)>,
}

impl RunningWindow {
    fn new(table: GroupTable) -> Self {
        RunningWindow {
            table,
            holders: Vec::new(),
            absent: 0,
            held: 0,
            late_merges: 0,
            strikes: 0,
            late_keys: Vec::new(),
            late_slots: Vec::new(),
            counted: VecDeque::new(),
            span: None,
        }
    }

    /// Counts nothing any more, keeping the buffers.
    fn clear(&mut self) {
        self.table.clear();
        self.holders.clear();
        self.absent = 0;
        self.held = 0;
        self.counted.clear();
        self.span = None;
    }

    /// Whether late rows may go on merging a run of `keys` rows: while what late runs cost
    /// since the last instance (their keys, and `LATE_RUN` keys' worth a run for finding
    /// them) stays below what counting the instance afresh costs (or `LATE_FLOOR` keys'
    /// worth, for small instances). Beyond, the instance is counted afresh (its other late
    /// rows then cost nothing more); after `LATE_STRIKES` such instances in a row, the reason
    /// to give up on the running value.
    fn afford(&mut self, keys: usize) -> std::result::Result<bool, &'static str> {
        const LATE_RUN: u64 = 32;
        const LATE_STRIKES: u32 = 16;
        self.late_merges += keys as u64 + LATE_RUN;
        if self.late_merges <= self.held.max(LATE_FLOOR) {
            return Ok(true);
        }
        self.clear();
        self.strikes += 1;
        if self.strikes >= LATE_STRIKES {
            return Err(LATE);
        }
        Ok(false)
    }

    fn spans(&self, slice: i64) -> bool {
        self.span.is_some_and(|(from, through)| from <= slice && slice <= through)
    }

    /// See [`Sliding::before_rows`] (`subtract`) and [`Sliding::after_rows`]; the reason to
    /// give up on the running value, if any.
    fn late_rows(
        &mut self,
        (slice, table, keys): (i64, &GroupTable, &[u32]),
        subtract: bool,
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) -> std::result::Result<(), &'static str> {
        // Before the rows, only a counted slice has states to take out.
        if !self.spans(slice) || (subtract && self.counted.binary_search(&slice).is_err()) {
            return Ok(());
        }
        if !self.afford(keys.len())? {
            return Ok(());
        }
        if let Err(at) = self.counted.binary_search(&slice) {
            self.counted.insert(at, slice);
        }
        self.count_keys(table, keys, subtract, scratch, slice_reads).then_some(()).ok_or(NO_INVERSE)
    }

    /// Adds (or subtracts) the states `table` holds for `keys` (ids, repeats allowed).
    fn count_keys(
        &mut self,
        table: &GroupTable,
        keys: &[u32],
        subtract: bool,
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) -> bool {
        let (mut present, mut src) = (std::mem::take(&mut self.late_keys), std::mem::take(&mut self.late_slots));
        present.clear();
        present.extend_from_slice(keys);
        present.sort_unstable();
        present.dedup();
        src.clear();
        present.retain(|&k| table.slot_of(k).inspect(|&slot| src.push(slot)).is_some());
        *slice_reads += present.len() as u64;
        let exact = self.apply(table, &present, Some(&src), subtract, scratch);
        (self.late_keys, self.late_slots) = (present, src);
        exact
    }

    /// Moves to the instance of slices `first..=last`: subtracts the counted slices before
    /// `first`, adds those after the last counted up to `last`, and drops the keys no counted
    /// slice holds. False if an aggregate's states have no exact inverse (the states are then
    /// unusable).
    fn slide(&mut self, instance: &InstanceSlices, scratch: &mut Vec<u32>, slice_reads: &mut u64) -> Result<bool> {
        let &InstanceSlices { first, last, slices, new_table } = instance;
        if self.span.is_some_and(|(_, through)| last < through) {
            self.clear();
        }
        if self.counted.back().is_some_and(|&k| k < first) {
            // Every counted slice leaves: start afresh rather than subtract them all.
            let span = self.span;
            self.clear();
            self.span = span;
        }
        while let Some(&k) = self.counted.front().filter(|&&k| k < first) {
            // A counted slice is kept until it is subtracted (see `oldest_needed`); should one
            // be gone, count the instance afresh.
            let Some(slice) = slices.get(k) else {
                self.clear();
                break;
            };
            if !self.count(slice, true, scratch) {
                return Ok(false);
            }
            *slice_reads += slice.keys.len() as u64;
            self.counted.pop_front();
        }
        let from = self.span.map_or(first, |(_, through)| first.max(through + 1));
        if from <= last {
            for (k, slice) in slices.range(from..=last) {
                if !self.count(slice, false, scratch) {
                    return Ok(false);
                }
                *slice_reads += slice.keys.len() as u64;
                self.counted.push_back(k);
            }
        }
        self.span = Some((first, self.span.map_or(last, |(_, through)| through.max(last))));
        if self.late_merges <= self.held.max(LATE_FLOOR) {
            self.strikes = 0;
        }
        self.late_merges = 0;
        if self.absent > 0 {
            self.compact(new_table, scratch)?;
        }
        Ok(true)
    }

    /// Adds (or subtracts) a slice's states and who holds each key.
    fn count(&mut self, slice: &GroupTable, subtract: bool, scratch: &mut Vec<u32>) -> bool {
        self.apply(slice, &slice.keys, None, subtract, scratch)
    }

    /// Adds (or subtracts) the states of `keys` in `slice`, at its slots `src` (`None`: every
    /// slot, `keys` being the slice's keys), and counts the slice as a holder of each.
    fn apply(
        &mut self,
        slice: &GroupTable,
        keys: &[u32],
        src: Option<&[u32]>,
        subtract: bool,
        scratch: &mut Vec<u32>,
    ) -> bool {
        let before = self.table.keys.len();
        self.table.slots_for(keys, scratch);
        let RunningWindow { table, holders, absent, held, .. } = self;
        for (mine, theirs) in table.states.iter_mut().zip(&slice.states) {
            let Some(invertible) = mine.invertible() else { return false };
            if invertible.add_exactly(theirs.as_ref(), src, scratch, subtract).is_err() {
                return false;
            }
        }
        // New slots are held by no slice until this one is counted.
        *absent += table.keys.len() - before;
        if subtract {
            *held -= scratch.len() as u64;
        } else {
            *held += scratch.len() as u64;
        }
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
        self.holders = held.iter().map(|&s| self.holders[s]).collect();
        self.absent = 0;
        self.table = compacted;
        Ok(())
    }

    /// The current instance's states, `None` if no counted slice has data.
    fn current(&self) -> Option<&GroupTable> {
        (!self.table.keys.is_empty()).then_some(&self.table)
    }

    /// Writes where the running value stands; its states and holders are a table of their
    /// own (saved with their exact sums, so a resumed run goes on from the same exact values,
    /// and its results are the same to the bit).
    fn encode_progress(&self, w: &mut StateWriter) {
        w.i64s(&self.counted.iter().copied().collect::<Vec<_>>());
        w.bool(self.span.is_some());
        let (from, through) = self.span.unwrap_or_default();
        w.i64(from);
        w.i64(through);
        w.u64(self.late_merges);
        w.u32(self.strikes);
    }

    fn decode_progress(&mut self, r: &mut StateReader) -> Result<()> {
        self.counted = r.i64s()?.into();
        let spanned = r.bool()?;
        let span = (r.i64()?, r.i64()?);
        self.span = spanned.then_some(span);
        self.late_merges = r.u64()?;
        self.strikes = r.u32()?;
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.table.bytes() + self.holders.capacity() * 4 + self.counted.capacity() * 8
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
    use crate::exec::group_table::Tables;

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
        let values: Vec<_> = plan.aggregates.iter().map(|a| a.evaluate_args(&batch).unwrap()).collect();
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

    /// The aggregator rebuilt from its progress and its tables, saved one by one as the key
    /// groups' table manager saves them.
    fn saved_and_restored(sliding: &mut Sliding, plan: &WindowAggregatePlan) -> Sliding {
        let mut w = StateWriter::default();
        sliding.encode_progress(&mut w);
        let progress = w.into_bytes();
        let mut tables = Vec::new();
        sliding
            .visit_tables(0, &mut |name, table| {
                let mut w = StateWriter::default();
                table.encode(&mut w);
                tables.push((name, w.into_bytes()));
                Ok(())
            })
            .unwrap();
        let mut restored = Sliding::decode_progress(plan, &mut StateReader::new(&progress)).unwrap();
        for (name, bytes) in tables {
            let mut r = StateReader::new(&bytes);
            restored.insert_table(name, plan, &mut r).unwrap();
            r.finish().unwrap();
        }
        restored
    }

    #[test]
    fn counts_and_sums_slide_on_a_running_value() {
        let running = |aggregates: &str| {
            SlidingAggregator::for_aggregates(&plan_of(aggregates).aggregates) == SlidingAggregator::RunningValue
        };
        assert!(running("COUNT(*), COUNT(v)"));
        assert!(running("SUM(v), AVG(v), COUNT(*)"));
        assert!(!running("MIN(v), COUNT(*)"));
        assert!(!running("VAR_SAMP(v)"));
    }

    proptest! {
        /// Sliding over slices with keys coming and going, empty slices, rows arriving in a
        /// slice already counted (or spanned while empty), slices dropped as soon as the operator may drop them, and
        /// the state saved and restored between instances: every instance equals its slices
        /// merged afresh, to the bit, also with values far apart in magnitude.
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
                // A value a float sum of its slice would lose.
                let key = pending[t][0].0;
                pending[t].push((key, 1e-30));
            }
            let mut slices: BTreeMap<i64, Vec<(u32, f64)>> = BTreeMap::new();
            let mut tables = Tables::default();
            let mut sliding = Sliding::new(SlidingAggregator::for_aggregates(&plan.aggregates), &plan);
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
                    let before = tables.remove(target).unwrap_or_else(new_table);
                    sliding.before_rows((target, &before, &[key, key]), &mut scratch, &mut reads);
                    let rows = slices.entry(target).or_default();
                    rows.push((key, f64::from(v) / 4.0));
                    let after = slice(&plan, rows);
                    sliding.after_rows((target, &after, &[key, key]), &mut scratch, &mut reads);
                    tables.insert(target, after);
                }
                let instance = InstanceSlices { first, last, slices: &tables, new_table: &new_table };
                let got = values(sliding.window(&instance, &mut scratch, &mut reads).unwrap().as_deref());
                let mut fresh: Option<GroupTable> = None;
                for (_, table) in tables.range(first..=last) {
                    fresh.get_or_insert_with(new_table).merge_from(table, &mut scratch).unwrap();
                }
                let want = values(fresh.as_ref());
                prop_assert_eq!(&got, &want, "instance {}", m);
                // What the operator drops before the next instance.
                let keep_from = sliding.oldest_needed().map_or(first + 1, |k| k.min(first + 1));
                while tables.pop_below(keep_from).is_some() {}
                slices.retain(|&k, _| k >= keep_from);
                if saves[m as usize] {
                    sliding = saved_and_restored(&mut sliding, &plan);
                }
            }
            // The few late rows here cost less than a rebuild.
            prop_assert!(matches!(sliding, Sliding::Running(_)));
        }
    }
}
