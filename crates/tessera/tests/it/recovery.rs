//! Checkpoints and recovery in process: a run on one to three workers that fails after a random
//! number of batches, having checkpointed after every batch, and is then resumed from its state directory, ends
//! with exactly the rows of an uninterrupted run — for every aggregate (the snapshot encodes
//! each partial state), string keys and values, every window strategy, late events and
//! `EMIT CHANGES` (which rows of an open window were written), with state in memory or in key
//! groups spilled to disk.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::AsArray;
use arrow::record_batch::RecordBatch;
use proptest::prelude::*;

use super::harness::rows;
use super::properties::{batches, event_strategy, window_strategy};
use super::reference::Agg;
use arrow::datatypes::SchemaRef;
use tessera::connectors::memory::MemoryReader;
use tessera::connectors::sink::{MemorySink, ResultSink};
use tessera::connectors::{BatchReader, OnError, ReadOptions, Skipped};
use tessera::engine::{run_script_with_readers, RunOptions, Script, StateOptions};
use tessera::exec::pipeline::Parallelism;
use tessera::optimizer::window_strategy::Strategy;
use tessera::state::checkpoint::CheckpointConfig;
use tessera::TesseraError;

/// Reads `inner`, pausing `pause` before each batch and failing (like a crash) once
/// `fail_after` batches were read; counts the batches it hands out in `read_batches`.
struct CrashingReader {
    inner: Box<dyn BatchReader>,
    fail_after: Option<usize>,
    pause: Duration,
    read_batches: Arc<AtomicUsize>,
}

impl CrashingReader {
    fn new(inner: Box<dyn BatchReader>, fail_after: Option<usize>, read_batches: &Arc<AtomicUsize>) -> Self {
        CrashingReader { inner, fail_after, pause: Duration::ZERO, read_batches: Arc::clone(read_batches) }
    }
}

impl BatchReader for CrashingReader {
    fn next_batch(&mut self) -> tessera::Result<Option<RecordBatch>> {
        std::thread::sleep(self.pause);
        if self.fail_after == Some(self.read_batches.load(Ordering::Relaxed)) {
            return Err(TesseraError::Execution("simulated crash".into()));
        }
        let batch = self.inner.next_batch()?;
        self.read_batches.fetch_add(usize::from(batch.is_some()), Ordering::Relaxed);
        Ok(batch)
    }

    fn progress(&self) -> (u64, Option<u64>) {
        self.inner.progress()
    }

    fn skipped(&self) -> Skipped {
        self.inner.skipped()
    }

    fn seek(&mut self, position: u64, skipped: Option<Skipped>) -> tessera::Result<bool> {
        self.inner.seek(position, skipped)
    }
}

/// A stand-in for the batch engine of queries kept whole: it answers any query with the
/// number of events it is handed and a checksum of their values, so a resumed run that lost or
/// repeated a kept event answers differently.
struct ChecksumSql;

impl tessera::exec::prefix::BatchSql for ChecksumSql {
    fn query(
        &self,
        _sql: &str,
        _table: &str,
        schema: SchemaRef,
        rows: Vec<RecordBatch>,
    ) -> tessera::Result<Vec<RecordBatch>> {
        use arrow::row::{RowConverter, SortField};
        let converter =
            RowConverter::new(schema.fields().iter().map(|f| SortField::new(f.data_type().clone())).collect())?;
        let (mut events, mut checksum) = (0i64, 0i64);
        for batch in &rows {
            for row in converter.convert_columns(batch.columns())?.iter() {
                let hash = row
                    .data()
                    .iter()
                    .fold(0xcbf29ce484222325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
                (events, checksum) = (events + 1, checksum.wrapping_add(hash as i64));
            }
        }
        let columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(arrow::array::Int64Array::from(vec![events])),
            Arc::new(arrow::array::Int64Array::from(vec![checksum])),
        ];
        Ok(vec![RecordBatch::try_from_iter([("n", columns[0].clone()), ("s", columns[1].clone())])?])
    }
}

