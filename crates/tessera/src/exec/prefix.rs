//! Continuous queries kept whole: what no bounded synopsis answers (a join comparing two
//! events' amounts, Theorem 3.1's join of per-instant counts) runs, when the script says
//! `SET allow_unbounded_state = true`, by keeping every on-time event of its source and
//! answering with a batch SQL engine over them. The state grows with the stream; that is what
//! the setting allows.
//!
//! Events wait for nothing: all are kept as they arrive (late ones set aside and counted). The
//! answer over the events before the watermark is computed where `EMIT CHANGES` asks for it
//! (after a batch that completed more events: the rows that left the answer as `-D`, those that
//! entered as `+I`), else once at the end of the input over every event; before the first event
//! there is no answer (no row, as for a synopsis). Checkpoints write the
//! events kept since the previous one as a chunk to the state store.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};

use super::{CheckpointBytes, EventBatch, OperatorMetrics, Output, StreamOperator};
use crate::error::{Result, TesseraError};
use crate::plan::{EmitMode, PrefixPlan};
use crate::state::codec::{batch_bytes, batch_from_bytes, StateReader, StateWriter};
use crate::state::store::StateStore;

/// A batch SQL engine: runs `sql` over one table, `table`, of `rows` (all of `schema`).
pub trait BatchSql: Send + Sync {
    fn query(&self, sql: &str, table: &str, schema: SchemaRef, rows: Vec<RecordBatch>) -> Result<Vec<RecordBatch>>;
}

/// The column a saved chunk of events carries their event times in, after the source's.
const EVENT_TIME: &str = "__tessera_event_time";

pub struct PrefixExec {
    plan: Arc<PrefixPlan>,
    engine: Arc<dyn BatchSql>,
    /// The on-time events so far, with their event times.
    kept: Vec<(RecordBatch, ScalarBuffer<i64>)>,
    /// For `EMIT CHANGES`: the answer last written, the watermark it was computed at and how
    /// many events it read.
    written: Option<(RecordBatch, i64, usize)>,
    store: Arc<StateStore>,
    operator: u64,
    /// Batches of `kept` already in a chunk of the store, and the chunks written.
    saved_batches: usize,
    saved_chunks: u64,
    metrics: OperatorMetrics,
}

impl PrefixExec {
    pub fn new(plan: Arc<PrefixPlan>, engine: Arc<dyn BatchSql>, (store, operator): (Arc<StateStore>, u64)) -> Self {
        PrefixExec {
            plan,
            engine,
            kept: Vec::new(),
            written: None,
            store,
            operator,
            saved_batches: 0,
            saved_chunks: 0,
            metrics: OperatorMetrics::default(),
        }
    }

    fn chunk_key(&self, chunk: u64) -> Vec<u8> {
        [self.operator.to_be_bytes(), chunk.to_be_bytes()].concat()
    }

    /// The events before `watermark` (all: `i64::MAX`).
    fn events_before(&self, watermark: i64) -> Result<Vec<RecordBatch>> {
        let mut rows = Vec::with_capacity(self.kept.len());
        for (batch, times) in &self.kept {
            if times.iter().all(|&t| t < watermark) {
                rows.push(batch.clone());
            } else {
                let mask = BooleanArray::from_iter(times.iter().map(|&t| Some(t < watermark)));
                rows.push(arrow::compute::filter_record_batch(batch, &mask)?);
            }
        }
        Ok(rows)
    }

    fn count_before(&self, watermark: i64) -> usize {
        self.kept.iter().map(|(_, times)| times.iter().filter(|&&t| t < watermark).count()).sum()
    }

