//! The runtime of one source: instantiates the source's operators of the physical plan on
//! 1..N workers, reads and stamps batches on a thread of their own, and runs one loop that
//! hands every worker its part of each batch, sends checkpoint barriers when the one clock says
//! so, and collects what the workers emit into the sink (the [`Collector`]).
//!
//! ```text
//!  reader ─▶ stamp ─▶ loop: whole operators or rows by key hash ─┬─▶ worker 0 ─┐
//!                                                                └─▶ worker 1 ─┴─▶ collector ─▶ sink
//! ```
//!
//! One worker runs on the calling thread, between batches; several run on threads of their
//! own, with the collector on a sink thread. Watermarks are computed before the split, so every
//! worker sees the same event-time progress as the source.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use datafusion_common::hash_utils::{create_hashes, RandomState};

use super::handoff::{Batches, InternProgress, WorkerStopped};
use super::key_interner::key_signature;
use super::prefix::BatchSql;
use super::stamp::Stamper;
use super::{
    create_operator, CheckpointBytes, EventBatch, KeySpaces, OperatorMetrics, OperatorState, Output, QueryRows,
    StreamOperator,
};
use crate::catalog::SourceDef;
use crate::connectors::sink::ResultSink;
use crate::connectors::{BatchReader, FreedHere, Skipped};
use crate::engine::StateOptions;
use crate::error::{Result, TesseraError};
use crate::physical::{OperatorKind, OperatorPlan};
use crate::plan::QueryPlan;
use crate::state::checkpoint::{CheckpointRecord, Checkpointer, SourcePosition};
use crate::state::codec::{StateReader, StateWriter};
use crate::state::store::StateStore;

/// How many workers compute, and how rows reach them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallelism {
    /// Up to this many workers, each running whole operators on shared batches; a script with
    /// one operator runs it on one worker, beside the reader thread. Splitting rows by key
    /// costs the dispatching thread about as much as a second worker saves on shared slices.
    Auto(usize),
    /// Exactly this many workers; with fewer operators than workers, rows are split by the
    /// hash of their group key.
    Fixed(usize),
}

impl Parallelism {
    pub fn workers(self, operators: usize) -> usize {
        match self {
            Parallelism::Auto(n) => n.min(operators).max(1),
            Parallelism::Fixed(n) => n.max(1),
        }
    }
}

/// Progress of a run, reported after every batch.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub done: u64,
    pub total: Option<u64>,
    pub events: u64,
}

pub type ProgressFn<'a> = dyn Fn(Progress) + Send + Sync + 'a;

/// What running one source's queries produced.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct SourceRun {
    /// Workers used.
    pub workers: usize,
    pub events_in: u64,
    pub bad_rows: u64,
    pub state_bytes_peak: u64,
    /// Per query (by index in the script): the rows the runtime counted, and the summed
    /// metrics of its operators.
    pub query_rows: Vec<QueryRows>,
    pub query_metrics: Vec<OperatorMetrics>,
    /// Checkpoints written while reading this source, and the time they took.
    pub checkpoints: u64,
    pub checkpoint_ms: u64,
    /// What each checkpoint wrote.
    pub checkpoint_log: Vec<CheckpointRecord>,
    /// Resuming: the events the checkpoint held, and the time until the first new batch
    /// reached the operators (restoring the state and moving the input to the checkpoint).
    pub resumed_events: u64,
    pub recovery_ms: u64,
    /// The window nodes of each operator, as the operators built them from the plan.
    #[serde(skip)]
    pub window_nodes: Vec<Vec<(crate::window::WindowSpec, crate::physical::WindowInput)>>,
}

/// The operators one worker runs, each with the query of each of its output slots.
struct Worker {
    operators: Vec<(Vec<usize>, Box<dyn StreamOperator>)>,
    /// Shared with the reading thread, which may intern keys ahead when there is one worker.
    key_spaces: Arc<KeySpaces>,
    state_bytes: Arc<AtomicU64>,
    /// Where the interned keys are saved at checkpoints, under this worker's prefix, and the
    /// chunks of them saved so far.
    store: Arc<StateStore>,
    keys_prefix: Vec<u8>,
    keys_saved: Vec<Vec<(u64, u64, u64)>>,
}

