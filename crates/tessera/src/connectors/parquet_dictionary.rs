//! Dictionary-encoded columns of a Parquet file read as Arrow dictionary arrays: the
//! dictionary indices of each page unpacked, the row group's dictionary as the values. Where a
//! column is read only as a group key or an aggregate's argument, nothing needs more: keys are
//! interned once per dictionary entry, aggregates look each row's value up in the dictionary,
//! and the column's values are never materialized row by row. The parquet crate's reader looks
//! each index up and writes the value out (into a zero-filled buffer) for every row; on W1's
//! file that was 15.5 ms for the key column, its indices alone 4.5 ms.
//!
//! Read here: INT32, INT64, FLOAT, DOUBLE and UTF-8 string columns, not repeated, at most one
//! definition level, whose chunks all have a dictionary page and use only the plain and
//! dictionary encodings (data pages that fell back to plain encoding become entries of the
//! batch's dictionary), in data pages of format v1 and v2. Other columns are read by the
//! parquet crate.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, DictionaryArray, UInt32Array};
use arrow::buffer::{Buffer, MutableBuffer, NullBuffer};
use arrow::datatypes::{DataType, UInt32Type};
use bytes::{Buf, Bytes};
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};
use parquet::file::serialized_reader::SerializedPageReader;

/// The Arrow type a dictionary column is read as, for a column of `value_type`.
pub fn dictionary_type(value_type: &DataType) -> DataType {
    DataType::Dictionary(Box::new(DataType::UInt32), Box::new(value_type.clone()))
}

/// Whether the chunks of leaf column `leaf` in `metadata`'s row groups can be read here as
/// values of `value_type` (which the parquet crate reads the column as).
pub fn readable(metadata: &ParquetMetaData, leaf: usize, value_type: &DataType) -> bool {
    let physical = match value_type {
        DataType::Int32 => PhysicalType::INT32,
        DataType::Int64 => PhysicalType::INT64,
        DataType::Float32 => PhysicalType::FLOAT,
        DataType::Float64 => PhysicalType::DOUBLE,
        DataType::Utf8 => PhysicalType::BYTE_ARRAY,
        _ => return false,
    };
    let supported = |chunk: &ColumnChunkMetaData| {
        let column = chunk.column_descr();
        chunk.column_type() == physical
            && column.max_rep_level() == 0
            && column.max_def_level() <= 1
            && chunk.dictionary_page_offset().is_some()
            && chunk.encodings().all(|encoding| {
                matches!(
                    encoding,
                    Encoding::PLAIN | Encoding::PLAIN_DICTIONARY | Encoding::RLE | Encoding::RLE_DICTIONARY
                )
            })
    };
    metadata.row_groups().iter().all(|group| supported(group.column(leaf)))
}

/// A dictionary-encoded column read batch by batch, from a given row of the first of the row
/// groups it reads.
pub struct DictionaryColumn {
    input: Arc<Bytes>,
    metadata: Arc<ParquetMetaData>,
    leaf: usize,
    value_type: DataType,
    /// Whether the column has definition levels (may hold NULLs).
    nullable: bool,
    /// Row groups not opened yet.
    groups: VecDeque<usize>,
    pages: Option<SerializedPageReader<Bytes>>,
    /// The open row group's dictionary.
    dictionary: Option<ArrayRef>,
    page: Option<DataPage>,
    /// Rows to pass over before the first batch.
    skip: usize,
    /// Definition levels of the rows being read (reused).
    levels: Vec<u32>,
}

/// The part of a data page not read yet.
struct DataPage {
    rows: usize,
    /// Definition levels (1: a value, 0: NULL) of a column that may hold NULLs.
    levels: Option<Hybrid>,
    values: Values,
}

enum Values {
    Indices(Hybrid),
    /// A page that fell back to plain encoding: the values themselves.
    Plain(Bytes),
}

/// A failure to read the column, as the reader reports it.
type ReadResult<T> = std::result::Result<T, String>;

