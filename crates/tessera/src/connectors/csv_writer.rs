//! CSV text of record batches, the same bytes as arrow's CSV writer with its defaults (a header
//! row of the column names, `,` between fields, `\n` after each row, NULL as an empty field,
//! quotes only where a field holds `,`, `"`, `\r` or `\n`, and `""` for a row whose one field is
//! empty), written faster: integer and float columns are formatted straight into one line buffer
//! (itoa and ryu, which print what arrow's display does), strings are copied as they are, and
//! only other types (dates, timestamps, decimals, booleans) go through arrow's formatter. Arrow's
//! writer formats every field into a `String` through a `dyn` display and hands each row to the
//! `csv` crate: on W1's 349,000 output rows that was a third of a run's instructions.

use std::io::Write;

use arrow::array::{
    Array, ArrowPrimitiveType, AsArray, LargeStringArray, PrimitiveArray, StringArray, StringViewArray,
};
use arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type,
    UInt8Type,
};
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::error::{Result, TesseraError};

/// Rows are handed to the output in pieces of about this size.
const FLUSH_AT: usize = 256 << 10;

/// Writes batches as CSV rows to `out`, starting with a header row if asked.
pub struct CsvWriter<W: Write> {
    out: W,
    header_due: bool,
    buffer: Vec<u8>,
}

impl<W: Write> CsvWriter<W> {
    pub fn new(out: W, header: bool) -> Self {
        CsvWriter { out, header_due: header, buffer: Vec::with_capacity(FLUSH_AT + 4096) }
    }

    /// Writes the rows of `batch` (the header first, before the first batch).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if std::mem::take(&mut self.header_due) {
            let schema = batch.schema();
            let start = self.buffer.len();
            for (i, field) in schema.fields().iter().enumerate() {
                if i > 0 {
                    self.buffer.push(b',');
                }
                push_text(&mut self.buffer, field.name().as_bytes());
            }
            let written = self.buffer.len() - start;
            end_row(&mut self.buffer, written);
        }
        let options = FormatOptions::default();
        let columns = batch.columns().iter().map(|c| Column::new(c.as_ref(), &options)).collect::<Result<Vec<_>>>()?;
        let mut text = String::new();
        for row in 0..batch.num_rows() {
            let start = self.buffer.len();
            for (i, column) in columns.iter().enumerate() {
                if i > 0 {
                    self.buffer.push(b',');
                }
                column.write(row, &mut self.buffer, &mut text).map_err(|e| {
                    TesseraError::Execution(format!("cannot write row {}, column {} as CSV: {e}", row + 1, i + 1))
                })?;
            }
            let written = self.buffer.len() - start;
            end_row(&mut self.buffer, written);
            if self.buffer.len() >= FLUSH_AT {
                self.hand_over()?;
            }
        }
        Ok(())
    }

    /// Hands the rows written so far to the output and flushes it.
    pub fn flush(&mut self) -> Result<()> {
        self.hand_over()?;
        self.out.flush().map_err(|e| TesseraError::io("cannot write CSV rows", e))
    }

    /// The output, with every row written so far handed to it (not flushed).
    pub fn into_inner(mut self) -> Result<W> {
        self.hand_over()?;
        Ok(self.out)
    }

    fn hand_over(&mut self) -> Result<()> {
        self.out.write_all(&self.buffer).map_err(|e| TesseraError::io("cannot write CSV rows", e))?;
        self.buffer.clear();
        Ok(())
    }
}

/// Ends a row of `written` bytes; a row with no bytes at all is written as `""` so that it
/// still reads back as one (empty) field, as the `csv` crate does.
fn end_row(buffer: &mut Vec<u8>, written: usize) {
    if written == 0 {
        buffer.extend_from_slice(b"\"\"");
    }
    buffer.push(b'\n');
}

/// `text` as one field: in quotes, with its quotes doubled, if it holds a byte that would end
/// the field or the row.
fn push_text(buffer: &mut Vec<u8>, text: &[u8]) {
    if !text.iter().any(|b| matches!(b, b',' | b'"' | b'\r' | b'\n')) {
        buffer.extend_from_slice(text);
        return;
    }
    buffer.push(b'"');
    for &b in text {
        if b == b'"' {
            buffer.push(b'"');
        }
        buffer.push(b);
    }
    buffer.push(b'"');
}

