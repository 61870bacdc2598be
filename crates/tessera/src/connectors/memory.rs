//! Batches already in memory as a source: for benchmarks that time computation without
//! decoding, and for tests.

use arrow::record_batch::RecordBatch;

use super::{BatchReader, Skipped};
use crate::error::Result;

/// Hands out prepared batches in order.
pub struct MemoryReader {
    batches: Vec<RecordBatch>,
    next: usize,
}

impl MemoryReader {
    pub fn new(batches: Vec<RecordBatch>) -> Self {
        MemoryReader { batches, next: 0 }
    }
}

/// Reads every batch of `reader` into memory.
pub fn read_all(reader: &mut dyn BatchReader) -> Result<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    while let Some(batch) = reader.next_batch()? {
        batches.push(batch);
    }
    Ok(batches)
}

impl BatchReader for MemoryReader {
    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        let batch = self.batches.get(self.next).cloned();
        self.next += 1;
        Ok(batch)
    }

    fn progress(&self) -> (u64, Option<u64>) {
        (self.next.min(self.batches.len()) as u64, Some(self.batches.len() as u64))
    }

    fn skipped(&self) -> Skipped {
        Skipped::default()
    }

    /// Positions are batch indexes.
    fn seek(&mut self, position: u64, _skipped: Option<Skipped>) -> Result<bool> {
        let found = position as usize <= self.batches.len();
        if found {
            self.next = position as usize;
        }
        Ok(found)
    }
}
