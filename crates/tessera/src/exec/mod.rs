//! The streaming runtime: push-based operators over Arrow batches in event time.
//!
//! ```text
//!  source ──EventBatch──▶ [exchange by key hash] ──▶ operator per query branch ──▶ Output ──▶ sink
//!                         (one worker per partition)        │ advance_watermark / finish
//! ```
//!
//! Every source row carries the watermark in force when it arrives (the largest event time
//! before it minus the source's out-of-orderness bound). Operators close windows up to that
//! watermark before they take the row, so lateness is decided per row exactly as if rows came
//! one at a time, and results do not depend on how the input is cut into batches or partitions.
//!
//! A window operator ([`key_groups`]) owns its state as tables per key group, which it keeps
//! in memory within the run's budget and saves to the state store beyond it and at
//! checkpoints, writing only what changed; [`window_aggregate`] evaluates one key group. A
//! continuous temporal query ([`synopsis`]) keeps its synopsis the same way, in groups of
//! partitions ([`synopsis_groups`]); both write their tables through [`versions`] (one version
//! per checkpoint epoch).

mod filter_project;
mod group_table;
mod handoff;
mod key_groups;
pub mod key_interner;
pub mod pipeline;
pub mod prefix;
mod running_window;
mod stamp;
mod state_tables;
mod synopsis;
mod synopsis_groups;
mod synopsis_values;
mod time_runs;
mod two_stacks;
mod versions;
mod window_aggregate;
mod window_emitter;

use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::buffer::ScalarBuffer;
use arrow::compute::filter_record_batch;
use arrow::datatypes::Int64Type;
use arrow::record_batch::RecordBatch;

use crate::error::{Result, TesseraError};
use crate::physical::OperatorKind;
use crate::plan::WindowAggregatePlan;
use crate::state::codec::{batch_bytes, batch_from_bytes, StateReader, StateWriter};
use crate::state::store::StateStore;
pub use filter_project::{filter_and_project, FilterProjectExec};
use key_groups::KeyGroupsExec;
use key_interner::{key_signature, SharedKeys};
pub use window_aggregate::WindowAggregateExec;

/// The stack of every thread that plans or evaluates expressions: DataFusion's planner and the
/// evaluation of physical expressions recurse once per level of an expression, tens of
/// kilobytes a level in a debug build, and a query may nest [`MAX_EXPRESSION_DEPTH`] levels.
/// Only the pages a thread touches are committed.
///
/// [`MAX_EXPRESSION_DEPTH`]: crate::sql::nesting::MAX_EXPRESSION_DEPTH
pub const THREAD_STACK_BYTES: usize = 256 << 20;

/// A builder for a thread named `name` (so that profilers and debuggers tell the threads apart)
/// with a stack of [`THREAD_STACK_BYTES`].
pub fn thread_builder(name: impl Into<String>) -> std::thread::Builder {
    std::thread::Builder::new().name(name.into()).stack_size(THREAD_STACK_BYTES)
}