fn run(
    text: &str,
    strategy: Option<Strategy>,
    input: &[RecordBatch],
    state: Option<&Path>,
    (fail_after, pause): (Option<usize>, Duration),
    (workers, disk): (usize, Option<u64>),
    sink: &mut dyn ResultSink,
) -> tessera::Result<tessera::engine::RunStats> {
    let mut script = Script::compile(text, Path::new("."))?;
    script.settings.window_strategy = strategy;
    let options = RunOptions {
        parallelism: Parallelism::Fixed(workers),
        checkpoints: state.map(|dir| CheckpointConfig { dir: dir.to_path_buf(), interval: Duration::ZERO }),
        // Key groups of two key ids, within `disk` bytes of memory (`None`: in memory).
        state: StateOptions { memory_bytes: disk, group_bits: 1, ..StateOptions::default() },
        batch_sql: Some(Arc::new(ChecksumSql)),
        ..RunOptions::default()
    };
    run_script_with_readers(&script, &options, sink, &mut |_| {
        let inner = Box::new(MemoryReader::new(input.to_vec()));
        let reader = CrashingReader { pause, ..CrashingReader::new(inner, fail_after, &Arc::default()) };
        Ok(Box::new(reader) as Box<dyn BatchReader>)
    })
}

/// Runs `text` with checkpoints in `dir`, crashing after each of `crashes` batches in turn (an
/// attempt that does not reach its crash ends the crashing), then to the end from the last
/// checkpoint.
fn resumed_after_crashes(
    text: &str,
    strategy: Option<Strategy>,
    input: &[RecordBatch],
    dir: &Path,
    crashes: &[usize],
    layout: (usize, Option<u64>),
    sink: &mut dyn ResultSink,
) -> tessera::Result<tessera::engine::RunStats> {
    for &crash in crashes {
        if run(text, strategy, input, Some(dir), (Some(crash), Duration::ZERO), layout, sink).is_ok() {
            break;
        }
    }
    run(text, strategy, input, Some(dir), (None, Duration::ZERO), layout, sink)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    #[test]
    fn a_resumed_run_equals_an_uninterrupted_one(
        events in event_strategy(),
        slide in 1i64..5,
        extra in 0i64..12,
        delay in 0i64..6,
        batch_size in 1usize..20,
        crashes in prop::collection::vec(0usize..12, 1..4),
        strategy in window_strategy(),
        two_keys in any::<bool>(),
        workers in 1usize..4,
        disk in any::<bool>(),
    ) {
        // On disk, every group is spilled after every batch.
        let disk = disk.then_some(0);
        let range = slide + extra;
        let mut aggregates: Vec<String> = Agg::ALL.iter().map(|a| a.sql("v")).collect();
        aggregates.push("MIN(tag)".into());
        aggregates.push("MAX(tag)".into());
        let keys = if two_keys { "k, tag" } else { "k" };
        let text = format!(
            "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '{delay}' SECOND)
               WITH (path = 'unused.csv', time_unit = 's');
             SELECT k, window_start, window_end, {} FROM HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND)
             GROUP BY {keys}, window_start, window_end;
             SELECT k, window_start, window_end, MIN(v), COUNT(*) FROM TUMBLE(s, ts, INTERVAL '{range}' SECOND)
             GROUP BY k, window_start, window_end;
             SELECT k, window_start, window_end, MAX(v), COUNT(*) FROM HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND)
             GROUP BY k, window_start, window_end HAVING COUNT(*) < 3 EMIT CHANGES;
             SELECT k, window_start, window_end, SUM(v), AVG(v), COUNT(v) FROM HOP(s, ts, INTERVAL '1' SECOND, INTERVAL '600' SECOND)
             GROUP BY k, window_start, window_end;",
            aggregates.join(", ")
        );
        let input = batches(&events, batch_size);
        let mut expected = MemorySink::default();
        run(&text, strategy, &input, None, (None, Duration::ZERO), (workers, disk), &mut expected).expect("uninterrupted run");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut resumed = MemorySink::default();
        // Each attempt resumes from the last checkpoint and crashes a few batches later.
        let stats = resumed_after_crashes(&text, strategy, &input, dir.path(), &crashes, (workers, disk), &mut resumed)
            .expect("resumed run");
        prop_assert_eq!(stats.events_in, events.len() as u64);
        for q in 0..4 {
            let (want, got) = (rows(&expected.rows[q]), rows(&resumed.rows[q]));
            // To the bit: a resumed run merges partial aggregates in the same order.
            prop_assert!(got == want, "query {q} {strategy:?}\nuninterrupted: {want:?}\nresumed:       {got:?}");
            prop_assert_eq!(rows(&resumed.late[q]), rows(&expected.late[q]));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Continuous temporal queries resume to the same rows (and late rows) as one worker writes
    /// without crashing, on one or two workers (which share a synopsis's groups where each
    /// group's partitions are on one worker), in memory or evicted to the store after every batch: their synopses' groups of partitions and interned values are saved to
    /// the store as they change, their waiting events and last instants in the snapshot, and `EMIT CHANGES` continues from the rows it wrote (also for
    /// a formula whose answer moves with the current instant, SINCE_DURATION). Queries kept
    /// whole resume with the same events: the chunks checkpoints wrote.
    #[test]
    fn a_resumed_temporal_query_equals_an_uninterrupted_one(
        events in event_strategy(),
        delay in 0i64..6,
        batch_size in 1usize..20,
        crashes in prop::collection::vec(0usize..12, 1..4),
        workers in 1usize..3,
        disk in any::<bool>(),
    ) {
        // On disk, every group of partitions is evicted after every batch.
        let disk = disk.then_some(0);
        let text = format!(
            "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '{delay}' SECOND)
               WITH (path = 'unused.csv', time_unit = 's');
             SELECT a.k, COUNT(*) FROM s a, s b WHERE a.k = b.k AND a.v < 0 AND b.v > 0 AND a.ts < b.ts GROUP BY a.k;
             SELECT a.tag, COUNT(*) FROM s a, s b, s c WHERE a.tag = b.tag AND b.tag = c.tag AND a.ts < b.ts
               AND b.ts <= c.ts GROUP BY a.tag EMIT CHANGES;
             SELECT COUNT(*) FROM s a, s b WHERE a.v = b.v AND a.ts > b.ts;
             SELECT DISTINCT a.k FROM s a, s b WHERE a.k = b.k AND a.v > 1 AND b.v < -1 AND a.ts >= b.ts;
             WITH up AS (SELECT k FROM s WHERE v > 0), down AS (SELECT k FROM s WHERE v < 0)
             SELECT k, COUNT(*) FROM TEMPORAL(SINCE_DURATION(NOT down, down) OR up AND NOT SO_FAR(down)) GROUP BY k
               EMIT CHANGES;
             SET allow_unbounded_state = true;
             SELECT COUNT(*) AS n, SUM(a.k) AS s FROM s a, s b WHERE a.k = b.k AND a.v < b.v;
             SELECT COUNT(*) AS n, SUM(a.k) AS s FROM s a, s b WHERE a.k = b.k AND a.v < b.v EMIT CHANGES;"
        );
        let input = batches(&events, batch_size);
        let mut expected = MemorySink::default();
        // One worker in memory: workers sharing a synopsis's groups must answer as one does.
        run(&text, None, &input, None, (None, Duration::ZERO), (1, None), &mut expected).expect("uninterrupted run");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut resumed = MemorySink::default();
        resumed_after_crashes(&text, None, &input, dir.path(), &crashes, (workers, disk), &mut resumed)
            .expect("resumed run");
        // The last two are kept whole (every event, answered by a stand-in batch engine).
        for q in 0..7 {
            let (want, got) = (rows(&expected.rows[q]), rows(&resumed.rows[q]));
            prop_assert!(got == want, "query {q}\nuninterrupted: {want:?}\nresumed:       {got:?}");
            prop_assert_eq!(rows(&resumed.late[q]), rows(&expected.late[q]));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// With one worker the output is the same bytes in the same order whether the state is
    /// in memory, in key groups evicted after every batch, in key groups partly in memory, or
    /// checkpointed and resumed after crashes: which groups are in memory never changes what
    /// is written or when.
    #[test]
    fn the_output_does_not_depend_on_where_the_state_is(
        events in event_strategy(),
        slide in 1i64..4,
        extra in 0i64..8,
        delay in 0i64..4,
        batch_size in 1usize..12,
        crashes in prop::collection::vec(0usize..12, 1..3),
        strategy in window_strategy(),
    ) {
        let range = slide + extra;
        let text = format!(
            "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '{delay}' SECOND)
               WITH (path = 'unused.csv', time_unit = 's');
             SELECT k, window_start, window_end, SUM(v), MAX(v), COUNT(*), STDDEV_SAMP(v) FROM HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND)
             GROUP BY k, window_start, window_end;
             SELECT k, window_start, window_end, MIN(v), COUNT(*) FROM TUMBLE(s, ts, INTERVAL '{range}' SECOND)
             GROUP BY k, window_start, window_end;"
        );
        same_output_wherever_the_state_is(&text, strategy, &batches(&events, batch_size), &crashes, 2)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The same for continuous temporal queries: their groups of partitions evicted after every
    /// batch or partly in memory, and resumed after crashes.
    #[test]
    fn temporal_output_does_not_depend_on_where_the_state_is(
        events in event_strategy(),
        delay in 0i64..4,
        batch_size in 1usize..12,
        crashes in prop::collection::vec(0usize..12, 1..3),
    ) {
        let text = format!(
            "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '{delay}' SECOND)
               WITH (path = 'unused.csv', time_unit = 's');
             SELECT a.k, COUNT(*) FROM s a, s b WHERE a.k = b.k AND a.v < 0 AND b.v > 0 AND a.ts < b.ts GROUP BY a.k
               EMIT CHANGES;
             SELECT a.k, a.tag, COUNT(*) FROM s a, s b, s c WHERE a.k = b.k AND b.k = c.k AND a.tag = b.tag
               AND b.tag = c.tag AND a.ts < b.ts AND b.ts < c.ts GROUP BY a.k, a.tag;
             WITH up AS (SELECT k FROM s WHERE v > 0), down AS (SELECT k FROM s WHERE v < 0)
             SELECT k, COUNT(*) FROM TEMPORAL(SINCE_DURATION(NOT down, down) OR up AND NOT SO_FAR(down)) GROUP BY k
               EMIT CHANGES;
             SELECT b.k, COUNT(*) FROM s a, s b, s c WHERE a.k = b.k AND b.tag = c.tag AND a.ts < b.ts AND b.ts < c.ts
               GROUP BY b.k;"
        );
        same_output_wherever_the_state_is(&text, None, &batches(&events, batch_size), &crashes, 4)?;
    }
}

/// Runs `text` over `input` with one worker in memory, within budgets of 0 and 600 bytes, and
/// resumed after `crashes` (in memory and on disk), and checks that the first `queries` write
/// the same bytes in the same order each time.
fn same_output_wherever_the_state_is(
    text: &str,
    strategy: Option<Strategy>,
    input: &[RecordBatch],
    crashes: &[usize],
    queries: usize,
) -> Result<(), TestCaseError> {
    let written = |sink: &MemorySink| -> Vec<String> {
        (0..queries)
            .flat_map(|q| [&sink.rows[q], &sink.late[q]])
            .map(|batches| arrow::util::pretty::pretty_format_batches(batches).expect("printable").to_string())
            .collect()
    };
    let mut in_memory = MemorySink::default();
    run(text, strategy, input, None, (None, Duration::ZERO), (1, None), &mut in_memory).expect("in memory");
    let want = written(&in_memory);
    // Evicted after every batch, or within a budget that holds some groups.
    for budget in [0, 600] {
        let mut sink = MemorySink::default();
        run(text, strategy, input, None, (None, Duration::ZERO), (1, Some(budget)), &mut sink).expect("on disk");
        prop_assert_eq!(&written(&sink), &want, "budget {}", budget);
    }
    for disk in [None, Some(0)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut resumed = MemorySink::default();
        resumed_after_crashes(text, strategy, input, dir.path(), crashes, (1, disk), &mut resumed).expect("resumed");
        prop_assert_eq!(&written(&resumed), &want, "resumed, disk {:?}", disk);
    }
    Ok(())
}

/// Checkpoints write what changed: where most keys' slices stay as they were between two
/// checkpoints, a checkpoint writes a small part of the state the store holds, and never
/// more than the tables written since the previous one.
#[test]
fn a_checkpoint_writes_the_tables_that_changed() {
    use super::reference::Event;
    // 400 keys in the first 40 seconds, then only key 0: later checkpoints find the other
    // keys' slices unchanged (the 1,000-second window keeps them).
    let events: Vec<Event> = (0..4_000i64)
        .map(|i| Event { key: Some(if i < 2_000 { i % 400 } else { 0 }), value: Some((i % 17) as f64), ts: i / 50 })
        .collect();
    let text = "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts)
           WITH (path = 'unused.csv', time_unit = 's');
         SELECT k, window_start, window_end, SUM(v), COUNT(*) FROM HOP(s, ts, INTERVAL '10' SECOND, INTERVAL '1000' SECOND)
         GROUP BY k, window_start, window_end;";
    let input = batches(&events, 500);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut sink = MemorySink::default();
    let stats = run(text, None, &input, Some(dir.path()), (None, Duration::ZERO), (1, None), &mut sink).expect("run");
    let log = &stats.checkpoint_log;
    assert!(log.len() >= 6, "{log:?}");
    for c in log {
        assert!(c.tables_written <= c.tables_changed, "{c:?}");
        assert!(c.tables_written <= c.tables_stored, "{c:?}");
    }
    let last = log.last().expect("checkpoints");
    assert!(last.tables_written * 4 < last.tables_stored, "{last:?}");
    // A complete run leaves no state behind.
    assert!(!dir.path().join("store").exists());
}

/// A sink that takes its time over every batch of rows, so the reading thread runs ahead of the
/// worker and interns keys of batches the worker has not reached.
struct SlowSink(MemorySink);

impl ResultSink for SlowSink {
    fn open_query(&mut self, query: usize, schema: &SchemaRef) -> tessera::Result<()> {
        self.0.open_query(query, schema)
    }

    fn write_rows(&mut self, query: usize, batch: &RecordBatch) -> tessera::Result<()> {
        std::thread::sleep(Duration::from_millis(2));
        self.0.write_rows(query, batch)
    }

    fn write_late(&mut self, query: usize, batch: &RecordBatch) -> tessera::Result<()> {
        self.0.write_late(query, batch)
    }

    fn finish(&mut self) -> tessera::Result<()> {
        self.0.finish()
    }

    fn checkpoint(&mut self) -> tessera::Result<Vec<u64>> {
        self.0.checkpoint()
    }

    fn resume(&mut self, positions: &[u64]) -> tessera::Result<()> {
        self.0.resume(positions)
    }
}

/// Key groups on disk are blocks of key ids, and which keys share a group decides when the
/// sliding aggregator of a group is rebuilt after a late row, hence the order in which
/// floating-point partial sums are merged. Key ids must therefore follow the input alone, not
/// how far the reading thread runs ahead of the worker: a slow reader (the worker waits for
/// every batch) and a slow sink (batches queue up for the worker) must give the same bits and
/// the same spills.
#[test]
fn key_groups_do_not_depend_on_how_far_reading_runs_ahead() {
    use super::reference::Event;
    // Every batch of four brings new keys; every seventh event is late by a few slices.
    let events: Vec<Event> = (0..600i64)
        .map(|i| Event {
            key: Some((i / 3) % 90),
            value: Some(((i * 37) % 101) as f64 * 0.1),
            ts: i / 2 - if i % 7 == 0 { 5 } else { 0 },
        })
        .collect();
    let text = "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '6' SECOND)
           WITH (path = 'unused.csv', time_unit = 's');
         SELECT k, window_start, window_end, SUM(v), AVG(v), VAR_SAMP(v), STDDEV_SAMP(v) FROM HOP(s, ts, INTERVAL '2' SECOND, INTERVAL '12' SECOND)
         GROUP BY k, window_start, window_end;";
    let input = batches(&events, 4);
    let strategy = Some(Strategy::SharedSliding);
    let mut reading_behind = MemorySink::default();
    let pause = Duration::from_millis(1);
    let reading_behind_stats =
        run(text, strategy, &input, None, (None, pause), (1, Some(0)), &mut reading_behind).expect("slow reader");
    let mut reading_ahead = SlowSink(MemorySink::default());
    let reading_ahead_stats =
        run(text, strategy, &input, None, (None, Duration::ZERO), (1, Some(0)), &mut reading_ahead).expect("slow sink");
    assert_eq!(reading_ahead_stats.spill, reading_behind_stats.spill);
    assert!(rows(&reading_ahead.0.rows[0]) == rows(&reading_behind.rows[0]), "results depend on timing");
}

/// A resumed run keeps in memory the key groups the interrupted run had there (it neither
/// writes them to the spill store nor reads them back) and ends with the same rows.
#[test]
fn a_resumed_run_keeps_resident_key_groups_in_memory() {
    use super::reference::Event;
    let events: Vec<Event> =
        (0..300i64).map(|i| Event { key: Some(i % 40), value: Some((i % 13) as f64 * 0.3), ts: i / 3 }).collect();
    let text = "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '2' SECOND)
           WITH (path = 'unused.csv', time_unit = 's');
         SELECT k, window_start, window_end, SUM(v), VAR_SAMP(v) FROM HOP(s, ts, INTERVAL '2' SECOND, INTERVAL '10' SECOND)
         GROUP BY k, window_start, window_end;";
    let input = batches(&events, 10);
    let in_memory = (1, Some(1 << 30));
    let mut expected = MemorySink::default();
    run(text, None, &input, None, (None, Duration::ZERO), in_memory, &mut expected).expect("uninterrupted run");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut resumed = MemorySink::default();
    run(text, None, &input, Some(dir.path()), (Some(12), Duration::ZERO), in_memory, &mut resumed)
        .expect_err("the reader fails");
    let stats = run(text, None, &input, Some(dir.path()), (None, Duration::ZERO), in_memory, &mut resumed)
        .expect("resumed run");
    assert!(stats.resumed_events > 0);
    assert_eq!(stats.spill, tessera::exec::SpillCounters::default());
    assert!(rows(&resumed.rows[0]) == rows(&expected.rows[0]));
}

/// Events for the file-resume tests: 17 keys, some late rows.
fn file_events() -> Vec<super::reference::Event> {
    (0..5_000i64)
        .map(|i| super::reference::Event {
            key: Some(i % 17),
            value: Some((i % 29) as f64 * 0.25),
            // 35 seconds of events, every eleventh 30 seconds late (windows closed for it).
            ts: i * 7 - (i % 11 == 0) as i64 * 30_000,
        })
        .collect()
}

/// Runs `script` over its file in batches of 256 rows, with checkpoints after every batch in
/// `state` if given, failing after `fail_after` batches; `read_batches` counts those read.
/// Malformed rows fail the run, or go to `dead_letter` if given.
fn run_file(
    script: &Script,
    (state, dead_letter): (Option<&Path>, Option<&Path>),
    fail_after: Option<usize>,
    sink: &mut MemorySink,
    read_batches: &Arc<AtomicUsize>,
) -> tessera::Result<tessera::engine::RunStats> {
    let mut read = ReadOptions { batch_size: 256, ..Default::default() };
    if let Some(path) = dead_letter {
        (read.on_error, read.dead_letter_path) = (OnError::Skip, path.to_path_buf());
    }
    let options = RunOptions {
        parallelism: Parallelism::Fixed(1),
        checkpoints: state.map(|dir| CheckpointConfig { dir: dir.to_path_buf(), interval: Duration::ZERO }),
        ..RunOptions::default()
    };
    run_script_with_readers(script, &options, sink, &mut |source| {
        // Key columns as `run_script` reads them (a Parquet key column as a dictionary).
        let read = ReadOptions {
            dictionary_columns: tessera::engine::dictionary_columns(&script.queries, source),
            ..read.clone()
        };
        let reader = tessera::connectors::open_input(source.input(), &read)?;
        Ok(Box::new(CrashingReader::new(reader, fail_after, read_batches)) as Box<dyn BatchReader>)
    })
}

/// Runs a script over the file at `path` (batches of 256 rows), fails it after 11 batches with
/// checkpoints after every batch, resumes it, and checks that the resumed run read only the
/// batches after the checkpoint and wrote exactly the rows of an uninterrupted run, `EMIT
/// CHANGES` included (whose rows follow the batches, so these must be cut as before). With
/// `skip`, malformed rows go to a dead-letter file: the resumed run's holds the uninterrupted
/// run's entries, each once, and counts as many skipped rows.
fn check_resume_skips_to_the_checkpoint(path: &Path, with: &str, skip: bool) {
    let dir = path.parent().expect("a folder");
    let text = format!(
        "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '3' SECOND)
           WITH (path = '{}'{with});
         SELECT k, window_start, window_end, SUM(v), VAR_SAMP(v), COUNT(*) FROM HOP(s, ts, INTERVAL '5' SECOND, INTERVAL '20' SECOND)
         GROUP BY k, window_start, window_end;
         SELECT k, window_start, window_end, MAX(v), COUNT(*) FROM HOP(s, ts, INTERVAL '5' SECOND, INTERVAL '20' SECOND)
         GROUP BY k, window_start, window_end EMIT CHANGES;",
        path.display()
    );
    let script = Script::compile(&text, dir).expect("script");
    let with_suffix = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        std::path::PathBuf::from(name)
    };
    let state = with_suffix(".state");
    let (expected_dead, resumed_dead) = (with_suffix(".expected-dead.jsonl"), with_suffix(".resumed-dead.jsonl"));
    let (expected_dead, resumed_dead) =
        if skip { (Some(expected_dead.as_path()), Some(resumed_dead.as_path())) } else { (None, None) };
    let (all, first, rest) = (Arc::default(), Arc::default(), Arc::default());
    let mut expected = MemorySink::default();
    let uninterrupted = run_file(&script, (None, expected_dead), None, &mut expected, &all).expect("uninterrupted run");
    let mut resumed = MemorySink::default();
    run_file(&script, (Some(&state), resumed_dead), Some(11), &mut resumed, &first).expect_err("the reader fails");
    if let Some(dead) = resumed_dead {
        // What a reader ahead of the last checkpoint wrote before the run died goes.
        let mut file = std::fs::OpenOptions::new().append(true).open(dead).expect("dead-letter file");
        std::io::Write::write_all(&mut file, b"{\"read\": \"ahead\"}\n").expect("append");
    }
    let stats = run_file(&script, (Some(&state), resumed_dead), None, &mut resumed, &rest).expect("resumed run");
    assert!(stats.resumed_events > 0);
    assert_eq!(first.load(Ordering::Relaxed), 11);
    assert!(rest.load(Ordering::Relaxed) + 10 <= all.load(Ordering::Relaxed), "{rest:?} of {all:?}");
    for q in 0..2 {
        assert!(rows(&resumed.rows[q]) == rows(&expected.rows[q]), "query {q}");
        assert!(rows(&resumed.late[q]) == rows(&expected.late[q]), "query {q}: late rows");
        // Late rows in the declared schema, however the reader handed the key column out.
        let declared = script.catalog.source("s").expect("source").schema.field(0).data_type().clone();
        assert!(!expected.late[q].is_empty(), "query {q}: late rows");
        assert!(expected.late[q].iter().chain(&resumed.late[q]).all(|b| b.schema().field(0).data_type() == &declared));
    }
    assert_eq!(stats.bad_rows, uninterrupted.bad_rows);
    if let (Some(expected_dead), Some(resumed_dead)) = (expected_dead, resumed_dead) {
        assert!(uninterrupted.bad_rows > 2, "malformed rows on both sides of the checkpoint");
        let read = |p: &Path| std::fs::read_to_string(p).expect("dead-letter file");
        assert_eq!(read(resumed_dead), read(expected_dead));
    }
}

/// Parquet: the row groups before the checkpoint's row are not read; rows without an event
/// time, skipped into a dead-letter file, do not change that.
#[test]
fn a_resumed_parquet_run_starts_at_the_checkpointed_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = batches(&file_events(), 5_000).remove(0);
    let write = |path: &Path, batch: &RecordBatch| {
        let file = std::fs::File::create(path).expect("parquet file");
        // Row groups of 700 rows, read in batches of 256: batches straddle row groups.
        let properties =
            parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(700)).build();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(properties)).expect("writer");
        writer.write(batch).expect("write");
        writer.close().expect("close");
    };
    write(&dir.path().join("events.parquet"), &input);
    check_resume_skips_to_the_checkpoint(&dir.path().join("events.parquet"), "", false);
    let times = input.column(3).as_primitive::<arrow::datatypes::Int64Type>();
    let with_gaps: arrow::array::Int64Array =
        (0..times.len()).map(|i| (i % 450 != 7).then(|| times.value(i))).collect();
    let mut fields: Vec<_> = input.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields[3] = fields[3].clone().with_nullable(true);
    let mut columns = input.columns().to_vec();
    columns[3] = Arc::new(with_gaps);
    let gaps = RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), columns).expect("batch");
    let skipping = tempfile::tempdir().expect("temp dir");
    write(&skipping.path().join("events.parquet"), &gaps);
    check_resume_skips_to_the_checkpoint(&skipping.path().join("events.parquet"), "", true);
}

