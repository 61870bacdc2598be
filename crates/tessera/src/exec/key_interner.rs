//! Interning group keys: every distinct key (a tuple of column values, NULL included) gets a
//! dense `u32` id once per batch row, so window slices index their states by id instead of
//! hashing keys again. A single integer key takes a fast path; any other key set is encoded
//! with Arrow's row format. A single key handed out as a dictionary (as Parquet key columns are
//! read) is resolved once per dictionary entry, not once per row.

use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, DictionaryArray, Int64Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type, UInt32Type};
use arrow::row::{Row, RowConverter, Rows, SortField};
use hashbrown::{DefaultHashBuilder, HashTable};

use crate::error::{Result, TesseraError};
use crate::state::codec::{batch_bytes, batch_from_bytes, StateReader, StateWriter};

/// Integer keys in `[0, DENSE_KEYS)` are looked up by value (at most 256 KiB of ids).
const DENSE_KEYS: i64 = 1 << 16;
const NO_ID: u32 = u32::MAX;

/// Keys in the row format reached interning without their converted rows.
fn unconverted() -> TesseraError {
    TesseraError::Internal("group keys in the row format were not converted".into())
}

pub struct KeyInterner {
    types: Vec<DataType>,
    kind: KeyKind,
}

enum KeyKind {
    /// No GROUP BY keys besides the window: one key.
    Unit {
        seen: bool,
    },
    Int(IntKeys),
    Rows(RowKeys),
}

impl KeyInterner {
    pub fn new(types: Vec<DataType>) -> Result<Self> {
        let kind = match types.as_slice() {
            [] => KeyKind::Unit { seen: false },
            [t] if t.is_integer() => KeyKind::Int(IntKeys::default()),
            _ => {
                let converter = RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?;
                let rows = converter.empty_rows(0, 0);
                KeyKind::Rows(RowKeys {
                    converter,
                    table: HashTable::new(),
                    rows,
                    hasher: DefaultHashBuilder::default(),
                })
            }
        };
        Ok(KeyInterner { types, kind })
    }