/// Runs `work` on a thread of its own with a stack of [`THREAD_STACK_BYTES`], and returns what
/// it returned.
pub fn on_deep_stack<T: Send>(name: &str, work: impl FnOnce() -> crate::Result<T> + Send) -> crate::Result<T> {
    std::thread::scope(|scope| {
        let handle = thread_builder(name)
            .spawn_scoped(scope, work)
            .map_err(|e| crate::TesseraError::io(format!("cannot start thread {name}"), e))?;
        handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The cores this process may run on, asked of the system once (it reads cgroup files).
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Source rows with their event times and the watermark each row meets.
#[derive(Debug, Clone)]
pub struct EventBatch {
    pub rows: RecordBatch,
    /// Each row's event time (shares the source column's buffer when it is already `Int64`).
    pub event_times: ScalarBuffer<i64>,
    /// The watermark each row meets (it never decreases along the batch).
    pub watermarks: Watermarks,
    /// The event times never decrease along the batch: a row's run of rows in one slice ends
    /// where a binary search says, without reading the rows between.
    pub times_ascend: bool,
    /// Key ids interned ahead of the operators (by the reading thread), by the interner
    /// that made them (see [`SharedKeys::id`]).
    pub key_ids: Vec<(usize, Arc<Vec<u32>>)>,
}

impl EventBatch {
    pub fn len(&self) -> usize {
        self.event_times.len()
    }

    pub fn is_empty(&self) -> bool {
        self.event_times.is_empty()
    }

    /// The bytes the batch holds: its columns, event times (unless they share a column's
    /// buffer), watermarks and interned key ids.
    pub fn memory_bytes(&self) -> u64 {
        // Event times share the buffer of the `Int64` column they were read from.
        let times = self.event_times.inner().as_ptr();
        let shared = self
            .rows
            .columns()
            .iter()
            .any(|c| c.as_primitive_opt::<Int64Type>().is_some_and(|a| a.values().inner().as_ptr() == times));
        let times_bytes = if shared { 0 } else { self.event_times.inner().len() };
        let ids_bytes: usize = self.key_ids.iter().map(|(_, ids)| 4 * ids.len()).sum();
        (self.rows.get_array_memory_size() + times_bytes + self.watermarks.memory_bytes() + ids_bytes) as u64
    }

    /// The rows where `mask` is true (NULL counts as false, as in Arrow's filter).
    pub fn filter(&self, mask: &BooleanArray) -> Result<EventBatch> {
        let keep = |i: usize| mask.is_valid(i) && mask.value(i);
        Ok(EventBatch {
            rows: filter_record_batch(&self.rows, mask)?,
            event_times: self.event_times.iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, &t)| t).collect(),
            watermarks: self.watermarks.select((0..self.len()).filter(|&i| keep(i))),
            times_ascend: self.times_ascend,
            key_ids: Vec::new(),
        })
    }

    /// Writes the rows (Arrow IPC), event times and watermarks; keys interned ahead are not
    /// kept (they are interned again).
    pub fn encode(&self, w: &mut StateWriter) -> Result<()> {
        w.bytes(&batch_bytes(&self.rows)?);
        w.i64s(&self.event_times);
        w.i64s(&self.watermarks.per_row(self.len()));
        Ok(())
    }

    pub fn decode(r: &mut StateReader) -> Result<Self> {
        let rows = batch_from_bytes(r.bytes()?)?;
        let (event_times, watermarks) = (r.i64s()?, r.i64s()?);
        if event_times.len() != rows.num_rows() || watermarks.len() != rows.num_rows() || !watermarks.is_sorted() {
            return Err(TesseraError::Checkpoint("a saved batch of rows is inconsistent".into()));
        }
        Ok(EventBatch {
            rows,
            times_ascend: event_times.is_sorted(),
            event_times: event_times.into(),
            watermarks: Watermarks::from_rows(watermarks),
            key_ids: Vec::new(),
        })
    }

    /// The rows at `indices`, which ascend (so the watermarks keep their order).
    pub fn take(&self, indices: &[u32]) -> Result<EventBatch> {
        debug_assert!(indices.is_sorted(), "rows taken out of order");
        let index_array = arrow::array::UInt32Array::from(indices.to_vec());
        let columns = self
            .rows
            .columns()
            .iter()
            .map(|c| arrow::compute::take(c.as_ref(), &index_array, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(EventBatch {
            rows: RecordBatch::try_new(self.rows.schema(), columns)?,
            event_times: indices.iter().map(|&i| self.event_times[i as usize]).collect(),
            watermarks: self.watermarks.select(indices.iter().map(|&i| i as usize)),
            times_ascend: self.times_ascend,
            key_ids: Vec::new(),
        })
    }
}

/// The watermark each row of a batch meets, kept as the rows where it rises: events mostly
/// arrive in time order, many at one time, so a batch of thousands of rows holds a few steps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watermarks {
    /// `(row, watermark)`: the watermark from `row` on, both ascending; the first is row 0.
    steps: Vec<(usize, i64)>,
}

impl Watermarks {
    /// From each row's watermark, which must never decrease.
    pub fn from_rows(per_row: impl IntoIterator<Item = i64>) -> Self {
        let mut watermarks = Watermarks::default();
        per_row.into_iter().enumerate().for_each(|(row, w)| watermarks.meet(row, w));
        watermarks
    }

    /// Rows from `row` on (after every step so far) meet `watermark`.
    fn meet(&mut self, row: usize, watermark: i64) {
        if self.steps.last().is_none_or(|&(_, w)| w != watermark) {
            debug_assert!(self.steps.last().is_none_or(|&(_, w)| w < watermark), "a watermark went back");
            self.steps.push((row, watermark));
        }
    }

    /// The watermark row `row` meets.
    pub fn at(&self, row: usize) -> i64 {
        self.steps[self.steps.partition_point(|&(r, _)| r <= row) - 1].1
    }

    /// The first row from `from` on (of `len`) that meets a watermark of `threshold` or more;
    /// `len` if none does.
    pub fn first_reaching(&self, threshold: i64, from: usize, len: usize) -> usize {
        match self.steps.get(self.steps.partition_point(|&(_, w)| w < threshold)) {
            Some(&(row, _)) => row.max(from).min(len),
            None => len,
        }
    }

    /// The watermarks of `rows`, which ascend.
    pub fn select(&self, rows: impl Iterator<Item = usize>) -> Watermarks {
        let mut selected = Watermarks::default();
        let mut step = 0;
        for (i, row) in rows.enumerate() {
            while self.steps.get(step + 1).is_some_and(|&(r, _)| r <= row) {
                step += 1;
            }
            selected.meet(i, self.steps[step].1);
        }
        selected
    }

    /// Each of the `len` rows' watermark.
    pub fn per_row(&self, len: usize) -> Vec<i64> {
        (0..self.steps.len())
            .flat_map(|i| {
                let end = self.steps.get(i + 1).map_or(len, |&(r, _)| r);
                std::iter::repeat_n(self.steps[i].1, end - self.steps[i].0)
            })
            .collect()
    }

    fn memory_bytes(&self) -> usize {
        self.steps.capacity() * std::mem::size_of::<(usize, i64)>()
    }
}

/// What operators produce, by output slot (the query branch they belong to): result rows, and
/// source rows that arrived too late for a window of that branch.
#[derive(Debug, Default)]
pub struct Output {
    pub rows: Vec<(usize, RecordBatch)>,
    pub late: Vec<(usize, RecordBatch)>,
}

/// What a checkpoint wrote of an operator's tables: the bytes it wrote, the bytes written
/// since the previous checkpoint (by evictions, and by it), and the bytes of every table the
/// store holds for the operator after it (the whole state, encoded).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointBytes {
    pub tables_written: u64,
    pub tables_changed: u64,
    pub tables_stored: u64,
}

impl CheckpointBytes {
    pub fn add(&mut self, other: &CheckpointBytes) {
        self.tables_written += other.tables_written;
        self.tables_changed += other.tables_changed;
        self.tables_stored += other.tables_stored;
    }
}

/// What the runtime counts of every query, whatever its operators: the rows it emitted and
/// the source rows it set aside as too late for its windows.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueryRows {
    pub rows_out: u64,
    pub late: u64,
}

