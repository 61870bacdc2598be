//! Running scripts over in-memory batches and turning results into comparable rows.

use std::path::Path;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use arrow::record_batch::RecordBatch;
use tessera::connectors::memory::MemoryReader;
use tessera::connectors::sink::MemorySink;
use tessera::engine::{run_script_with_readers, RunOptions, RunStats, Script, StateOptions};
use tessera::exec::pipeline::Parallelism;
use tessera::optimizer::window_strategy::Strategy;

/// The results of one run: rows per query, late rows per query, and the run's statistics.
pub struct Outcome {
    pub rows: Vec<Vec<RecordBatch>>,
    pub late: Vec<Vec<RecordBatch>>,
    pub stats: RunStats,
}

/// Compiles `script` (one source) and runs all its queries over `batches` through the
/// library's entry point, with the window strategy forced or (`None`) chosen by the optimizer.
pub fn run_batches(
    script: &str,
    batches: Vec<RecordBatch>,
    parallelism: usize,
    strategy: Option<Strategy>,
) -> tessera::Result<Outcome> {
    run_batches_with_state(script, batches, parallelism, strategy, StateOptions::default())
}

/// Like [`run_batches`], with window state kept as `state` says.
pub fn run_batches_with_state(
    script: &str,
    batches: Vec<RecordBatch>,
    parallelism: usize,
    strategy: Option<Strategy>,
    state: StateOptions,
) -> tessera::Result<Outcome> {
    let mut script = Script::compile(script, Path::new("."))?;
    script.settings.window_strategy = strategy;
    let options = RunOptions { parallelism: Parallelism::Fixed(parallelism), state, ..RunOptions::default() };
    let mut sink = MemorySink::default();
    let mut batches = Some(batches);
    let stats = run_script_with_readers(&script, &options, &mut sink, &mut |_| {
        Ok(Box::new(MemoryReader::new(batches.take().expect("one source"))))
    })?;
    Ok(Outcome { rows: sink.rows, late: sink.late, stats })
}

/// State on disk in `dir`, with `memory_bytes` for it in memory and key groups of
/// `2^group_bits` keys.
pub fn on_disk(dir: &Path, memory_bytes: u64, group_bits: u32) -> StateOptions {
    StateOptions { memory_bytes: Some(memory_bytes), spill_dir: dir.to_path_buf(), group_bits }
}

/// A SQL value as the tests compare it: integers exactly, floats to 9 significant digits.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
pub enum Value {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
}

impl Value {
    pub fn approx_eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Float(a), Value::Float(b)) => (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
            (Value::Int(a), Value::Float(b)) | (Value::Float(b), Value::Int(a)) => (*a as f64 - b).abs() < 1e-9,
            (a, b) => a == b,
        }
    }

    pub fn render(&self) -> String {
        match self {
            Value::Null => "NULL".into(),
            Value::Int(v) => v.to_string(),
            Value::Float(v) => {
                let rounded = format!("{v:.6}");
                rounded.trim_end_matches('0').trim_end_matches('.').to_string()
            }
            Value::Text(s) => s.clone(),
        }
    }
}

fn value(column: &ArrayRef, row: usize) -> Value {
    if column.is_null(row) {
        return Value::Null;
    }
    match column.data_type() {
        DataType::Float64 => Value::Float(column.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => Value::Text(column.as_string::<i32>().value(row).to_string()),
        t if t.is_integer() => {
            let c = arrow::compute::cast(column, &DataType::Int64).expect("integer cast");
            Value::Int(c.as_primitive::<Int64Type>().value(row))
        }
        t if t.is_floating() => {
            let c = arrow::compute::cast(column, &DataType::Float64).expect("float cast");
            Value::Float(c.as_primitive::<Float64Type>().value(row))
        }
        _ => {
            let c = arrow::compute::cast(column, &DataType::Utf8).expect("text cast");
            Value::Text(c.as_string::<i32>().value(row).to_string())
        }
    }
}

/// All rows of the batches, sorted.
pub fn rows(batches: &[RecordBatch]) -> Vec<Vec<Value>> {
    let mut out = rows_in_order(batches);
    out.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    out
}

/// The rows of `batches` in the order they were written.
pub fn rows_in_order(batches: &[RecordBatch]) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            out.push(batch.columns().iter().map(|c| value(c, row)).collect::<Vec<_>>());
        }
    }
    out
}

/// Whether two sorted row sets are equal, floats approximately.
pub fn same_rows(a: &[Vec<Value>], b: &[Vec<Value>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.approx_eq(q)))
}