/// One column of a batch and how its values become text.
enum Column<'a> {
    Int8(&'a PrimitiveArray<Int8Type>),
    Int16(&'a PrimitiveArray<Int16Type>),
    Int32(&'a PrimitiveArray<Int32Type>),
    Int64(&'a PrimitiveArray<Int64Type>),
    UInt8(&'a PrimitiveArray<UInt8Type>),
    UInt16(&'a PrimitiveArray<UInt16Type>),
    UInt32(&'a PrimitiveArray<UInt32Type>),
    UInt64(&'a PrimitiveArray<UInt64Type>),
    Float32(&'a PrimitiveArray<Float32Type>),
    Float64(&'a PrimitiveArray<Float64Type>),
    Utf8(&'a StringArray),
    LargeUtf8(&'a LargeStringArray),
    Utf8View(&'a StringViewArray),
    /// Anything else, through arrow's display (which the CSV reader's types read back).
    Formatted(ArrayFormatter<'a>),
}

impl<'a> Column<'a> {
    fn new(array: &'a dyn Array, options: &FormatOptions<'a>) -> Result<Self> {
        Ok(match array.data_type() {
            DataType::Int8 => Column::Int8(array.as_primitive()),
            DataType::Int16 => Column::Int16(array.as_primitive()),
            DataType::Int32 => Column::Int32(array.as_primitive()),
            DataType::Int64 => Column::Int64(array.as_primitive()),
            DataType::UInt8 => Column::UInt8(array.as_primitive()),
            DataType::UInt16 => Column::UInt16(array.as_primitive()),
            DataType::UInt32 => Column::UInt32(array.as_primitive()),
            DataType::UInt64 => Column::UInt64(array.as_primitive()),
            DataType::Float32 => Column::Float32(array.as_primitive()),
            DataType::Float64 => Column::Float64(array.as_primitive()),
            DataType::Utf8 => Column::Utf8(array.as_string()),
            DataType::LargeUtf8 => Column::LargeUtf8(array.as_string()),
            DataType::Utf8View => Column::Utf8View(array.as_string_view()),
            t if t.is_nested() => {
                return Err(TesseraError::Execution(format!("a column of type {t} cannot be written as CSV")))
            }
            _ => Column::Formatted(ArrayFormatter::try_new(array, options)?),
        })
    }

    /// Appends the value of `row` (nothing for NULL); `text` is scratch space.
    fn write(&self, row: usize, buffer: &mut Vec<u8>, text: &mut String) -> std::result::Result<(), ArrowError> {
        match self {
            Column::Int8(a) => integer(a, row, buffer),
            Column::Int16(a) => integer(a, row, buffer),
            Column::Int32(a) => integer(a, row, buffer),
            Column::Int64(a) => integer(a, row, buffer),
            Column::UInt8(a) => integer(a, row, buffer),
            Column::UInt16(a) => integer(a, row, buffer),
            Column::UInt32(a) => integer(a, row, buffer),
            Column::UInt64(a) => integer(a, row, buffer),
            Column::Float32(a) => float(a, row, buffer),
            Column::Float64(a) => float(a, row, buffer),
            Column::Utf8(a) => string(a.is_valid(row).then(|| a.value(row)), buffer),
            Column::LargeUtf8(a) => string(a.is_valid(row).then(|| a.value(row)), buffer),
            Column::Utf8View(a) => string(a.is_valid(row).then(|| a.value(row)), buffer),
            Column::Formatted(f) => {
                text.clear();
                f.value(row).write(text)?;
                push_text(buffer, text.as_bytes());
            }
        }
        Ok(())
    }
}

fn string(value: Option<&str>, buffer: &mut Vec<u8>) {
    if let Some(value) = value {
        push_text(buffer, value.as_bytes());
    }
}

fn integer<T: ArrowPrimitiveType>(array: &PrimitiveArray<T>, row: usize, buffer: &mut Vec<u8>)
where
    T::Native: itoa::Integer,
{
    if array.is_valid(row) {
        buffer.extend_from_slice(itoa::Buffer::new().format(array.value(row)).as_bytes());
    }
}

/// Shortest round-trip text, `NaN`, `inf` and `-inf`, as arrow prints floats.
fn float<T: ArrowPrimitiveType>(array: &PrimitiveArray<T>, row: usize, buffer: &mut Vec<u8>)
where
    T::Native: ryu::Float,
{
    if array.is_valid(row) {
        buffer.extend_from_slice(ryu::Buffer::new().format(array.value(row)).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, BooleanArray, Date32Array, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array,
        TimestampMillisecondArray, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
    };

    use super::*;

    /// What arrow's own CSV writer makes of the batches.
    fn arrow_text(batches: &[RecordBatch]) -> String {
        let mut writer = arrow::csv::WriterBuilder::new().with_header(true).build(Vec::new());
        for batch in batches {
            writer.write(batch).unwrap();
        }
        String::from_utf8(writer.into_inner()).unwrap()
    }

    fn our_text(batches: &[RecordBatch]) -> String {
        let mut writer = CsvWriter::new(Vec::new(), true);
        for batch in batches {
            writer.write(batch).unwrap();
        }
        String::from_utf8(writer.into_inner().unwrap()).unwrap()
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn writes_what_arrow_writes_for_every_kind_of_column() {
        let floats = [
            Some(0.0),
            Some(-0.0),
            Some(-10.0),
            Some(-9.96995608),
            Some(1e21),
            Some(1.5e-7),
            Some(f64::MAX),
            Some(f64::MIN_POSITIVE),
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(f64::NEG_INFINITY),
            None,
        ];
        let n = floats.len();
        let ints = |i: usize| (i != 3).then_some(i as i64 * 7_919 - 40_000);
        let texts = ["plain", "a,b", "say \"hi\"", "two\nlines", "cr\rhere", "", " padded ", "ünï", "'", "x", "y", "z"];
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("f64", Arc::new(Float64Array::from(floats.to_vec()))),
            ("f32", Arc::new(Float32Array::from(floats.iter().map(|f| f.map(|v| v as f32)).collect::<Vec<_>>()))),
            ("i8", Arc::new(Int8Array::from((0..n).map(|i| ints(i).map(|v| v as i8)).collect::<Vec<_>>()))),
            ("i16", Arc::new(Int16Array::from((0..n).map(|i| ints(i).map(|v| v as i16)).collect::<Vec<_>>()))),
            ("i32", Arc::new(Int32Array::from((0..n).map(|i| ints(i).map(|v| v as i32)).collect::<Vec<_>>()))),
            ("i64", Arc::new(Int64Array::from((0..n).map(|i| ints(i).map(|v| v * 1_000_003)).collect::<Vec<_>>()))),
            ("u8", Arc::new(UInt8Array::from((0..n).map(|i| ints(i).map(|v| v as u8)).collect::<Vec<_>>()))),
            ("u16", Arc::new(UInt16Array::from((0..n).map(|i| ints(i).map(|v| v as u16)).collect::<Vec<_>>()))),
            ("u32", Arc::new(UInt32Array::from((0..n).map(|i| ints(i).map(|v| v as u32)).collect::<Vec<_>>()))),
            ("u64", Arc::new(UInt64Array::from((0..n).map(|i| ints(i).map(|v| v as u64)).collect::<Vec<_>>()))),
            (
                "utf8",
                Arc::new(StringArray::from(
                    texts.iter().enumerate().map(|(i, t)| (i != 2).then_some(*t)).collect::<Vec<_>>(),
                )),
            ),
            ("large utf8", Arc::new(LargeStringArray::from(texts.to_vec()))),
            ("view", Arc::new(StringViewArray::from(texts.to_vec()))),
            (
                "bool",
                Arc::new(BooleanArray::from((0..n).map(|i| (i % 5 != 4).then_some(i % 2 == 0)).collect::<Vec<_>>())),
            ),
            ("date", Arc::new(Date32Array::from((0..n).map(|i| ints(i).map(|v| v as i32)).collect::<Vec<_>>()))),
            (
                "ts \"ms\", quoted",
                Arc::new(TimestampMillisecondArray::from(
                    (0..n).map(|i| ints(i).map(|v| v * 3_600_007)).collect::<Vec<_>>(),
                )),
            ),
        ];
        let batches = [batch(columns.clone()), batch(columns).slice(3, 5)];
        assert_eq!(our_text(&batches), arrow_text(&batches));
    }

    #[test]
    fn a_row_with_one_empty_field_is_quoted_as_arrow_does() {
        let one = batch(vec![("", Arc::new(StringArray::from(vec![Some(""), None, Some("x")])) as ArrayRef)]);
        assert_eq!(our_text(std::slice::from_ref(&one)), arrow_text(&[one]));
    }

    #[test]
    fn a_header_alone_for_no_rows_and_none_without_header() {
        let empty = batch(vec![("a", Arc::new(Int64Array::from(Vec::<i64>::new())) as ArrayRef)]);
        assert_eq!(our_text(std::slice::from_ref(&empty)), "a\n");
        let mut writer = CsvWriter::new(Vec::new(), false);
        writer.write(&batch(vec![("a", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef)])).unwrap();
        assert_eq!(writer.into_inner().unwrap(), b"1\n2\n");
    }

    #[test]
    fn rows_are_handed_over_in_pieces_and_all_arrive() {
        let values: Vec<i64> = (0..200_000).map(|i| i * 104_729).collect();
        let big = batch(vec![("v", Arc::new(Int64Array::from(values)) as ArrayRef)]);
        assert_eq!(our_text(std::slice::from_ref(&big)), arrow_text(&[big]));
    }
}
