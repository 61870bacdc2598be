//! The partitions of one synopsis (one block of a continuous temporal query) in groups, and
//! the table manager that keeps them within the operator's memory.
//!
//! Partition `id` belongs to group `id >> group_bits`; a group is one table of the state
//! store, held in memory as a synopsis of its partitions (a formula's [`Synopsis`], or
//! [`ChainSynopsis`] counters indexed by the id within the group). Partitions are independent:
//! a group's events need only reach it in time order, not with the other groups', so events
//! for a group that is evicted wait in memory, in time order, and are applied when it is
//! loaded: at once when it fits in the memory left, when its waiting events grow many, when
//! all waiting events outgrow a quarter of the memory (the group with the most is loaded), or
//! when an answer is read (every group in turn, each evicting the least recently used ones
//! it needs room from). Groups are evicted least recently used first, writing them only if
//! they changed since they were last written.
//!
//! Checkpoints write the groups in memory that changed (through [`Versions`], so a checkpoint
//! writes what changed and never copies the whole state); the snapshot holds each group's
//! version and its waiting events. A resumed run loads groups when their events arrive.

use std::sync::Arc;

use super::versions::Versions;
use super::SpillCounters;
use crate::error::Result;
use crate::state::codec::{StateReader, StateWriter};
use crate::synopsis::evaluator::{decode_count, decode_key, encode_count, encode_key};
use crate::synopsis::{ChainSynopsis, Count, Key, Program, Synopsis};

/// Events waiting for an evicted group before it is loaded to take them.
const WAITING_EVENTS: usize = 1 << 16;

/// The tag of a group's table name (after it: the block and the group).
pub(super) const GROUP_TABLE: u8 = 0;

/// The state of a group of partitions, as the manager holds, saves and feeds it.
pub(super) trait PartitionGroup: Sized {
    /// What the group takes, in time order.
    type Event;
    fn empty(program: &Arc<Program>) -> Result<Self>;
    fn apply(&mut self, event: Self::Event) -> Result<()>;
    fn encode(&self, w: &mut StateWriter);
    fn decode(program: &Arc<Program>, r: &mut StateReader) -> Result<Self>;
    /// The bytes it takes in memory.
    fn bytes(&self) -> usize;
    fn event_bytes(event: &Self::Event) -> usize;
    fn encode_event(event: &Self::Event, w: &mut StateWriter);
    fn decode_event(r: &mut StateReader) -> Result<Self::Event>;
}

/// A formula's group takes the events of one instant: `(atom, valuation, count)`.
impl PartitionGroup for Synopsis {
    type Event = (i64, Vec<(usize, Key, Count)>);

    fn empty(program: &Arc<Program>) -> Result<Self> {
        Ok(Synopsis::new(Arc::clone(program)))
    }

    fn apply(&mut self, (instant, events): Self::Event) -> Result<()> {
        Synopsis::apply(self, instant, events)
    }

    fn encode(&self, w: &mut StateWriter) {
        Synopsis::encode(self, w)
    }

    fn decode(program: &Arc<Program>, r: &mut StateReader) -> Result<Self> {
        Synopsis::decode(Arc::clone(program), r)
    }

    fn bytes(&self) -> usize {
        self.state_bytes()
    }

    fn event_bytes((_, events): &Self::Event) -> usize {
        32 + events.iter().map(|(_, key, _)| 48 + 8 * key.len()).sum::<usize>()
    }

    fn encode_event((instant, events): &Self::Event, w: &mut StateWriter) {
        w.i64(*instant);
        w.len(events.len());
        for (atom, key, count) in events {
            w.u32(*atom as u32);
            encode_key(w, key);
            encode_count(w, *count);
        }
    }