/// What an operator counts of its own work (its state and its reads and writes of it); the
/// rows every query emits and sets aside as late the runtime counts for all of them alike
/// ([`QueryRows`]). The runtime sums both into the run's statistics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OperatorMetrics {
    pub state_bytes: u64,
    /// Reads of state: rows updating partial aggregates, and partial aggregates combined
    /// to emit rows (`emit_reads`, counted in `store_reads` too).
    pub store_reads: u64,
    pub store_writes: u64,
    pub emit_reads: u64,
    /// Window instances emitted (closed with data, per worker or key group holding them) and
    /// the group keys they held, before HAVING: their ratio is the keys per window instance
    /// that the cost model's `SET keys` means.
    pub windows_out: u64,
    pub window_keys: u64,
    /// Traffic of the disk backend's spill store (not checkpointed: the work this process did).
    pub spill: SpillCounters,
}

/// What an operator keeping its state in key groups did with the spill store on disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpillCounters {
    /// Key groups written out beyond `--state-memory`, and their encoded bytes.
    pub group_writes: u64,
    pub bytes_written: u64,
    /// Key groups read back, and their bytes.
    pub group_reads: u64,
    pub bytes_read: u64,
    /// Spilled groups a watermark passed without reading them: the in-memory index (each
    /// group's next window end) showed that none of their windows closes.
    pub lookups_in_memory: u64,
    /// Loads forced because the rows waiting for spilled groups outgrew their share of
    /// `--state-memory`.
    pub pending_flushes: u64,
}