impl DictionaryColumn {
    /// Reads `groups`' chunks of leaf `leaf` (which [`readable`] accepted) from row `offset` of
    /// the first.
    pub fn new(
        input: Bytes,
        metadata: Arc<ParquetMetaData>,
        leaf: usize,
        value_type: DataType,
        groups: Vec<usize>,
        offset: usize,
    ) -> Self {
        let nullable = metadata.file_metadata().schema_descr().column(leaf).max_def_level() > 0;
        DictionaryColumn {
            input: Arc::new(input),
            metadata,
            leaf,
            value_type,
            nullable,
            groups: groups.into(),
            pages: None,
            dictionary: None,
            page: None,
            skip: offset,
            levels: Vec::new(),
        }
    }

    /// The next `rows` rows (fewer at the end of the column).
    pub fn next(&mut self, rows: usize) -> ReadResult<ArrayRef> {
        while self.skip > 0 {
            let n = self.skip.min(1 << 16);
            self.read(n)?;
            self.skip -= n;
        }
        self.read(rows)
    }

    fn read(&mut self, rows: usize) -> ReadResult<ArrayRef> {
        let mut keys: Vec<u32> = Vec::with_capacity(rows);
        // Validity, once a NULL was read (every earlier row valid).
        let mut valid: Option<Vec<bool>> = None;
        let mut dictionaries: Vec<ArrayRef> = Vec::new();
        let mut dictionary_len = 0u32;
        // Plain values of the pages read since the last dictionary, not yet in `dictionaries`.
        let mut plain = PlainRun::default();
        // The last row group dictionary the batch took in, and where it starts among them.
        let mut last: Option<(ArrayRef, u32)> = None;
        while keys.len() < rows {
            let Some(page) = self.page.as_mut().filter(|page| page.rows > 0) else {
                if !self.next_page()? {
                    break;
                }
                continue;
            };
            let n = (rows - keys.len()).min(page.rows);
            page.rows -= n;
            // Rows with a value, and where the NULLs are: a run of rows that all have one is
            // passed over whole.
            let present = match &mut page.levels {
                None => n,
                Some(levels) => match levels.repeated_for(n)? {
                    Some(1) => n,
                    repeated => {
                        self.levels.clear();
                        match repeated {
                            Some(level) => self.levels.resize(n, level),
                            None => levels.read(n, &mut self.levels)?,
                        }
                        let present = self.levels.iter().filter(|&&level| level == 1).count();
                        if present < n {
                            let valid = valid.get_or_insert_with(|| vec![true; keys.len()]);
                            valid.extend(self.levels.iter().map(|&level| level == 1));
                        }
                        present
                    }
                },
            };
            let start = keys.len();
            let offset = match &mut page.values {
                Values::Indices(indices) => {
                    indices.read(present, &mut keys)?;
                    let dictionary = self.dictionary.as_ref().ok_or("a data page before its dictionary page")?;
                    // Indices of fewer bits than the dictionary needs are all within it.
                    let within = dictionary.len() >= 1 << indices.width
                        || keys[start..].iter().max().is_none_or(|&max| (max as usize) < dictionary.len());
                    if !within {
                        return Err("a dictionary index past the end of the dictionary".into());
                    }
                    match &last {
                        Some((taken, start)) if Arc::ptr_eq(taken, dictionary) => *start,
                        _ => {
                            let start = dictionary_len;
                            plain.finish_into(&self.value_type, &mut dictionaries)?;
                            dictionaries.push(Arc::clone(dictionary));
                            dictionary_len += dictionary.len() as u32;
                            last = Some((Arc::clone(dictionary), start));
                            start
                        }
                    }
                }
                Values::Plain(values) => {
                    plain.take(values, present, rows - start, &self.value_type, &mut dictionaries)?;
                    dictionary_len += present as u32;
                    keys.extend(0..present as u32);
                    dictionary_len - present as u32
                }
            };
            if offset > 0 {
                keys[start..].iter_mut().for_each(|key| *key += offset);
            }
            if present < n {
                // Spread the values over the rows, NULLs taking key 0.
                let values = keys.split_off(start);
                let mut values = values.into_iter();
                keys.extend(self.levels.iter().map(|&level| if level == 1 { values.next().unwrap_or(0) } else { 0 }));
            } else if let Some(valid) = &mut valid {
                valid.resize(keys.len(), true);
            }
        }
        plain.finish_into(&self.value_type, &mut dictionaries)?;
        let held: usize = dictionaries.iter().map(|part| part.len()).sum();
        let values = match dictionaries.len() {
            0 => arrow::array::new_empty_array(&self.value_type),
            1 => dictionaries.pop().expect("one"),
            _ if held > keys.len() => values_of_rows(&dictionaries, &mut keys)?,
            _ => arrow::compute::concat(&dictionaries.iter().map(|d| d.as_ref()).collect::<Vec<_>>())
                .map_err(|e| e.to_string())?,
        };
        let nulls = valid.map(NullBuffer::from).filter(|nulls| nulls.null_count() > 0);
        let keys = UInt32Array::new(keys.into(), nulls);
        // SAFETY: every key is an index into `values`: each page's indices were checked against
        // their dictionary's length, then moved by where it starts in `values`; plain values
        // and NULLs took keys within their part; with the rows' values gathered, each key is
        // its own row. (Checking them again, as the safe constructor does one by one, took 4%
        // of a W1 run's time.)
        Ok(Arc::new(unsafe { DictionaryArray::<UInt32Type>::new_unchecked(keys, values) }))
    }

