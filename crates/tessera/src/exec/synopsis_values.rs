//! The values of a temporal query's variables, interned per variable: each value is given an
//! id in the order first seen (the synopsis keys its counts by ids), integers through a map of
//! their own, other values by their bytes in Arrow's row format. [`super::synopsis`] checkpoints
//! the values interned since the previous checkpoint.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use arrow::datatypes::{DataType, Int64Type};
use arrow::row::{RowConverter, SortField};
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use std::hash::BuildHasher;

use crate::error::Result;
use crate::state::memory::{allocation, hash_table};
use crate::synopsis::Value;

/// The values of one variable, each given an id in the order first seen (the id is what the
/// synopsis keys its counts by), their bytes in Arrow's row format one after another.
pub(super) struct ValueInterner {
    /// The ids of the 64-bit integers seen, so a column of them is interned without encoding.
    int_ids: HashMap<i64, Value>,
    converter: RowConverter,
    /// The ids, found by hashing the values they stand for.
    ids: HashTable<Value>,
    hasher: DefaultHashBuilder,
    /// Value `id` is `data[ends[id - 1]..ends[id]]` (from 0 for the first).
    data: Vec<u8>,
    ends: Vec<usize>,
}

impl ValueInterner {
    pub(super) fn new(data_type: &DataType) -> Result<Self> {
        Ok(ValueInterner {
            int_ids: HashMap::new(),
            converter: RowConverter::new(vec![SortField::new(data_type.clone())])?,
            ids: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            data: Vec::new(),
            ends: Vec::new(),
        })
    }

    /// The values interned.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(super) fn value(&self, id: usize) -> &[u8] {
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        &self.data[start..self.ends[id]]
    }

    /// The id of every value of `column`.
    pub(super) fn intern(&mut self, column: &ArrayRef) -> Result<Vec<Value>> {
        let Some(ints) = column.as_primitive_opt::<Int64Type>().filter(|a| a.null_count() == 0) else {
            return self.intern_rows(column);
        };
        // Only the values not seen before go through the row format, in the order first seen.
        let mut unknown: Vec<i64> = Vec::new();
        for &v in ints.values() {
            if let hashbrown::hash_map::Entry::Vacant(entry) = self.int_ids.entry(v) {
                entry.insert(Value::MAX);
                unknown.push(v);
            }
        }
        if !unknown.is_empty() {
            let fresh: ArrayRef = Arc::new(Int64Array::from(unknown.clone()));
            for (v, id) in unknown.into_iter().zip(self.intern_rows(&fresh)?) {
                self.int_ids.insert(v, id);
            }
        }
        Ok(ints.values().iter().map(|v| self.int_ids[v]).collect())
    }

    /// [`intern`](Self::intern) through Arrow's row format (any type, NULL a value of its own).
    fn intern_rows(&mut self, column: &ArrayRef) -> Result<Vec<Value>> {
        let rows = self.converter.convert_columns(std::slice::from_ref(column))?;
        Ok(rows.iter().map(|row| self.id(row.as_ref())).collect())
    }

    /// The id of `value` (in the row format), given one if new.
    pub(super) fn id(&mut self, value: &[u8]) -> Value {
        let hash = self.hasher.hash_one(value);
        if let Some(&id) = self.ids.find(hash, |&id| self.value(id as usize) == value) {
            return id;
        }
        let id = self.len() as Value;
        self.data.extend_from_slice(value);
        self.ends.push(self.data.len());
        let (data, ends, hasher) = (&self.data, &self.ends, &self.hasher);
        let rehash = |&id: &Value| {
            let id = id as usize;
            hasher.hash_one(&data[if id == 0 { 0 } else { ends[id - 1] }..ends[id]])
        };
        self.ids.insert_unique(hash, id, rehash);
        id
    }

    /// The values of `ids`, as a column.
    pub(super) fn column(&self, ids: impl Iterator<Item = Value>) -> Result<ArrayRef> {
        let parser = self.converter.parser();
        let rows: Vec<_> = ids.map(|id| parser.parse(self.value(id as usize))).collect();
        let mut columns = self.converter.convert_rows(rows)?;
        Ok(columns.remove(0))
    }

    /// The bytes it takes in memory.
    pub(super) fn bytes(&self) -> usize {
        allocation(self.data.capacity())
            + allocation(self.ends.capacity() * std::mem::size_of::<usize>())
            + hash_table::<Value>(self.ids.capacity())
            + hash_table::<(i64, Value)>(self.int_ids.capacity())
    }
}
