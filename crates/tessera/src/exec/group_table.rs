//! `GroupTable`: the partial states of every group key seen in one slice or window instance,
//! one state column per aggregate, addressed by interned key id. The unit of window state.

use arrow::array::ArrayRef;

use crate::aggregate::GroupStates;
use crate::error::{Result, TesseraError};
use crate::plan::WindowAggregatePlan;
use crate::state::codec::{StateReader, StateWriter};

const NO_SLOT: u32 = u32::MAX;

/// Key ids below this always fit a dense index.
const DENSE_FLOOR: usize = 4096;

/// Where each key id's slot is: a dense array indexed by key id while the table holds a fair
/// share of the ids up to its largest one, a hash map when it holds few keys with large ids
/// (sparse keys over many slices would otherwise pay an array of every key per slice).
#[derive(Clone)]
enum SlotIndex {
    /// `NO_SLOT` where a key has no state here.
    Dense(Vec<u32>),
    Sparse {
        slots: hashbrown::HashMap<u32, u32>,
        max_key: u32,
    },
}

/// Whether a dense index up to `key` is worth it for a table of `keys` keys.
fn dense_fits(key: u32, keys: usize) -> bool {
    (key as usize) < DENSE_FLOOR.max(8 * (keys + 1))
}

/// The slot of `key` in a sparse index, creating it.
fn sparse_slot(slots: &mut hashbrown::HashMap<u32, u32>, max_key: &mut u32, keys: &mut Vec<u32>, key: u32) -> u32 {
    *max_key = (*max_key).max(key);
    *slots.entry(key).or_insert_with(|| {
        keys.push(key);
        keys.len() as u32 - 1
    })
}

/// Emptied tables kept for reuse: a new slice or instance takes one whose buffers already
/// have the size a table of this operator needs, instead of growing fresh ones. A few only,
/// so memory stays bounded.
#[derive(Default)]
pub(super) struct TablePool {
    spare: Vec<GroupTable>,
}

impl TablePool {
    const SPARE: usize = 4;

    /// An empty table for `plan`.
    pub(super) fn take(&mut self, plan: &WindowAggregatePlan) -> GroupTable {
        self.spare.pop().unwrap_or_else(|| GroupTable::new(plan))
    }

    /// The memory the spare tables keep.
    pub(super) fn bytes(&self) -> usize {
        self.spare.iter().map(GroupTable::bytes).sum()
    }

    /// Takes back a table nobody needs any more.
    pub(super) fn give(&mut self, mut table: GroupTable) {
        if self.spare.len() < Self::SPARE {
            table.clear();
            self.spare.push(table);
        }
    }
}

/// Tables by instance or slice index, in index order. An operator holds a few at a time per
/// node, added mostly at the back and dropped from the front: a sorted deque, where a B-tree's
/// inserts and removals took a tenth of a run whose instances hold a few keys each.
#[derive(Default)]
pub(super) struct Tables {
    entries: std::collections::VecDeque<(i64, GroupTable)>,
}

impl Tables {
    /// Where `index` is, or would go.
    fn find(&self, index: i64) -> std::result::Result<usize, usize> {
        match self.entries.back() {
            Some(&(last, _)) if last < index => Err(self.entries.len()),
            _ => self.entries.binary_search_by_key(&index, |&(k, _)| k),
        }
    }

    pub(super) fn get(&self, index: i64) -> Option<&GroupTable> {
        self.find(index).ok().map(|i| &self.entries[i].1)
    }

    /// The table of `index`, made by `new` if there is none.
    pub(super) fn get_or_insert_with(&mut self, index: i64, new: impl FnOnce() -> GroupTable) -> &mut GroupTable {
        let i = self.find(index).unwrap_or_else(|i| {
            self.entries.insert(i, (index, new()));
            i
        });
        &mut self.entries[i].1
    }

    pub(super) fn insert(&mut self, index: i64, table: GroupTable) {
        match self.find(index) {
            Ok(i) => self.entries[i].1 = table,
            Err(i) => self.entries.insert(i, (index, table)),
        }
    }