impl SpillCounters {
    pub fn add(&mut self, other: &SpillCounters) {
        self.group_writes += other.group_writes;
        self.bytes_written += other.bytes_written;
        self.group_reads += other.group_reads;
        self.bytes_read += other.bytes_read;
        self.lookups_in_memory += other.lookups_in_memory;
        self.pending_flushes += other.pending_flushes;
    }
}

impl OperatorMetrics {
    /// Writes the counters (not `state_bytes`, a gauge).
    pub fn encode(&self, w: &mut StateWriter) {
        for v in [self.store_reads, self.store_writes, self.emit_reads, self.windows_out, self.window_keys] {
            w.u64(v);
        }
    }

    pub fn decode(r: &mut StateReader) -> Result<Self> {
        Ok(OperatorMetrics {
            state_bytes: 0,
            store_reads: r.u64()?,
            store_writes: r.u64()?,
            emit_reads: r.u64()?,
            windows_out: r.u64()?,
            window_keys: r.u64()?,
            spill: SpillCounters::default(),
        })
    }

    pub fn add(&mut self, other: &OperatorMetrics) {
        self.state_bytes += other.state_bytes;
        self.store_reads += other.store_reads;
        self.store_writes += other.store_writes;
        self.emit_reads += other.emit_reads;
        self.windows_out += other.windows_out;
        self.window_keys += other.window_keys;
        self.spill.add(&other.spill);
    }
}

/// A streaming operator: consumes event batches, reacts to watermarks, flushes at the end.
pub trait StreamOperator: Send {
    fn name(&self) -> &'static str;
    /// Consumes source rows. Rows late for a window they belong to go to `out.late`. The
    /// batch is shared: operators grouping by the same keys intern them once per batch.
    fn process(&mut self, input: &Arc<EventBatch>, out: &mut Output) -> Result<()>;
    /// Emits everything that the watermark closes (and what `process` held back), handing
    /// `emit` one part at a time.
    fn advance_watermark(&mut self, watermark: i64, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()>;
    /// End of input: emits everything still open, handing `emit` one part at a time (a window
    /// at a time, a key group at a time) so the rows of a whole stream's last windows need not
    /// be in memory at once.
    fn finish(&mut self, emit: &mut dyn FnMut(Output) -> Result<()>) -> Result<()>;
    /// Saves the operator's state for a checkpoint: its tables to the state store (what
    /// changed since they were last saved), its progress and counters to `w`.
    fn checkpoint(&mut self, w: &mut StateWriter) -> Result<CheckpointBytes>;
    /// Takes back the state a [`checkpoint`](Self::checkpoint) of an operator of the same
    /// plan saved.
    fn restore(&mut self, r: &mut StateReader) -> Result<()>;
    /// Counters per output slot; `state_bytes` (reported on slot 0) excludes interned keys,
    /// which [`KeySpaces`] reports.
    fn metrics(&self) -> Vec<OperatorMetrics>;
    /// The window nodes the operator evaluates, as it built them: each node's window and where
    /// its instances get their partial states (the sliding aggregator it holds).
    fn window_nodes(&self) -> Vec<(crate::window::WindowSpec, crate::physical::WindowInput)> {
        Vec::new()
    }
}

/// The encoding of a chunk of saved keys; one of another format is refused with a message.
const KEYS_FORMAT: u8 = 1;

/// The store key of the chunk of space `space`'s keys from id `first`, under `prefix`.
fn key_chunk(prefix: &[u8], space: usize, first: u64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&(space as u32).to_be_bytes());
    key.extend_from_slice(&first.to_be_bytes());
    key
}

