//! Spark's `xxhash64(expr, ...)`, reproduced bit for bit, as a DataFusion function: the hash of
//! a view's sample (Stale View Cleaning's `eta`), so that Spark keeps the same sample.
//!
//! Spark hashes the arguments in order, each with the previous one's hash as its seed (42 for
//! the first), and leaves the seed as it is for a NULL. Per type, as Spark's `XxHash64`:
//! booleans, 8-, 16- and 32-bit integers and dates as the 4 bytes of an `int` (booleans 1 or 0),
//! 64-bit integers and timestamps in microseconds as the 8 bytes of a `long`, floats and
//! doubles as the bits of their value with -0.0 taken as 0.0 (Spark 3.2 on), strings as their
//! UTF-8 bytes, decimals of precision up to 18 as their unscaled `long`. XXH64 of 4 or 8 bytes
//! is what Spark's `hashInt` and `hashLong` compute, so one XXH64 (the `twox-hash` crate, which
//! the parquet crate brings already) serves every type.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    TimeUnit, TimestampMicrosecondType, UInt16Type, UInt32Type, UInt8Type,
};
use datafusion::common::{exec_err, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};
use twox_hash::XxHash64;

/// Spark's seed of `xxhash64`.
pub const SPARK_SEED: i64 = 42;

/// `xxhash64(expr, ...)` as Spark computes it.
pub fn xxhash64() -> ScalarUDF {
    ScalarUDF::new_from_impl(SparkXxHash64 {
        signature: Signature::one_of(vec![TypeSignature::VariadicAny], Volatility::Immutable),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct SparkXxHash64 {
    signature: Signature,
}

impl ScalarUDFImpl for SparkXxHash64 {
    fn name(&self) -> &str {
        "xxhash64"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
        let mut hashes = vec![SPARK_SEED; rows];
        for array in &arrays {
            hash_into(array, &mut hashes)?;
        }
        Ok(ColumnarValue::Array(Arc::new(Int64Array::from(hashes))))
    }
}

/// `pmod(xxhash64(stream, replicate, position), n)` as Spark computes it (each argument an
/// `INT`): the position drawn for `position` in bootstrap resample `replicate` of `n` values,
/// a counter-based draw that Spark SQL repeats exactly.
pub fn drawn(stream: i32, replicate: i32, position: i32, n: usize) -> usize {
    let hash = [stream, replicate, position].iter().fold(SPARK_SEED, |seed, v| hash_int(*v, seed));
    hash.rem_euclid(n as i64) as usize
}

fn hash_bytes(bytes: &[u8], seed: i64) -> i64 {
    XxHash64::oneshot(seed as u64, bytes) as i64
}

fn hash_int(value: i32, seed: i64) -> i64 {
    hash_bytes(&value.to_le_bytes(), seed)
}

fn hash_long(value: i64, seed: i64) -> i64 {
    hash_bytes(&value.to_le_bytes(), seed)
}

/// Each row's hash in `hashes` hashed on with the row's value in `array`.
fn hash_into(array: &ArrayRef, hashes: &mut [i64]) -> Result<()> {
    fn each<T>(array: &dyn Array, hashes: &mut [i64], values: impl Fn(usize) -> T, hash: impl Fn(T, i64) -> i64) {
        for (row, h) in hashes.iter_mut().enumerate() {
            if array.is_valid(row) {
                *h = hash(values(row), *h);
            }
        }
    }
    let a = array.as_ref();
    match array.data_type() {
        DataType::Null => {}
        DataType::Boolean => each(a, hashes, |r| array.as_boolean().value(r) as i32, hash_int),
        DataType::Int8 => each(a, hashes, |r| array.as_primitive::<Int8Type>().value(r) as i32, hash_int),
        DataType::Int16 => each(a, hashes, |r| array.as_primitive::<Int16Type>().value(r) as i32, hash_int),
        DataType::Int32 => each(a, hashes, |r| array.as_primitive::<Int32Type>().value(r), hash_int),
        DataType::UInt8 => each(a, hashes, |r| array.as_primitive::<UInt8Type>().value(r) as i32, hash_int),
        DataType::UInt16 => each(a, hashes, |r| array.as_primitive::<UInt16Type>().value(r) as i32, hash_int),
        DataType::UInt32 => each(a, hashes, |r| array.as_primitive::<UInt32Type>().value(r) as i64, hash_long),
        DataType::Date32 => each(a, hashes, |r| array.as_primitive::<Date32Type>().value(r), hash_int),
        DataType::Int64 => each(a, hashes, |r| array.as_primitive::<Int64Type>().value(r), hash_long),
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            each(a, hashes, |r| array.as_primitive::<TimestampMicrosecondType>().value(r), hash_long)
        }
        DataType::Float32 => each(
            a,
            hashes,
            |r| array.as_primitive::<Float32Type>().value(r),
            |f, seed| {
                hash_int(
                    if f == 0.0 {
                        0
                    } else if f.is_nan() {
                        0x7fc0_0000
                    } else {
                        f.to_bits() as i32
                    },
                    seed,
                )
            },
        ),
        DataType::Float64 => each(
            a,
            hashes,
            |r| array.as_primitive::<Float64Type>().value(r),
            |f, seed| {
                let bits = if f == 0.0 {
                    0
                } else if f.is_nan() {
                    0x7ff8_0000_0000_0000
                } else {
                    f.to_bits() as i64
                };
                hash_long(bits, seed)
            },
        ),
        DataType::Decimal128(precision, _) if *precision <= 18 => {
            each(a, hashes, |r| array.as_primitive::<Decimal128Type>().value(r) as i64, hash_long)
        }
        DataType::Utf8 => each(a, hashes, |r| array.as_string::<i32>().value(r), |s, h| hash_bytes(s.as_bytes(), h)),
        DataType::LargeUtf8 => {
            each(a, hashes, |r| array.as_string::<i64>().value(r), |s, h| hash_bytes(s.as_bytes(), h))
        }
        DataType::Utf8View => each(a, hashes, |r| array.as_string_view().value(r), |s, h| hash_bytes(s.as_bytes(), h)),
        DataType::Binary => each(a, hashes, |r| array.as_binary::<i32>().value(r), hash_bytes),
        DataType::Dictionary(_, value_type) => {
            let plain = arrow::compute::cast(array, value_type)?;
            hash_into(&plain, hashes)?;
        }
        other => return exec_err!("xxhash64 of {other} is not computed as Spark computes it"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int32Array, StringArray};

    fn hash(columns: Vec<ArrayRef>) -> Vec<i64> {
        let mut hashes = vec![SPARK_SEED; columns[0].len()];
        for c in &columns {
            hash_into(c, &mut hashes).unwrap();
        }
        hashes
    }

    #[test]
    fn hashes_as_spark_does() {
        // Spark's documentation of xxhash64: `SELECT xxhash64('Spark', array(123), 2)` is
        // 5602566077635097486; an array hashes its elements in order, as further arguments.
        let spark = hash(vec![
            Arc::new(StringArray::from(vec!["Spark"])),
            Arc::new(Int32Array::from(vec![123])),
            Arc::new(Int32Array::from(vec![2])),
        ]);
        assert_eq!(spark, [5602566077635097486]);
        // A NULL leaves the seed; -0.0 hashes as 0.0.
        let nulls = hash(vec![Arc::new(Int32Array::from(vec![None, Some(1)]))]);
        assert_eq!(nulls[0], SPARK_SEED);
        assert_ne!(nulls[1], SPARK_SEED);
        let zeros = hash(vec![Arc::new(Float64Array::from(vec![0.0, -0.0, 1.0]))]);
        assert_eq!(zeros[0], zeros[1]);
        assert_ne!(zeros[0], zeros[2]);
    }

    #[test]
    fn bootstrap_draws_are_sparks() {
        // PySpark 4.0.1: `SELECT pmod(xxhash64(CAST(1 AS INT), CAST(0 AS INT), CAST(0 AS INT)),
        // 1000)` is 686; (2, 399, 57) modulo 83 is 32; (1, 7, 3) modulo 5 is 0.
        assert_eq!(drawn(1, 0, 0, 1000), 686);
        assert_eq!(drawn(2, 399, 57, 83), 32);
        assert_eq!(drawn(1, 7, 3, 5), 0);
    }
}