    pub(super) fn remove(&mut self, index: i64) -> Option<GroupTable> {
        let i = self.find(index).ok()?;
        self.entries.remove(i).map(|(_, table)| table)
    }

    /// Removes the first table if its index is below `index`.
    pub(super) fn pop_below(&mut self, index: i64) -> Option<GroupTable> {
        match self.entries.front() {
            Some(&(first, _)) if first < index => self.entries.pop_front().map(|(_, table)| table),
            _ => None,
        }
    }

    /// The tables whose indexes are in `range`, in order.
    pub(super) fn range(
        &self,
        range: impl std::ops::RangeBounds<i64>,
    ) -> impl Iterator<Item = (i64, &GroupTable)> + '_ {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let first = |pred: &dyn Fn(i64) -> bool| self.entries.partition_point(|&(k, _)| pred(k));
        let start = match range.start_bound() {
            Included(&a) => first(&|k| k < a),
            Excluded(&a) => first(&|k| k <= a),
            Unbounded => 0,
        };
        let end = match range.end_bound() {
            Included(&b) => first(&|k| k <= b),
            Excluded(&b) => first(&|k| k < b),
            Unbounded => self.entries.len(),
        };
        self.entries.range(start..end.max(start)).map(|(k, table)| (*k, table))
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (i64, &mut GroupTable)> + '_ {
        self.entries.iter_mut().map(|(k, table)| (*k, table))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &GroupTable> + '_ {
        self.entries.iter().map(|(_, table)| table)
    }
}

impl FromIterator<(i64, GroupTable)> for Tables {
    /// Tables from entries in any order (a later entry of an index replaces an earlier one).
    fn from_iter<I: IntoIterator<Item = (i64, GroupTable)>>(entries: I) -> Self {
        let mut tables = Tables::default();
        for (index, table) in entries {
            tables.insert(index, table);
        }
        tables
    }
}

/// Partial states of every group seen in one slice (or, while emitting, one window).
pub(super) struct GroupTable {
    /// Slot of each interned key id.
    index: SlotIndex,
    /// Key id of each slot.
    pub(super) keys: Vec<u32>,
    /// One state column per aggregate.
    pub(super) states: Vec<Box<dyn GroupStates>>,
    /// Changed since it was last saved to the state store (or made): the table manager
    /// writes it at the next eviction or checkpoint, and clears this.
    pub(super) changed: bool,
}

impl Clone for GroupTable {
    fn clone(&self) -> Self {
        GroupTable { index: self.index.clone(), keys: self.keys.clone(), states: self.states.clone(), changed: true }
    }

    /// A copy into this table's buffers.
    fn clone_from(&mut self, source: &Self) {
        self.changed = true;
        match (&mut self.index, &source.index) {
            (SlotIndex::Dense(mine), SlotIndex::Dense(theirs)) => mine.clone_from(theirs),
            (mine, theirs) => *mine = theirs.clone(),
        }
        self.keys.clone_from(&source.keys);
        self.states.truncate(source.states.len());
        for (mine, theirs) in self.states.iter_mut().zip(&source.states) {
            if !mine.copy_from(theirs.as_ref()) {
                *mine = theirs.clone();
            }
        }
        self.states.extend(source.states[self.states.len()..].iter().cloned());
    }
}

impl GroupTable {
    pub(super) fn new(plan: &WindowAggregatePlan) -> Self {
        GroupTable {
            index: SlotIndex::Dense(Vec::new()),
            keys: Vec::new(),
            states: plan.aggregates.iter().map(|a| a.new_states()).collect(),
            changed: true,
        }
    }

    /// Empties the table, keeping its buffers.
    pub(super) fn clear(&mut self) {
        self.changed = true;
        match &mut self.index {
            // The index keeps its length, so that the next slice's keys find their entries
            // there (see `slots_for`); only the entries in use are reset.
            SlotIndex::Dense(dense) => self.keys.iter().for_each(|&k| dense[k as usize] = NO_SLOT),
            SlotIndex::Sparse { .. } => self.index = SlotIndex::Dense(Vec::new()),
        }
        self.keys.clear();
        self.states.iter_mut().for_each(|s| s.resize(0));
    }