    /// Moves to the next data page (through the next row groups and dictionary pages): whether
    /// there is one.
    fn next_page(&mut self) -> ReadResult<bool> {
        loop {
            let page = match self.pages.as_mut() {
                Some(pages) => pages.get_next_page().map_err(|e| e.to_string())?,
                None => None,
            };
            let Some(page) = page else {
                let Some(group) = self.groups.pop_front() else { return Ok(false) };
                let group = self.metadata.row_group(group);
                let rows = group.num_rows().max(0) as usize;
                let pages = SerializedPageReader::new(Arc::clone(&self.input), group.column(self.leaf), rows, None)
                    .map_err(|e| e.to_string())?;
                (self.pages, self.dictionary) = (Some(pages), None);
                continue;
            };
            let nullable = self.nullable;
            let (buf, rows, encoding, levels) = match page {
                Page::DictionaryPage { mut buf, num_values, .. } => {
                    let values = PlainRun::array(&mut buf, num_values as usize, &self.value_type)
                        .map_err(|_| "the dictionary page holds fewer values than it says")?;
                    self.dictionary = Some(values);
                    continue;
                }
                Page::DataPage { buf, num_values, encoding, def_level_encoding, .. } => {
                    if !nullable {
                        (buf, num_values, encoding, None)
                    } else if def_level_encoding != Encoding::RLE {
                        return Err(format!("definition levels encoded as {def_level_encoding}"));
                    } else {
                        let length = buf.get(..4).ok_or("a data page without its definition levels")?;
                        let length = u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize;
                        let levels = buf.get(4..4 + length).ok_or("a data page cut short in its levels")?;
                        let levels = Hybrid::new(buf.slice_ref(levels), 1);
                        (buf.slice(4 + length..), num_values, encoding, Some(levels))
                    }
                }
                Page::DataPageV2 { buf, num_values, encoding, def_levels_byte_len, rep_levels_byte_len, .. } => {
                    let start = rep_levels_byte_len as usize;
                    let end = start + def_levels_byte_len as usize;
                    let levels = buf.get(start..end).ok_or("a data page cut short in its levels")?;
                    let levels = nullable.then(|| Hybrid::new(buf.slice_ref(levels), 1));
                    (buf.slice(end..), num_values, encoding, levels)
                }
            };
            let values = match encoding {
                Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                    let width = *buf.first().ok_or("a data page without its values")? as usize;
                    if width > 32 {
                        return Err(format!("dictionary indices of {width} bits"));
                    }
                    Values::Indices(Hybrid::new(buf.slice(1..), width))
                }
                Encoding::PLAIN => Values::Plain(buf),
                other => return Err(format!("a data page encoded as {other}")),
            };
            self.page = Some(DataPage { rows: rows as usize, levels, values });
            return Ok(true);
        }
    }
}