/// The key interners of one worker, one per distinct list of group-key expressions.
#[derive(Default)]
pub struct KeySpaces {
    spaces: Vec<KeySpace>,
}

struct KeySpace {
    signature: String,
    keys: Vec<crate::plan::ExprRef>,
    shared: Arc<SharedKeys>,
    /// Every operator using it interns every row of each batch (none has a WHERE of its own),
    /// so interning whole batches, on whichever thread, keeps the order the operators' own
    /// interning would have.
    whole_batches: bool,
}

impl KeySpaces {
    fn get(&mut self, plan: &WindowAggregatePlan) -> Result<Arc<SharedKeys>> {
        let signature = key_signature(&plan.keys);
        let whole = plan.filter.is_none();
        if let Some(space) = self.spaces.iter_mut().find(|s| s.signature == signature) {
            space.whole_batches &= whole;
            return Ok(Arc::clone(&space.shared));
        }
        let shared = Arc::new(SharedKeys::new(plan.key_types())?);
        self.spaces.push(KeySpace {
            signature,
            keys: plan.keys.clone(),
            shared: Arc::clone(&shared),
            whole_batches: whole,
        });
        Ok(shared)
    }

    pub fn bytes(&self) -> usize {
        self.spaces.iter().map(|s| s.shared.bytes()).sum()
    }

    /// Saves the keys every interner took since the last checkpoint to `store`, as a chunk
    /// of ids under `prefix` (keys are only ever added, so a checkpoint writes the new ones),
    /// and writes every interner's chunks to `w`; `saved` lists the chunks so far, per space
    /// (first id, end, bytes). Returns the bytes written and the bytes of every chunk.
    pub fn checkpoint(
        &self,
        (store, prefix): (&StateStore, &[u8]),
        saved: &mut Vec<Vec<(u64, u64, u64)>>,
        w: &mut StateWriter,
    ) -> Result<(u64, u64)> {
        saved.resize(self.spaces.len(), Vec::new());
        let mut written = 0;
        w.len(self.spaces.len());
        for (i, (space, chunks)) in self.spaces.iter().zip(saved.iter_mut()).enumerate() {
            let from = chunks.last().map_or(0, |&(_, end, _)| end);
            let to = space.shared.len() as u64;
            if to > from {
                let mut chunk = StateWriter::default();
                chunk.u8(KEYS_FORMAT);
                space.shared.snapshot((from as usize, to as usize), &mut chunk)?;
                let bytes = chunk.into_bytes();
                store.put(&key_chunk(prefix, i, from), &bytes)?;
                chunks.push((from, to, bytes.len() as u64));
                written += bytes.len() as u64;
            }
            w.str(&space.signature);
            w.len(chunks.len());
            for &(first, end, bytes) in chunks.iter() {
                w.u64(first);
                w.u64(end);
                w.u64(bytes);
            }
        }
        let stored = saved.iter().flatten().map(|&(_, _, bytes)| bytes).sum();
        Ok((written, stored))
    }