    /// The slot of `key`, if it has state here.
    pub(super) fn slot_of(&self, key: u32) -> Option<u32> {
        match &self.index {
            SlotIndex::Dense(dense) => dense.get(key as usize).copied().filter(|&s| s != NO_SLOT),
            SlotIndex::Sparse { slots, .. } => slots.get(&key).copied(),
        }
    }

    /// Slots for `key_ids`, creating missing ones.
    pub(super) fn slots_for(&mut self, key_ids: &[u32], out: &mut Vec<u32>) {
        // Every caller changes the states of these slots.
        self.changed = true;
        out.clear();
        out.resize(key_ids.len(), NO_SLOT);
        let mut i = 0;
        while i < key_ids.len() {
            // Most keys have an entry in a dense index: a tight loop, which also makes the
            // slots of keys new here, up to the first key past the index, which gets its slot
            // made outside (the index may change shape).
            if let SlotIndex::Dense(dense) = &mut self.index {
                for (slot, &key) in out[i..].iter_mut().zip(&key_ids[i..]) {
                    let Some(entry) = dense.get_mut(key as usize) else { break };
                    if *entry == NO_SLOT {
                        *entry = self.keys.len() as u32;
                        self.keys.push(key);
                    }
                    *slot = *entry;
                    i += 1;
                }
            }
            if let Some(&key) = key_ids.get(i) {
                out[i] = self.slot(key);
                i += 1;
            }
        }
        let n = self.keys.len();
        for s in &mut self.states {
            if s.len() < n {
                s.resize(n);
            }
        }
    }

    /// The slot of `key`, created if missing (the index may turn sparse or dense).
    fn slot(&mut self, key: u32) -> u32 {
        let GroupTable { index, keys, .. } = self;
        match index {
            SlotIndex::Dense(dense) if (key as usize) < dense.len() || dense_fits(key, keys.len()) => {
                let k = key as usize;
                if k >= dense.len() {
                    dense.resize(k + 1, NO_SLOT);
                }
                if dense[k] == NO_SLOT {
                    dense[k] = keys.len() as u32;
                    keys.push(key);
                }
                dense[k]
            }
            SlotIndex::Dense(dense) => {
                let slots = dense.iter().enumerate().filter(|(_, &s)| s != NO_SLOT).map(|(k, &s)| (k as u32, s));
                let mut slots: hashbrown::HashMap<u32, u32> = slots.collect();
                let mut max_key = slots.keys().copied().max().unwrap_or(0);
                let slot = sparse_slot(&mut slots, &mut max_key, keys, key);
                *index = SlotIndex::Sparse { slots, max_key };
                slot
            }
            SlotIndex::Sparse { slots, max_key } => {
                let slot = sparse_slot(slots, max_key, keys, key);
                // Turn dense once the keys fill a fair share of the ids up to the largest.
                if dense_fits(*max_key, keys.len()) {
                    let mut dense = vec![NO_SLOT; *max_key as usize + 1];
                    for (&k, &s) in slots.iter() {
                        dense[k as usize] = s;
                    }
                    *index = SlotIndex::Dense(dense);
                }
                slot
            }
        }
    }

    /// Adds the rows starting at `offset` whose keys are `key_ids`.
    pub(super) fn add_rows(&mut self, key_ids: &[u32], offset: usize, args: &[Vec<ArrayRef>], scratch: &mut Vec<u32>) {
        self.slots_for(key_ids, scratch);
        for (state, args) in self.states.iter_mut().zip(args) {
            state.update(args, offset, scratch);
        }
    }

    pub(super) fn merge_from(&mut self, other: &GroupTable, scratch: &mut Vec<u32>) -> Result<()> {
        if self.keys.is_empty() {
            self.clone_from(other);
            return Ok(());
        }
        self.slots_for(&other.keys, scratch);
        for (mine, theirs) in self.states.iter_mut().zip(&other.states) {
            mine.merge(theirs.as_ref(), None, scratch)?;
        }
        Ok(())
    }

