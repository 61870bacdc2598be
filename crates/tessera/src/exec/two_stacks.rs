//! `TwoStacks`: a sliding aggregator over the consecutive slices of a hopping window, so an
//! instance costs O(1) amortized merges however many slices it spans.
//!
//! Slices enter at the back (each merged once into a running aggregate of the back) and leave
//! at the front. When a slice must leave and the front is empty, the back *flips*: its slices
//! move to the front, each with the merge of itself and every newer slice moved with it, so the
//! front's top is always the aggregate of the whole front. An instance is the front's top merged
//! with the back's aggregate. Each slice is thus merged twice, and each instance once.
//!
//! A late row that changes a slice already pushed makes the aggregates stale: the caller
//! [`invalidate`](TwoStacks::invalidate)s from that slice and the next instance rebuilds from
//! the slices (late rows are rare, and counted).

use std::borrow::Cow;

use super::group_table::{GroupTable, Tables};
use super::state_tables::{TableName, TableRef, TableRole};
use crate::error::Result;
use crate::state::codec::{StateReader, StateWriter};

/// The slices of one instance, `first..=last`, among those with data (`slices`), and how to
/// make the empty table merges start from.
pub(super) struct InstanceSlices<'a> {
    pub(super) first: i64,
    pub(super) last: i64,
    pub(super) slices: &'a Tables,
    pub(super) new_table: &'a dyn Fn() -> GroupTable,
}

#[derive(Default)]
pub(super) struct TwoStacks {
    /// Slices pushed since the last flip, oldest first.
    back: Vec<i64>,
    /// The merge of the `back` slices.
    back_merged: Option<GroupTable>,
    /// Slices moved at the last flip, newest first, each with the merge of itself and every
    /// newer slice in `front`: the top (last) aggregates the whole front.
    front: Vec<(i64, GroupTable)>,
    /// The slices up to this one have been pushed (or were empty).
    pushed_through: Option<i64>,
    /// The last instance combined from both stacks; its buffers are reused for the next.
    combined: Option<GroupTable>,
}

impl TwoStacks {
    /// A row changed slice `slice`: forget the aggregates if they include it.
    pub(super) fn invalidate(&mut self, slice: i64) {
        if self.pushed_through.is_some_and(|p| slice <= p) {
            *self = TwoStacks::default();
        }
    }

    /// The merge of the instance's slices with data, `None` if all are empty; `slice_reads`
    /// counts the slices' group states read (each slice is read when pushed and when flipped;
    /// combining the stacks' own aggregates reads no slice). Instances come in order (`first`
    /// and `last` never decrease; a window ending before the last one pushed is rebuilt).
    pub(super) fn window<'a>(
        &'a mut self,
        instance: &InstanceSlices,
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) -> Result<Option<Cow<'a, GroupTable>>> {
        let &InstanceSlices { first, last, slices, new_table } = instance;
        if self.pushed_through.is_some_and(|p| last < p) {
            *self = TwoStacks::default();
        }
        // Pop the slices before `first`.
        loop {
            if self.front.last().is_some_and(|(k, _)| *k < first) {
                self.front.pop();
            } else if self.front.is_empty() && self.back.first().is_some_and(|&k| k < first) {
                self.flip(first, slices, new_table, scratch, slice_reads)?;
            } else {
                break;
            }
        }
        // Push the new ones.
        let from = self.pushed_through.map_or(first, |p| first.max(p + 1));
        if from <= last {
            for (k, table) in slices.range(from..=last) {
                self.back.push(k);
                self.back_merged.get_or_insert_with(new_table).merge_from(table, scratch)?;
                *slice_reads += table.keys.len() as u64;
            }
        }
        self.pushed_through = Some(self.pushed_through.map_or(last, |p| p.max(last)));
        Ok(match (self.front.last(), &self.back_merged) {
            (None, None) => None,
            (Some((_, front)), None) => Some(Cow::Borrowed(front)),
            (None, Some(back)) => Some(Cow::Borrowed(back)),
            (Some((_, front)), Some(back)) => {
                let both = self.combined.get_or_insert_with(new_table);
                both.clone_from(front);
                both.merge_from(back, scratch)?;
                Some(Cow::Borrowed(both))
            }
        })
    }

    /// Moves the back's slices from `first` on to the front, newest first, with their suffix
    /// merges; older ones are leaving anyway.
    fn flip(
        &mut self,
        first: i64,
        slices: &Tables,
        new_table: &dyn Fn() -> GroupTable,
        scratch: &mut Vec<u32>,
        slice_reads: &mut u64,
    ) -> Result<()> {
        let back = std::mem::take(&mut self.back);
        self.back_merged = None;
        for &k in back.iter().rev().take_while(|&&k| k >= first) {
            let Some(table) = slices.get(k) else { continue };
            let mut suffix = self.front.last().map_or_else(new_table, |(_, newer)| newer.clone());
            suffix.merge_from(table, scratch)?;
            *slice_reads += table.keys.len() as u64;
            self.front.push((k, suffix));
        }
        Ok(())
    }

    /// Writes which slices the stacks hold; their aggregates are tables of their own (saved
    /// rather than rebuilt, so a resumed run merges in the same order and its floating-point
    /// results are the same to the bit).
    pub(super) fn encode_progress(&self, w: &mut StateWriter) {
        w.i64s(&self.back);
        w.bool(self.pushed_through.is_some());
        w.i64(self.pushed_through.unwrap_or(0));
    }

    pub(super) fn decode_progress(r: &mut StateReader) -> Result<Self> {
        let back = r.i64s()?;
        let pushed_through = if r.bool()? { Some(r.i64()?) } else { r.i64().map(|_| None)? };
        Ok(TwoStacks { back, pushed_through, ..TwoStacks::default() })
    }

    /// Hands `visit` the back's merge and the front's entries.
    pub(super) fn visit_tables(
        &mut self,
        node: u16,
        visit: &mut dyn FnMut(TableName, TableRef<'_>) -> Result<()>,
    ) -> Result<()> {
        if let Some(table) = &mut self.back_merged {
            visit(TableName { role: TableRole::StackBack, node, index: 0 }, TableRef::Table(table))?;
        }
        for (index, table) in &mut self.front {
            visit(TableName { role: TableRole::StackFront, node, index: *index }, TableRef::Table(table))?;
        }
        Ok(())
    }

    /// Puts back a table [`visit_tables`](Self::visit_tables) named.
    pub(super) fn insert_table(&mut self, name: TableName, table: GroupTable) {
        if name.role == TableRole::StackBack {
            self.back_merged = Some(table);
        } else {
            self.front.retain(|(k, _)| *k != name.index);
            self.front.push((name.index, table));
            // Newest first.
            self.front.sort_by_key(|(k, _)| std::cmp::Reverse(*k));
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.front.iter().map(|(_, t)| t.bytes()).sum::<usize>()
            + self.back_merged.iter().chain(&self.combined).map(GroupTable::bytes).sum::<usize>()
    }
}
