//! Property tests: the engine equals the reference evaluator on random streams (out of order
//! within and beyond the watermark bound, late events, NULL keys and values, duplicate
//! timestamps, negative times), random windows, batch sizes and parallelism.

use std::sync::Arc;

use arrow::array::{Float64Array, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use proptest::prelude::*;

use super::harness::{on_disk, rows, rows_in_order, run_batches, run_batches_with_state, same_rows, Value};
use super::reference::{evaluate, Agg, Event};
use tessera::engine::StateOptions;
use tessera::optimizer::window_strategy::Strategy as WindowStrategy;

pub fn event_strategy() -> impl Strategy<Value = Vec<Event>> {
    let step =
        (0i64..4, 0i64..10, prop::option::weighted(0.9, 0i64..5), prop::option::weighted(0.85, -40i64..40), 0u8..20);
    (-60i64..60, prop::collection::vec(step, 0..150)).prop_map(|(start, steps)| {
        let mut base = start;
        steps
            .into_iter()
            .map(|(advance, back, key, value, jump)| {
                base += advance;
                // Mostly a little behind the front; now and then far behind (a late event).
                let behind = if jump == 0 { back * 4 } else { back % 4 };
                Event { key, value: value.map(|v| v as f64 / 4.0), ts: base - behind }
            })
            .collect()
    })
}

pub fn batches(events: &[Event], batch_size: usize) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("tag", DataType::Utf8, true),
        Field::new("v", DataType::Float64, true),
        Field::new("ts", DataType::Int64, false),
    ]));
    events
        .chunks(batch_size.max(1))
        .map(|chunk| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter(chunk.iter().map(|e| e.key))),
                    Arc::new(StringArray::from_iter(chunk.iter().map(|e| e.key.map(|k| format!("t{k}"))))),
                    Arc::new(Float64Array::from_iter(chunk.iter().map(|e| e.value))),
                    Arc::new(Int64Array::from_iter_values(chunk.iter().map(|e| e.ts))),
                ],
            )
            .expect("batch")
        })
        .collect()
}