    /// Merges the states `other` holds for `keys` (ids, without repeats); returns how many
    /// of them it held.
    pub(super) fn merge_keys_from(
        &mut self,
        other: &GroupTable,
        keys: &[u32],
        scratch: &mut Vec<u32>,
    ) -> Result<usize> {
        let (present, src): (Vec<u32>, Vec<u32>) =
            keys.iter().filter_map(|&k| other.slot_of(k).map(|s| (k, s))).unzip();
        self.slots_for(&present, scratch);
        for (mine, theirs) in self.states.iter_mut().zip(&other.states) {
            mine.merge(theirs.as_ref(), Some(&src), scratch)?;
        }
        Ok(present.len())
    }

    pub(super) fn encode(&self, w: &mut StateWriter) {
        w.u32s(&self.keys);
        self.states.iter().for_each(|s| s.encode(w));
    }

    /// A table written by [`encode`](Self::encode) for the same plan.
    pub(super) fn decode(plan: &WindowAggregatePlan, r: &mut StateReader) -> Result<Self> {
        let mut table = GroupTable::new(plan);
        let keys = r.u32s()?;
        let mut slots = Vec::new();
        table.slots_for(&keys, &mut slots);
        for state in &mut table.states {
            state.decode(r)?;
        }
        if slots.iter().enumerate().any(|(i, &s)| s as usize != i) || table.states.iter().any(|s| s.len() != keys.len())
        {
            return Err(TesseraError::Checkpoint("a saved group table is inconsistent".into()));
        }
        table.changed = false;
        Ok(table)
    }

