//! Parquet files: columns are matched to the declared schema by name and cast to the declared
//! types. Parquet has no lines, so a malformed row is reported by its 1-based row number. A
//! resumed run starts at the checkpoint's row: row groups before it are not read at all.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use arrow::compute::cast;
use arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use super::{BadRowPolicy, BatchReader, ReadOptions, RowShape, Skipped};
use crate::catalog::SourceDef;
use crate::error::{Result, TesseraError};

/// A Parquet file mapped into memory: pages are decoded straight from the page cache, with no
/// read into a fresh buffer per page (W1's `wcg` plan ran 10% faster end to end than through
/// `File`'s reader, which copies every page into a newly allocated buffer). With the bytes
/// comes what maps the pages the reader will decode in ahead of it.
pub fn map_file(file: &std::fs::File) -> std::io::Result<(bytes::Bytes, MapAhead)> {
    // SAFETY: the map is read-only and private. Another process truncating the file while it
    // is read would fault the reading thread (SIGBUS), as it would in any reader that maps
    // files (DuckDB, Polars, Arrow's own); rewriting it in place can only hand the decoder
    // bytes it then rejects or reads as other values, never memory outside the map.
    let map = unsafe { memmap2::Mmap::map(file)? };
    // Where the page cache holds a file in 2 MiB folios (read in cold through this map, or
    // written in large writes, as `tessera generate` does), they are mapped with one entry
    // each instead of 512: a decoder that reads a file once takes a TLB miss per 4 KiB page
    // otherwise, and under a hypervisor each costs a two-level page walk (W1's file decoded in
    // 45 ms instead of 58). Small folios are mapped as before; an error (no THP) changes nothing.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    let map = Arc::new(map);
    Ok((bytes::Bytes::from_owner(SharedMap(Arc::clone(&map))), MapAhead(map)))
}

/// The map, shared by the decoder's bytes and [`MapAhead`].
struct SharedMap(Arc<memmap2::Mmap>);

impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Maps byte ranges of a mapped file in (reading from disk what is not cached), in order, on a
/// thread of its own. The reading thread otherwise takes a page fault every few pages it
/// decodes and does any disk read itself; this runs on the core beside it, idle while the
/// first batches are decoded (W1's shared plan ran 5 to 10 ms faster, the baseline 5 to 8).
/// It stops after `LIMIT` bytes, so a file larger than memory is not read in far ahead of the
/// decoder, and as soon as the reader has dropped the map.
pub struct MapAhead(Arc<memmap2::Mmap>);

impl MapAhead {
    /// Bytes mapped in at a time.
    #[cfg(target_os = "linux")]
    const CHUNK: u64 = 16 << 20;
    /// Bytes mapped in at most.
    #[cfg(target_os = "linux")]
    const LIMIT: u64 = 1 << 30;

    /// Starts mapping `ranges` (offset, length) in.
    #[cfg(target_os = "linux")]
    fn start(self, ranges: Vec<(u64, u64)>) {
        let pieces = pieces(&ranges, self.0.len() as u64, (Self::CHUNK, Self::LIMIT));
        // Without the thread the decoder faults the pages in itself: no harm but the time.
        let _ = std::thread::Builder::new().name("tessera-map".into()).spawn(move || {
            for (offset, len) in pieces {
                // An error: a kernel before 5.14.
                let mapped = self.0.advise_range(memmap2::Advice::PopulateRead, offset as usize, len as usize);
                if mapped.is_err() || Arc::strong_count(&self.0) == 1 {
                    return;
                }
            }
        });
    }

    #[cfg(not(target_os = "linux"))]
    fn start(self, _ranges: Vec<(u64, u64)>) {}
}

/// `ranges` (offset, length) within a map of `len` bytes, in order, cut in pieces of at most
/// `chunk` bytes, `limit` bytes in all.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn pieces(ranges: &[(u64, u64)], len: u64, (chunk, limit): (u64, u64)) -> Vec<(u64, u64)> {
    let mut pieces = Vec::new();
    let mut budget = limit;
    for &(offset, length) in ranges {
        let (mut at, end) = (offset.min(len), offset.saturating_add(length).min(len));
        while at < end && budget > 0 {
            let n = chunk.min(end - at).min(budget);
            pieces.push((at, n));
            (at, budget) = (at + n, budget - n);
        }
    }
    pieces
}

/// Builds the batch reader starting at a given row.
type StartAt = Box<dyn FnOnce(u64) -> Result<ParquetRecordBatchReader> + Send>;

pub struct ParquetReader {
    name: String,
    /// Until the first batch is read, how to start reading (at row 0, or where `seek` says).
    start: Option<StartAt>,
    reader: Option<ParquetRecordBatchReader>,
    /// The declared columns as read, and which of them a row must have.
    shape: RowShape,
    /// Position of each declared column in the projected batches.
    columns: Vec<usize>,
    rows_read: u64,
    total_rows: u64,
    policy: BadRowPolicy,
}

