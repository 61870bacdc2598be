//! The names of a window operator's state tables and a borrowed view of one table, the unit
//! the key-group table manager ([`super::key_groups`]) saves to the state store: a slice, an
//! open or kept closed instance, or a sliding aggregator's running value, back aggregate or
//! front entry, each holding the partial states of the keys of one key group.

use super::group_table::GroupTable;
use crate::error::{Result, TesseraError};
use crate::state::codec::{StateReader, StateWriter};

/// What a table holds for its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum TableRole {
    /// The partial states of a slice of the operator's slicing (`node` is 0).
    Slice,
    /// An open instance of a node reading the stream.
    Open,
    /// A closed instance kept for the nodes reading it.
    Closed,
    /// A running value's states and how many counted slices hold each key.
    Running,
    /// Two stacks: the merge of the back.
    StackBack,
    /// Two stacks: a front entry, by slice.
    StackFront,
}

impl TableRole {
    const ALL: [TableRole; 6] = [
        TableRole::Slice,
        TableRole::Open,
        TableRole::Closed,
        TableRole::Running,
        TableRole::StackBack,
        TableRole::StackFront,
    ];
}

/// A table of one operator's state: its role, the window node it belongs to and its index
/// (the slice, instance or front entry; 0 where a node has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct TableName {
    pub(super) role: TableRole,
    pub(super) node: u16,
    pub(super) index: i64,
}

impl TableName {
    /// Bytes of [`encode`](Self::encode).
    pub(super) const BYTES: usize = 11;

    /// Orders as the name does (big-endian, the index's sign bit flipped).
    pub(super) fn encode(&self, key: &mut Vec<u8>) {
        key.push(self.role as u8);
        key.extend_from_slice(&self.node.to_be_bytes());
        key.extend_from_slice(&((self.index as u64) ^ (1 << 63)).to_be_bytes());
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<TableName> {
        let corrupt = || TesseraError::Checkpoint("the state store holds a key tessera did not write".into());
        let bytes: &[u8; Self::BYTES] = bytes.get(..Self::BYTES).and_then(|b| b.try_into().ok()).ok_or_else(corrupt)?;
        let role = *TableRole::ALL.get(usize::from(bytes[0])).ok_or_else(corrupt)?;
        let node = u16::from_be_bytes([bytes[1], bytes[2]]);
        let index = (u64::from_be_bytes(bytes[3..11].try_into().expect("8 bytes")) ^ (1 << 63)) as i64;
        Ok(TableName { role, node, index })
    }
}

/// One table of an operator's state, borrowed to be saved.
pub(super) enum TableRef<'a> {
    Table(&'a mut GroupTable),
    /// A running value: its states and, per slot, how many counted slices hold the key.
    Running {
        table: &'a mut GroupTable,
        holders: &'a [u32],
    },
}

impl TableRef<'_> {
    fn table(&self) -> &GroupTable {
        match self {
            TableRef::Table(table) | TableRef::Running { table, .. } => table,
        }
    }

    /// Changed since it was last saved.
    pub(super) fn changed(&self) -> bool {
        self.table().changed
    }

    pub(super) fn mark_saved(&mut self) {
        match self {
            TableRef::Table(table) | TableRef::Running { table, .. } => table.changed = false,
        }
    }

    pub(super) fn encode(&self, w: &mut StateWriter) {
        self.table().encode(w);
        if let TableRef::Running { holders, .. } = self {
            w.u32s(holders);
        }
    }
}

/// Reads a running value's table and holders, as [`TableRef::encode`] wrote them.
pub(super) fn decode_running(
    plan: &crate::plan::WindowAggregatePlan,
    r: &mut StateReader,
) -> Result<(GroupTable, Vec<u32>)> {
    let table = GroupTable::decode(plan, r)?;
    let holders = r.u32s()?;
    if holders.len() != table.keys.len() {
        return Err(TesseraError::Checkpoint("a saved running window is inconsistent".into()));
    }
    Ok((table, holders))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order_as_their_encoding() {
        let names: Vec<TableName> = TableRole::ALL
            .iter()
            .flat_map(|&role| {
                [0u16, 3].into_iter().flat_map(move |node| {
                    [i64::MIN, -1, 0, 1, i64::MAX].into_iter().map(move |index| TableName { role, node, index })
                })
            })
            .collect();
        let mut encoded: Vec<Vec<u8>> = names
            .iter()
            .map(|n| {
                let mut key = Vec::new();
                n.encode(&mut key);
                assert_eq!(key.len(), TableName::BYTES);
                assert_eq!(TableName::decode(&key).unwrap(), *n);
                key
            })
            .collect();
        encoded.sort();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(encoded.iter().map(|k| TableName::decode(k).unwrap()).collect::<Vec<_>>(), sorted);
        assert!(TableName::decode(&[9; 11]).is_err());
        assert!(TableName::decode(&[0; 5]).is_err());
    }
}