    pub(super) fn bytes(&self) -> usize {
        let index = match &self.index {
            SlotIndex::Dense(dense) => dense.capacity() * 4,
            SlotIndex::Sparse { slots, .. } => slots.capacity() * 9,
        };
        index + self.keys.capacity() * 4 + self.states.iter().map(|s| s.bytes()).sum::<usize>()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::plan::BranchPlan;

    /// The plan of a window query grouping `v DOUBLE` by `k` with `aggregates`.
    pub(in crate::exec) fn plan_of(aggregates: &str) -> std::sync::Arc<WindowAggregatePlan> {
        let script = crate::engine::Script::compile(
            &format!("CREATE SOURCE s (k BIGINT, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'unused.csv');
             SELECT k, window_start, window_end, {aggregates} FROM TUMBLE(s, ts, INTERVAL '1' SECOND) GROUP BY k, window_start, window_end;"),
            std::path::Path::new("."),
        )
        .expect("script");
        match &script.queries[0].branches[0] {
            BranchPlan::WindowAggregate(plan) => plan.clone(),
            BranchPlan::Stateless(_) | BranchPlan::Temporal(_) | BranchPlan::Prefix(_) => panic!("a window query"),
        }
    }

    proptest::proptest! {
        /// Tables keep the order and contents of a B-tree map under any inserts, removals,
        /// drops from the front and range queries.
        #[test]
        fn tables_behave_as_an_ordered_map(ops in proptest::collection::vec((0u8..5, -20i64..20, -20i64..20), 0..80)) {
            let plan = plan_of("SUM(v)");
            let table_of = |k: i64| {
                let mut table = GroupTable::new(&plan);
                table.slots_for(&[k.unsigned_abs() as u32], &mut Vec::new());
                table
            };
            let key = |t: &GroupTable| t.keys[0];
            let mut tables = Tables::default();
            let mut map = std::collections::BTreeMap::new();
            for (op, a, b) in ops {
                match op {
                    0 => {
                        tables.insert(a, table_of(b));
                        map.insert(a, b.unsigned_abs() as u32);
                    }
                    1 => {
                        let got = key(tables.get_or_insert_with(a, || table_of(b)));
                        proptest::prop_assert_eq!(got, *map.entry(a).or_insert(b.unsigned_abs() as u32));
                    }
                    2 => proptest::prop_assert_eq!(tables.remove(a).map(|t| key(&t)), map.remove(&a)),
                    3 => {
                        while let Some(t) = tables.pop_below(a) {
                            let (first, k) = map.pop_first().expect("the map holds it too");
                            proptest::prop_assert!(first < a);
                            proptest::prop_assert_eq!(key(&t), k);
                        }
                        proptest::prop_assert!(map.first_key_value().is_none_or(|(&first, _)| first >= a));
                    }
                    _ => {
                        let got: Vec<(i64, u32)> = tables.range(a..=b).map(|(k, t)| (k, key(t))).collect();
                        let want: Vec<(i64, u32)> =
                            if a <= b { map.range(a..=b).map(|(&k, &v)| (k, v)).collect() } else { Vec::new() };
                        proptest::prop_assert_eq!(got, want);
                        let after: Vec<i64> = tables.range(a..).map(|(k, _)| k).collect();
                        proptest::prop_assert_eq!(after, map.range(a..).map(|(&k, _)| k).collect::<Vec<_>>());
                    }
                }
                proptest::prop_assert_eq!(tables.values().count(), map.len());
                proptest::prop_assert_eq!(tables.get(a).map(key), map.get(&a).copied());
            }
        }
    }

    #[test]
    fn few_keys_with_large_ids_index_sparsely_and_many_densely() {
        let plan = plan_of("SUM(v)");
        let mut table = GroupTable::new(&plan);
        let mut slots = Vec::new();
        // Two keys with large ids: a hash map, not an array of a million slots.
        table.slots_for(&[1_000_000, 7], &mut slots);
        assert_eq!(slots, [0, 1]);
        assert!(matches!(table.index, SlotIndex::Sparse { .. }));
        assert!(table.bytes() < 10_000, "{}", table.bytes());
        // Enough keys below the largest id make it dense again, slots unchanged.
        table.slots_for(&(100_000..230_000).collect::<Vec<_>>(), &mut slots);
        assert!(matches!(table.index, SlotIndex::Dense(_)));
        assert_eq!((table.slot_of(1_000_000), table.slot_of(7), table.slot_of(100_000)), (Some(0), Some(1), Some(2)));
        assert_eq!(table.slot_of(8), None);
        // Merging a sparse table's keys and a round trip through the codec keep every slot.
        let mut sparse = GroupTable::new(&plan);
        sparse.slots_for(&[900_000, 5], &mut slots);
        let mut merged = GroupTable::new(&plan);
        assert_eq!(merged.merge_keys_from(&sparse, &[5, 6, 900_000], &mut slots).unwrap(), 2);
        assert_eq!(merged.keys, [5, 900_000]);
        let mut w = StateWriter::default();
        merged.encode(&mut w);
        let bytes = w.into_bytes();
        let back = GroupTable::decode(&plan, &mut StateReader::new(&bytes)).unwrap();
        assert_eq!((back.slot_of(5), back.slot_of(900_000), back.slot_of(6)), (Some(0), Some(1), None));
    }

    #[test]
    fn a_cleared_table_reused_holds_only_its_new_keys() {
        let plan = plan_of("COUNT(*)");
        let mut table = GroupTable::new(&plan);
        let mut slots = Vec::new();
        table.slots_for(&[3, 9, 3, 1], &mut slots);
        assert_eq!(slots, [0, 1, 0, 2]);
        table.clear();
        assert_eq!((table.slot_of(3), table.slot_of(9), table.slot_of(1)), (None, None, None));
        // Keys inside the index kept from before and one past it, first seen in any order.
        table.slots_for(&[9, 20, 2, 9], &mut slots);
        assert_eq!(slots, [0, 1, 2, 0]);
        assert_eq!(table.keys, [9, 20, 2]);
        assert_eq!((table.slot_of(3), table.slot_of(20)), (None, Some(1)));
        assert_eq!(table.states[0].len(), 3);
    }
}