/// What a worker hands to the sink.
enum Emitted {
    Rows(usize, RecordBatch),
    Late(usize, RecordBatch),
    /// A worker's state at a checkpoint barrier (it sent every row it emitted before).
    Snapshot {
        state: Vec<u8>,
        position: Arc<SourcePosition>,
        tables: CheckpointBytes,
    },
}

/// The checkpoint snapshot of a run: the state of every worker, in order.
fn combine_snapshots(workers: &[Vec<u8>]) -> Vec<u8> {
    let mut w = StateWriter::default();
    w.len(workers.len());
    workers.iter().for_each(|state| w.bytes(state));
    w.into_bytes()
}

/// The state of each of `workers` workers in a checkpoint snapshot.
fn split_snapshot(snapshot: &[u8], workers: usize) -> Result<Vec<&[u8]>> {
    let mut r = StateReader::new(snapshot);
    let saved = r.len(8)?;
    if saved != workers {
        return Err(TesseraError::Checkpoint(format!(
            "the checkpoint was written by {saved} workers and this run has {workers}: resume with --parallelism {saved}"
        )));
    }
    let parts = (0..saved).map(|_| r.bytes()).collect::<Result<Vec<_>>>()?;
    r.finish()?;
    Ok(parts)
}

impl Worker {
    /// Worker `index` of `workers`, running `specs`, keeping window state as `state` says,
    /// in `store` beyond memory and at checkpoints.
    fn new(
        specs: &[OperatorPlan],
        event_time_type: &DataType,
        (state, store): (&StateOptions, &Arc<StateStore>),
        (index, workers): (usize, usize),
        batch_sql: Option<&Arc<dyn BatchSql>>,
    ) -> Result<Self> {
        let mut key_spaces = KeySpaces::default();
        let operators = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let state = OperatorState {
                    store: Arc::clone(store),
                    id: ((index as u64) << 32) | i as u64,
                    // An equal share of the memory for every operator of every worker.
                    memory_bytes: state.memory_bytes.map_or(u64::MAX, |m| m / (workers * specs.len()).max(1) as u64),
                    group_bits: state.group_bits,
                    // Whole operators take every row; otherwise rows are split among workers.
                    share: if specs.len() >= workers { (0, 1) } else { (index, workers) },
                };
                Ok((s.queries.clone(), create_operator(&s.kind, event_time_type, &mut key_spaces, state, batch_sql)?))
            })
            .collect::<Result<Vec<_>>>()?;
        // Operators' tables are under their id, (worker << 32) | operator; keys under a prefix
        // no operator id has.
        let keys_prefix = [u64::MAX.to_be_bytes().as_slice(), &(index as u32).to_be_bytes()].concat();
        Ok(Worker {
            operators,
            key_spaces: Arc::new(key_spaces),
            state_bytes: Arc::new(AtomicU64::new(0)),
            store: Arc::clone(store),
            keys_prefix,
            keys_saved: Vec::new(),
        })
    }

    fn flush(queries: &[usize], out: Output, emit: &mut dyn FnMut(Emitted) -> Result<()>) -> Result<()> {
        for (slot, batch) in out.rows {
            emit(Emitted::Rows(queries[slot], batch))?;
        }
        for (slot, batch) in out.late {
            emit(Emitted::Late(queries[slot], batch))?;
        }
        Ok(())
    }

    fn handle(
        &mut self,
        parts: Vec<(usize, Arc<EventBatch>)>,
        watermark: i64,
        emit: &mut dyn FnMut(Emitted) -> Result<()>,
    ) -> Result<()> {
        for (op, input) in parts {
            let mut out = Output::default();
            let (queries, operator) = &mut self.operators[op];
            operator.process(&input, &mut out)?;
            Self::flush(queries, out, emit)?;
        }
        let mut state = self.key_spaces.bytes() as u64;
        for (queries, operator) in &mut self.operators {
            operator.advance_watermark(watermark, &mut |out| Self::flush(queries, out, emit))?;
            state += operator.metrics().iter().map(|m| m.state_bytes).sum::<u64>();
        }
        self.state_bytes.store(state, Ordering::Relaxed);
        Ok(())
    }

    /// Saves every operator's state for a checkpoint: the keys interned since the last one and
    /// the operators' changed tables to the state store, made durable; returns the snapshot
    /// (the key chunks saved, the operators' progress) and what the tables took.
    fn checkpoint(&mut self) -> Result<(Vec<u8>, CheckpointBytes)> {
        let mut w = StateWriter::default();
        let (written, stored) =
            self.key_spaces.checkpoint((&self.store, &self.keys_prefix), &mut self.keys_saved, &mut w)?;
        w.len(self.operators.len());
        let mut tables = CheckpointBytes { tables_written: written, tables_changed: written, tables_stored: stored };
        for (_, operator) in &mut self.operators {
            tables.add(&operator.checkpoint(&mut w)?);
        }
        self.store.persist()?;
        Ok((w.into_bytes(), tables))
    }

    /// Takes back the state a [`checkpoint`](Self::checkpoint) of a worker of the same plan saved.
    fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let mut r = StateReader::new(bytes);
        self.keys_saved = self.key_spaces.restore((&self.store, &self.keys_prefix), &mut r)?;
        if r.len(1)? != self.operators.len() {
            return Err(TesseraError::Checkpoint("the snapshot's operators do not match the plan's".into()));
        }
        for (_, operator) in &mut self.operators {
            operator.restore(&mut r)?;
        }
        r.finish()
    }

    /// Flushes every operator; the metrics of every output slot, by query.
    fn finish(&mut self, emit: &mut dyn FnMut(Emitted) -> Result<()>) -> Result<Vec<(usize, OperatorMetrics)>> {
        for (queries, operator) in &mut self.operators {
            operator.finish(&mut |out| Self::flush(queries, out, emit))?;
        }
        Ok(self
            .operators
            .iter()
            .flat_map(|(queries, operator)| queries.iter().copied().zip(operator.metrics()).collect::<Vec<_>>())
            .collect())
    }
}