    /// Re-interns the keys a [`checkpoint`](Self::checkpoint) saved under `prefix`, so every
    /// key gets its saved id back, and deletes the chunks there it does not name (written
    /// after it); returns the chunks.
    pub fn restore(
        &self,
        (store, prefix): (&StateStore, &[u8]),
        r: &mut StateReader,
    ) -> Result<Vec<Vec<(u64, u64, u64)>>> {
        let n = r.len(1)?;
        if n != self.spaces.len() {
            return Err(TesseraError::Checkpoint("the snapshot's key spaces do not match the plan's".into()));
        }
        let mut saved = Vec::with_capacity(n);
        let mut named = Vec::new();
        for (i, space) in self.spaces.iter().enumerate() {
            if r.str()? != space.signature {
                return Err(TesseraError::Checkpoint("the snapshot's group keys do not match the plan's".into()));
            }
            let chunks = (0..r.len(24)?).map(|_| Ok((r.u64()?, r.u64()?, r.u64()?))).collect::<Result<Vec<_>>>()?;
            for &(first, _, _) in &chunks {
                let key = key_chunk(prefix, i, first);
                let bytes = store.get(&key)?.ok_or_else(|| {
                    TesseraError::Checkpoint("the state store lacks interned keys the checkpoint names".into())
                })?;
                let mut chunk = StateReader::new(&bytes);
                chunk.format("interned keys", KEYS_FORMAT)?;
                space.shared.restore(&mut chunk)?;
                chunk.finish()?;
                named.push(key);
            }
            saved.push(chunks);
        }
        for key in store.keys(prefix)? {
            if !named.contains(&key) {
                store.remove(&key)?;
            }
        }
        Ok(saved)
    }

    /// Interns the keys of every row of `batch` where every operator reads whole batches and
    /// attaches the ids to it, so a thread ahead of the operators can do it (pipelining the
    /// work of one worker).
    pub fn prefetch(&self, batch: &mut EventBatch) -> Result<()> {
        for space in self.spaces.iter().filter(|s| s.whole_batches) {
            let ids = space.shared.intern(&batch.rows, &space.keys)?;
            batch.key_ids.push((space.shared.id(), Arc::new(ids)));
        }
        Ok(())
    }

    /// Interns what [`prefetch`](Self::prefetch) would have, where the reading thread did not
    /// (the operators then find the ids cached).
    pub fn intern_whole(&self, batch: &Arc<EventBatch>) -> Result<()> {
        for space in self.spaces.iter().filter(|s| s.whole_batches) {
            space.shared.ids_for(batch, &space.keys)?;
        }
        Ok(())
    }
}

/// The share of the state store and of the memory for state that one window operator gets.
pub struct OperatorState {
    pub store: Arc<crate::state::store::StateStore>,
    /// Tells this operator's tables apart in the store.
    pub id: u64,
    /// Its memory for state (`u64::MAX`: no limit).
    pub memory_bytes: u64,
    /// Its keys are split into key groups of `2^group_bits` ids.
    pub group_bits: u32,
    /// This worker's number and the workers sharing the operator's rows (`(0, 1)`: it takes
    /// all of them); a synopsis that workers may share takes the groups it owns.
    pub share: (usize, usize),
}