/// The plain-encoded values of consecutive data pages (a chunk whose dictionary grew too large
/// falls back to them), which become one part of the batch's dictionary. Values from one page
/// stay where the page was decompressed (the array shares the page's buffer); values from
/// several are gathered into one buffer, instead of an array per page concatenated afterwards
/// (a second copy of the values of every batch that spans pages). Strings, rarer here, become a
/// part per page.
#[derive(Default)]
struct PlainRun {
    /// The values taken from one page, not copied.
    shared: Option<Bytes>,
    bytes: MutableBuffer,
    values: usize,
}

impl PlainRun {
    /// Takes `count` plain values from `page`; `room`: the values the batch may still take (at
    /// least `count`), so that a run gathered from several pages is not moved as it grows.
    fn take(
        &mut self,
        page: &mut Bytes,
        count: usize,
        room: usize,
        value_type: &DataType,
        parts: &mut Vec<ArrayRef>,
    ) -> ReadResult<()> {
        const SHORT: &str = "a data page holds fewer values than it says";
        if value_type == &DataType::Utf8 {
            parts.push(plain_strings(page, count).ok_or(SHORT)?);
            return Ok(());
        }
        let width = value_type.primitive_width().ok_or("a plain column of an unsupported type")?;
        let len = count.checked_mul(width).filter(|&n| n <= page.len()).ok_or(SHORT)?;
        let taken = page.split_to(len);
        if self.values == 0 {
            self.shared = Some(taken);
        } else {
            if self.bytes.capacity() == 0 {
                self.bytes.reserve((self.values + room).saturating_mul(width));
            }
            if let Some(shared) = self.shared.take() {
                self.bytes.extend_from_slice(&shared);
            }
            self.bytes.extend_from_slice(&taken);
        }
        self.values += count;
        Ok(())
    }

    /// `count` plain values of `value_type` from `page`, as one array.
    fn array(page: &mut Bytes, count: usize, value_type: &DataType) -> ReadResult<ArrayRef> {
        let (mut run, mut parts) = (PlainRun::default(), Vec::new());
        run.take(page, count, count, value_type, &mut parts)?;
        run.finish_into(value_type, &mut parts)?;
        Ok(parts.pop().unwrap_or_else(|| arrow::array::new_empty_array(value_type)))
    }

    /// Adds the values gathered to `parts` as one array of `value_type`.
    fn finish_into(&mut self, value_type: &DataType, parts: &mut Vec<ArrayRef>) -> ReadResult<()> {
        if self.values == 0 {
            return Ok(());
        }
        let width = value_type.primitive_width().unwrap_or(1);
        let buffer: Buffer = match self.shared.take() {
            // Arrow holds numbers in the machine's order, aligned to their width; Parquet stores
            // them little-endian, wherever the page puts them.
            Some(shared) if cfg!(target_endian = "little") && shared.as_ptr().align_offset(width) == 0 => shared.into(),
            shared => {
                let mut bytes = std::mem::take(&mut self.bytes);
                if let Some(shared) = shared {
                    bytes.extend_from_slice(&shared);
                }
                if cfg!(target_endian = "big") {
                    bytes.as_slice_mut().chunks_exact_mut(width).for_each(<[u8]>::reverse);
                }
                bytes.into()
            }
        };
        let values = std::mem::take(&mut self.values);
        let data = arrow::array::ArrayData::try_new(value_type.clone(), values, None, 0, vec![buffer], vec![])
            .map_err(|e| e.to_string())?;
        parts.push(arrow::array::make_array(data));
        Ok(())
    }
}

