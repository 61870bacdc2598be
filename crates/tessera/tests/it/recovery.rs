//! Checkpoints and recovery in process: a run on one to three workers that fails after a random
//! number of batches, having checkpointed after every batch, and is then resumed from its state directory, ends
//! with exactly the rows of an uninterrupted run — for every aggregate (the snapshot encodes
//! each partial state), string keys and values, every window strategy, late events and
//! `EMIT CHANGES` (which rows of an open window were written), with state in memory or in key
//! groups spilled to disk.

use std::path::Path;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use proptest::prelude::*;

use super::harness::rows;
use super::properties::{batches, event_strategy, window_strategy};
use super::reference::Agg;
use tessera::connectors::memory::MemoryReader;
use tessera::connectors::sink::MemorySink;
use tessera::connectors::BatchReader;
use tessera::engine::{run_script_with_readers, RunOptions, Script, StateOptions};
use tessera::exec::pipeline::Parallelism;
use tessera::optimizer::window_strategy::Strategy;
use tessera::state::checkpoint::CheckpointConfig;
use tessera::TesseraError;

/// Reads `batches`, failing (like a crash) once `fail_after` of them were read.
struct CrashingReader {
    inner: MemoryReader,
    fail_after: Option<usize>,
}

impl BatchReader for CrashingReader {
    fn next_batch(&mut self) -> tessera::Result<Option<RecordBatch>> {
        match &mut self.fail_after {
            Some(0) => Err(TesseraError::Execution("simulated crash".into())),
            Some(left) => {
                *left -= 1;
                self.inner.next_batch()
            }
            None => self.inner.next_batch(),
        }
    }

    fn progress(&self) -> (u64, Option<u64>) {
        self.inner.progress()
    }

    fn bad_rows(&self) -> u64 {
        0
    }
}

fn run(
    text: &str,
    strategy: Option<Strategy>,
    input: &[RecordBatch],
    state: Option<&Path>,
    fail_after: Option<usize>,
    (workers, disk): (usize, bool),
    sink: &mut MemorySink,
) -> tessera::Result<tessera::engine::RunStats> {
    let mut script = Script::compile(text, Path::new("."))?;
    script.settings.window_strategy = strategy;
    let options = RunOptions {
        parallelism: Parallelism::Fixed(workers),
        checkpoints: state.map(|dir| CheckpointConfig { dir: dir.to_path_buf(), interval: Duration::ZERO }),
        // On disk: key groups of two key ids, every one spilled after every batch.
        state: if disk {
            StateOptions::Disk { memory_bytes: 0, dir: std::env::temp_dir(), group_bits: 1 }
        } else {
            StateOptions::Memory
        },
        ..RunOptions::default()
    };
    run_script_with_readers(&script, &options, sink, &mut |_| {
        Ok(Box::new(CrashingReader { inner: MemoryReader::new(input.to_vec()), fail_after }) as Box<dyn BatchReader>)
    })
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
             GROUP BY k, window_start, window_end HAVING COUNT(*) < 3 EMIT CHANGES;",
            aggregates.join(", ")
        );
        let input = batches(&events, batch_size);
        let mut expected = MemorySink::default();
        run(&text, strategy, &input, None, None, (workers, disk), &mut expected).expect("uninterrupted run");
        let dir = tempfile::tempdir().expect("temp dir");
        let mut resumed = MemorySink::default();
        for crash in crashes {
            // Each attempt resumes from the last checkpoint and crashes a few batches later.
            if run(&text, strategy, &input, Some(dir.path()), Some(crash), (workers, disk), &mut resumed).is_ok() {
                break;
            }
        }
        let stats = run(&text, strategy, &input, Some(dir.path()), None, (workers, disk), &mut resumed).expect("resumed run");
        prop_assert_eq!(stats.events_in, events.len() as u64);
        for q in 0..3 {
            let (want, got) = (rows(&expected.rows[q]), rows(&resumed.rows[q]));
            // To the bit: a resumed run merges partial aggregates in the same order.
            prop_assert!(got == want, "query {q} {strategy:?}\nuninterrupted: {want:?}\nresumed:       {got:?}");
            prop_assert_eq!(rows(&resumed.late[q]), rows(&expected.late[q]));
        }
    }
}