    /// Number of distinct keys seen.
    pub fn len(&self) -> usize {
        match &self.kind {
            KeyKind::Unit { seen } => usize::from(*seen),
            KeyKind::Int(keys) => keys.values.len(),
            KeyKind::Rows(keys) => keys.rows.num_rows(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id of every row's key (inserting new keys).
    pub fn intern(&mut self, columns: &[ArrayRef], num_rows: usize) -> Result<Vec<u32>> {
        let converted = self.convert(columns)?;
        self.intern_converted(columns, converted, num_rows)
    }

    /// Keys kept in Arrow's row format: the batch's key columns in that format (`None` for
    /// other keys, and for a dictionary column, whose entries are converted instead), converted
    /// once for a lookup and the interning that may follow it.
    fn convert(&self, columns: &[ArrayRef]) -> Result<Option<Rows>> {
        match &self.kind {
            KeyKind::Rows(keys) if dictionary(columns).is_none() => Ok(Some(keys.converter.convert_columns(columns)?)),
            _ => Ok(None),
        }
    }

    /// [`intern`](Self::intern) with the rows [`convert`](Self::convert) made of `columns`
    /// (which it must be given for keys in the row format).
    fn intern_converted(&mut self, columns: &[ArrayRef], converted: Option<Rows>, num_rows: usize) -> Result<Vec<u32>> {
        match &mut self.kind {
            KeyKind::Unit { seen } => {
                *seen |= num_rows > 0;
                Ok(vec![0; num_rows])
            }
            KeyKind::Int(keys) => {
                if let Some(column) = dictionary(columns) {
                    let entries = int_entries(column)?;
                    let known = known_entries(entries.len(), num_rows, |entry| keys.find(entries[entry]));
                    let ids =
                        dictionary_ids(column.keys(), known, |entry| Some(keys.intern(entry.and_then(|e| entries[e]))));
                    return Ok(ids.expect("interning resolves every key"));
                }
                let (column, mut out, known) = dense_prefix(&keys.dense, &columns[0])?;
                let has_nulls = column.null_count() > 0;
                for (i, &v) in column.values().iter().enumerate().skip(known) {
                    out[i] = keys.intern((!has_nulls || column.is_valid(i)).then_some(v));
                }
                Ok(out)
            }
            KeyKind::Rows(keys) => {
                if let Some(column) = dictionary(columns) {
                    let (entries, null) = keys.entries(column)?;
                    let row = |entry: Option<usize>| entry.map_or(null.row(0), |entry| entries.row(entry));
                    let known = known_entries(entries.num_rows(), num_rows, |entry| keys.find(entries.row(entry)));
                    let ids = dictionary_ids(column.keys(), known, |entry| Some(keys.intern(row(entry))));
                    return Ok(ids.expect("interning resolves every key"));
                }
                let batch_rows = converted.ok_or_else(unconverted)?;
                Ok(batch_rows.iter().map(|row| keys.intern(row)).collect())
            }
        }
    }

    /// The id of every row's key if every key was interned before, `None` otherwise (the
    /// interner is left as it was).
    pub fn lookup(&self, columns: &[ArrayRef], num_rows: usize) -> Result<Option<Vec<u32>>> {
        self.lookup_converted(columns, self.convert(columns)?.as_ref(), num_rows)
    }

    /// [`lookup`](Self::lookup) with the rows [`convert`](Self::convert) made of `columns`
    /// (which it must be given for keys in the row format).
    fn lookup_converted(
        &self,
        columns: &[ArrayRef],
        converted: Option<&Rows>,
        num_rows: usize,
    ) -> Result<Option<Vec<u32>>> {
        match &self.kind {
            KeyKind::Unit { seen } => Ok((*seen || num_rows == 0).then(|| vec![0; num_rows])),
            KeyKind::Int(keys) => {
                if let Some(column) = dictionary(columns) {
                    let entries = int_entries(column)?;
                    let known = known_entries(entries.len(), num_rows, |entry| keys.find(entries[entry]));
                    return Ok(dictionary_ids(column.keys(), known, |entry| keys.find(entry.and_then(|e| entries[e]))));
                }
                let (column, mut out, known) = dense_prefix(&keys.dense, &columns[0])?;
                let has_nulls = column.null_count() > 0;
                for (i, &v) in column.values().iter().enumerate().skip(known) {
                    match keys.find((!has_nulls || column.is_valid(i)).then_some(v)) {
                        Some(id) => out[i] = id,
                        None => return Ok(None),
                    }
                }
                Ok(Some(out))
            }
            KeyKind::Rows(keys) => {
                if let Some(column) = dictionary(columns) {
                    let (entries, null) = keys.entries(column)?;
                    let row = |entry: Option<usize>| entry.map_or(null.row(0), |entry| entries.row(entry));
                    let known = known_entries(entries.num_rows(), num_rows, |entry| keys.find(entries.row(entry)));
                    return Ok(dictionary_ids(column.keys(), known, |entry| keys.find(row(entry))));
                }
                let batch_rows = converted.ok_or_else(unconverted)?;
                Ok(batch_rows.iter().map(|row| keys.find(row)).collect())
            }
        }
    }

    /// The key columns for the given ids, in their original types.
    pub fn columns(&self, ids: &[u32]) -> Result<Vec<ArrayRef>> {
        match &self.kind {
            KeyKind::Unit { .. } => Ok(vec![]),
            KeyKind::Int(IntKeys { values, null_id, .. }) => {
                let keys: Vec<i64> = ids.iter().map(|&id| values[id as usize]).collect();
                // Without a NULL key no value is missing: no validity to build.
                let validity = null_id.map(|null| ids.iter().map(|&id| id != null).collect());
                let array: ArrayRef = Arc::new(Int64Array::new(keys.into(), validity));
                if array.data_type() == &self.types[0] {
                    Ok(vec![array])
                } else {
                    Ok(vec![cast(&array, &self.types[0])?])
                }
            }
            KeyKind::Rows(keys) => Ok(keys.converter.convert_rows(ids.iter().map(|&id| keys.rows.row(id as usize)))?),
        }
    }

    pub fn bytes(&self) -> usize {
        match &self.kind {
            KeyKind::Unit { .. } => 0,
            KeyKind::Int(IntKeys { dense, ids, values, .. }) => {
                // A hash table bucket: the id and a control byte.
                dense.capacity() * 4 + ids.capacity() * 5 + values.capacity() * 8
            }
            KeyKind::Rows(keys) => keys.table.capacity() * 8 + keys.rows.size(),
        }
    }
}

/// Interned integer keys.
#[derive(Default)]
struct IntKeys {
    /// Ids of small non-negative keys (device numbers, codes), indexed by value: no hashing on
    /// the hot path.
    dense: Vec<u32>,
    /// Ids of every other key, hashed by their value in `values` (4 bytes per key where a map
    /// from value to id would take 16: high-cardinality keys are where this matters).
    ids: HashTable<u32>,
    hasher: DefaultHashBuilder,
    null_id: Option<u32>,
    /// The key of each id (0 at `null_id`).
    values: Vec<i64>,
}

impl IntKeys {
    /// The id of a key (`None`: NULL), new if it was not seen before.
    fn intern(&mut self, key: Option<i64>) -> u32 {
        let Some(v) = key else {
            return *self.null_id.get_or_insert_with(|| {
                self.values.push(0);
                self.values.len() as u32 - 1
            });
        };
        if (0..DENSE_KEYS).contains(&v) {
            let index = v as usize;
            if index >= self.dense.len() {
                self.dense.resize(index + 1, NO_ID);
            }
            if self.dense[index] == NO_ID {
                self.values.push(v);
                self.dense[index] = self.values.len() as u32 - 1;
            }
            return self.dense[index];
        }
        let hash = self.hasher.hash_one(v);
        if let Some(&id) = self.ids.find(hash, |&id| self.values[id as usize] == v) {
            return id;
        }
        self.values.push(v);
        let id = self.values.len() as u32 - 1;
        let (values, hasher) = (&self.values, &self.hasher);
        self.ids.insert_unique(hash, id, |&id| hasher.hash_one(values[id as usize]));
        id
    }

    /// The id of a key seen before.
    fn find(&self, key: Option<i64>) -> Option<u32> {
        let Some(v) = key else { return self.null_id };
        self.dense
            .get(v as usize)
            .copied()
            .filter(|&id| id != NO_ID)
            .or_else(|| self.ids.find(self.hasher.hash_one(v), |&id| self.values[id as usize] == v).copied())
    }
}

/// Keys of other types (strings, several columns), in Arrow's row format.
struct RowKeys {
    converter: RowConverter,
    /// The id of each key, hashed by its row in `rows`.
    table: HashTable<u32>,
    rows: Rows,
    hasher: DefaultHashBuilder,
}

impl RowKeys {
    /// The id of a key seen before.
    fn find(&self, row: Row<'_>) -> Option<u32> {
        let hash = self.hasher.hash_one(row.as_ref());
        self.table.find(hash, |&id| self.rows.row(id as usize).as_ref() == row.as_ref()).copied()
    }

    /// The id of a key, new if it was not seen before.
    fn intern(&mut self, row: Row<'_>) -> u32 {
        let hash = self.hasher.hash_one(row.as_ref());
        if let Some(&id) = self.table.find(hash, |&id| self.rows.row(id as usize).as_ref() == row.as_ref()) {
            return id;
        }
        let id = self.rows.num_rows() as u32;
        self.rows.push(row);
        let (rows, hasher) = (&self.rows, &self.hasher);
        self.table.insert_unique(hash, id, |&id| hasher.hash_one(rows.row(id as usize).as_ref()));
        id
    }

    /// The entries of a dictionary column of the one key, and a NULL key, in the row format.
    fn entries(&self, column: &DictionaryArray<UInt32Type>) -> Result<(Rows, Rows)> {
        let null = arrow::array::new_null_array(column.values().data_type(), 1);
        Ok((self.converter.convert_columns(&[Arc::clone(column.values())])?, self.converter.convert_columns(&[null])?))
    }
}

/// The one key column, if it is a dictionary array (as a reader hands out key columns).
fn dictionary(columns: &[ArrayRef]) -> Option<&DictionaryArray<UInt32Type>> {
    match columns {
        [column] => column.as_dictionary_opt::<UInt32Type>(),
        _ => None,
    }
}

/// A dictionary column's entries as integers (`None`: NULL).
fn int_entries(column: &DictionaryArray<UInt32Type>) -> Result<Vec<Option<i64>>> {
    Ok(cast(column.values(), &DataType::Int64)?.as_primitive::<Int64Type>().iter().collect())
}

/// The ids of a dictionary's entries already known (`find`; the others `NO_ID`), where the
/// dictionary is not larger than the batch of `rows` rows: its rows are then one lookup each
/// in a small table. Otherwise none, each then resolved when a row uses it.
fn known_entries(entries: usize, rows: usize, find: impl Fn(usize) -> Option<u32>) -> Vec<u32> {
    if entries > rows {
        return vec![NO_ID; entries];
    }
    (0..entries).map(|entry| find(entry).unwrap_or(NO_ID)).collect()
}

/// The ids of the keys of a dictionary column, whose rows hold `indices` into its entries:
/// each entry a row uses resolved once (`resolve(Some(entry))`, interned or looked up; a NULL
/// row `resolve(None)`), in row order, so that each key gets the id it gets from the same keys
/// in a plain column; `known` holds the ids of entries found before (see [`known_entries`]).
/// `None` once a key is not resolved.
fn dictionary_ids(
    indices: &arrow::array::UInt32Array,
    mut known: Vec<u32>,
    mut resolve: impl FnMut(Option<usize>) -> Option<u32>,
) -> Option<Vec<u32>> {
    if indices.null_count() == 0 && !known.contains(&NO_ID) && !known.is_empty() {
        // A table of a power-of-two length, indexed by masked entries: no bounds checks, so
        // the lookups vectorize (every entry is within the dictionary anyway).
        let mask = known.len().next_power_of_two() - 1;
        known.resize(mask + 1, NO_ID);
        let table = &known[..=mask];
        return Some(indices.values().iter().map(|&entry| table[entry as usize & mask]).collect());
    }
    let mut out = Vec::with_capacity(indices.len());
    for (row, &entry) in indices.values().iter().enumerate() {
        let id = if indices.is_null(row) {
            resolve(None)?
        } else {
            let id = &mut known[entry as usize];
            if *id == NO_ID {
                *id = resolve(Some(entry as usize))?;
            }
            *id
        };
        out.push(id);
    }
    Some(out)
}

/// A key column as `Int64`, with the ids of its leading rows in the common case, every key a
/// small value seen before: one lookup per row, up to the first that is not (a negative value
/// converts to an index past the end). Returns how many rows it found; the others are `NO_ID`.
fn dense_prefix(dense: &[u32], column: &ArrayRef) -> Result<(Int64Array, Vec<u32>, usize)> {
    let column = cast(column, &DataType::Int64)?.as_primitive::<Int64Type>().clone();
    let mut out = vec![NO_ID; column.len()];
    let mut known = 0;
    if column.null_count() == 0 {
        for (id, &v) in out.iter_mut().zip(column.values()) {
            match dense.get(v as usize) {
                Some(&found) if found != NO_ID => *id = found,
                _ => break,
            }
            known += 1;
        }
    }
    Ok((column, out, known))
}

/// Identifies a list of key expressions: operators with the same signature group by the same
/// keys and can share one interner (and one partitioning).
pub fn key_signature(keys: &[crate::plan::ExprRef]) -> String {
    format!("{keys:?}")
}

/// A key interner shared by the operators of one worker that group by the same expressions:
/// each batch's keys are evaluated and interned once, not once per query. Batches whose keys
/// are all known are interned under a read lock, so the reading thread interning ahead and the
/// worker reading keys back for its output do not wait for each other.
pub struct SharedKeys {
    interner: std::sync::RwLock<KeyInterner>,
    /// The batch the worker last interned and its ids (a weak handle keeps its address from
    /// being reused).
    cached: std::sync::Mutex<(std::sync::Weak<super::EventBatch>, Arc<Vec<u32>>)>,
}

impl SharedKeys {
    pub fn new(types: Vec<DataType>) -> Result<Self> {
        Ok(SharedKeys {
            interner: std::sync::RwLock::new(KeyInterner::new(types)?),
            cached: std::sync::Mutex::new((std::sync::Weak::new(), Arc::new(Vec::new()))),
        })
    }

    // A panic elsewhere cannot leave the interner half-updated in a way that matters here.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, KeyInterner> {
        self.interner.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, KeyInterner> {
        self.interner.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Identifies this interner among a worker's (ids interned ahead carry it).
    pub fn id(&self) -> usize {
        self as *const SharedKeys as usize
    }

    /// The key ids of every row of `batch`, computed once per batch (or ahead, by the reading
    /// thread).
    pub fn ids_for(&self, batch: &Arc<super::EventBatch>, keys: &[crate::plan::ExprRef]) -> Result<Arc<Vec<u32>>> {
        if let Some((_, ids)) = batch.key_ids.iter().find(|(id, _)| *id == self.id()) {
            return Ok(Arc::clone(ids));
        }
        let mut cached = self.cached.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if std::sync::Weak::ptr_eq(&cached.0, &Arc::downgrade(batch)) {
            return Ok(Arc::clone(&cached.1));
        }
        let ids = Arc::new(self.intern(&batch.rows, keys)?);
        *cached = (Arc::downgrade(batch), Arc::clone(&ids));
        Ok(ids)
    }

    /// Key ids of every row of `batch` (for rows that only one operator sees, after its own
    /// filter, or a whole batch interned ahead).
    pub fn intern(&self, batch: &arrow::record_batch::RecordBatch, keys: &[crate::plan::ExprRef]) -> Result<Vec<u32>> {
        let n = batch.num_rows();
        let columns = keys.iter().map(|k| Ok(k.evaluate(batch)?.into_array(n)?)).collect::<Result<Vec<_>>>()?;
        // Keys in Arrow's row format are converted once, for the lookup and the interning.
        let converted = {
            let interner = self.read();
            let converted = interner.convert(&columns)?;
            if let Some(ids) = interner.lookup_converted(&columns, converted.as_ref(), n)? {
                return Ok(ids);
            }
            converted
        };
        self.write().intern_converted(&columns, converted, n)
    }

    pub fn columns(&self, ids: &[u32]) -> Result<Vec<ArrayRef>> {
        self.read().columns(ids)
    }

    pub fn bytes(&self) -> usize {
        self.read().bytes()
    }

    /// The number of keys interned so far.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the keys with ids `from..to`, in id order: their count, then the key columns as
    /// Arrow IPC.
    pub fn snapshot(&self, (from, to): (usize, usize), w: &mut StateWriter) -> Result<()> {
        let interner = self.read();
        w.len(to - from);
        let ids: Vec<u32> = (from as u32..to as u32).collect();
        let columns = interner.columns(&ids)?;
        if columns.is_empty() {
            return Ok(());
        }
        let fields: Vec<arrow::datatypes::Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| arrow::datatypes::Field::new(format!("k{i}"), c.data_type().clone(), true))
            .collect();
        let batch =
            arrow::record_batch::RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), columns)?;
        w.bytes(&batch_bytes(&batch)?);
        Ok(())
    }

    /// Interns the keys a [`snapshot`](Self::snapshot) from this interner's length wrote: each
    /// gets its saved id.
    pub fn restore(&self, r: &mut StateReader) -> Result<()> {
        let n = r.len(0)?;
        let mut interner = self.write();
        let first = interner.len();
        let columns = if interner.types.is_empty() {
            Vec::new()
        } else {
            let batch = batch_from_bytes(r.bytes()?)?;
            if batch.num_rows() != n {
                return Err(TesseraError::Checkpoint("the state snapshot's keys do not add up".into()));
            }
            batch.columns().to_vec()
        };
        let ids = interner.intern(&columns, n)?;
        if ids.iter().enumerate().any(|(i, &id)| id as usize != first + i) {
            return Err(TesseraError::Checkpoint("the state snapshot holds a key twice".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    #[test]
    fn ids_are_dense_and_round_trip() {
        let mut interner = KeyInterner::new(vec![DataType::Int32]).unwrap();
        // 5 is looked up by value, -1 and 70000 by hash.
        let keys: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![
            Some(5),
            None,
            Some(5),
            Some(-1),
            None,
            Some(70000),
            Some(70000),
        ]));
        assert_eq!(interner.lookup(&[Arc::clone(&keys)], 7).unwrap(), None);
        assert!(interner.is_empty(), "a lookup interns nothing");
        let ids = interner.intern(&[Arc::clone(&keys)], 7).unwrap();
        assert_eq!(ids, vec![0, 1, 0, 2, 1, 3, 3]);
        assert_eq!(interner.lookup(&[keys], 7).unwrap(), Some(ids));
        let unseen: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![Some(5), Some(-2)]));
        assert_eq!(interner.lookup(&[unseen], 2).unwrap(), None);
        let back = interner.columns(&[2, 1, 0]).unwrap();
        assert_eq!(back[0].data_type(), &DataType::Int32);
        assert_eq!(
            back[0].as_primitive::<arrow::datatypes::Int32Type>().iter().collect::<Vec<_>>(),
            vec![Some(-1), None, Some(5)]
        );
    }

    #[test]
    fn many_large_keys_keep_their_ids_through_growth() {
        let mut interner = KeyInterner::new(vec![DataType::Int64]).unwrap();
        // Spread far past the dense range, both signs, each key twice in a batch.
        let keys: Vec<i64> = (0..50_000i64).flat_map(|i| [i * 1_000_003 - 7_000_000_000; 2]).collect();
        let array: ArrayRef = Arc::new(Int64Array::from(keys.clone()));
        let ids = interner.intern(&[Arc::clone(&array)], keys.len()).unwrap();
        let expected: Vec<u32> = (0..50_000u32).flat_map(|i| [i; 2]).collect();
        assert_eq!(ids, expected);
        assert_eq!(interner.lookup(&[Arc::clone(&array)], keys.len()).unwrap(), Some(ids.clone()));
        assert_eq!(interner.intern(&[array], keys.len()).unwrap(), ids, "interning again adds nothing");
        assert_eq!(interner.len(), 50_000);
        let back = interner.columns(&[49_999, 0]).unwrap();
        assert_eq!(back[0].as_primitive::<Int64Type>().values().to_vec(), vec![keys[99_998], keys[0]]);
    }

    /// Interns and looks up `batches` of a dictionary column of `key_type` (each batch: its
    /// rows as dictionary entries, NULL a NULL row, and its dictionary) and the same keys as
    /// plain columns: the same ids, keys and number of keys (`keys`: entries no row uses get no
    /// id).
    fn check_dictionary_ids(key_type: DataType, batches: Vec<(Vec<Option<u32>>, ArrayRef)>, keys: usize) {
        let (mut by_dictionary, mut plain) =
            (KeyInterner::new(vec![key_type.clone()]).unwrap(), KeyInterner::new(vec![key_type]).unwrap());
        for (rows, values) in batches {
            let indices = arrow::array::UInt32Array::from(rows);
            let plain_rows = arrow::compute::take(&values, &indices, None).unwrap();
            let dictionary: ArrayRef = Arc::new(DictionaryArray::<UInt32Type>::try_new(indices, values).unwrap());
            let n = dictionary.len();
            let known = plain.lookup(&[Arc::clone(&plain_rows)], n).unwrap();
            assert_eq!(by_dictionary.lookup(&[Arc::clone(&dictionary)], n).unwrap(), known);
            let ids = plain.intern(&[plain_rows], n).unwrap();
            assert_eq!(by_dictionary.intern(&[Arc::clone(&dictionary)], n).unwrap(), ids);
            assert_eq!(by_dictionary.lookup(&[dictionary], n).unwrap(), Some(ids));
            assert_eq!(by_dictionary.len(), plain.len());
        }
        let all: Vec<u32> = (0..plain.len() as u32).collect();
        assert_eq!(by_dictionary.columns(&all).unwrap()[0].as_ref(), plain.columns(&all).unwrap()[0].as_ref());
        assert_eq!(plain.len(), keys);
    }

    #[test]
    fn dictionary_columns_get_the_ids_their_values_get_plain() {
        // Keys looked up by value and by hash, a NULL entry, entries no row uses, a dictionary
        // larger than its batch, and batches whose keys were all seen before: 2^40, 7, NULL, 5
        // and -3.
        let ints = |values: Vec<Option<i64>>| Arc::new(Int64Array::from(values)) as ArrayRef;
        let batches = vec![
            (vec![Some(2), Some(0), Some(2), None], ints(vec![Some(7), Some(-3), Some(1 << 40), Some(99)])),
            (vec![Some(1), Some(1), Some(0)], ints(vec![Some(1 << 40), Some(5), Some(6), Some(8), Some(9)])),
            (vec![Some(0), Some(2), Some(1), Some(1)], ints(vec![Some(5), None, Some(7)])),
            (vec![Some(3), Some(0), Some(3), Some(1)], ints(vec![Some(-3), Some(7), Some(12), Some(5)])),
        ];
        check_dictionary_ids(DataType::Int64, batches, 5);
        // Strings, in the row format: a, NULL, b and c.
        let strings = |values: Vec<Option<&str>>| Arc::new(StringArray::from(values)) as ArrayRef;
        let batches = vec![
            (vec![Some(1), None, Some(1), Some(0)], strings(vec![Some("b"), Some("a"), Some("unused")])),
            (vec![Some(0), Some(2), Some(1)], strings(vec![Some("c"), None, Some("a")])),
            (vec![Some(1), Some(0), Some(1), Some(1)], strings(vec![Some("a"), Some("b")])),
        ];
        check_dictionary_ids(DataType::Utf8, batches, 4);
    }

    #[test]
    fn multi_column_keys_use_rows() {
        let mut interner = KeyInterner::new(vec![DataType::Utf8, DataType::Int64]).unwrap();
        let a: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), Some("x"), None, Some("x")]));
        let b: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 1, 1]));
        let ids = interner.intern(&[Arc::clone(&a), Arc::clone(&b)], 4).unwrap();
        assert_eq!(ids, vec![0, 1, 2, 0]);
        assert_eq!(interner.lookup(&[a, Arc::clone(&b)], 4).unwrap(), Some(ids));
        let unseen: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), Some("y")]));
        assert_eq!(interner.lookup(&[unseen, b.slice(0, 2)], 2).unwrap(), None);
        let back = interner.columns(&[1]).unwrap();
        assert_eq!(back[0].as_string::<i32>().value(0), "x");
        assert_eq!(back[1].as_primitive::<Int64Type>().value(0), 2);
    }
}
