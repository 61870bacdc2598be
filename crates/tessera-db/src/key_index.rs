//! A table's primary-key index: each key to the position (segment, row) of the live row that
//! holds it. The keys are kept once per segment, in Arrow's row format (one buffer, not an
//! allocation per key); the hash table holds positions only and compares keys in place.

use std::hash::BuildHasher;

use arrow::row::Rows;
use hashbrown::{DefaultHashBuilder, HashTable};

#[derive(Default)]
pub struct KeyIndex {
    positions: HashTable<(u32, u32)>,
    /// The keys of every row of each segment, live or deleted, by segment.
    keys: Vec<Rows>,
    hasher: DefaultHashBuilder,
}

impl KeyIndex {
    /// The position of the row holding `key` (in the row format).
    pub fn get(&self, key: &[u8]) -> Option<(u32, u32)> {
        let hash = self.hasher.hash_one(key);
        self.positions.find(hash, |&(s, r)| self.keys[s as usize].row(r as usize).data() == key).copied()
    }

    /// Adds segment `keys.len()`, whose rows hold `keys`, with the rows `live` says are live;
    /// `Err(row)` names a row whose key is held already (the index then holds the rows before it).
    pub fn add_segment(&mut self, keys: Rows, live: impl Fn(usize) -> bool) -> Result<(), usize> {
        let segment = self.keys.len() as u32;
        self.positions
            .reserve(keys.num_rows(), |&(s, r)| self.hasher.hash_one(self.keys[s as usize].row(r as usize).data()));
        self.keys.push(keys);
        let keys = &self.keys;
        for row in (0..keys[segment as usize].num_rows()).filter(|&r| live(r)) {
            let key = keys[segment as usize].row(row).data();
            let hash = self.hasher.hash_one(key);
            let held = |&(s, r): &(u32, u32)| keys[s as usize].row(r as usize).data() == key;
            if self.positions.find(hash, held).is_some() {
                return Err(row);
            }
            self.positions.insert_unique(hash, (segment, row as u32), |&(s, r)| {
                self.hasher.hash_one(keys[s as usize].row(r as usize).data())
            });
        }
        Ok(())
    }

    /// Forgets the row at `position` (deleted).
    pub fn remove(&mut self, (segment, row): (u32, u32)) {
        let key = self.keys[segment as usize].row(row as usize).data();
        let hash = self.hasher.hash_one(key);
        if let Ok(entry) = self.positions.find_entry(hash, |&p| p == (segment, row)) {
            entry.remove();
        }
    }
}
