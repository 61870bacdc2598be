//! `GroupTable`: the partial states of every group key seen in one slice or window instance,
//! one state column per aggregate, addressed by interned key id. The unit of window state.

use arrow::array::ArrayRef;

use crate::aggregate::GroupStates;
use crate::error::{Result, TesseraError};
use crate::plan::WindowAggregatePlan;
use crate::state::codec::{StateReader, StateWriter};

const NO_SLOT: u32 = u32::MAX;

/// Partial states of every group seen in one slice (or, while emitting, one window).
#[derive(Clone)]
pub(super) struct GroupTable {
    /// Slot of each interned key id, `NO_SLOT` if the key has no state here.
    slot_of_key: Vec<u32>,
    /// Key id of each slot.
    pub(super) keys: Vec<u32>,
    /// One state column per aggregate.
    pub(super) states: Vec<GroupStates>,
}

impl GroupTable {
    pub(super) fn new(plan: &WindowAggregatePlan) -> Self {
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

    /// Adds the rows starting at `offset` whose keys are `key_ids`.
    pub(super) fn add_rows(
        &mut self,
        key_ids: &[u32],
        offset: usize,
        values: &[Option<ArrayRef>],
        scratch: &mut Vec<u32>,
    ) {
        self.slots_for(key_ids.iter().copied(), scratch);
        for (state, value) in self.states.iter_mut().zip(values) {
            state.update(value.as_ref(), offset, scratch);
        }
    }

    pub(super) fn merge_from(&mut self, other: &GroupTable, scratch: &mut Vec<u32>) -> Result<()> {
        self.slots_for(other.keys.iter().copied(), scratch);
        for (mine, theirs) in self.states.iter_mut().zip(&other.states) {
            mine.merge(theirs, scratch)?;
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
        let (present, src): (Vec<u32>, Vec<u32>) = keys
            .iter()
            .filter_map(|&k| other.slot_of_key.get(k as usize).filter(|&&s| s != NO_SLOT).map(|&s| (k, s)))
            .unzip();
        self.slots_for(present.iter().copied(), scratch);
        for (mine, theirs) in self.states.iter_mut().zip(&other.states) {
            mine.merge_selected(theirs, &src, scratch)?;
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
        table.slots_for(keys.iter().copied(), &mut slots);
        for state in &mut table.states {
            state.decode(r)?;
        }
        if slots.iter().enumerate().any(|(i, &s)| s as usize != i) || table.states.iter().any(|s| s.len() != keys.len())
        {
            return Err(TesseraError::Checkpoint("a saved group table is inconsistent".into()));
        }
        Ok(table)
    }

    pub(super) fn bytes(&self) -> usize {
        self.slot_of_key.capacity() * 4
            + self.keys.capacity() * 4
            + self.states.iter().map(GroupStates::bytes).sum::<usize>()
    }
}