/// CSV and JSON lines: the bytes before the checkpoint are skipped unparsed, with blank lines
/// and a quoted field spanning two lines among them, and the lines after it keep their numbers.
#[test]
fn a_resumed_text_run_skips_the_bytes_before_the_checkpoint() {
    let dir = tempfile::tempdir().expect("temp dir");
    let events = file_events();
    let tag = |i: usize, k: i64| if i == 40 { format!("\"t{k}\nsecond line\"") } else { format!("t{k}") };
    let mut csv = String::from("k,tag,v,ts\n");
    let mut jsonl = String::new();
    for (i, e) in events.iter().enumerate() {
        let (k, v) = (e.key.expect("a key"), e.value.expect("a value"));
        csv.push_str(&format!("{k},{},{v},{}\n", tag(i, k), e.ts));
        jsonl.push_str(&format!("{{\"k\": {k}, \"tag\": \"t{k}\", \"v\": {v}, \"ts\": {}}}\n", e.ts));
        if i % 97 == 0 {
            csv.push('\n');
            jsonl.push('\n');
        }
    }
    let bad_line = csv.lines().count() + 1;
    std::fs::write(dir.path().join("events.csv"), &csv).expect("csv");
    check_resume_skips_to_the_checkpoint(&dir.path().join("events.csv"), "", false);
    std::fs::write(dir.path().join("events.jsonl"), &jsonl).expect("jsonl");
    check_resume_skips_to_the_checkpoint(&dir.path().join("events.jsonl"), ", format = 'jsonl'", false);
    // Malformed rows skipped into a dead-letter file, before and after the checkpoint: the
    // resumed run still starts at the checkpoint, and counts and writes each once.
    let skipping = tempfile::tempdir().expect("temp dir");
    let malformed = |text: &str, bad: &str| {
        let lines: Vec<&str> = text.lines().collect();
        let mut out = String::new();
        for (i, line) in lines.iter().enumerate() {
            out.push_str(line);
            out.push('\n');
            if i % 450 == 7 {
                out.push_str(bad);
                out.push('\n');
            }
        }
        out
    };
    std::fs::write(skipping.path().join("events.csv"), malformed(&csv, "3,t3,oops,17")).expect("csv");
    check_resume_skips_to_the_checkpoint(&skipping.path().join("events.csv"), "", true);
    std::fs::write(skipping.path().join("events.jsonl"), malformed(&jsonl, "{\"k\": 3, \"v\": 1.0}")).expect("jsonl");
    check_resume_skips_to_the_checkpoint(&skipping.path().join("events.jsonl"), ", format = 'jsonl'", true);
    // A malformed row after the checkpoint is reported at its line in the file.
    let bad_dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(bad_dir.path().join("events.csv"), format!("{csv}1,t1,oops,5000\n")).expect("csv");
    let path = bad_dir.path().join("events.csv");
    let text = format!(
        "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = '{}');
         SELECT k, window_start, window_end, COUNT(*) FROM TUMBLE(s, ts, INTERVAL '5' SECOND) GROUP BY k, window_start, window_end;",
        path.display()
    );
    let script = Script::compile(&text, bad_dir.path()).expect("script");
    let state = bad_dir.path().join("state");
    let mut sink = MemorySink::default();
    run_file(&script, (Some(&state), None), Some(11), &mut sink, &Arc::default()).expect_err("the reader fails");
    let error = run_file(&script, (Some(&state), None), None, &mut sink, &Arc::default())
        .expect_err("a malformed row")
        .to_string();
    assert!(error.contains(&format!(":{bad_line}")), "line {bad_line}: {error}");
}