    fn decode_event(r: &mut StateReader) -> Result<Self::Event> {
        let instant = r.i64()?;
        let events = (0..r.len(28)?)
            .map(|_| Ok((r.u32()? as usize, decode_key(r)?, decode_count(r)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok((instant, events))
    }
}

/// A funnel's group takes one event at a time: its instant, its partition's id within the
/// group and its atom.
impl PartitionGroup for ChainSynopsis {
    type Event = (i64, u32, u32);

    fn empty(program: &Arc<Program>) -> Result<Self> {
        ChainSynopsis::new(Arc::clone(program))
    }

    #[inline]
    fn apply(&mut self, (instant, partition, atom): Self::Event) -> Result<()> {
        self.add(instant, partition, atom as usize, 1)
    }

    fn encode(&self, w: &mut StateWriter) {
        ChainSynopsis::encode(self, w)
    }

    fn decode(program: &Arc<Program>, r: &mut StateReader) -> Result<Self> {
        ChainSynopsis::decode(Arc::clone(program), r)
    }

    fn bytes(&self) -> usize {
        self.state_bytes()
    }

    fn event_bytes(_: &Self::Event) -> usize {
        std::mem::size_of::<Self::Event>()
    }

    fn encode_event(&(instant, partition, atom): &Self::Event, w: &mut StateWriter) {
        w.i64(instant);
        w.u32(partition);
        w.u32(atom);
    }

    fn decode_event(r: &mut StateReader) -> Result<Self::Event> {
        Ok((r.i64()?, r.u32()?, r.u32()?))
    }
}

struct Slot<G: PartitionGroup> {
    /// In memory, or `None` (evicted, or never made).
    group: Option<G>,
    /// Its version in the store and the bytes it took there.
    saved: Option<(u64, u64)>,
    /// Changed since it was last saved.
    changed: bool,
    /// Events waiting while it is evicted, in time order.
    waiting: Vec<G::Event>,
    waiting_bytes: u64,
    /// Its bytes in memory, as last seen there.
    bytes: u64,
    last_used: u64,
}

impl<G: PartitionGroup> Default for Slot<G> {
    fn default() -> Self {
        Slot { group: None, saved: None, changed: false, waiting: Vec::new(), waiting_bytes: 0, bytes: 0, last_used: 0 }
    }
}

pub(super) struct PartitionGroups<G: PartitionGroup> {
    program: Arc<Program>,
    /// The block of the query whose partitions these are (in table names).
    block: u16,
    slots: Vec<Slot<G>>,
    /// Bytes of the groups in memory, of the events waiting for evicted ones, and of what the
    /// block holds besides (interned values, events before the watermark).
    resident_bytes: u64,
    waiting_bytes: u64,
    other_bytes: u64,
    budget: u64,
    clock: u64,
    spill: SpillCounters,
}

impl<G: PartitionGroup> PartitionGroups<G> {
    /// The groups of `program`'s partitions for block `block`, in memory up to `budget` bytes
    /// (`u64::MAX`: no limit) with what the block holds besides.
    pub(super) fn new(program: Arc<Program>, block: usize, budget: u64) -> Self {
        PartitionGroups {
            program,
            block: block as u16,
            slots: Vec::new(),
            resident_bytes: 0,
            waiting_bytes: 0,
            other_bytes: 0,
            budget,
            clock: 0,
            spill: SpillCounters::default(),
        }
    }

    fn name(&self, g: usize) -> [u8; 7] {
        let mut name = [GROUP_TABLE, 0, 0, 0, 0, 0, 0];
        name[1..3].copy_from_slice(&self.block.to_be_bytes());
        name[3..7].copy_from_slice(&(g as u32).to_be_bytes());
        name
    }

    /// The memory left for groups to come in.
    fn room(&self) -> u64 {
        self.budget.saturating_sub(self.resident_bytes + self.waiting_bytes + self.other_bytes)
    }

    /// Hands `event` to group `g`: applied now if the group is in memory (or can come in),
    /// waiting for it otherwise.
    #[inline]
    pub(super) fn deliver(&mut self, g: usize, event: G::Event, versions: &mut Versions) -> Result<()> {
        match self.slots.get_mut(g) {
            Some(slot) if slot.group.is_some() => {
                let group = slot.group.as_mut().expect("in memory");
                group.apply(event)?;
                slot.changed = true;
                slot.last_used = self.clock;
                if self.budget != u64::MAX {
                    let bytes = group.bytes() as u64;
                    self.resident_bytes = self.resident_bytes + bytes - slot.bytes;
                    slot.bytes = bytes;
                }
                Ok(())
            }
            _ => self.deliver_to_absent(g, event, versions),
        }
    }

    /// [`deliver`](Self::deliver) to a group not in memory: made if new, loaded if it fits,
    /// else the event waits (loading the group once many wait).
    #[cold]
    fn deliver_to_absent(&mut self, g: usize, event: G::Event, versions: &mut Versions) -> Result<()> {
        if g >= self.slots.len() {
            self.slots.resize_with(g + 1, Slot::default);
        }
        let room = self.room();
        let slot = &mut self.slots[g];
        if slot.saved.is_none() {
            slot.group = Some(G::empty(&self.program)?);
        } else if slot.bytes <= room {
            self.load(g, versions)?;
        } else {
            let bytes = G::event_bytes(&event) as u64;
            slot.waiting.push(event);
            slot.waiting_bytes += bytes;
            self.waiting_bytes += bytes;
            if slot.waiting.len() >= WAITING_EVENTS {
                self.load(g, versions)?;
            }
            return Ok(());
        }
        self.deliver(g, event, versions)
    }

    /// Brings group `g` into memory (making room first) and applies its waiting events.
    fn load(&mut self, g: usize, versions: &mut Versions) -> Result<()> {
        self.clock += 1;
        self.slots[g].last_used = self.clock;
        if self.slots[g].group.is_some() {
            return Ok(());
        }
        let incoming = self.slots[g].bytes;
        let room = self.budget.saturating_sub(self.waiting_bytes + self.other_bytes);
        self.evict_until(room.saturating_sub(incoming), versions)?;
        let group = match self.slots[g].saved {
            None => G::empty(&self.program)?,
            Some((version, _)) => {
                let (block, program) = (self.block, &self.program);
                let bytes =
                    versions.get(&self.name(g), version, &|| format!("group {g} of the synopsis of block {block}"))?;
                let mut r = StateReader::new(&bytes);
                let group = G::decode(program, &mut r)?;
                r.finish()?;
                self.spill.group_reads += 1;
                self.spill.bytes_read += bytes.len() as u64;
                group
            }
        };
        let slot = &mut self.slots[g];
        let mut group = group;
        let waiting = std::mem::take(&mut slot.waiting);
        slot.changed |= !waiting.is_empty();
        for event in waiting {
            group.apply(event)?;
        }
        self.waiting_bytes -= std::mem::take(&mut slot.waiting_bytes);
        slot.bytes = group.bytes() as u64;
        self.resident_bytes += slot.bytes;
        slot.group = Some(group);
        Ok(())
    }

    /// Writes group `g` to the store if it changed since it was last written, and drops it
    /// from memory.
    fn evict(&mut self, g: usize, versions: &mut Versions) -> Result<()> {
        let written = self.save(g, versions)?;
        let slot = &mut self.slots[g];
        slot.group = None;
        self.resident_bytes -= slot.bytes;
        self.spill.group_writes += 1;
        self.spill.bytes_written += written;
        Ok(())
    }

    /// Writes group `g` (in memory) if it changed; returns the bytes written.
    fn save(&mut self, g: usize, versions: &mut Versions) -> Result<u64> {
        let name = self.name(g);
        let slot = &mut self.slots[g];
        let group = slot.group.as_ref().expect("in memory");
        if !slot.changed && slot.saved.is_some() {
            return Ok(0);
        }
        let mut w = StateWriter::default();
        group.encode(&mut w);
        let bytes = w.into_bytes();
        let version = versions.put(&name, &bytes, slot.saved.map(|(v, _)| v))?;
        slot.saved = Some((version, bytes.len() as u64));
        slot.changed = false;
        Ok(bytes.len() as u64)
    }

    /// Evicts the least recently used groups in memory until they take at most `bytes`.
    fn evict_until(&mut self, bytes: u64, versions: &mut Versions) -> Result<()> {
        while self.resident_bytes > bytes {
            let Some(g) = (0..self.slots.len())
                .filter(|&g| self.slots[g].group.is_some() && self.slots[g].bytes > 0)
                .min_by_key(|&g| self.slots[g].last_used)
            else {
                return Ok(());
            };
            self.evict(g, versions)?;
        }
        Ok(())
    }

    /// Keeps the waiting events within a quarter of the budget (loading the group with the
    /// most), then evicts groups until everything fits the budget.
    fn fit_budget(&mut self, versions: &mut Versions) -> Result<()> {
        if !self.bounded() {
            return Ok(());
        }
        // Groups used since the last fit count as used now.
        self.clock += 1;
        while self.waiting_bytes > self.budget / 4 {
            let g = (0..self.slots.len()).max_by_key(|&g| self.slots[g].waiting_bytes).expect("events wait");
            self.spill.pending_flushes += 1;
            self.load(g, versions)?;
        }
        let room = self.budget.saturating_sub(self.waiting_bytes + self.other_bytes);
        self.evict_until(room, versions)
    }

    /// Calls `f` with every group (its number and state), each loaded in turn, every
    /// waiting event applied.
    pub(super) fn for_each(
        &mut self,
        versions: &mut Versions,
        f: &mut dyn FnMut(usize, &G) -> Result<()>,
    ) -> Result<()> {
        for g in 0..self.slots.len() {
            if self.slots[g].group.is_none() && self.slots[g].saved.is_none() && self.slots[g].waiting.is_empty() {
                continue;
            }
            self.load(g, versions)?;
            f(g, self.slots[g].group.as_ref().expect("loaded"))?;
        }
        self.fit_budget(versions)
    }
}

/// What a block asks of its groups, whatever the kind of synopsis they hold.
pub(super) trait GroupTable {
    /// Whether memory is bounded (else nothing is ever evicted).
    fn bounded(&self) -> bool;
    /// Fits the budget, the block holding `other_bytes` besides the groups.
    fn fit(&mut self, other_bytes: u64, versions: &mut Versions) -> Result<()>;
    /// Saves the groups in memory that changed; writes each group's version and waiting
    /// events to `w`; returns the bytes written to the store.
    fn checkpoint(&mut self, w: &mut StateWriter, versions: &mut Versions) -> Result<u64>;
    /// Takes back what [`checkpoint`](Self::checkpoint) wrote: every saved group stays in the
    /// store until its events arrive.
    fn restore(&mut self, r: &mut StateReader) -> Result<()>;
    /// Whether the checkpoint restored names version `version` of group `g`.
    fn names(&self, g: usize, version: u64) -> bool;
    /// The bytes the groups take in memory with their waiting events.
    fn bytes(&self) -> u64;
    /// The bytes of every group's version in the store.
    fn stored_bytes(&self) -> u64;
    fn spill(&self) -> SpillCounters;
}

impl<G: PartitionGroup> GroupTable for PartitionGroups<G> {
    fn bounded(&self) -> bool {
        self.budget != u64::MAX
    }

    fn fit(&mut self, other_bytes: u64, versions: &mut Versions) -> Result<()> {
        self.other_bytes = other_bytes;
        self.fit_budget(versions)
    }

    fn checkpoint(&mut self, w: &mut StateWriter, versions: &mut Versions) -> Result<u64> {
        let mut written = 0;
        for g in 0..self.slots.len() {
            if self.slots[g].group.is_some() {
                written += self.save(g, versions)?;
            }
        }
        w.len(self.slots.len());
        for slot in &self.slots {
            w.bool(slot.saved.is_some());
            let (version, bytes) = slot.saved.unwrap_or((0, 0));
            w.u64(version);
            w.u64(bytes);
            w.len(slot.waiting.len());
            slot.waiting.iter().for_each(|e| G::encode_event(e, w));
        }
        Ok(written)
    }

    fn restore(&mut self, r: &mut StateReader) -> Result<()> {
        self.slots.clear();
        (self.resident_bytes, self.waiting_bytes) = (0, 0);
        for _ in 0..r.len(25)? {
            let saved = r.bool()?;
            let (version, bytes) = (r.u64()?, r.u64()?);
            let waiting = (0..r.len(8)?).map(|_| G::decode_event(r)).collect::<Result<Vec<_>>>()?;
            let waiting_bytes = waiting.iter().map(|e| G::event_bytes(e) as u64).sum();
            self.waiting_bytes += waiting_bytes;
            self.slots.push(Slot {
                saved: saved.then_some((version, bytes)),
                waiting,
                waiting_bytes,
                bytes,
                ..Slot::default()
            });
        }
        Ok(())
    }

    fn names(&self, g: usize, version: u64) -> bool {
        self.slots.get(g).and_then(|s| s.saved).is_some_and(|(v, _)| v == version)
    }

    /// Kept as they change when memory is bounded, summed when asked otherwise.
    fn bytes(&self) -> u64 {
        if self.bounded() {
            return self.resident_bytes + self.waiting_bytes;
        }
        self.slots.iter().filter_map(|s| s.group.as_ref()).map(|g| g.bytes() as u64).sum::<u64>() + self.waiting_bytes
    }

    fn stored_bytes(&self) -> u64 {
        self.slots.iter().filter_map(|s| s.saved).map(|(_, bytes)| bytes).sum()
    }

    fn spill(&self) -> SpillCounters {
        self.spill
    }
}