/// The operator for `kind`; window operators get the key interner of their group keys and
/// keep their state in key groups within `state`.
pub fn create_operator(
    kind: &OperatorKind,
    event_time_type: &arrow::datatypes::DataType,
    key_spaces: &mut KeySpaces,
    state: OperatorState,
    batch_sql: Option<&Arc<dyn prefix::BatchSql>>,
) -> Result<Box<dyn StreamOperator>> {
    match kind {
        OperatorKind::Prefix(plan) => {
            let engine = batch_sql.ok_or_else(|| {
                TesseraError::Plan(
                    "a query kept whole needs a batch SQL engine: the tessera command has \
                     one; a program gives one in RunOptions::batch_sql"
                        .into(),
                )
            })?;
            Ok(Box::new(prefix::PrefixExec::new(Arc::clone(plan), Arc::clone(engine), (state.store, state.id))))
        }
        OperatorKind::Stateless(plan) => Ok(Box::new(FilterProjectExec::new(plan.clone()))),
        OperatorKind::Synopsis(plan) => {
            let OperatorState { store, id, memory_bytes, group_bits, share } = state;
            let shape = (memory_bytes, group_bits, share);
            Ok(Box::new(synopsis::SynopsisExec::new(Arc::clone(plan), (store, id), shape)?))
        }
        OperatorKind::Windows(windows) => {
            let keys = key_spaces.get(&windows.slots[0])?;
            let shape = Arc::clone(&windows.slots[0]);
            let group_keys = Arc::clone(&keys);
            let (windows, event_time_type) = (windows.clone(), event_time_type.clone());
            let make = Box::new(move |key_base| {
                WindowAggregateExec::new(&windows, event_time_type.clone(), Arc::clone(&keys), key_base)
            });
            let OperatorState { store, id, memory_bytes, group_bits, .. } = state;
            Ok(Box::new(KeyGroupsExec::new(make, shape, group_keys, (store, id), group_bits, memory_bytes)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array};
    use arrow::buffer::ScalarBuffer;
    use arrow::record_batch::RecordBatch;

    use super::{EventBatch, Watermarks};

    /// Event times read straight from an `Int64` column are its buffer: counted once. Times
    /// of their own, and interned key ids, are counted.
    #[test]
    fn memory_bytes_counts_each_buffer_once() {
        let ts = Int64Array::from_iter_values(0..1000);
        let rows = RecordBatch::try_from_iter([("ts", Arc::new(ts.clone()) as ArrayRef)]).unwrap();
        let batch = |event_times: ScalarBuffer<i64>| EventBatch {
            rows: rows.clone(),
            event_times,
            watermarks: Watermarks::from_rows(0..1000),
            times_ascend: true,
            key_ids: Vec::new(),
        };
        let shared = batch(ts.values().clone());
        let own = batch((0..1000).collect());
        assert_eq!(own.memory_bytes(), shared.memory_bytes() + 8000);
        let mut keyed = batch(ts.values().clone());
        keyed.key_ids = vec![(0, Arc::new(vec![0; 1000]))];
        assert_eq!(keyed.memory_bytes(), shared.memory_bytes() + 4000);
    }

    #[test]
    fn watermark_steps_answer_like_one_watermark_per_row() {
        let mut rng = crate::window::generators::SplitMix::new(11);
        for case in 0..300 {
            let len = (rng.next_u64() % 60) as usize;
            let mut w = -5 + (rng.next_u64() % 3) as i64;
            let per_row: Vec<i64> = (0..len)
                .map(|_| {
                    w += [0, 0, 0, 1, 7][(rng.next_u64() % 5) as usize];
                    w
                })
                .collect();
            let steps = Watermarks::from_rows(per_row.iter().copied());
            assert_eq!(steps.per_row(len), per_row, "case {case}");
            for (row, &w) in per_row.iter().enumerate() {
                assert_eq!(steps.at(row), w, "case {case} row {row}");
            }
            for from in 0..=len {
                for threshold in per_row.first().map_or(0, |f| f - 1)..=per_row.last().map_or(0, |l| l + 1) {
                    let expected = from + per_row[from..].partition_point(|&w| w < threshold);
                    assert_eq!(steps.first_reaching(threshold, from, len), expected, "case {case} from {from}");
                }
            }
            let kept: Vec<usize> = (0..len).filter(|_| rng.next_u64().is_multiple_of(3)).collect();
            let selected: Vec<i64> = kept.iter().map(|&r| per_row[r]).collect();
            assert_eq!(steps.select(kept.iter().copied()).per_row(kept.len()), selected, "case {case}");
            assert_eq!(steps.select(kept.iter().copied()), Watermarks::from_rows(selected), "case {case}");
        }
    }
}