/// The values `keys` pick from `parts` (a batch's dictionaries, one after the other), in row
/// order, each key then pointing at its own row. For a batch whose parts hold more values than
/// it has rows, this is the smaller copy: a row group's dictionary (pyarrow's hold up to 1 MiB)
/// and the pages after it that fell back to plain encoding, or the dictionaries of two row
/// groups the batch straddles. Joined, every such batch would copy the whole dictionary again.
fn values_of_rows(parts: &[ArrayRef], keys: &mut [u32]) -> ReadResult<ArrayRef> {
    let starts: Vec<u32> = parts
        .iter()
        .scan(0u32, |start, part| {
            let this = *start;
            *start += part.len() as u32;
            Some(this)
        })
        .collect();
    // (part, row in it) of each key: the last part starting at or before it.
    let picks: Vec<(usize, usize)> = keys
        .iter()
        .map(|&key| {
            let part = starts.partition_point(|&start| start <= key).saturating_sub(1);
            (part, (key - starts[part]) as usize)
        })
        .collect();
    let parts: Vec<&dyn Array> = parts.iter().map(|part| part.as_ref()).collect();
    let values = arrow::compute::interleave(&parts, &picks).map_err(|e| e.to_string())?;
    keys.iter_mut().zip(0u32..).for_each(|(key, row)| *key = row);
    Ok(values)
}

/// `count` plain-encoded strings (each a 4-byte little-endian length, then its bytes) from
/// `bytes`; `None` if it holds fewer.
fn plain_strings(bytes: &mut Bytes, count: usize) -> Option<ArrayRef> {
    let (mut offsets, mut values, mut at) = (vec![0i32], Vec::new(), 0usize);
    for _ in 0..count {
        let length = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
        values.extend_from_slice(bytes.get(at + 4..(at + 4).checked_add(length)?)?);
        offsets.push(i32::try_from(values.len()).ok()?);
        at += 4 + length;
    }
    bytes.advance(at);
    let offsets = arrow::buffer::OffsetBuffer::new(offsets.into());
    Some(Arc::new(arrow::array::StringArray::try_new(offsets, values.into(), None).ok()?))
}

/// Parquet's hybrid of run-length and bit-packed encoding, of values `width` bits wide (at most
/// 32), read a given number of values at a time: runs are a ULEB128 header, then either one
/// value repeated (header's low bit 0, count in the rest; the value in whole bytes) or groups
/// of eight values packed least significant bit first (low bit 1, groups in the rest).
struct Hybrid {
    buf: Bytes,
    at: usize,
    width: usize,
    /// Values left in the current run, and the value of a repeated run.
    repeated: (usize, u32),
    packed: usize,
    /// A bit-packed group partly read, and how much of it was.
    group: [u32; 8],
    group_read: usize,
}

impl Hybrid {
    fn new(buf: Bytes, width: usize) -> Self {
        Hybrid { buf, at: 0, width, repeated: (0, 0), packed: 0, group: [0; 8], group_read: 8 }
    }

    /// Appends the next `n` values to `out`.
    fn read(&mut self, mut n: usize, out: &mut Vec<u32>) -> ReadResult<()> {
        while n > 0 {
            if self.group_read < 8 {
                let take = n.min(8 - self.group_read);
                out.extend_from_slice(&self.group[self.group_read..self.group_read + take]);
                (self.group_read, n) = (self.group_read + take, n - take);
            } else if self.repeated.0 > 0 {
                let take = n.min(self.repeated.0);
                out.resize(out.len() + take, self.repeated.1);
                (self.repeated.0, n) = (self.repeated.0 - take, n - take);
            } else if self.packed > 0 {
                // Whole groups straight into `out`, the last one partly read into `group`.
                let groups = (n / 8).min(self.packed / 8);
                let bytes = self.take_bytes(groups * self.width)?;
                unpack(self.width, &self.buf[bytes], groups, out);
                (self.packed, n) = (self.packed - groups * 8, n - groups * 8);
                if n > 0 && n < 8 && self.packed > 0 {
                    let bytes = self.take_bytes(self.width)?;
                    let mut group = Vec::with_capacity(8);
                    unpack(self.width, &self.buf[bytes], 1, &mut group);
                    self.group.copy_from_slice(&group);
                    (self.group_read, self.packed) = (0, self.packed - 8);
                }
            } else {
                self.next_run()?;
            }
        }
        Ok(())
    }