/// Splits the rows of a batch among workers: by group-key hash for window aggregates (so each
/// group lives on one worker), whole batches in turn for stateless queries.
struct Partitioner {
    workers: usize,
    random_state: RandomState,
    hashes: Vec<u64>,
    batches_seen: usize,
}

impl Partitioner {
    fn split(
        &mut self,
        kind: &OperatorKind,
        input: &Arc<EventBatch>,
        cache: &mut Vec<(String, Vec<Option<Arc<EventBatch>>>)>,
    ) -> Result<Vec<Option<Arc<EventBatch>>>> {
        let n = self.workers;
        match kind {
            // Every worker sees every row of a synopsis it may share and takes the events of
            // its own groups (its partitions are keyed by values each alias reads from its own
            // columns, and every instant of the stream counts).
            OperatorKind::Synopsis(plan) if plan.shardable() => return Ok(vec![Some(Arc::clone(input)); n]),
            // Other synopses, and a query kept whole (it relates any events), on the first.
            OperatorKind::Synopsis(_) | OperatorKind::Prefix(_) => {
                return Ok((0..n).map(|w| (w == 0).then(|| Arc::clone(input))).collect())
            }
            _ => {}
        }
        let Some(plan) = kind.window_shape() else {
            let target = self.batches_seen % n;
            return Ok((0..n).map(|w| (w == target).then(|| Arc::clone(input))).collect());
        };
        if plan.keys.is_empty() {
            return Ok((0..n).map(|w| (w == 0).then(|| Arc::clone(input))).collect());
        }
        // Operators grouping by the same keys get the same parts, so they share key interning.
        let signature = key_signature(&plan.keys);
        if let Some((_, parts)) = cache.iter().find(|(s, _)| *s == signature) {
            return Ok(parts.clone());
        }
        let keys = plan
            .keys
            .iter()
            .map(|k| Ok(k.evaluate(&input.rows)?.into_array(input.len())?))
            .collect::<Result<Vec<_>>>()?;
        self.hashes.clear();
        self.hashes.resize(input.len(), 0);
        create_hashes(&keys, &self.random_state, &mut self.hashes)?;
        let mut indices = vec![Vec::with_capacity(input.len() / n + 1); n];
        for (row, hash) in self.hashes.iter().enumerate() {
            indices[(*hash % n as u64) as usize].push(row as u32);
        }
        let parts = indices
            .iter()
            .map(|rows| if rows.is_empty() { Ok(None) } else { input.take(rows).map(|part| Some(Arc::new(part))) })
            .collect::<Result<Vec<_>>>()?;
        cache.push((signature, parts.clone()));
        Ok(parts)
    }
}

/// A stamped batch, the watermark and the largest event time after it, and the reader's
/// progress.
type Stamped = (Arc<EventBatch>, i64, i64, (u64, Option<u64>), Skipped);