    /// The answer over the events before `watermark`, in the plan's columns, rows ascending.
    fn answer(&mut self, watermark: i64) -> Result<RecordBatch> {
        let rows = self.events_before(watermark)?;
        let schema = self.kept.first().map_or_else(|| Arc::clone(&self.plan.source_schema), |(b, _)| b.schema());
        self.metrics.store_reads += rows.iter().map(|b| b.num_rows() as u64).sum::<u64>();
        let answer = self.engine.query(&self.plan.sql, &self.plan.source, schema, rows)?;
        let columns_schema = &self.plan.columns_schema;
        let mut batches = Vec::with_capacity(answer.len());
        for batch in answer {
            if batch.num_columns() != columns_schema.fields().len() {
                return Err(TesseraError::Internal("the batch engine answered with other columns".into()));
            }
            let columns = batch
                .columns()
                .iter()
                .zip(columns_schema.fields())
                .map(|(column, field)| Ok(arrow::compute::cast(column, field.data_type())?))
                .collect::<Result<Vec<ArrayRef>>>()?;
            batches.push(RecordBatch::try_new(Arc::clone(columns_schema), columns)?);
        }
        let answer = arrow::compute::concat_batches(columns_schema, &batches)?;
        // Ascending by its columns, so a run's rows do not depend on the engine's partitions.
        let sort: Vec<arrow::compute::SortColumn> = answer
            .columns()
            .iter()
            .map(|c| arrow::compute::SortColumn { values: Arc::clone(c), options: None })
            .collect();
        let order = arrow::compute::lexsort_to_indices(&sort, None)?;
        let answer = arrow::compute::take_record_batch(&answer, &order)?;
        self.metrics.emit_reads += answer.num_rows() as u64;
        Ok(answer)
    }

    /// Writes the changes from the answer last written to the answer at `watermark`.
    fn write_changes(&mut self, watermark: i64, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        let read = self.count_before(watermark);
        if read == 0 || self.written.as_ref().is_some_and(|(_, _, before)| *before == read) {
            return Ok(());
        }
        let now = self.answer(watermark)?;
        let old = match self.written.take() {
            Some((old, _, _)) => old,
            None => RecordBatch::new_empty(now.schema()),
        };
        let changes = changelog(&old, &now)?;
        self.written = Some((now, watermark, read));
        if changes.num_rows() > 0 {
            emit(Output { rows: vec![(0, changes)], late: Vec::new() })?;
        }
        Ok(())
    }
}

/// The rows that left `old` (`-D`) and those that entered `new` (`+I`), as multisets.
fn changelog(old: &RecordBatch, new: &RecordBatch) -> Result<RecordBatch> {
    let fields: Vec<SortField> = new.schema().fields().iter().map(|f| SortField::new(f.data_type().clone())).collect();
    let converter = RowConverter::new(fields)?;
    let (old_rows, new_rows) = (converter.convert_columns(old.columns())?, converter.convert_columns(new.columns())?);
    let mut balance: HashMap<&[u8], i64> = HashMap::new();
    for row in new_rows.iter() {
        *balance.entry(row.data()).or_insert(0) += 1;
    }
    for row in old_rows.iter() {
        *balance.entry(row.data()).or_insert(0) -= 1;
    }
    let mut take = |rows: &arrow::row::Rows, leaving: bool| -> Vec<u32> {
        let mut chosen = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let b = balance.get_mut(row.data()).expect("counted");
            if leaving && *b < 0 {
                *b += 1;
                chosen.push(i as u32);
            } else if !leaving && *b > 0 {
                *b -= 1;
                chosen.push(i as u32);
            }
        }
        chosen
    };
    let (deleted, inserted) = (take(&old_rows, true), take(&new_rows, false));
    let ops: Vec<&str> = deleted.iter().map(|_| "-D").chain(inserted.iter().map(|_| "+I")).collect();
    let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(ops))];
    for (o, n) in old.columns().iter().zip(new.columns()) {
        let parts = [
            arrow::compute::take(o, &UInt32Array::from(deleted.clone()), None)?,
            arrow::compute::take(n, &UInt32Array::from(inserted.clone()), None)?,
        ];
        columns.push(arrow::compute::concat(&[parts[0].as_ref(), parts[1].as_ref()])?);
    }
    let mut fields = vec![Field::new("op", DataType::Utf8, false)];
    fields.extend(new.schema().fields().iter().map(|f| f.as_ref().clone()));
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

