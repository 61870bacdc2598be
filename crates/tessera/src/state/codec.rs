//! The binary encoding of state: little-endian fixed-width numbers and length-prefixed
//! sequences, written by [`StateWriter`] and read back by [`StateReader`], which reports a
//! truncated or corrupt input as an error, never a panic.

use crate::error::{Result, TesseraError};

/// An Arrow batch as IPC stream bytes.
pub fn batch_bytes(batch: &arrow::record_batch::RecordBatch) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut bytes, &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(bytes)
}

/// The batch [`batch_bytes`] wrote.
pub fn batch_from_bytes(bytes: &[u8]) -> Result<arrow::record_batch::RecordBatch> {
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

#[derive(Default)]
pub struct StateWriter {
    buf: Vec<u8>,
}

impl StateWriter {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }

    pub fn bytes(&mut self, v: &[u8]) {
        self.len(v.len());
        self.buf.extend_from_slice(v);
    }

    pub fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }

    pub fn u32s(&mut self, v: &[u32]) {
        self.len(v.len());
        v.iter().for_each(|x| self.u32(*x));
    }

    pub fn u64s(&mut self, v: impl ExactSizeIterator<Item = u64>) {
        self.len(v.len());
        v.for_each(|x| self.u64(x));
    }

    pub fn i64s(&mut self, v: &[i64]) {
        self.len(v.len());
        v.iter().for_each(|x| self.i64(*x));
    }

    pub fn i128s(&mut self, v: &[i128]) {
        self.len(v.len());
        v.iter().for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
    }

    pub fn f64s(&mut self, v: &[f64]) {
        self.len(v.len());
        v.iter().for_each(|x| self.u64(x.to_bits()));
    }

    pub fn bools(&mut self, v: &[bool]) {
        self.len(v.len());
        v.iter().for_each(|x| self.bool(*x));
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

pub struct StateReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn corrupt(what: &str) -> TesseraError {
    TesseraError::Checkpoint(format!("the state snapshot is truncated or corrupt ({what})"))
}

impl<'a> StateReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        StateReader { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| corrupt("ends early"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// Reads the format byte of a stored `what` (a table, a partition...), refusing one this
    /// tessera does not read with a message that says what to do.
    pub fn format(&mut self, what: &str, reads: u8) -> Result<()> {
        let format = self.u8()?;
        if format != reads {
            return Err(TesseraError::Checkpoint(format!(
                "the state store holds {what} in format {format}; this tessera reads format {reads}: resume \
                 with the tessera that wrote it, or give another --state-dir"
            )));
        }
        Ok(())
    }

    pub fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(corrupt("a flag is neither 0 nor 1")),
        }
    }

    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A length, checked against the bytes left (each element takes at least `min_size`).
    pub fn len(&mut self, min_size: usize) -> Result<usize> {
        let n = self.u64()?;
        let left = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(min_size as u64) > left {
            return Err(corrupt("a length exceeds the data"));
        }
        Ok(n as usize)
    }

    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.len(1)?;
        self.take(n)
    }

    pub fn str(&mut self) -> Result<&'a str> {
        std::str::from_utf8(self.bytes()?).map_err(|_| corrupt("a string is not UTF-8"))
    }

    pub fn u32s(&mut self) -> Result<Vec<u32>> {
        let n = self.len(4)?;
        (0..n).map(|_| self.u32()).collect()
    }

    pub fn u64s(&mut self) -> Result<Vec<u64>> {
        let n = self.len(8)?;
        (0..n).map(|_| self.u64()).collect()
    }

    pub fn i64s(&mut self) -> Result<Vec<i64>> {
        let n = self.len(8)?;
        (0..n).map(|_| self.i64()).collect()
    }

    pub fn i128s(&mut self) -> Result<Vec<i128>> {
        let n = self.len(16)?;
        (0..n).map(|_| Ok(i128::from_le_bytes(self.array()?))).collect()
    }

    pub fn f64s(&mut self) -> Result<Vec<f64>> {
        let n = self.len(8)?;
        (0..n).map(|_| Ok(f64::from_bits(self.u64()?))).collect()
    }

    pub fn bools(&mut self) -> Result<Vec<bool>> {
        let n = self.len(1)?;
        (0..n).map(|_| self.bool()).collect()
    }

    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<()> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(corrupt("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_format_this_tessera_does_not_read_is_refused_with_what_to_do() {
        let bytes = [2u8, 9];
        let mut r = StateReader::new(&bytes);
        r.format("a table", 2).expect("the format it reads");
        assert_eq!(r.u8().unwrap(), 9, "the format byte is consumed");
        let message = StateReader::new(&bytes).format("a table", 1).unwrap_err().to_string();
        assert!(message.contains("holds a table in format 2; this tessera reads format 1"), "{message}");
        assert!(message.contains("--state-dir"), "{message}");
    }

    #[test]
    fn values_round_trip_and_truncation_is_an_error() {
        let mut w = StateWriter::default();
        w.i64(-5);
        w.str("héllo");
        w.f64s(&[1.5, f64::NAN]);
        w.i128s(&[i128::MIN]);
        w.bools(&[true, false]);
        w.u32s(&[7]);
        let bytes = w.into_bytes();
        let mut r = StateReader::new(&bytes);
        assert_eq!(r.i64().unwrap(), -5);
        assert_eq!(r.str().unwrap(), "héllo");
        let floats = r.f64s().unwrap();
        assert!(floats[0] == 1.5 && floats[1].is_nan());
        assert_eq!(r.i128s().unwrap(), vec![i128::MIN]);
        assert_eq!(r.bools().unwrap(), vec![true, false]);
        assert_eq!(r.u32s().unwrap(), vec![7]);
        r.finish().unwrap();
        for cut in 0..bytes.len() {
            let mut r = StateReader::new(&bytes[..cut]);
            let result = (|| -> Result<()> {
                r.i64()?;
                r.str()?;
                r.f64s()?;
                r.i128s()?;
                r.bools()?;
                r.u32s()?;
                Ok(())
            })();
            assert!(result.is_err(), "cut at {cut}");
        }
    }
}
