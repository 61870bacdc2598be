//! State reads and writes per event, counted by the runtime on controlled input (one key,
//! one event per slide, in order), against the sub-window design note's figures for a window
//! of `R = M/N` slides: the naive per-window plan reads and writes `R` times per event; the
//! note's sub-windows cost 1 read and 1 write per event when results are suppressed until the
//! window closes (plus `R` reads to combine each window), and `2R - 1` reads and 1 write per
//! event when every update is emitted. tessera's two-stacks sliding reads each slice at most
//! twice in all, and its per-update emission reads each slice the changed windows span once.
//! With the state spilled to disk, a key group is read back only when it takes rows or one of
//! its windows closes: other watermarks are answered from the in-memory index of next closes.

use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;

use super::harness::{on_disk, run_batches, run_batches_with_state};
use tessera::exec::OperatorMetrics;
use tessera::optimizer::window_strategy::Strategy;

const EVENTS: u64 = 600;

/// One event per batch (every update its own input batch): `(key, time)` pairs, value = time.
fn one_event_batches(events: impl IntoIterator<Item = (i64, i64)>) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("tag", DataType::Utf8, true),
        Field::new("v", DataType::Float64, true),
        Field::new("ts", DataType::Int64, false),
    ]));
    events
        .into_iter()
        .map(|(k, t)| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(vec![k])),
                    Arc::new(StringArray::from(vec!["a"])),
                    Arc::new(Float64Array::from(vec![t as f64])),
                    Arc::new(Int64Array::from(vec![t])),
                ],
            )
            .expect("batch")
        })
        .collect()
}

fn costs(r: u64, strategy: Strategy, changes: bool) -> OperatorMetrics {
    let emit = if changes { " EMIT CHANGES" } else { "" };
    let text = format!(
        "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'unused.csv', time_unit = 's');
         SELECT k, window_start, window_end, MIN(v) FROM HOP(s, ts, INTERVAL '1' SECOND, INTERVAL '{r}' SECOND)
         GROUP BY k, window_start, window_end{emit};"
    );
    let outcome =
        run_batches(&text, one_event_batches((0..EVENTS as i64).map(|t| (1, t))), 1, Some(strategy)).expect("run");
    let stats = &outcome.stats;
    // Every instance is written once on close, or once per event it takes with EMIT CHANGES.
    let rows = if changes { r * EVENTS } else { EVENTS + r - 1 };
    assert_eq!(stats.rows_out, rows, "R {r} {strategy:?} changes {changes}");
    OperatorMetrics {
        store_reads: stats.store_reads,
        store_writes: stats.store_writes,
        emit_reads: stats.emit_reads,
        ..OperatorMetrics::default()
    }
}

#[test]
fn reads_and_writes_per_event_match_the_design_note_and_beat_it() {
    for r in [2u64, 5, 10, 30] {
        let events = EVENTS;
        // Naive per-window plan: R reads and R writes per event.
        let naive = costs(r, Strategy::Baseline, false);
        assert_eq!((naive.store_reads, naive.store_writes, naive.emit_reads), (r * events, r * events, 0));
        // Sub-windows, suppressed: 1 read and 1 write per event, R reads to combine a window.
        let note = costs(r, Strategy::SharedPaired, false);
        assert_eq!((note.store_reads - note.emit_reads, note.store_writes), (events, events));
        assert_eq!(note.emit_reads, r * events);
        // Two stacks: each slice read when pushed and at most once more when the stacks flip.
        let sliding = costs(r, Strategy::SharedSliding, false);
        assert_eq!((sliding.store_reads - sliding.emit_reads, sliding.store_writes), (events, events));
        assert!(sliding.emit_reads <= 2 * events, "R {r}: {}", sliding.emit_reads);
        if r > 2 {
            assert!(sliding.emit_reads < note.emit_reads);
        }
        // Every update emitted. Naive: R more reads per event, one per window.
        let naive = costs(r, Strategy::Baseline, true);
        assert_eq!((naive.store_reads, naive.store_writes), (2 * r * events, r * events));
        // The note: 2R - 1 reads and 1 write per event. tessera reads each slice the changed
        // windows span once: the R up to the event (later ones are empty), fewer at the start.
        let note_reads = (2 * r - 1) * events;
        for strategy in [Strategy::SharedPaired, Strategy::SharedSliding] {
            let ours = costs(r, strategy, true);
            assert_eq!(ours.store_writes, events);
            assert_eq!(ours.store_reads, events + r * events - r * (r - 1) / 2, "R {r} {strategy:?}");
            if r > 2 {
                assert!(ours.store_reads < note_reads);
            }
        }
    }
}

/// Two keys, each its own key group, no memory for state (a group holding state is written
/// out after each batch): key 1 reports every second, key 2 at 0 s and 50 s only. Key 2's
/// group is read back to close its two windows; the watermarks before those closes, which
/// close none of its windows, are answered from memory.
#[test]
fn spilled_groups_are_read_only_when_they_take_rows_or_close_a_window() {
    let seconds = 100i64;
    let mut rows: Vec<(i64, i64)> = (0..seconds).map(|t| (1, t)).collect();
    rows.insert(1, (2, 0));
    rows.insert(52, (2, 50));
    let batches = one_event_batches(rows.iter().copied());
    let text = "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'unused.csv', time_unit = 's');
         SELECT k, window_start, window_end, SUM(v) FROM TUMBLE(s, ts, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;";
    let dir = tempfile::tempdir().expect("temp dir");
    let outcome = run_batches_with_state(text, batches.clone(), 1, None, on_disk(dir.path(), 0, 0)).expect("run");
    let spill = outcome.stats.spill;
    let in_memory = run_batches(text, batches, 1, None).expect("run");
    assert_eq!(outcome.stats.queries[0].rows_out, in_memory.stats.queries[0].rows_out);
    assert_eq!(outcome.stats.queries[0].rows_out, 12);
    // Every group written out is read back (at the latest when the input ends).
    assert_eq!(spill.group_reads, spill.group_writes);
    // Key 1's group is read for each of its rows and window closes: fewer than two reads per
    // input batch in all.
    assert!(spill.group_reads < 2 * rows.len() as u64, "{spill:?}");
    // Key 2's group sat on disk through the watermarks 1-9 and 51-59 at least.
    assert!(spill.lookups_in_memory >= 18, "{spill:?}");
}