fn script(range: i64, slide: i64, delay: i64, two_keys: bool) -> String {
    let window = if range == slide {
        format!("TUMBLE(s, ts, INTERVAL '{range}' SECOND)")
    } else {
        format!("HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND)")
    };
    let aggs: Vec<String> = Agg::ALL.iter().map(|a| a.sql("v")).collect();
    let keys = if two_keys { "k, tag" } else { "k" };
    format!(
        "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '{delay}' SECOND)
           WITH (path = 'unused.csv', time_unit = 's');
         SELECT k, window_start, window_end, {} FROM {window} GROUP BY {keys}, window_start, window_end;",
        aggs.join(", ")
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn engine_equals_reference(
        events in event_strategy(),
        slide in 1i64..8,
        extra in 0i64..30,
        delay in 0i64..6,
        batch_size in 1usize..40,
        parallelism in 1usize..4,
        two_keys in any::<bool>(),
    ) {
        let range = slide + extra;
        let outcome = run_batches(&script(range, slide, delay, two_keys), batches(&events, batch_size), parallelism, None)
            .expect("engine run");
        let (expected, expected_late) = evaluate(&events, range, slide, delay, &Agg::ALL);
        let actual = rows(&outcome.rows[0]);
        prop_assert!(same_rows(&actual, &expected), "range {range} slide {slide} delay {delay}\nengine:    {actual:?}\nreference: {expected:?}");
        prop_assert_eq!(outcome.stats.queries[0].late_events, expected_late);
        let late_rows: usize = outcome.late[0].iter().map(|b| b.num_rows()).sum();
        prop_assert_eq!(late_rows as u64, expected_late);
    }
}

/// A script of one query per window, `aggs` of `v` per key over HOP windows: window `i` slides
/// by `base * sizes[i].0` and spans `sizes[i].1` slides more (windows related by coverage more
/// often than not); with the windows as (range, slide).
fn hop_queries(delay: i64, base: i64, sizes: &[(i64, i64)], aggs: &[Agg]) -> (String, Vec<(i64, i64)>) {
    let mut text = source_ddl(delay);
    let select: Vec<String> = aggs.iter().map(|a| a.sql("v")).collect();
    let windows: Vec<(i64, i64)> = sizes.iter().map(|(k, extra)| (base * k + base * extra, base * k)).collect();
    for (range, slide) in &windows {
        text.push_str(&format!(
            "SELECT k, window_start, window_end, {} FROM HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND) GROUP BY k, window_start, window_end;\n",
            select.join(", ")
        ));
    }
    (text, windows)
}

/// `None` (auto) or one of the strategies.
pub fn window_strategy() -> impl proptest::strategy::Strategy<Value = Option<WindowStrategy>> {
    prop::option::weighted(0.85, prop::sample::select(WindowStrategy::ALL.to_vec()))
}

fn source_ddl(delay: i64) -> String {
    format!(
        "CREATE SOURCE s (k BIGINT, tag VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '{delay}' SECOND)
           WITH (path = 'unused.csv', time_unit = 's');\n"
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// Several queries in one script, windows related by coverage more often than not, under
    /// every window strategy: workers run whole operators (or key partitions when there are
    /// more workers than operators); each query must still equal the reference.
    #[test]
    fn every_query_of_a_script_equals_reference(
        events in event_strategy(),
        base in 1i64..4,
        sizes in prop::collection::vec((1i64..4, 0i64..8), 1..5),
        delay in 0i64..5,
        batch_size in 1usize..30,
        parallelism in 1usize..4,
        strategy in window_strategy(),
        min_max_only in any::<bool>(),
    ) {
        // MIN and MAX may be computed from overlapping windows, SUM and COUNT only from disjoint ones.
        let aggs = if min_max_only { vec![Agg::Min, Agg::Max] } else { vec![Agg::Min, Agg::Sum, Agg::CountRows] };
        let (text, windows) = hop_queries(delay, base, &sizes, &aggs);
        let outcome = run_batches(&text, batches(&events, batch_size), parallelism, strategy).expect("engine run");
        for (q, (range, slide)) in windows.iter().enumerate() {
            let (expected, late) = evaluate(&events, *range, *slide, delay, &aggs);
            let actual = rows(&outcome.rows[q]);
            prop_assert!(same_rows(&actual, &expected), "query {q} {windows:?} {strategy:?}\nengine:    {actual:?}\nreference: {expected:?}");
            prop_assert_eq!(outcome.stats.queries[q].late_events, late);
        }
    }

    /// FIRST_VALUE, LAST_VALUE, BOOL_AND, BOOL_OR and the percentile sketch share partial
    /// states through slices and the coverage graph: under every strategy each query equals
    /// the reference (the percentile within its documented bound: values here are at most 10
    /// in magnitude, so 1% of the larger neighbouring value is at most 0.1), and equals to the
    /// bit the same query computed window by window (baseline, one worker): no merge order
    /// shows in the results.
    #[test]
    fn ordered_and_sketched_aggregates_share_windows_under_every_strategy(
        events in event_strategy(),
        base in 1i64..4,
        sizes in prop::collection::vec((1i64..4, 0i64..8), 1..4),
        delay in 0i64..5,
        batch_size in 1usize..30,
        parallelism in 1usize..4,
        strategy in window_strategy(),
        with_sketch in any::<bool>(),
    ) {
        // Without the sketch every aggregate may combine overlapping windows, as MIN does.
        let mut aggs = vec![Agg::FirstValue, Agg::LastValue, Agg::BoolAnd, Agg::BoolOr];
        if with_sketch {
            aggs.push(Agg::PercentileCont(300));
        }
        let (text, windows) = hop_queries(delay, base, &sizes, &aggs);
        let outcome = run_batches(&text, batches(&events, batch_size), parallelism, strategy).expect("engine run");
        let one_by_one = run_batches(&text, batches(&events, batch_size), 1, Some(WindowStrategy::Baseline)).expect("engine run");
        let close = |column: usize, a: &Value, b: &Value| match (aggs.get(column.wrapping_sub(3)), a, b) {
            (Some(Agg::PercentileCont(_)), Value::Float(a), Value::Float(b)) => (a - b).abs() <= 0.1 + 1e-9,
            _ => a.approx_eq(b),
        };
        for (q, (range, slide)) in windows.iter().enumerate() {
            let (expected, late) = evaluate(&events, *range, *slide, delay, &aggs);
            let actual = rows(&outcome.rows[q]);
            let matches = actual.len() == expected.len()
                && actual.iter().zip(&expected).all(|(a, e)| a.iter().zip(e).enumerate().all(|(c, (a, e))| close(c, a, e)));
            prop_assert!(matches, "query {q} {windows:?} {strategy:?}\nengine:    {actual:?}\nreference: {expected:?}");
            prop_assert_eq!(&actual, &rows(&one_by_one.rows[q]), "query {} against baseline", q);
            prop_assert_eq!(outcome.stats.queries[q].late_events, late);
        }
    }

    /// Factor windows are computed, feed the windows they cover, and are not output.
    #[test]
    fn factor_windows_equal_reference(
        events in event_strategy(),
        base in 1i64..4,
        delay in 0i64..5,
        batch_size in 1usize..30,
    ) {
        let mut text = source_ddl(delay);
        let ranges = [2 * base, 3 * base, 4 * base];
        for range in ranges {
            text.push_str(&format!(
                "SELECT k, window_start, window_end, SUM(v), COUNT(*), AVG(v) FROM TUMBLE(s, ts, INTERVAL '{range}' SECOND) GROUP BY k, window_start, window_end;\n"
            ));
        }
        text.push_str("SET window_strategy = 'wcg_factor';\nSET eta = 10;\n");
        let script = tessera::engine::Script::compile(&text, std::path::Path::new(".")).expect("script");
        let groups = script.window_groups();
        prop_assert_eq!(groups.len(), 1);
        prop_assert!(groups[0].plan.nodes.iter().any(|n| !n.output && n.spec.range == base), "{:?}", groups[0].plan.nodes);
        let outcome = run_batches(&text, batches(&events, batch_size), 1, Some(WindowStrategy::WcgFactor)).expect("engine run");
        prop_assert_eq!(outcome.rows.len(), 3);
        for (q, range) in ranges.iter().enumerate() {
            let (expected, late) = evaluate(&events, *range, *range, delay, &[Agg::Sum, Agg::CountRows, Agg::Avg]);
            let actual = rows(&outcome.rows[q]);
            prop_assert!(same_rows(&actual, &expected), "query {q}\nengine:    {actual:?}\nreference: {expected:?}");
            prop_assert_eq!(outcome.stats.queries[q].late_events, late);
        }
    }

    /// The compact `WINDOWS(...)` form equals the `UNION ALL` it stands for, with the window's
    /// name in `window_name`, and its windows are planned as one group.
    #[test]
    fn compact_windows_equal_union_all(
        events in event_strategy(),
        sizes in prop::collection::vec((1i64..4, 0i64..6), 1..4),
        delay in 0i64..5,
        batch_size in 1usize..30,
    ) {
        let windows: Vec<(i64, i64)> = sizes.iter().map(|(s, extra)| (2 * s + 2 * extra, 2 * s)).collect();
        let hop = |(range, slide): (i64, i64)| format!("HOP(INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND)");
        let compact_args: Vec<String> = windows.iter().enumerate().map(|(i, w)| format!("n{i} => {}", hop(*w))).collect();
        let compact = format!(
            "{}SELECT k, window_name, window_start, window_end, MIN(v), COUNT(*) FROM WINDOWS(s, ts, {}) WHERE v > -5 GROUP BY k, window_name, window_start, window_end;",
            source_ddl(delay),
            compact_args.join(", ")
        );
        let union: Vec<String> = windows
            .iter()
            .enumerate()
            .map(|(i, (range, slide))| format!(
                "SELECT k, 'n{i}' AS window_name, window_start, window_end, MIN(v), COUNT(*) FROM HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND) WHERE v > -5 GROUP BY k, window_start, window_end"
            ))
            .collect();
        let union = format!("{}{};", source_ddl(delay), union.join(" UNION ALL "));
        let script = tessera::engine::Script::compile(&compact, std::path::Path::new(".")).expect("compact script");
        prop_assert_eq!(script.window_groups().len(), 1);
        let sorted = |mut r: Vec<Vec<super::harness::Value>>| { r.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal)); r };
        let a = run_batches(&compact, batches(&events, batch_size), 1, None).expect("compact run");
        let b = run_batches(&union, batches(&events, batch_size), 1, Some(WindowStrategy::Baseline)).expect("union run");
        let (ra, rb) = (sorted(rows(&a.rows[0])), sorted(rows(&b.rows[0])));
        prop_assert!(same_rows(&ra, &rb), "compact: {ra:?}\nunion:   {rb:?}");
        prop_assert_eq!(a.stats.queries[0].late_events, b.stats.queries[0].late_events);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// COUNT, SUM and AVG slide on a running value (slices added and subtracted exactly), in
    /// memory and spilled, with keys coming and going (NULL keys, sparse streams) and late
    /// events, and `tiny` values a float running sum would lose. Equal to the reference, and
    /// the sliding plan to the naive one.
    #[test]
    fn invertible_aggregates_on_a_running_value_equal_reference(
        events in event_strategy(),
        slide in 1i64..6,
        extra in 1i64..25,
        delay in 0i64..6,
        batch_size in 1usize..30,
        parallelism in 1usize..4,
        tiny in prop::option::weighted(0.3, 0usize..40),
        spill in any::<bool>(),
    ) {
        let mut events = events;
        if let Some(i) = tiny {
            if let Some(event) = events.get_mut(i).filter(|e| e.value.is_some()) {
                event.value = Some(1e-30);
            }
        }
        let (range, aggs) = (slide + extra, [Agg::Sum, Agg::CountRows, Agg::Count, Agg::Avg]);
        let select: Vec<String> = aggs.iter().map(|a| a.sql("v")).collect();
        let text = format!(
            "{}SELECT k, window_start, window_end, {} FROM HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND) GROUP BY k, window_start, window_end;",
            source_ddl(delay),
            select.join(", ")
        );
        let mut script = tessera::engine::Script::compile(&text, std::path::Path::new(".")).expect("script");
        script.settings.window_strategy = Some(WindowStrategy::SharedSliding);
        let explained = tessera::explain::explain_json(&script);
        let window = &explained["queries"][0]["windows"][0];
        if window["sliding"] == true {
            prop_assert_eq!(&window["sliding_aggregator"], "running value");
        }
        let (expected, late) = evaluate(&events, range, slide, delay, &aggs);
        let dir = tempfile::tempdir().expect("temp dir");
        for strategy in [WindowStrategy::SharedSliding, WindowStrategy::Baseline] {
            let state = if spill {
                on_disk(dir.path(), 0, 1)
            } else {
                StateOptions::default()
            };
            let outcome = run_batches_with_state(&text, batches(&events, batch_size), parallelism, Some(strategy), state).expect("engine run");
            let actual = rows(&outcome.rows[0]);
            prop_assert!(same_rows(&actual, &expected), "{strategy:?} range {range} slide {slide}\nengine:    {actual:?}\nreference: {expected:?}");
            prop_assert_eq!(outcome.stats.queries[0].late_events, late);
        }
    }
}

/// Folds an `EMIT CHANGES` changelog (`op` first, then the key and window columns, then the
/// aggregates) into the rows that stand at the end, checking that every `+I` starts a row,
/// every `+U` and `-D` changes a standing one, and every written row is `valid`.
fn fold_changelog(changes: &[Vec<Value>], valid: &dyn Fn(&[Value]) -> bool) -> Result<Vec<Vec<Value>>, String> {
    let mut standing: std::collections::BTreeMap<String, Vec<Value>> = std::collections::BTreeMap::new();
    for row in changes {
        let (op, columns) = (&row[0], row[1..].to_vec());
        let key = format!("{:?}", &columns[..3]);
        match op {
            Value::Text(op) if op == "+I" && !standing.contains_key(&key) => {}
            Value::Text(op) if (op == "+U" || op == "-D") && standing.contains_key(&key) => {}
            _ => return Err(format!("{op:?} out of order for {key}")),
        }
        if *op == Value::Text("-D".into()) {
            standing.remove(&key);
            continue;
        }
        if !valid(&columns) {
            return Err(format!("{columns:?} is no window's value after any batch"));
        }
        standing.insert(key, columns);
    }
    let mut rows: Vec<Vec<Value>> = standing.into_values().collect();
    rows.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    Ok(rows)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 80, ..ProptestConfig::default() })]

    /// `EMIT CHANGES` writes, after each batch, rows that are the reference's value of their
    /// window over the input so far, and its changelog folds into the final rows; with HAVING,
    /// groups that stop passing are deleted, and the fold equals `EMIT ON WINDOW CLOSE`.
    #[test]
    fn emit_changes_writes_current_rows_that_fold_into_the_final_ones(
        events in event_strategy(),
        slide in 1i64..6,
        extra in 0i64..20,
        delay in 0i64..6,
        batch_size in 1usize..30,
        strategy in window_strategy(),
    ) {
        let range = slide + extra;
        let aggs = [Agg::Min, Agg::Sum, Agg::CountRows, Agg::Avg];
        let select: Vec<String> = aggs.iter().map(|a| a.sql("v")).collect();
        let window = format!("HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND)");
        let query = format!("SELECT k, window_start, window_end, {} FROM {window} GROUP BY k, window_start, window_end", select.join(", "));
        let mut text = source_ddl(delay);
        text.push_str(&format!("{query} EMIT CHANGES;\n"));
        text.push_str(&format!("{query} HAVING SUM(v) < 0 EMIT CHANGES;\n"));
        text.push_str(&format!("{query} HAVING SUM(v) < 0;\n"));
        let outcome = run_batches(&text, batches(&events, batch_size), 1, strategy).expect("engine run");
        // Every row written is some window's value after some batch.
        let mut valid = Vec::new();
        let mut end = 0;
        while end < events.len() {
            end = (end + batch_size).min(events.len());
            valid.extend(evaluate(&events[..end], range, slide, delay, &aggs).0);
        }
        let is_valid = |row: &[Value]| valid.iter().any(|v: &Vec<Value>| same_rows(std::slice::from_ref(v), &[row.to_vec()]));
        let folded = fold_changelog(&rows_in_order(&outcome.rows[0]), &is_valid);
        prop_assert!(folded.is_ok(), "{:?}", folded);
        let (expected, late) = evaluate(&events, range, slide, delay, &aggs);
        let folded = folded.unwrap();
        prop_assert!(same_rows(&folded, &expected), "{strategy:?}\nfolded:    {folded:?}\nreference: {expected:?}");
        prop_assert_eq!(outcome.stats.queries[0].late_events, late);
        let with_having = fold_changelog(&rows_in_order(&outcome.rows[1]), &|_| true);
        prop_assert!(with_having.is_ok(), "{:?}", with_having);
        let on_close = rows(&outcome.rows[2]);
        prop_assert!(same_rows(&with_having.unwrap(), &on_close));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 60, ..ProptestConfig::default() })]

    /// Window state spilled to the LSM store: key groups of 1-4 key ids, no memory or a few
    /// hundred bytes for them (groups are written out after most batches and read back when
    /// they take rows, when the rows waiting for them outgrow half the budget, or when they
    /// must close a window), under every strategy, both emit modes and parallelism 1-3: the
    /// same rows as the reference.
    #[test]
    fn spilled_key_groups_equal_reference(
        events in event_strategy(),
        slide in 1i64..6,
        extra in 0i64..15,
        delay in 0i64..5,
        batch_size in 1usize..30,
        parallelism in 1usize..4,
        strategy in window_strategy(),
        group_bits in 0u32..3,
        memory_bytes in prop_oneof![Just(0u64), 100u64..3000],
        changes in any::<bool>(),
    ) {
        let range = slide + extra;
        let aggs = [Agg::Min, Agg::Sum, Agg::CountRows, Agg::Median];
        let select: Vec<String> = aggs.iter().map(|a| a.sql("v")).collect();
        let emit = if changes { " EMIT CHANGES" } else { "" };
        let text = format!(
            "{}SELECT k, window_start, window_end, {} FROM HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND) GROUP BY k, window_start, window_end{emit};",
            source_ddl(delay),
            select.join(", ")
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let state = on_disk(dir.path(), memory_bytes, group_bits);
        let outcome = run_batches_with_state(&text, batches(&events, batch_size), parallelism, strategy, state).expect("engine run");
        let (expected, late) = evaluate(&events, range, slide, delay, &aggs);
        let actual = if changes {
            fold_changelog(&rows_in_order(&outcome.rows[0]), &|_| true).expect("a changelog")
        } else {
            rows(&outcome.rows[0])
        };
        prop_assert!(same_rows(&actual, &expected), "{strategy:?} bits {group_bits} memory {memory_bytes}\nengine:    {actual:?}\nreference: {expected:?}");
        prop_assert_eq!(outcome.stats.queries[0].late_events, late);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 30, ..ProptestConfig::default() })]

    /// Float SUM and AVG are exact sums rounded once: every window strategy, parallelism,
    /// batch size and state backend writes the same bits, also for values far apart in
    /// magnitude, whose float sums depend on the order they are added in.
    #[test]
    fn float_sums_are_the_same_bits_under_every_plan(
        events in event_strategy(),
        magnitudes in prop::collection::vec(prop::sample::select(vec![1e-20, 1e-3, 0.1, 1.0, 1e3, 1e15, 1e300]), 150),
        slide in 1i64..5,
        extra in 0i64..12,
        batch_size in 1usize..30,
    ) {
        let events: Vec<Event> = events
            .iter()
            .zip(&magnitudes)
            .map(|(e, m)| Event { value: e.value.map(|v| v * m + 0.1), ..*e })
            .collect();
        let range = slide + extra;
        let text = format!(
            "{}SELECT k, window_start, window_end, SUM(v) AS s, AVG(v) AS a FROM HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{range}' SECOND) GROUP BY k, window_start, window_end;",
            source_ddl(2)
        );
        let bits = |rows: Vec<Vec<Value>>| -> Vec<Vec<String>> {
            rows.iter().map(|r| r.iter().map(|v| match v { Value::Float(f) => format!("{:x}", f.to_bits()), v => v.render() }).collect()).collect()
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let mut first: Option<(String, Vec<Vec<String>>)> = None;
        for strategy in WindowStrategy::ALL {
            for (parallelism, spill) in [(1, false), (3, false), (2, true)] {
                let state = if spill {
                    on_disk(&dir.path().join(format!("{strategy:?}")), 0, 1)
                } else {
                    StateOptions::default()
                };
                let size = if parallelism == 1 { batch_size } else { 7 };
                let outcome = run_batches_with_state(&text, batches(&events, size), parallelism, Some(strategy), state).expect("engine run");
                let plan = format!("{strategy:?} parallelism {parallelism} spilled {spill}");
                let got = bits(rows(&outcome.rows[0]));
                match &first {
                    None => first = Some((plan, got)),
                    Some((first_plan, want)) => prop_assert!(&got == want, "{plan} against {first_plan}:\n{got:?}\n{want:?}"),
                }
            }
        }
    }
}
