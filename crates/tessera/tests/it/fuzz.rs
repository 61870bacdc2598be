//! Fuzzing the user-facing entry points: no SQL text, setting, window size, event time or
//! input bytes may cause a panic or a hang.
//! Every target runs `TESSERA_FUZZ_CASES` cases (a quick smoke run by default; the recorded
//! long runs use 100000).

use std::path::Path;

use proptest::prelude::*;
use tessera::compile::flink::compile_flink;
use tessera::connectors::{read_text, OnError, ReadOptions};
use tessera::engine::Script;
use tessera::sql::{parse_script, StatementKind};
use tessera::TesseraError;

fn cases() -> u32 {
    std::env::var("TESSERA_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

const SEED_SCRIPT: &str = "CREATE SOURCE s (k BIGINT, name VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH (path = 'e.csv', time_unit = 's');
SET batch_size = 10;
SELECT k, window_start, window_end, MIN(v) AS lo, COUNT(*) n, AVG(v + 1) FROM HOP(s, ts, INTERVAL '1' MINUTE, INTERVAL '5' MINUTE) WHERE v > 0 AND name <> 'x' GROUP BY k, window_start, window_end HAVING COUNT(*) > 1
UNION ALL SELECT k, window_start, window_end, MAX(v), COUNT(v), MEDIAN(v) FROM TUMBLE(s, ts, INTERVAL '10' SECOND) GROUP BY k, window_start, window_end;";

/// The compact multi-window form with a computed key and windows that cascade.
const SEED_WINDOWS: &str = "CREATE SOURCE s (k BIGINT, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH (path = 'e.csv', time_unit = 's');
SELECT k % 3 AS b, window_name, window_start, MIN(v), SUM(v) AS total FROM WINDOWS(s, ts, a => TUMBLE(INTERVAL '10' MINUTE), c => HOP(INTERVAL '10' MINUTE, INTERVAL '30' MINUTE), d => TUMBLE(INTERVAL '40' MINUTE)) WHERE v > 0 GROUP BY k % 3, window_name, window_start HAVING k % 3 <> 1;
SELECT k, window_start, MAX(v) FROM TUMBLE(s, ts, INTERVAL '20' MINUTE) GROUP BY k, window_start;";

const SEED_TEMPORAL: &str = "CREATE SOURCE s (k BIGINT, kind VARCHAR, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH (path = 'e.csv', time_unit = 's');
WITH alarm AS (SELECT k FROM s WHERE kind = 'alarm'), service AS (SELECT k AS k FROM s WHERE kind <> 'x'), anything AS (SELECT 1 FROM s)
SELECT k, COUNT(*) FROM TEMPORAL(alarm OR SINCE_COUNT(NOT service, alarm) AND NOT PREVIOUS(FOR_SOME(k, DISTINCT(SO_FAR(alarm)))) AND ONCE_DURATION(anything)) GROUP BY k;
SELECT a.k, COUNT(*) FROM s a JOIN s b ON a.k = b.k, s c WHERE a.kind = 'x' AND a.ts < b.ts AND b.ts <= c.ts GROUP BY a.k UNION ALL SELECT a.k, COUNT(*) FROM s a GROUP BY a.k;";

/// SQL made of tokens the grammar knows, in random order: reaches deeper than random bytes.
fn sql_tokens() -> impl Strategy<Value = String> {
    let token = prop::sample::select(vec![
        "SELECT",
        "FROM",
        "WHERE",
        "GROUP",
        "BY",
        "HAVING",
        "UNION",
        "ALL",
        "TUMBLE",
        "HOP",
        "(",
        ")",
        ",",
        ";",
        "s",
        "ts",
        "k",
        "v",
        "window_start",
        "window_end",
        "MIN(v)",
        "COUNT(*)",
        "INTERVAL",
        "'5'",
        "'1 minute'",
        "SECOND",
        "MINUTE",
        "CREATE",
        "SOURCE",
        "WATERMARK",
        "FOR",
        "AS",
        "-",
        "+",
        "*",
        "/",
        "1",
        "0",
        "-1",
        "NULL",
        "'x'",
        "=",
        ">",
        "WITH",
        "path",
        "time_unit",
        "'s'",
        "BIGINT",
        "DOUBLE",
        "VARCHAR",
        "TIMESTAMP",
        "SET",
        "parallelism",
        "AND",
        "OR",
        "NOT",
        "CAST",
        "ORDER",
        "LIMIT",
        "DISTINCT",
        "JOIN",
        "ON",
        "SUM(v)",
        "MEDIAN(k)",
        "APPROX_COUNT_DISTINCT(k)",
        "e.csv",
        "TEMPORAL",
        "SINCE_COUNT",
        "ONCE_DURATION",
        "SO_FAR",
        "PREVIOUS",
        "FOR_SOME",
        "TRUE",
    ]);
    prop::collection::vec(token, 0..40).prop_map(|t| t.join(" "))
}

/// The seed script with a random byte range replaced by random text.
fn mutated_script(seed: &'static str) -> impl Strategy<Value = String> {
    (0..seed.len(), 0usize..20, "\\PC{0,12}").prop_map(move |(at, len, insert)| {
        let mut s = seed.to_string();
        let at = (0..=at).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
        let end = (at + len).min(s.len());
        let end = (end..=s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(s.len());
        s.replace_range(at..end, &insert);
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn sql_never_panics(
        text in prop_oneof![any::<String>(), sql_tokens(), mutated_script(SEED_SCRIPT), mutated_script(SEED_WINDOWS), mutated_script(SEED_TEMPORAL)]
    ) {
        // A script that compiles is also compiled to Flink SQL (`tessera compile`).
        if let Ok(script) = Script::compile(&text, Path::new(".")) {
            let _ = compile_flink(&script);
        }
    }

    #[test]
    fn csv_reader_never_panics(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        "k,name,v,ts\n([-0-9a-z.,\"\n ]{0,12}\n){0,8}".prop_map(String::into_bytes),
    ]) {
        read_all("csv", bytes);
    }

    #[test]
    fn json_reader_never_panics(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        "(\\{(\"(k|v|ts|name)\": ?(-?[0-9.e]{0,6}|\"[a-z]{0,3}\"|null|\\[\\]|\\{\\}),? ?){0,4}\\}\n){0,6}".prop_map(String::into_bytes),
    ]) {
        read_all("jsonl", bytes);
    }
}

/// Numbers at the edges of what settings, durations and event times go through.
const EDGES: [&str; 16] = [
    "0",
    "1",
    "3",
    "-1",
    "7",
    "60",
    "0.5",
    "1e3",
    "1e11",
    "1048576",
    "1048577",
    "576460752303423488",
    "1152921504606846976",
    "1152921504606846977",
    "9223372036854775807",
    "-9223372036854775808",
];

/// A duration from [`EDGES`] but 2^20, whose million windows an event of a HOP with a slide
/// of 1 may fill: too slow a case to repeat by the thousand.
fn duration() -> impl Strategy<Value = &'static str> {
    prop::sample::select(EDGES.iter().copied().filter(|e| *e != "1048576").collect::<Vec<_>>())
}

/// Event times at the edges of the windowable range (±2^62) and of 64 bits.
const EDGE_TIMES: [i64; 10] =
    [i64::MIN, i64::MIN + 1, -(1 << 62) - 1, -(1 << 62), 0, 5, 1 << 62, (1 << 62) + 1, i64::MAX - 1, i64::MAX];

/// A script with random settings, a window of random size and slide, and CSV rows with event
/// times drawn from [`EDGE_TIMES`] and small ones, values from the float edges.
fn edge_run() -> impl Strategy<Value = (String, Vec<u8>, usize)> {
    let setting = (
        prop::sample::select(vec!["parallelism", "batch_size", "eta", "keys", "window_strategy", "input_flush_ms"]),
        prop::sample::select(EDGES.iter().copied().chain(["'baseline'", "'wcg_factor'", "'x'"]).collect::<Vec<_>>()),
    );
    let time = prop_oneof![prop::sample::select(EDGE_TIMES.to_vec()), -50i64..200];
    let value = prop::sample::select(vec!["1.5", "-0.0", "1e308", "-1e308", "5e-324", "NaN", "inf", "-inf", "", "2"]);
    (
        prop::collection::vec(setting, 0..3),
        duration(),
        duration(),
        duration(),
        any::<bool>(),
        prop::collection::vec((0i64..3, time, value), 0..25),
        1usize..4,
    )
        .prop_map(|(settings, slide, size, delay, hop, rows, parallelism)| {
            let window = if hop {
                format!("HOP(s, ts, INTERVAL '{slide}' SECOND, INTERVAL '{size}' SECOND)")
            } else {
                format!("TUMBLE(s, ts, {size})")
            };
            let sets: String = settings.iter().map(|(name, value)| format!("SET {name} = {value};\n")).collect();
            let script = format!(
                "CREATE SOURCE s (k BIGINT, name VARCHAR, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '{delay}' SECOND) WITH (path = 'e.csv', time_unit = 's');
{sets}SELECT k, window_start, window_end, SUM(v) AS s, MIN(v), COUNT(*) FROM {window} GROUP BY k, window_start, window_end;"
            );
            let csv: String = rows.iter().map(|(k, ts, v)| format!("{k},n,{v},{ts}\n")).collect();
            (script, format!("k,name,v,ts\n{csv}").into_bytes(), parallelism)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Settings, window sizes and event times at the edges: a script is refused or runs to the
    /// end (reading its rows with its own batch size, bad rows skipped), never panics or
    /// hangs (every case must finish; the harness's time limit is the test's).
    #[test]
    fn edge_settings_windows_and_times_run_or_are_refused((text, csv, parallelism) in edge_run()) {
        let Ok(script) = Script::compile(&text, Path::new(".")) else { return Ok(()) };
        let source = script.catalog.source("s").expect("declared").clone();
        let dead_letter = tempfile::NamedTempFile::new().expect("temp file");
        let options = ReadOptions {
            batch_size: script.settings.batch_size,
            on_error: OnError::Skip,
            dead_letter_path: dead_letter.path().to_path_buf(),
            ..ReadOptions::default()
        };
        let mut reader = read_text(source.input(), "edges".into(), Box::new(std::io::Cursor::new(csv)), None, &options)
            .expect("a reader over CSV");
        let mut batches = Vec::new();
        while let Some(batch) = reader.next_batch().expect("skipping never fails") {
            batches.push(batch);
        }
        let _ = super::harness::run_batches(&text, batches, parallelism, script.settings.window_strategy);
    }
}

/// Reads everything, skipping malformed rows: any outcome but a panic is fine, and every
/// well-formed batch must have the declared columns.
fn read_all(format: &str, bytes: Vec<u8>) {
    let script = SEED_SCRIPT.replace("path = 'e.csv'", &format!("path = 'e.{format}'"));
    let statements = parse_script(&script, Path::new(".")).expect("seed script parses");
    let StatementKind::CreateSource(source) = &statements[0].kind else {
        panic!("first statement declares the source")
    };
    let dead_letter = tempfile::NamedTempFile::new().expect("temp file");
    for on_error in [OnError::Fail, OnError::Skip] {
        let options = ReadOptions {
            batch_size: 3,
            on_error,
            dead_letter_path: dead_letter.path().to_path_buf(),
            ..ReadOptions::default()
        };
        let Ok(mut reader) =
            read_text(source.input(), "fuzz".into(), Box::new(std::io::Cursor::new(bytes.clone())), None, &options)
        else {
            continue;
        };
        while let Ok(Some(batch)) = reader.next_batch() {
            assert_eq!(batch.num_columns(), 4);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Skipping malformed rows keeps exactly the well-formed ones, in order, and reports each
    /// malformed one once at its line, in the order of the file, however they fall in the
    /// decoder's chunks; failing on them stops at the first.
    #[test]
    fn skipping_keeps_exactly_the_well_formed_rows(
        kinds in prop::collection::vec(0u8..8, 0..120),
        batch_size in 1usize..40,
        json in any::<bool>(),
    ) {
        let (format, header) = if json { ("jsonl", "") } else { ("csv", "k,name,v,ts\n") };
        let mut text = String::from(header);
        let mut good = Vec::new();
        let mut bad_lines = Vec::new();
        for (i, kind) in kinds.iter().enumerate() {
            let line = i as u64 + 1 + u64::from(!json);
            let k = i as i64;
            let record = match (kind, json) {
                // Malformed: a value that is not a number, a missing event time, too many fields.
                (0, false) => format!("{k},a,oops,{k}"),
                (1, false) => format!("{k},a,1.5,"),
                (2, false) => format!("{k},a,1.5,{k},extra"),
                (0, true) => format!("{{\"k\": {k}, \"v\": \"oops\", \"ts\": {k}}}"),
                (1, true) => format!("{{\"k\": {k}, \"v\": 1.5}}"),
                (2, true) => format!("{{\"k\": {k}, \"v\": [1], \"ts\": {k}}}"),
                (_, false) => format!("{k},a,1.5,{k}"),
                (_, true) => format!("{{\"k\": {k}, \"name\": \"a\", \"v\": 1.5, \"ts\": {k}}}"),
            };
            if *kind < 3 { bad_lines.push(line) } else { good.push(k) }
            text.push_str(&record);
            text.push('\n');
        }
        let script = SEED_SCRIPT.replace("path = 'e.csv'", &format!("path = 'e.{format}'"));
        let statements = parse_script(&script, Path::new(".")).expect("seed script parses");
        let StatementKind::CreateSource(source) = &statements[0].kind else { panic!("first statement declares the source") };
        let dead_letter = tempfile::NamedTempFile::new().expect("temp file");
        let options = ReadOptions {
            batch_size,
            on_error: OnError::Skip,
            dead_letter_path: dead_letter.path().to_path_buf(),
            ..ReadOptions::default()
        };
        let text_bytes = text.into_bytes();
        let mut reader = read_text(source.input(), "rows".into(), Box::new(std::io::Cursor::new(text_bytes.clone())), None, &options)
            .expect("reader");
        let mut kept = Vec::new();
        while let Some(batch) = reader.next_batch().expect("skipping never fails") {
            let keys = batch.column(0).as_any().downcast_ref::<arrow::array::Int64Array>().expect("k");
            kept.extend(keys.iter().map(|k| k.expect("a key")));
        }
        prop_assert_eq!(kept, good);
        prop_assert_eq!(reader.skipped().rows, bad_lines.len() as u64);
        let written = std::fs::read_to_string(dead_letter.path()).unwrap_or_default();
        let lines: Vec<u64> = written
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("an entry")["line"].as_u64().expect("a line"))
            .collect();
        prop_assert_eq!(&lines, &bad_lines);
        // Failing on malformed rows, the run stops at the first.
        let options = ReadOptions { batch_size, ..ReadOptions::default() };
        let mut reader = read_text(source.input(), "rows".into(), Box::new(std::io::Cursor::new(text_bytes)), None, &options)
            .expect("reader");
        let outcome = std::iter::from_fn(|| reader.next_batch().transpose()).find_map(Result::err);
        match (outcome, bad_lines.first()) {
            (Some(TesseraError::Input { line, .. }), Some(&first)) => prop_assert_eq!(line, first),
            (None, None) => {}
            (outcome, first) => prop_assert!(false, "{:?} against the first malformed line {:?}", outcome, first),
        }
    }
}