/// How one source is run.
pub(crate) struct SourceOptions<'a> {
    pub parallelism: Parallelism,
    pub progress: Option<&'a ProgressFn<'a>>,
    pub checkpoints: Option<SourceCheckpoints<'a>>,
    /// Where window state lives: the memory it may take, and the store beyond it.
    pub state: &'a StateOptions,
    pub store: Arc<StateStore>,
    /// Answers the queries kept whole (see [`super::prefix`]).
    pub batch_sql: Option<&'a Arc<dyn BatchSql>>,
}

/// Checkpointing of the source being run: where to save, and the position to resume from.
pub(crate) struct SourceCheckpoints<'a> {
    pub checkpointer: &'a mut Checkpointer,
    /// Index of the source in run order.
    pub source: usize,
    pub resume: Option<(SourcePosition, Vec<u8>)>,
}

/// Runs `queries` (index in the script, plan) over `source` until its input ends, evaluating
/// them by `operators`, the source's operators in the physical plan.
///
/// Decoding runs on its own thread ahead of the operators, so reading and computing overlap.
pub(crate) fn run_source(
    source: &SourceDef,
    reader: &mut dyn BatchReader,
    queries: &[(usize, &QueryPlan)],
    operators: &[OperatorPlan],
    sink: &mut dyn ResultSink,
    options: SourceOptions<'_>,
) -> Result<SourceRun> {
    let SourceOptions { parallelism, progress, mut checkpoints, state, store, batch_sql } = options;
    let started = std::time::Instant::now();
    let specs = operators;
    let query_count = queries.iter().map(|(q, _)| q + 1).max().unwrap_or(0);
    let mut run = SourceRun {
        query_rows: vec![QueryRows::default(); query_count],
        query_metrics: vec![OperatorMetrics::default(); query_count],
        ..Default::default()
    };
    // Checkpoints are cut between batches of one worker (the reading thread still decodes
    // ahead on the other core).
    let workers = parallelism.workers(specs.len());
    run.workers = workers;
    let resume = checkpoints.as_mut().and_then(|c| c.resume.take());
    let (skip_batches, max_event_time) = resume.as_ref().map_or((0, i64::MIN), |(p, _)| (p.batches, p.max_event_time));
    let seek_to = resume.as_ref().and_then(|(p, _)| p.read.map(|read| (read, p.skipped)));
    if let Some((position, _)) = &resume {
        run.resumed_events = position.events_in;
        run.events_in = position.events_in;
        run.state_bytes_peak = position.state_bytes_peak;
        for (q, rows) in position.query_rows.iter().enumerate().take(query_count) {
            run.query_rows[q] = *rows;
        }
    }
    // With one worker, the reading thread interns the group keys of a batch ahead of the
    // operators whenever the worker is still busy with an earlier batch, so two cores split the
    // work of one worker; when the worker waits for input (decoding is the slower side) it
    // interns itself. Either way batches are interned whole and in order, so each key's id is
    // the same in every run of the same input: key groups on disk are blocks of ids, and a
    // resumed run must put each key in the group the interrupted run put it in.
    let mut pool = (0..workers)
        .map(|index| Worker::new(specs, &source.event_time.data_type, (state, &store), (index, workers), batch_sql))
        .collect::<Result<Vec<_>>>()?;
    run.window_nodes = pool[0].operators.iter().map(|(_, operator)| operator.window_nodes()).collect();
    if let Some((_, snapshot)) = &resume {
        for (worker, saved) in pool.iter_mut().zip(split_snapshot(snapshot, workers)?) {
            worker.restore(saved)?;
        }
    }
    let intern_progress = InternProgress::default();
    std::thread::scope(|scope| -> Result<SourceRun> {
        let (batch_tx, batch_rx) = sync_channel::<Stamped>(4);
        let one = (workers == 1).then(|| Arc::clone(&pool[0].key_spaces));
        let key_spaces = one.map(|spaces| (spaces, &intern_progress));
        let spare = if workers == 1 { reader.spare_work() } else { None };
        let read = move || -> Result<u64> {
            let mut stamp = Stamper { max_event_time, delay: source.event_time.watermark_delay };
            // Resuming: the operators' state already holds these batches; skip them unread
            // where the reader can.
            let sought = match seek_to {
                Some((position, skipped)) if skip_batches > 0 => reader.seek(position, skipped)?,
                _ => false,
            };
            let to_read = if sought { 0 } else { skip_batches };
            for _ in 0..to_read {
                if reader.next_batch()?.is_none() {
                    return Err(TesseraError::Checkpoint(format!(
                        "source {} ended before the checkpoint's position ({skip_batches} batches): the input changed",
                        source.name
                    )));
                }
            }
            let mut sent = 0;
            let mut freed_here = FreedHere::default();
            while let Some(batch) = reader.next_batch()? {
                let mut stamped = stamp.stamp(batch, source)?;
                if let Some((spaces, progress)) = key_spaces.as_ref().filter(|(_, p)| p.ahead(sent)) {
                    spaces.prefetch(&mut stamped)?;
                    progress.interned(sent);
                }
                sent += 1;
                let input = Arc::new(stamped);
                freed_here.hold(&input);
                let read = (input, stamp.watermark(), stamp.max_event_time, reader.progress(), reader.skipped());
                if batch_tx.send(read).is_err() {
                    break; // the operators stopped; their error ends the run
                }
            }
            Ok(reader.skipped().rows)
        };
        let reading = spawn_named(scope, "tessera-read".into(), read)?;
        // The outputs open while the first batches are decoded: cutting an earlier run's
        // output file to nothing took 4-5 ms for W1's 10 MB, before reading began.
        let opened = queries.iter().try_for_each(|(query, plan)| sink.open_query(*query, &plan.output_schema));
        let checkpoints =
            checkpoints.map(|c| (Consumed { source: c.source, batches: skip_batches, started }, c.checkpointer));
        // One worker waits for batches spinning, on a core it has to itself: see [`Batches`].
        let io = Io { batches: Batches::new(batch_rx, spare, workers == 1), sink, progress };
        // Without its outputs the run stops: the reader sees the batches' receiver dropped.
        let computed = opened.and_then(|()| compute(pool, &intern_progress, specs, io, &mut run, checkpoints));
        let read = reading.join().map_err(|_| TesseraError::Internal("the reader thread panicked".into()))?;
        // A read error explains a failure downstream better than the failure itself.
        run.bad_rows = read?;
        computed?;
        Ok(run)
    })
}