    /// The value of the next `n` values if they are all one repeated value, which are then
    /// read (`None`, nothing read, otherwise).
    fn repeated_for(&mut self, n: usize) -> ReadResult<Option<u32>> {
        if self.group_read == 8 && self.repeated.0 == 0 && self.packed == 0 && self.at < self.buf.len() {
            self.next_run()?;
        }
        if self.group_read < 8 || self.repeated.0 < n {
            return Ok(None);
        }
        self.repeated.0 -= n;
        Ok(Some(self.repeated.1))
    }

    /// Reads the next run's header (and a repeated run's value).
    fn next_run(&mut self) -> ReadResult<()> {
        let header = self.uleb128()?;
        let count = usize::try_from(header >> 1).map_err(|_| "a run too long")?;
        if count == 0 {
            return Err("an empty run".into());
        }
        if header & 1 == 1 {
            self.packed = count.checked_mul(8).ok_or("a run too long")?;
        } else {
            let bytes = self.take_bytes(self.width.div_ceil(8))?;
            let mut value = [0u8; 4];
            value[..bytes.len()].copy_from_slice(&self.buf[bytes]);
            self.repeated = (count, u32::from_le_bytes(value));
        }
        Ok(())
    }

    /// Where the next `n` bytes are in the buffer, which are then read.
    fn take_bytes(&mut self, n: usize) -> ReadResult<std::ops::Range<usize>> {
        let bytes = self.at..self.at + n;
        if bytes.end > self.buf.len() {
            return Err("a page cut short in its values".into());
        }
        self.at += n;
        Ok(bytes)
    }

    fn uleb128(&mut self) -> ReadResult<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let at = self.take_bytes(1)?.start;
            let byte = self.buf[at];
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err("a run header too long".into())
    }
}

/// Appends `groups` groups of eight `width`-bit values (`width` bytes each) from `bytes` to
/// `out`, with the width known at compile time (appended, not written over zeros: filling
/// the buffer first took a tenth of the reading thread's time on W1).
fn unpack(width: usize, bytes: &[u8], groups: usize, out: &mut Vec<u32>) {
    out.reserve(groups * 8);
    macro_rules! widths {
        ($($w:literal)*) => {
            match width {
                0 => out.resize(out.len() + groups * 8, 0),
                $($w => for group in bytes.chunks_exact($w) {
                    out.extend_from_slice(&unpack_group::<$w>(group))
                },)*
                _ => unreachable!("widths are at most 32 bits"),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32)
}

/// Eight `W`-bit values, least significant bit first, from `W` bytes.
#[inline(always)]
fn unpack_group<const W: usize>(bytes: &[u8]) -> [u32; 8] {
    let mut padded = [0u8; 32];
    padded[..W].copy_from_slice(&bytes[..W]);
    let low = u128::from_le_bytes(padded[..16].try_into().expect("16 bytes"));
    let high = u128::from_le_bytes(padded[16..].try_into().expect("16 bytes"));
    let mask = (1u128 << W) - 1;
    let mut out = [0; 8];
    for (i, value) in out.iter_mut().enumerate() {
        let bit = i * W;
        let bits = if bit + W <= 128 {
            low >> bit
        } else if bit >= 128 {
            high >> (bit - 128)
        } else {
            (low >> bit) | (high << (128 - bit))
        };
        *value = (bits & mask) as u32;
    }
    out
}