impl StreamOperator for PrefixExec {
    fn name(&self) -> &'static str {
        "PrefixExec"
    }

    fn process(&mut self, input: &Arc<EventBatch>, out: &mut Output) -> Result<()> {
        let n = input.len();
        let on_time: Vec<bool> =
            input.event_times.iter().zip(input.watermarks.per_row(n)).map(|(&t, watermark)| t >= watermark).collect();
        if on_time.iter().any(|&t| !t) {
            let late: Vec<u32> = (0..n as u32).filter(|&i| !on_time[i as usize]).collect();
            out.late.push((0, input.take(&late)?.rows));
        }
        let kept: Vec<u32> = (0..n as u32).filter(|&i| on_time[i as usize]).collect();
        if kept.is_empty() {
            return Ok(());
        }
        let batch = if kept.len() == n { input.rows.clone() } else { input.take(&kept)?.rows };
        let times: ScalarBuffer<i64> = kept.iter().map(|&i| input.event_times[i as usize]).collect();
        self.metrics.store_writes += kept.len() as u64;
        self.kept.push((batch, times));
        Ok(())
    }

    fn advance_watermark(&mut self, watermark: i64, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        if self.plan.emit == EmitMode::Changes {
            self.write_changes(watermark, emit)?;
        }
        Ok(())
    }

    fn finish(&mut self, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()> {
        if self.plan.emit == EmitMode::Changes {
            return self.write_changes(i64::MAX, emit);
        }
        if self.kept.is_empty() {
            return Ok(());
        }
        let answer = self.answer(i64::MAX)?;
        if answer.num_rows() > 0 {
            emit(Output { rows: vec![(0, answer)], late: Vec::new() })?;
        }
        Ok(())
    }

    /// Writes the events kept since the previous checkpoint as one chunk (the source's columns
    /// and their event times); the snapshot names how many chunks there are and where
    /// `EMIT CHANGES` was.
    fn checkpoint(&mut self, w: &mut StateWriter) -> Result<CheckpointBytes> {
        let mut written = 0;
        if self.saved_batches < self.kept.len() {
            let fresh = &self.kept[self.saved_batches..];
            let mut parts = Vec::with_capacity(fresh.len());
            for (batch, times) in fresh {
                let mut fields: Vec<Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
                fields.push(Field::new(EVENT_TIME, DataType::Int64, false));
                let mut columns = batch.columns().to_vec();
                columns.push(Arc::new(Int64Array::new(times.clone(), None)));
                parts.push(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?);
            }
            let chunk = arrow::compute::concat_batches(&parts[0].schema(), &parts)?;
            let bytes = batch_bytes(&chunk)?;
            self.store.put(&self.chunk_key(self.saved_chunks), &bytes)?;
            written = bytes.len() as u64;
            self.saved_chunks += 1;
            self.saved_batches = self.kept.len();
        }
        w.u64(self.saved_chunks);
        w.bool(self.written.is_some());
        w.i64(self.written.as_ref().map_or(0, |(_, at, _)| *at));
        let stored: u64 = self.kept.iter().map(|(b, _)| b.get_array_memory_size() as u64).sum();
        Ok(CheckpointBytes { tables_written: written, tables_changed: written, tables_stored: stored })
    }

    fn restore(&mut self, r: &mut StateReader) -> Result<()> {
        let chunks = r.u64()?;
        let written = r.bool()?;
        let written_at = r.i64()?;
        let written_at = written.then_some(written_at);
        self.kept.clear();
        for key in self.store.keys(&self.operator.to_be_bytes())? {
            let chunk = u64::from_be_bytes(key[8..].try_into().map_err(|_| corrupt())?);
            if chunk >= chunks {
                // Written after the checkpoint being resumed.
                self.store.remove(&key)?;
                continue;
            }
            let bytes = self.store.get(&key)?.ok_or_else(corrupt)?;
            let batch = batch_from_bytes(&bytes)?;
            let last = batch.num_columns() - 1;
            let times =
                arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(batch.column(last)).values().clone();
            let mut rows = batch;
            rows.remove_column(last);
            self.kept.push((rows, times));
        }
        if self.kept.len() as u64 != chunks {
            return Err(TesseraError::Checkpoint("the state store lacks events the checkpoint names".into()));
        }
        (self.saved_batches, self.saved_chunks) = (self.kept.len(), chunks);
        self.written = match written_at {
            Some(at) => Some((self.answer(at)?, at, self.count_before(at))),
            None => None,
        };
        Ok(())
    }

    fn metrics(&self) -> Vec<OperatorMetrics> {
        let kept: usize = self.kept.iter().map(|(b, t)| b.get_array_memory_size() + t.len() * 8).sum();
        vec![OperatorMetrics { state_bytes: kept as u64, ..self.metrics }]
    }
}

fn corrupt() -> TesseraError {
    TesseraError::Checkpoint("the state store holds a key tessera did not write".into())
}