/// Starts a thread of a run under `name` (see [`super::thread_builder`]).
fn spawn_named<'scope, 'env, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    name: String,
    body: impl FnOnce() -> T + Send + 'scope,
) -> Result<std::thread::ScopedJoinHandle<'scope, T>> {
    super::thread_builder(name.clone())
        .spawn_scoped(scope, body)
        .map_err(|e| TesseraError::io(format!("cannot start thread {name}"), e))
}

fn report(progress: Option<&ProgressFn<'_>>, (done, total): (u64, Option<u64>), events: u64) {
    if let Some(progress) = progress {
        progress(Progress { done, total, events });
    }
}

/// What the operators consumed of a checkpointed source: its index, the input batches, and
/// when the run started (for the recovery time).
struct Consumed {
    source: usize,
    batches: u64,
    started: std::time::Instant,
}

impl Consumed {
    /// Counts a consumed batch; at the first one after a resume, notes the recovery time.
    fn batch(&mut self, run: &mut SourceRun) {
        if run.resumed_events > 0 && run.recovery_ms == 0 {
            run.recovery_ms = self.started.elapsed().as_millis().max(1) as u64;
        }
        self.batches += 1;
    }

    /// Where the source stands after the batches consumed.
    fn position(&self, run: &SourceRun, max_event_time: i64, (read, skipped): (u64, Skipped)) -> SourcePosition {
        SourcePosition {
            source: self.source,
            batches: self.batches,
            read: Some(read),
            skipped: Some(skipped),
            max_event_time,
            events_in: run.events_in,
            query_rows: run.query_rows.clone(),
            state_bytes_peak: run.state_bytes_peak,
        }
    }
}

/// What a worker thread is sent.
enum WorkerMessage {
    Batch(Vec<(usize, Arc<EventBatch>)>, i64),
    /// A checkpoint barrier: send the state to the sink, after every row emitted so far.
    Snapshot(Arc<SourcePosition>),
}