impl ParquetReader {
    /// A reader of `input`; `ahead` maps the pages it will decode in ahead of it.
    pub fn new(
        source: &SourceDef,
        name: String,
        input: bytes::Bytes,
        ahead: Option<MapAhead>,
        options: &ReadOptions,
    ) -> Result<Self> {
        let invalid = |e: parquet::errors::ParquetError| TesseraError::Input {
            file: name.clone(),
            line: 0,
            reason: e.to_string(),
        };
        let builder = ParquetRecordBatchReaderBuilder::try_new(input).map_err(invalid)?;
        let file_schema = builder.schema().clone();
        let total_rows = builder.metadata().file_metadata().num_rows().max(0) as u64;
        let mut leaves = Vec::new();
        for field in source.schema.fields() {
            let index =
                file_schema.fields().iter().position(|f| f.name().eq_ignore_ascii_case(field.name())).ok_or_else(
                    || TesseraError::Input {
                        file: name.clone(),
                        line: 0,
                        reason: format!(
                            "no column `{}` in the file (it has: {})",
                            field.name(),
                            file_schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    },
                )?;
            leaves.push(index);
        }
        let mut sorted = leaves.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let columns = leaves.iter().map(|l| sorted.binary_search(l).expect("present")).collect();
        let mask = ProjectionMask::roots(builder.parquet_schema(), sorted.iter().copied());
        let batch_size = options.batch_size.max(1);
        let start_name = name.clone();
        let start: StartAt = Box::new(move |row| {
            // Whole row groups before `row` are skipped without reading them.
            let mut skipped = 0u64;
            let mut groups = Vec::new();
            for (i, group) in builder.metadata().row_groups().iter().enumerate() {
                let rows = group.num_rows().max(0) as u64;
                if groups.is_empty() && skipped + rows <= row {
                    skipped += rows;
                } else {
                    groups.push(i);
                }
            }
            if let Some(ahead) = ahead {
                let metadata = builder.metadata();
                let chunks = |g: &usize| metadata.row_group(*g).columns().iter().map(|c| c.byte_range());
                let leaves = |g: &usize| chunks(g).enumerate().filter(|(leaf, _)| mask.leaf_included(*leaf));
                ahead.start(groups.iter().flat_map(|g| leaves(g).map(|(_, range)| range)).collect());
            }
            builder
                .with_row_groups(groups)
                .with_offset((row - skipped) as usize)
                .with_projection(mask)
                .with_batch_size(batch_size)
                .build()
                .map_err(|e| TesseraError::Input { file: start_name, line: 0, reason: e.to_string() })
        });
        Ok(ParquetReader {
            name,
            start: Some(start),
            reader: None,
            shape: RowShape::of(source),
            columns,
            rows_read: 0,
            total_rows,
            policy: BadRowPolicy::new(options),
        })
    }

    fn reader(&mut self) -> Result<&mut ParquetRecordBatchReader> {
        if let Some(start) = self.start.take() {
            self.reader = Some(start(self.rows_read)?);
        }
        Ok(self.reader.as_mut().expect("started above"))
    }
}

impl BatchReader for ParquetReader {
    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            let Some(batch) = self.reader()?.next() else {
                self.policy.flush()?;
                return Ok(None);
            };
            let batch = batch.map_err(|e| TesseraError::Input {
                file: self.name.clone(),
                line: self.rows_read + 1,
                reason: e.to_string(),
            })?;
            let first_row = self.rows_read + 1;
            self.rows_read += batch.num_rows() as u64;
            let columns = self
                .columns
                .iter()
                .zip(self.shape.schema.fields())
                .map(|(&i, field)| {
                    let column = batch.column(i);
                    if column.data_type() == field.data_type() {
                        Ok(Arc::clone(column))
                    } else {
                        cast(column, field.data_type()).map_err(|e| TesseraError::Input {
                            file: self.name.clone(),
                            line: first_row,
                            reason: format!(
                                "column `{}` of type {} cannot be read as {}: {e}",
                                field.name(),
                                column.data_type(),
                                field.data_type()
                            ),
                        })
                    }
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
            let batch = RecordBatch::try_new(Arc::clone(&self.shape.schema), columns)?;
            let (name, policy) = (&self.name, &mut self.policy);
            let batch = self
                .shape
                .drop_incomplete(batch, |row, reason| policy.bad_row(name, first_row + row as u64, reason, ""))?;
            if batch.num_rows() > 0 {
                self.policy.flush()?;
                return Ok(Some(batch));
            }
        }
    }

    fn progress(&self) -> (u64, Option<u64>) {
        (self.rows_read, Some(self.total_rows))
    }

    fn skipped(&self) -> Skipped {
        self.policy.skipped()
    }

    /// Positions are rows read.
    fn seek(&mut self, position: u64, skipped: Option<Skipped>) -> Result<bool> {
        let found = self.start.is_some() && position <= self.total_rows && self.policy.resume(skipped)?;
        if found {
            self.rows_read = position;
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn ranges_are_mapped_in_chunks_within_the_map_and_the_limit() {
        let ranges = [(0, 40), (100, 10), (195, 10), (300, 5)];
        assert_eq!(pieces(&ranges, 200, (16, 1000)), vec![(0, 16), (16, 16), (32, 8), (100, 10), (195, 5)]);
        assert_eq!(pieces(&ranges, 200, (16, 20)), vec![(0, 16), (16, 4)]);
        assert_eq!(pieces(&[(0, u64::MAX)], 10, (16, 1000)), vec![(0, 10)]);
        assert!(pieces(&[], 10, (16, 1000)).is_empty());
    }
}