/// Runs `script` over its Parquet file on `workers` workers, with the columns the engine may
/// take as dictionaries read as dictionaries or all read as values.
fn run_parquet(script: &Script, workers: usize, dictionaries: bool) -> MemorySink {
    let read = ReadOptions { batch_size: 64, ..Default::default() };
    let options = RunOptions { parallelism: Parallelism::Fixed(workers), ..RunOptions::default() };
    let mut sink = MemorySink::default();
    run_script_with_readers(script, &options, &mut sink, &mut |source| {
        let columns = if dictionaries { tessera::engine::dictionary_columns(&script.queries, source) } else { vec![] };
        tessera::connectors::open_input(source.input(), &ReadOptions { dictionary_columns: columns, ..read.clone() })
    })
    .expect("run");
    sink
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    /// String and integer keys and float arguments read from Parquet as dictionaries give the
    /// rows and late rows of the same columns read as values: NULL keys and values, late
    /// events, row groups and pages smaller than a batch, one or two workers, `EMIT CHANGES`.
    #[test]
    fn parquet_columns_read_as_dictionaries_give_the_rows_of_values(
        events in super::properties::event_strategy(),
        workers in 1usize..3,
    ) {
        prop_assume!(!events.is_empty());
        let dir = tempfile::tempdir().expect("temp dir");
        let input = batches(&events, events.len()).remove(0);
        let properties = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(50))
            .set_write_batch_size(10)
            .set_data_page_row_count_limit(20)
            .build();
        let file = std::fs::File::create(dir.path().join("events.parquet")).expect("parquet file");
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, input.schema(), Some(properties)).expect("writer");
        writer.write(&input).expect("write");
        writer.close().expect("close");
        let text = "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '3' SECOND)
               WITH (path = 'events.parquet');
             SELECT tag, window_start, window_end, MIN(v), SUM(v), COUNT(*) FROM TUMBLE(s, ts, INTERVAL '10' SECOND)
             GROUP BY tag, window_start, window_end;
             SELECT k, window_start, window_end, MAX(v), AVG(v), COUNT(v) FROM HOP(s, ts, INTERVAL '5' SECOND, INTERVAL '15' SECOND)
             GROUP BY k, window_start, window_end EMIT CHANGES;";
        let script = Script::compile(text, dir.path()).expect("script");
        prop_assert_eq!(tessera::engine::dictionary_columns(&script.queries, script.catalog.source("s").expect("s")), vec![0, 1, 2]);
        let (dictionary, values) = (run_parquet(&script, workers, true), run_parquet(&script, workers, false));
        for q in 0..2 {
            prop_assert!(rows(&dictionary.rows[q]) == rows(&values.rows[q]), "query {}", q);
            prop_assert!(rows(&dictionary.late[q]) == rows(&values.late[q]), "query {}: late rows", q);
        }
    }
}