/// Where everything the workers emit meets: rows and late rows go to the sink, counted per
/// query (the counters every operator gets alike), and a
/// checkpoint is saved once every worker's state at a barrier is in. Barriers are aligned:
/// what a worker emits after its state, until the checkpoint is saved, is held and written
/// after it. With one worker it runs on the calling thread; with more, on a sink thread.
struct Collector<'a> {
    sink: &'a mut dyn ResultSink,
    rows: Vec<QueryRows>,
    checkpointer: Option<(&'a mut Checkpointer, Arc<CheckpointClock>)>,
    states: Vec<Option<(Vec<u8>, CheckpointBytes)>>,
    held: Vec<std::collections::VecDeque<Emitted>>,
    /// Checkpoints saved, and the milliseconds they took.
    saved: (u64, u64),
    /// What each checkpoint saved wrote.
    log: Vec<CheckpointRecord>,
}

impl<'a> Collector<'a> {
    fn new(
        workers: usize,
        sink: &'a mut dyn ResultSink,
        rows: Vec<QueryRows>,
        checkpointer: Option<(&'a mut Checkpointer, Arc<CheckpointClock>)>,
    ) -> Self {
        Collector {
            sink,
            rows,
            checkpointer,
            states: vec![None; workers],
            held: (0..workers).map(|_| Default::default()).collect(),
            saved: (0, 0),
            log: Vec::new(),
        }
    }

    /// Takes what worker `w` emitted.
    fn take(&mut self, w: usize, emitted: Emitted) -> Result<()> {
        let mut queue = std::collections::VecDeque::from([(w, emitted)]);
        while let Some((w, emitted)) = queue.pop_front() {
            if self.states[w].is_some() {
                self.held[w].push_back(emitted);
                continue;
            }
            match emitted {
                Emitted::Rows(q, batch) => {
                    self.rows[q].rows_out += batch.num_rows() as u64;
                    self.sink.write_rows(q, &batch)?;
                }
                Emitted::Late(q, batch) => {
                    self.rows[q].late += batch.num_rows() as u64;
                    self.sink.write_late(q, &batch)?;
                }
                Emitted::Snapshot { state, position, tables } => {
                    self.states[w] = Some((state, tables));
                    if self.states.iter().all(Option::is_some) {
                        let mut all = Vec::new();
                        let mut written = CheckpointBytes::default();
                        for (state, tables) in self.states.iter_mut().filter_map(Option::take) {
                            all.push(state);
                            written.add(&tables);
                        }
                        let position = SourcePosition { query_rows: self.rows.clone(), ..(*position).clone() };
                        self.save(position, &combine_snapshots(&all), written)?;
                        for (v, messages) in self.held.iter_mut().enumerate() {
                            queue.extend(messages.drain(..).map(|m| (v, m)));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Saves a checkpoint: makes the sink's output durable and writes the snapshot and manifest.
    fn save(&mut self, position: SourcePosition, snapshot: &[u8], tables: CheckpointBytes) -> Result<()> {
        let Some((checkpointer, clock)) = self.checkpointer.as_mut() else { return Ok(()) };
        let started = std::time::Instant::now();
        let sink_position = self.sink.checkpoint()?;
        let sequence = checkpointer.write(position, snapshot, sink_position)?;
        clock.saved();
        self.saved.0 += 1;
        self.saved.1 += started.elapsed().as_millis() as u64;
        self.log.push(CheckpointRecord {
            sequence,
            snapshot_bytes: snapshot.len() as u64,
            tables_written: tables.tables_written,
            tables_changed: tables.tables_changed,
            tables_stored: tables.tables_stored,
        });
        Ok(())
    }
}

/// The one checkpoint clock: the next barrier is due `interval` after the previous checkpoint
/// was saved (its saving not counted), and never while one is being taken. The calling thread
/// sends barriers; the [`Collector`], wherever it runs, says when it saved.
struct CheckpointClock {
    interval: std::time::Duration,
    started: std::time::Instant,
    /// When the last checkpoint was saved, in microseconds from `started`.
    saved_at: AtomicU64,
    in_flight: std::sync::atomic::AtomicBool,
}

impl CheckpointClock {
    fn new(interval: std::time::Duration) -> Self {
        CheckpointClock {
            interval,
            started: std::time::Instant::now(),
            saved_at: AtomicU64::new(0),
            in_flight: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Whether a barrier is due; if so, it counts as sent.
    fn barrier_due(&self) -> bool {
        let due = !self.in_flight.load(Ordering::Acquire)
            && self.now().saturating_sub(self.saved_at.load(Ordering::Acquire)) >= self.interval.as_micros() as u64;
        if due {
            self.in_flight.store(true, Ordering::Release);
        }
        due
    }

    fn saved(&self) {
        self.saved_at.store(self.now(), Ordering::Release);
        self.in_flight.store(false, Ordering::Release);
    }
}

/// The batches consumed, and the clock that says when the next barrier is due.
struct Barriers {
    consumed: Consumed,
    clock: Arc<CheckpointClock>,
}

/// Where a run's batches come from and its results go.
struct Io<'a, 'p> {
    batches: Batches<Stamped>,
    sink: &'a mut dyn ResultSink,
    progress: Option<&'a ProgressFn<'p>>,
}

/// The runtime loop, for any number of workers. The calling thread takes each batch and hands
/// the workers their parts: whole operators on shared batches, or rows split by key hash when
/// there are fewer operators than workers. One worker runs here, between batches (the reading
/// thread interning keys ahead of it through `interning`); several run on threads of their
/// own, and what they emit meets on a sink thread. When a checkpoint is due, every worker gets
/// a barrier between two batches and hands its state over behind the rows it emitted before;
/// the [`Collector`] saves the checkpoint once it has every state.
fn compute(
    mut pool: Vec<Worker>,
    interning: &InternProgress,
    specs: &[OperatorPlan],
    io: Io<'_, '_>,
    run: &mut SourceRun,
    checkpoints: Option<(Consumed, &mut Checkpointer)>,
) -> Result<()> {
    let Io { batches, sink, progress } = io;
    let workers = pool.len();
    let gauges: Vec<Arc<AtomicU64>> = pool.iter().map(|w| Arc::clone(&w.state_bytes)).collect();
    let (mut barriers, checkpointer) = match checkpoints {
        Some((consumed, checkpointer)) => {
            let clock = Arc::new(CheckpointClock::new(checkpointer.interval()));
            (Some(Barriers { consumed, clock: Arc::clone(&clock) }), Some((checkpointer, clock)))
        }
        None => (None, None),
    };
    let mut partitioner = Partitioner {
        workers,
        random_state: RandomState::with_seed(0),
        hashes: Vec::new(),
        batches_seen: barriers.as_ref().map_or(0, |b| b.consumed.batches as usize),
    };
    // With at least as many operators as workers, each worker runs whole operators on shared
    // batches: no hashing or copying of rows. Otherwise rows are split by key hash.
    let whole_operators = specs.len() >= workers;
    let mut collector = Some(Collector::new(workers, sink, run.query_rows.clone(), checkpointer));
    std::thread::scope(|scope| -> Result<()> {
        let mut here = if workers == 1 { pool.pop() } else { None };
        let _stopped = WorkerStopped(interning);
        let (sink_tx, sink_rx) = sync_channel::<(usize, Result<Emitted>)>(64);
        let mut senders: Vec<SyncSender<Option<WorkerMessage>>> = Vec::new();
        let mut handles = Vec::new();
        for (index, mut worker) in pool.into_iter().enumerate() {
            let (tx, rx) = sync_channel::<Option<WorkerMessage>>(4);
            senders.push(tx);
            let sink_tx = sink_tx.clone();
            let work = move || -> Result<Vec<(usize, OperatorMetrics)>> {
                let mut emit = |e: Emitted| sink_tx.send((index, Ok(e))).map_err(|_| sink_closed());
                let result = (|| -> Result<Vec<(usize, OperatorMetrics)>> {
                    while let Ok(Some(message)) = rx.recv() {
                        match message {
                            WorkerMessage::Batch(parts, watermark) => worker.handle(parts, watermark, &mut emit)?,
                            WorkerMessage::Snapshot(position) => {
                                let (state, tables) = worker.checkpoint()?;
                                emit(Emitted::Snapshot { state, position, tables })?
                            }
                        }
                    }
                    worker.finish(&mut emit)
                })();
                // The error travels to the sink thread, which ends the run with it.
                result.or_else(|e| sink_tx.send((index, Err(e))).map(|_| Vec::new()).map_err(|_| sink_closed()))
            };
            handles.push(spawn_named(scope, format!("tessera-work-{index}"), work)?);
        }
        drop(sink_tx);
        // Workers on threads: the collector runs on a sink thread, until every worker is done.
        let sink_thread = if handles.is_empty() {
            None
        } else {
            let mut collector = collector.take().expect("the collector, not yet moved");
            Some(spawn_named(scope, "tessera-sink".into(), move || -> Result<Collector> {
                let mut failure = None;
                for (w, message) in sink_rx {
                    if failure.is_none() {
                        failure = message.and_then(|emitted| collector.take(w, emitted)).err();
                    }
                }
                failure.map_or(Ok(collector), Err)
            })?)
        };
        // The rows split off for the workers are freed here, where they were copied.
        let mut freed_here = FreedHere::default();
        let dispatch = (|| -> Result<()> {
            for (n, (input, watermark, max_event_time, read, skipped)) in (0..).zip(batches) {
                run.events_in += input.len() as u64;
                let mut per_worker: Vec<Vec<(usize, Arc<EventBatch>)>> = vec![Vec::new(); workers];
                let mut cache = Vec::new();
                for (op, spec) in specs.iter().enumerate() {
                    if whole_operators {
                        per_worker[op % workers].push((op, Arc::clone(&input)));
                        continue;
                    }
                    for (w, part) in partitioner.split(&spec.kind, &input, &mut cache)?.into_iter().enumerate() {
                        if let Some(part) = part {
                            freed_here.hold(&part);
                            per_worker[w].push((op, part));
                        }
                    }
                }
                partitioner.batches_seen += 1;
                match here.as_mut() {
                    Some(worker) => {
                        worker.key_spaces.intern_whole(&input)?;
                        interning.interned(n);
                        let parts = per_worker.pop().unwrap_or_default();
                        let collector = collector.as_mut().expect("one worker collects here");
                        worker.handle(parts, watermark, &mut |e| collector.take(0, e))?;
                        interning.handled(n);
                    }
                    None => {
                        for (sender, parts) in senders.iter().zip(per_worker) {
                            if sender.send(Some(WorkerMessage::Batch(parts, watermark))).is_err() {
                                return Ok(()); // the worker failed; its error reaches the sink
                            }
                        }
                    }
                }
                let state: u64 = gauges.iter().map(|g| g.load(Ordering::Relaxed)).sum();
                run.state_bytes_peak = run.state_bytes_peak.max(state);
                report(progress, read, run.events_in);
                let Some(Barriers { consumed, clock }) = barriers.as_mut() else { continue };
                consumed.batch(run);
                if !clock.barrier_due() {
                    continue;
                }
                // The collector fills in the rows written when it saves.
                let position = Arc::new(consumed.position(run, max_event_time, (read.0, skipped)));
                match here.as_mut() {
                    Some(worker) => {
                        let (state, tables) = worker.checkpoint()?;
                        collector
                            .as_mut()
                            .expect("one worker collects here")
                            .take(0, Emitted::Snapshot { state, position, tables })?
                    }
                    None => {
                        for sender in &senders {
                            if sender.send(Some(WorkerMessage::Snapshot(Arc::clone(&position)))).is_err() {
                                return Ok(());
                            }
                        }
                    }
                }
            }
            Ok(())
        })();
        let mut metrics = Vec::new();
        if let Some(worker) = here.as_mut() {
            dispatch?;
            let collector = collector.as_mut().expect("one worker collects here");
            metrics.push(worker.finish(&mut |e| collector.take(0, e)));
        } else {
            for sender in &senders {
                let _ = sender.send(None);
            }
            drop(senders);
            for handle in handles {
                metrics.push(handle.join().map_err(|_| TesseraError::Internal("a worker thread panicked".into()))?);
            }
            let sink_thread = sink_thread.expect("workers on threads have a sink thread");
            let joined = sink_thread.join().map_err(|_| TesseraError::Internal("the sink thread panicked".into()))?;
            dispatch?;
            collector = Some(joined?);
        }
        let mut collector = collector.expect("the collector, back from the sink thread");
        run.query_rows = std::mem::take(&mut collector.rows);
        run.checkpoints += collector.saved.0;
        run.checkpoint_ms += collector.saved.1;
        run.checkpoint_log.append(&mut collector.log);
        for result in metrics {
            for (query, metrics) in result? {
                run.query_metrics[query].add(&metrics);
            }
        }
        Ok(())
    })
}

fn sink_closed() -> TesseraError {
    TesseraError::Internal("sink closed".into())
}
