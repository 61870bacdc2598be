//! The `tessera` command as a user runs it: exit statuses, messages, files written.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn tessera(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).current_dir(dir).output().expect("tessera runs")
}

/// Starts `tessera` with `args` in `dir`, its standard streams piped.
fn spawn_piped(args: &[&str], dir: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tessera starts")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `tessera generate` with `args` in `dir`.
fn generate(args: &[&str], dir: &Path) {
    let out = tessera(&[&["generate"], args].concat(), dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The lines of `output`, sorted (rows compared as a multiset).
fn sorted_lines(output: &str) -> Vec<String> {
    let mut lines: Vec<String> = output.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

const SOURCE: &str = "CREATE SOURCE readings (device_id BIGINT, temperature DOUBLE, ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '2' SECOND) WITH (path = 'readings.csv', time_unit = 's');
";
const QUERY: &str = "SELECT device_id, window_start, window_end, MIN(temperature) AS lo, COUNT(*) AS n
FROM TUMBLE(readings, ts, INTERVAL '10' SECOND) GROUP BY device_id, window_start, window_end;
";

fn workspace(data: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("q.sql"), format!("{SOURCE}{QUERY}")).expect("script");
    std::fs::write(dir.path().join("readings.csv"), data).expect("data");
    dir
}

const GOOD: &str = "device_id,temperature,ts\n1,20.5,1\n2,18.0,3\n1,19.0,12\n";
const ONE_BAD: &str = "device_id,temperature,ts\n1,20.5,1\n2,18.0,3\n1,warm,5\n1,19.0,12\n";

#[test]
fn a_malformed_row_stops_the_run_with_its_location() {
    let dir = workspace(ONE_BAD);
    let out = tessera(&["run", "q.sql"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("readings.csv:4:"), "{stderr}");
    assert!(stderr.contains("warm"), "{stderr}");
}

#[test]
fn skipped_rows_go_to_the_dead_letter_file_and_are_counted() {
    let dir = workspace(ONE_BAD);
    let out = tessera(
        &[
            "run",
            "q.sql",
            "--on-error",
            "skip",
            "--dead-letter",
            "bad.jsonl",
            "--stats-json",
            "stats.json",
            "-o",
            "out.csv",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dead = std::fs::read_to_string(dir.path().join("bad.jsonl")).expect("dead letter");
    assert_eq!(dead.lines().count(), 1);
    let entry: serde_json::Value = serde_json::from_str(dead.lines().next().unwrap()).expect("json line");
    assert_eq!(entry["line"], 4);
    assert_eq!(entry["record"], "1,warm,5");
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["bad_rows"], 1);
    assert_eq!(stats["events_in"], 3, "the skipped row is not an event");
    assert!(text(&out.stderr).contains("1 bad rows"), "{}", text(&out.stderr));
}

#[test]
fn disk_state_writes_what_memory_writes_and_needs_the_disk_backend_for_a_budget() {
    let dir = workspace(GOOD);
    let out = tessera(&["run", "q.sql", "--state-memory", "1MB"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--state-memory bounds the state of --state-backend disk"),
        "{}",
        text(&out.stderr)
    );
    let memory = tessera(&["run", "q.sql", "-q"], dir.path());
    let disk = tessera(&["run", "q.sql", "-q", "--state-backend", "disk", "--state-memory", "0"], dir.path());
    assert!(memory.status.success() && disk.status.success(), "{}", text(&disk.stderr));
    let sorted = |o: &Output| sorted_lines(&text(&o.stdout));
    assert_eq!(sorted(&disk), sorted(&memory));
    assert_eq!(sorted(&memory).len(), 4, "a header and three rows");
}

/// Over more keys than one key group holds (65,536), with a WHERE clause (rows re-interned
/// after the filter) and a budget that spills: the same rows as in memory.
#[test]
fn disk_state_over_several_key_groups_with_a_filter_writes_what_memory_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    generate(&["-o", "readings.csv", "--events", "150000", "--devices", "140000", "--disorder", "3"], dir.path());
    let query = "SELECT device_id, window_start, window_end, MIN(temperature) AS lo, COUNT(*) AS n
FROM HOP(readings, ts, INTERVAL '1' SECOND, INTERVAL '3' SECOND) WHERE temperature > 20
GROUP BY device_id, window_start, window_end;
";
    std::fs::write(dir.path().join("q.sql"), format!("{SOURCE}{query}")).expect("script");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "q.sql", "-q", "--stats-json", "stats.json"];
        args.extend_from_slice(extra);
        let out = tessera(&args, dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        (sorted_lines(&text(&out.stdout)), std::fs::read_to_string(dir.path().join("stats.json")).expect("stats"))
    };
    let (memory, _) = run(&[]);
    let (disk, stats) = run(&["--state-backend", "disk", "--state-memory", "256KB"]);
    assert!(memory.len() > 1000, "{}", memory.len());
    assert_eq!(disk, memory);
    assert!(!stats.contains("\"group_writes\": 0,"), "nothing spilled: {stats}");
}

#[test]
fn sql_errors_exit_1_with_a_caret() {
    let dir = workspace(GOOD);
    std::fs::write(
        dir.path().join("q.sql"),
        format!("{SOURCE}SELECT MIN(temp) FROM TUMBLE(readings, ts, INTERVAL '10' SECOND) GROUP BY window_start;"),
    )
    .unwrap();
    let out = tessera(&["run", "q.sql"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("unknown column `temp`"), "{stderr}");
    assert!(stderr.contains("line 3, column 12"), "{stderr}");
    assert!(stderr.contains("^"), "{stderr}");
}

#[test]
fn results_stats_and_late_events() {
    // The event at 2 arrives when the watermark is 13: its window [0, 10) is closed.
    let dir = workspace("device_id,temperature,ts\n1,20.5,1\n2,18.0,3\n1,19.0,15\n2,30.0,2\n");
    let out = tessera(&["run", "q.sql", "--stats-json", "stats.json", "--late-output", "late.csv"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    assert_eq!(lines.remove(0), "device_id,window_start,window_end,lo,n");
    lines.sort();
    assert_eq!(lines, vec!["1,0,10,20.5,1", "1,10,20,19.0,1", "2,0,10,18.0,1"]);
    let late = std::fs::read_to_string(dir.path().join("late.csv")).unwrap();
    assert_eq!(late.lines().collect::<Vec<_>>(), vec!["device_id,temperature,ts", "2,30.0,2"]);
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("stats.json")).unwrap()).unwrap();
    for key in [
        "events_in",
        "rows_out",
        "late_events",
        "bad_rows",
        "elapsed_ms",
        "state_bytes_peak",
        "store_reads",
        "store_writes",
    ] {
        assert!(stats.get(key).is_some(), "missing {key} in {stats}");
    }
    assert_eq!(stats["late_events"], 1);
    assert_eq!(stats["rows_out"], 3);
    // Windows [0, 10) with devices 1 and 2, [10, 20) with device 1.
    assert_eq!(stats["queries"][0]["windows_out"], 2);
    assert_eq!(stats["queries"][0]["keys_per_window"], 1.5);
    // One window: every strategy but the sliced ones reads each event once; the coverage
    // graph (here a single root) wins the tie.
    assert_eq!(stats["queries"][0]["chosen_strategy"], "wcg");
    assert!(stats["queries"][0]["sql"].as_str().unwrap().contains("TUMBLE"));
}

#[test]
fn a_run_whose_windows_held_few_keys_says_which_plan_the_model_told_them_chooses() {
    // Tumbling 2, 4, 6 and 8 s over one event a second per device. Planned for many keys the
    // coverage graph merges 30 instances per period of 24 s (cost 54 against 96); with one
    // key per window a merge weighs 5 events and every window is cheaper from the stream (the
    // coverage graph's tree of roots, the baseline's plan); with 50 a merge weighs 1.8 and the
    // tree stays.
    let windows: Vec<String> = [2, 4, 6, 8]
        .iter()
        .map(|r| format!("SELECT device_id, window_start, window_end, MIN(temperature) AS lo FROM TUMBLE(readings, ts, INTERVAL '{r}' SECOND) GROUP BY device_id, window_start, window_end"))
        .collect();
    let grouped = windows.join("\nUNION ALL\n");
    let keyless = grouped.replace("SELECT device_id, ", "SELECT ").replace("BY device_id, ", "BY ");
    let stats_of = |dir: &Path, name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
    };
    for devices in [1, 50] {
        let mut data = String::from("device_id,temperature,ts\n");
        for t in 0..480 {
            for d in 0..devices {
                data.push_str(&format!("{d},{}.5,{t}\n", (t * 7 + d) % 40));
            }
        }
        let dir = workspace(&data);
        std::fs::write(dir.path().join("q.sql"), format!("{SOURCE}{grouped};")).unwrap();
        let out = tessera(&["run", "q.sql", "-o", "out.csv", "--stats-json", "stats.json"], dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stats = stats_of(dir.path(), "stats.json");
        assert_eq!(
            (stats["queries"][0]["chosen_strategy"].clone(), stats["queries"][0]["plan_cost"].clone()),
            ("wcg".into(), 54.0.into())
        );
        assert_eq!(stats["queries"][0]["keys_per_window"], devices as f64);
        let summary = text(&out.stderr);
        if devices == 50 {
            assert_eq!(stats["keys_hints"], serde_json::json!([]), "{stats}");
            assert!(!summary.contains("SET keys"), "{summary}");
            continue;
        }
        let hints = &stats["keys_hints"];
        assert_eq!(hints.as_array().unwrap().len(), 1, "{stats}");
        assert_eq!((hints[0]["keys"].clone(), hints[0]["planned"].clone()), (1.0.into(), "wcg".into()));
        assert_eq!(hints[0]["with_keys"], "wcg");
        // The tree costs 24 + 30 merges * 5 = 174 against 96 from the stream.
        assert_eq!(hints[0]["modeled_ratio"], 174.0 / 96.0);
        let expected = "told `SET keys = 1`, the cost model chooses another `wcg`, 1.81x cheaper";
        assert!(summary.contains(expected), "{summary}");
        // Told the keys, the run takes that plan, writes the same rows and has nothing to
        // suggest; so does the same query without GROUP BY keys, planned for one key.
        let first = sorted_lines(&std::fs::read_to_string(dir.path().join("out.csv")).unwrap());
        assert_eq!(first.len(), 1 + 240 + 120 + 80 + 60);
        let out = tessera(&["run", "q.sql", "-o", "out.csv", "--stats-json", "s.json", "--set", "keys=1"], dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let told = stats_of(dir.path(), "s.json");
        assert_eq!(
            (told["queries"][0]["plan_cost"].clone(), told["keys_hints"].clone()),
            (96.0.into(), serde_json::json!([]))
        );
        assert_eq!(sorted_lines(&std::fs::read_to_string(dir.path().join("out.csv")).unwrap()), first);
        std::fs::write(dir.path().join("q.sql"), format!("{SOURCE}{keyless};")).unwrap();
        let out = tessera(&["run", "q.sql", "-o", "out.csv", "--stats-json", "s.json"], dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let keyless_stats = stats_of(dir.path(), "s.json");
        assert_eq!(keyless_stats["queries"][0]["plan_cost"], 96.0);
        assert_eq!(keyless_stats["keys_hints"], serde_json::json!([]));
    }
}

#[test]
fn csv_parquet_jsonl_and_stdin_inputs_agree() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["r.csv", "r.parquet"] {
        let args = ["-o", file, "--events", "5000", "--devices", "7", "--disorder", "2", "--null-fraction", "0.1"];
        generate(&args, dir.path());
    }
    let csv = std::fs::read_to_string(dir.path().join("r.csv")).unwrap();
    let mut jsonl = String::new();
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let t = if f[1].is_empty() { "null" } else { f[1] };
        jsonl.push_str(&format!("{{\"device_id\": {}, \"temperature\": {t}, \"ts\": {}}}\n", f[0], f[2]));
    }
    std::fs::write(dir.path().join("r.jsonl"), jsonl).unwrap();
    let query =
        "SELECT device_id, window_start, window_end, MIN(temperature) AS lo, AVG(temperature) AS mean, COUNT(*) AS n
        FROM HOP(r, ts, INTERVAL '1' MINUTE, INTERVAL '3' MINUTE) GROUP BY device_id, window_start, window_end;";
    let mut results = Vec::new();
    for (name, with) in [
        ("csv", "path = 'r.csv'"),
        ("parquet", "path = 'r.parquet'"),
        ("jsonl", "path = 'r.jsonl'"),
        ("stdin", "connector = 'stdin', format = 'csv'"),
    ] {
        let script = format!(
            "CREATE SOURCE r (device_id BIGINT, temperature DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ({with}, time_unit = 's');\n{query}"
        );
        std::fs::write(dir.path().join(format!("{name}.sql")), script).unwrap();
        let (script_name, late_name) = (format!("{name}.sql"), format!("{name}-late.csv"));
        let mut child =
            spawn_piped(&["run", &script_name, "--format", "jsonl", "-q", "--late-output", &late_name], dir.path());
        let mut stdin = child.stdin.take().unwrap();
        if name == "stdin" {
            stdin.write_all(csv.as_bytes()).unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let lines = sorted_lines(&text(&out.stdout));
        assert!(lines.len() > 100, "{name}: {} rows", lines.len());
        assert!(lines[0].starts_with("{\"device_id\":"), "{}", lines[0]);
        // Late rows as read (a Parquet key column is read as a dictionary: written as values).
        let late = sorted_lines(&std::fs::read_to_string(dir.path().join(format!("{name}-late.csv"))).unwrap());
        assert!(late.len() > 10, "{name}: {} late rows", late.len());
        results.push((name, [lines, late].concat()));
    }
    for (name, lines) in &results[1..] {
        assert_eq!(lines, &results[0].1, "{name} differs from csv");
    }
}

#[test]
fn settings_on_the_command_line_win_over_the_script() {
    let dir = workspace(GOOD);
    let out =
        tessera(&["run", "q.sql", "-q", "--set", "window_strategy=baseline", "--stats-json", "s.json"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("s.json")).unwrap()).unwrap();
    assert_eq!(stats["queries"][0]["chosen_strategy"], "baseline");
    let out = tessera(&["run", "q.sql", "--set", "window_strategy"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("expected NAME=VALUE"), "{}", text(&out.stderr));
}

#[test]
fn explain_shows_windows_and_costs() {
    let dir = workspace(GOOD);
    let out = tessera(&["explain", "q.sql", "--format", "json"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let query = &plan["queries"][0];
    assert_eq!(query["windows"][0]["range"], 10);
    assert_eq!(query["windows"][0]["unit"], "s");
    assert_eq!(query["costs"]["baseline"], 10.0);
    assert_eq!(query["costs"]["shared_paired"], 11.0, "10 events and one slice merged");
    assert_eq!(query["costs"]["chosen"], 10.0);
    assert_eq!(query["chosen_strategy"], "wcg");
    assert_eq!(query["edges"], serde_json::json!([{ "from": "stream", "to": "w1", "multiplier": 10 }]));
    assert_eq!(query["semantics"], "partitioned_by", "COUNT needs disjoint parts");
    assert_eq!(query["aggregates"], serde_json::json!(["min", "count"]));

    let out = tessera(&["explain", "q.sql", "--format", "dot"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dot = text(&out.stdout);
    assert!(dot.starts_with("digraph tessera {"), "{dot}");
    assert!(dot.contains("q0_stream -> q0_w1 [label=\"x10\"];"), "{dot}");
    assert!(dot.contains("range 10s, slide 10s"), "{dot}");

    // A WINDOWS(...) form names the windows.
    std::fs::write(
        dir.path().join("named.sql"),
        format!(
            "{SOURCE}SELECT device_id, window_name, window_start, window_end, MIN(temperature) AS lo
             FROM WINDOWS(readings, ts, short => TUMBLE(INTERVAL '10' SECOND), long => TUMBLE(INTERVAL '20' SECOND))
             GROUP BY device_id, window_name, window_start, window_end;"
        ),
    )
    .expect("script");
    let out = tessera(&["explain", "named.sql", "--format", "json", "--set", "window_strategy=wcg"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> =
        plan["queries"][0]["windows"].as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["short", "long"]);
    assert_eq!(plan["queries"][0]["edges"][1], serde_json::json!({ "from": "short", "to": "long", "multiplier": 2 }));
}

#[test]
fn queries_with_different_columns_get_their_own_files() {
    let dir = workspace(GOOD);
    let second = "SELECT window_start, COUNT(*) AS events FROM TUMBLE(readings, ts, INTERVAL '20' SECOND) GROUP BY window_start;";
    std::fs::write(dir.path().join("q.sql"), format!("{SOURCE}{QUERY}{second}")).unwrap();
    let out = tessera(&["run", "q.sql"], dir.path());
    assert_eq!(out.status.code(), Some(1), "stdout cannot hold two CSV tables");
    assert!(text(&out.stderr).contains("--output"), "{}", text(&out.stderr));
    let out = tessera(&["run", "q.sql", "-o", "out.csv", "-q"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let first = std::fs::read_to_string(dir.path().join("out.csv")).unwrap();
    let second = std::fs::read_to_string(dir.path().join("out-q2.csv")).unwrap();
    assert!(first.starts_with("device_id,window_start,window_end,lo,n\n"), "{first}");
    assert_eq!(second, "window_start,events\n0,3\n");
}

#[test]
fn compile_prints_flink_sql_and_refuses_streams_for_spark() {
    let dir = workspace(GOOD);
    let out = tessera(&["compile", "--target", "flink", "q.sql"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sql = text(&out.stdout);
    assert!(sql.contains("CREATE TABLE readings ("), "{sql}");
    assert!(sql.contains("WATERMARK FOR tessera_rowtime"), "{sql}");
    assert!(sql.contains("CREATE TEMPORARY VIEW g1_w1 AS"), "{sql}");
    // Spark takes database scripts, not streams; another target is a usage error.
    let out = tessera(&["compile", "--target", "spark", "q.sql"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("compiles with --target flink"), "{}", text(&out.stderr));
    let out = tessera(&["compile", "--target", "beam", "q.sql"], dir.path());
    assert!(text(&out.stderr).contains("[possible values: flink, spark]"), "{}", text(&out.stderr));
}

/// A run killed with SIGKILL at 20 random points and restarted each time from its state
/// directory writes exactly the rows (and late rows) of an uninterrupted run: nothing lost,
/// nothing duplicated. `extra` are the run's options besides the state directory; returns the
/// arguments of the run.
fn assert_killed_runs_write_every_row_once(dir: &Path, extra: &[&'static str]) -> Vec<&'static str> {
    // Long enough for 20 kills each some way into the run, in an optimized build too.
    let events = if cfg!(debug_assertions) { "600000" } else { "6000000" };
    generate(&["--output", "data.csv", "--events", events, "--devices", "50", "--disorder", "30"], dir);
    let select =
        "SELECT device_id, window_start, window_end, MIN(temperature) AS lo, SUM(temperature) AS s, COUNT(*) AS n";
    std::fs::write(
        dir.join("q.sql"),
        format!(
            "CREATE SOURCE readings (device_id BIGINT, temperature DOUBLE, ts BIGINT,
                WATERMARK FOR ts AS ts - INTERVAL '10' SECOND) WITH (path = 'data.csv', time_unit = 's');
             {select} FROM HOP(readings, ts, INTERVAL '1' MINUTE, INTERVAL '10' MINUTE) GROUP BY device_id, window_start, window_end;
             {select} FROM TUMBLE(readings, ts, INTERVAL '7' MINUTE) GROUP BY device_id, window_start, window_end;"
        ),
    )
    .expect("script");
    let started = std::time::Instant::now();
    let reference = tessera(&["run", "q.sql", "-q", "-o", "ref.csv", "--late-output", "ref-late.csv"], dir);
    assert!(reference.status.success(), "{}", text(&reference.stderr));
    // Kills 1/60 to 1/20 of an uninterrupted run apart (150 to 450 ms at most): twenty of them
    // come before the input ends, however fast the build and the machine.
    let spread = (started.elapsed().as_millis() as u64 / 30).clamp(10, 300);
    let mut args = vec![
        "run",
        "q.sql",
        "-q",
        "-o",
        "out.csv",
        "--late-output",
        "late.csv",
        "--state-dir",
        "state",
        "--checkpoint-interval",
        "0.02",
    ];
    args.extend(extra);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64;
    let mut rng = seed | 1;
    let mut kills = 0;
    while kills < 20 {
        let mut child =
            Command::new(env!("CARGO_BIN_EXE_tessera")).args(&args).current_dir(dir).spawn().expect("spawn");
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(std::time::Duration::from_millis(spread / 2 + rng % spread));
        let finished = child.try_wait().expect("wait");
        assert!(finished.is_none(), "the run ended after {kills} kills (seed {seed}): make it longer");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        kills += 1;
    }
    let last = tessera(&args, dir);
    assert!(last.status.success(), "seed {seed}: {}", text(&last.stderr));
    let lines = |name: &str| sorted_lines(&std::fs::read_to_string(dir.join(name)).expect(name));
    let (expected, actual) = (lines("ref.csv"), lines("out.csv"));
    assert!(expected.len() > 1000, "{}", expected.len());
    assert_eq!(expected.len(), actual.len(), "seed {seed}");
    assert!(expected == actual, "seed {seed}: the resumed output differs");
    assert!(lines("ref-late.csv") == lines("late.csv"), "seed {seed}: the late rows differ");
    args
}

/// One worker, its state on disk beyond a small budget: the reading thread interns keys ahead
/// while the worker is busy, and key groups go to disk and back between checkpoints.
#[test]
fn killed_and_resumed_runs_on_one_worker_and_disk_state_write_every_row_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let disk = ["--parallelism", "1", "--state-backend", "disk", "--state-memory", "8KB"];
    assert_killed_runs_write_every_row_once(dir.path(), &disk);
}

/// Two workers, rows split by key (checkpoints cut by barriers); then a finished run is not run
/// again, and a checkpoint of another plan or other input is refused.
#[test]
fn killed_and_resumed_runs_write_every_row_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let args = assert_killed_runs_write_every_row_once(dir.path(), &["--parallelism", "2"]);
    let lines = |name: &str| sorted_lines(&std::fs::read_to_string(dir.path().join(name)).expect(name));
    let expected = lines("ref.csv");
    // A finished run is not run again; another plan's checkpoint is refused.
    let again = tessera(&args, dir.path());
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(lines("out.csv") == expected);
    let mut other = args.to_vec();
    other.extend(["--set", "window_strategy=baseline"]);
    let refused = tessera(&other, dir.path());
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("written for another plan"), "{}", text(&refused.stderr));
    // So is a checkpoint of other input.
    let mut data = std::fs::OpenOptions::new().append(true).open(dir.path().join("data.csv")).expect("data");
    writeln!(data, "1,20.0,1700999999").expect("append");
    let changed = tessera(&args, dir.path());
    assert_eq!(changed.status.code(), Some(1), "{}", text(&changed.stderr));
    assert!(text(&changed.stderr).contains("another plan or input"), "{}", text(&changed.stderr));
    // And a checkpoint in an older format, with what to do.
    let manifest = dir.path().join("state/MANIFEST");
    let json = std::fs::read_to_string(&manifest).expect("manifest");
    let older = json.replacen("\"format\": 5", "\"format\": 4", 1);
    assert_ne!(older, json, "the manifest names its format: {json}");
    std::fs::write(&manifest, older).expect("manifest");
    let old = tessera(&args, dir.path());
    assert_eq!(old.status.code(), Some(1), "{}", text(&old.stderr));
    assert!(text(&old.stderr).contains("is in format 4"), "{}", text(&old.stderr));
    assert!(text(&old.stderr).contains("reads format 5"), "{}", text(&old.stderr));
}

/// Checkpointed output (and the dead-letter file when rows are skipped) must be a file that
/// can be cut back: devices are refused before the run starts, with the reason (stdout is
/// refused by the arguments).
#[test]
fn checkpoints_refuse_output_that_cannot_be_cut_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("q.sql"),
        "CREATE SOURCE s (k BIGINT, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'in.csv');
         SELECT k, window_start, window_end, COUNT(*) AS n FROM TUMBLE(s, ts, INTERVAL '1' SECOND) GROUP BY k, window_start, window_end;",
    )
    .expect("script");
    std::fs::write(dir.path().join("in.csv"), "k,ts\n1,1000\n").expect("input");
    for flag in ["-o", "--late-output", "--dead-letter"] {
        let mut args = vec!["run", "q.sql", "-q", "--state-dir", "state", flag, "/dev/null"];
        if flag != "-o" {
            args.extend(["-o", "out.csv"]);
        }
        if flag == "--dead-letter" {
            // Skipped rows' entries are cut back like rows (without skipping none are written).
            let accepted = tessera(&args, dir.path());
            assert!(accepted.status.success(), "{}", text(&accepted.stderr));
            std::fs::remove_dir_all(dir.path().join("state")).expect("state dir");
            args.extend(["--on-error", "skip"]);
        }
        let refused = tessera(&args, dir.path());
        assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stderr));
        assert!(text(&refused.stderr).contains("/dev/null is not one"), "{}", text(&refused.stderr));
    }
    let accepted = tessera(&["run", "q.sql", "-q", "--state-dir", "state", "-o", "out.csv"], dir.path());
    assert!(accepted.status.success(), "{}", text(&accepted.stderr));
}

/// The benchmarks run every plan on a small stream (each checks that every plan writes the same
/// number of rows) and print a row per range/slide and a line per generated window set.
#[test]
fn benchmarks_run_every_plan() {
    let dir = tempfile::tempdir().expect("temp dir");
    let slide = tessera(&["bench", "slide", "--events", "20000", "--ratios", "1,3", "--repeat", "2"], dir.path());
    assert!(slide.status.success(), "{}", text(&slide.stderr));
    let out = text(&slide.stdout);
    for ratio in ["1", "3"] {
        let rows: Vec<&str> = out.lines().filter(|l| l.starts_with(&format!("| {ratio} | "))).collect();
        // Two aggregate lists, three plans each, every plan timed.
        assert_eq!(rows.len(), 2, "{out}");
        assert!(rows.iter().all(|r| r.split(" | ").skip(1).all(|cell| cell.contains('('))), "{out}");
    }
    let wcg = tessera(
        &["bench", "wcg", "--sets", "1", "--measure-sets", "1", "--events", "5000", "--eta", "10", "--repeat", "2"],
        dir.path(),
    );
    assert!(wcg.status.success(), "{}", text(&wcg.stderr));
    let out = text(&wcg.stdout);
    // Three generators at 5 and 10 windows and RandomGraphGen at its own size, general and
    // tumbling: one set each, modeled and measured.
    let sets = out.lines().filter(|l| l.starts_with("| ") && l.contains(" | 1/1 | ")).count();
    assert_eq!(sets, 14, "{out}");
    assert!(out.contains("Spearman between modeled cost and measured time over"), "{out}");
    // Both choices, the paper model's and the one told the keys, measured against the fastest.
    for model in ["the paper's model", "the model told the keys"] {
        assert!(out.contains(&format!("The plan {model} chose, measured over the fastest plan: mean +")), "{out}");
    }
}

// Bad input: none of it may destroy a file, hang, crash or answer wrongly in silence.

#[test]
fn outputs_onto_inputs_or_onto_each_other_are_refused_before_anything_is_touched() {
    let dir = workspace(GOOD);
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("readings.csv"), dir.path().join("link.csv")).unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["--output", "readings.csv"], "the file of source `readings`"),
        (&["--output", "sub/../link.csv"], "the file of source `readings`"),
        (&["--output", "q.sql"], "the script"),
        (&["--output", "o.csv", "--late-output", "./o.csv"], "is also --output"),
        (&["--output", "o.csv", "--on-error", "skip", "--dead-letter", "sub/../o.csv"], "is also --output"),
        (&["--output", "o.csv", "--stats-json", "readings.csv"], "the file of source `readings`"),
        (&["--late-output", "q.sql"], "the script"),
    ];
    for (args, says) in cases {
        let out = tessera(&[&["run", "q.sql"], args].concat(), dir.path());
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(std::fs::read_to_string(dir.path().join("readings.csv")).unwrap(), GOOD, "{args:?}");
        assert_eq!(std::fs::read_to_string(dir.path().join("q.sql")).unwrap(), format!("{SOURCE}{QUERY}"));
        assert!(!dir.path().join("o.csv").exists(), "{args:?}: nothing written");
    }
    // A Parquet source, which is read mapped into memory, is refused the same way.
    generate(&["--output", "r.parquet", "--events", "100"], dir.path());
    let before = std::fs::read(dir.path().join("r.parquet")).unwrap();
    std::fs::write(dir.path().join("p.sql"), format!("{}{QUERY}", SOURCE.replace("readings.csv", "r.parquet")))
        .unwrap();
    let out = tessera(&["run", "p.sql", "--output", "r.parquet"], dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(dir.path().join("r.parquet")).unwrap(), before);
    // Devices may take several outputs.
    let out = tessera(&["run", "q.sql", "-q", "--output", "/dev/null", "--late-output", "/dev/null"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn ten_thousand_term_expressions_are_planned_or_refused_with_their_position() {
    let dir = workspace(GOOD);
    let any_device: Vec<String> = (0..10_000).map(|i| format!("device_id = {}", i * 2 + 1)).collect();
    let query = QUERY.replace("GROUP BY", &format!("WHERE {}\nGROUP BY", any_device.join(" OR ")));
    std::fs::write(dir.path().join("or.sql"), format!("{SOURCE}{query}")).unwrap();
    let out = tessera(&["run", "or.sql", "-q"], dir.path());
    assert!(out.status.success(), "{}", &text(&out.stderr)[..2000.min(out.stderr.len())]);
    // Only device 1 has an odd id.
    assert_eq!(
        sorted_lines(&text(&out.stdout)),
        ["1,0,10,20.5,1", "1,10,20,19.0,1", "device_id,window_start,window_end,lo,n"]
    );
    let every_term: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
    let query = QUERY.replace("MIN(temperature)", &format!("MIN(temperature + {})", every_term.join(" + ")));
    std::fs::write(dir.path().join("sum.sql"), format!("{SOURCE}{query}")).unwrap();
    for command in ["run", "explain"] {
        let out = tessera(&[command, "sum.sql"], dir.path());
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}", &stderr[..2000.min(stderr.len())]);
        assert!(stderr.contains("nested more than 1000 levels deep") && stderr.contains("line 3, column"), "{stderr}");
        assert!(stderr.len() < 1000, "the source line is cut around the caret: {stderr}");
    }
}

#[test]
fn extreme_event_times_and_window_sizes_are_bad_rows_or_refused_never_looped_on() {
    // Sentinels at both ends of 64 bits, and the last windowable times.
    let data = "device_id,temperature,ts\n1,20.5,1\n2,18.0,9223372036854775807\n\
                1,19.0,-9223372036854775808\n3,1.0,4611686018427387904\n1,19.0,12\n";
    let dir = workspace(data);
    let out = tessera(&["run", "q.sql"], dir.path());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("readings.csv:3:")
            && stderr.contains("event time 9223372036854775807 is outside the times tessera windows"),
        "{stderr}"
    );
    let out = tessera(
        &["run", "q.sql", "--on-error", "skip", "--dead-letter", "bad.jsonl", "--stats-json", "s.json", "-o", "o.csv"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dead = std::fs::read_to_string(dir.path().join("bad.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = dead.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.iter().map(|l| l["line"].as_u64().unwrap()).collect::<Vec<_>>(), [3, 4], "{dead}");
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("s.json")).unwrap()).unwrap();
    // Every event is a row out, late, or bad: the one at 2^62 closes the windows before it.
    assert_eq!((stats["events_in"].as_u64(), stats["bad_rows"].as_u64()), (Some(3), Some(2)), "{stats}");
    assert_eq!(stats["late_events"].as_u64(), Some(1), "{stats}");
    assert_eq!(
        sorted_lines(&std::fs::read_to_string(dir.path().join("o.csv")).unwrap()),
        ["1,0,10,20.5,1", "3,4611686018427387900,4611686018427387910,1.0,1", "device_id,window_start,window_end,lo,n"]
    );

    // Window sizes: at most 2^60 units, and at most 2^20 windows per event.
    let refused = [
        ("TUMBLE(readings, ts, INTERVAL '1152921504606846977' SECOND)", "longer than the longest duration"),
        ("HOP(readings, ts, INTERVAL '1' SECOND, INTERVAL '1048577' SECOND)", "tessera refuses more than 1048576"),
        ("TUMBLE(readings, ts, INTERVAL '9223372036854775807' SECOND)", "longer than the longest duration"),
    ];
    for (window, says) in refused {
        let query = QUERY.replace("TUMBLE(readings, ts, INTERVAL '10' SECOND)", window);
        std::fs::write(dir.path().join("w.sql"), format!("{SOURCE}{query}")).unwrap();
        let out = tessera(&["run", "w.sql"], dir.path());
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{window}: {stderr}");
        assert!(stderr.contains(says) && stderr.contains("line 4, column"), "{window}: {stderr}");
    }
    // The longest windows, every strategy, with events at the edges of the time line.
    let query = QUERY.replace(
        "TUMBLE(readings, ts, INTERVAL '10' SECOND)",
        "HOP(readings, ts, INTERVAL '576460752303423488' SECOND, INTERVAL '1152921504606846976' SECOND)",
    );
    std::fs::write(
        dir.path().join("w.sql"),
        format!("{}{query}", SOURCE.replace("'2' SECOND", "'1152921504606846976' SECOND")),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("readings.csv"),
        "device_id,temperature,ts\n1,2.0,-4611686018427387904\n1,3.0,5\n1,1.0,4611686018427387904\n",
    )
    .unwrap();
    for strategy in ["auto", "baseline", "wcg", "shared_sliding"] {
        let setting = format!("window_strategy={strategy}");
        let out = tessera(&["run", "w.sql", "-q", "--set", &setting], dir.path());
        assert!(out.status.success(), "{strategy}: {}", text(&out.stderr));
        assert_eq!(
            sorted_lines(&text(&out.stdout)),
            [
                "1,-4611686018427387904,-3458764513820540928,2.0,1",
                "1,-5188146770730811392,-4035225266123964416,2.0,1",
                "1,-576460752303423488,576460752303423488,3.0,1",
                "1,0,1152921504606846976,3.0,1",
                "1,4035225266123964416,5188146770730811392,1.0,1",
                "1,4611686018427387904,5764607523034234880,1.0,1",
                "device_id,window_start,window_end,lo,n",
            ],
            "{strategy}"
        );
    }
}

/// Asserts `out` is a refusal: exit status 1, no panic, and `says` in the message.
fn assert_refused(out: &Output, says: &str, what: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
    assert!(stderr.contains(says) && !stderr.contains("panicked"), "{what}: expected `{says}` in {stderr}");
}

#[test]
fn every_setting_and_option_is_range_checked() {
    let dir = workspace(GOOD);
    let settings: [(&str, &str, &[&str]); 5] = [
        ("parallelism", "between 1 and 256", &["0", "257", "-1", "9223372036854775807", "two"]),
        ("batch_size", "between 1 and 1048576", &["0", "1048577", "9223372036854775807", "1e11", "-5"]),
        ("eta", "between 0.000001 and 1000000000", &["0", "-1", "NaN", "inf", "1e10"]),
        ("keys", "between 1 and 1000000000000", &["0", "1000000000001", "1.5"]),
        ("input_flush_ms", "between 0 and 60000", &["-1", "60001", "18446744073709551616"]),
    ];
    for (name, range, values) in settings {
        let says = format!("{name} must be between {}", range.trim_start_matches("between "));
        for value in values {
            let script = format!("{SOURCE}SET {name} = '{value}';\n{QUERY}");
            std::fs::write(dir.path().join("set.sql"), script).unwrap();
            let out = tessera(&["run", "set.sql"], dir.path());
            assert_refused(&out, &says, &format!("SET {name} = {value}"));
            assert!(text(&out.stderr).contains("at line 3, column 1"), "{}", text(&out.stderr));
            let out = tessera(&["run", "q.sql", "--set", &format!("{name}={value}")], dir.path());
            assert_refused(&out, &says, &format!("--set {name}={value}"));
        }
    }
    // The limits themselves are accepted.
    for setting in ["batch_size=1048576", "batch_size=1", "input_flush_ms=0", "keys=1000000000000", "eta=0.000001"] {
        let out = tessera(&["run", "q.sql", "-q", "--set", setting], dir.path());
        assert!(out.status.success(), "{setting}: {}", text(&out.stderr));
    }
    let state = ["--state-dir", "state", "-o", "o.csv"];
    let disk = ["--state-backend", "disk"];
    let options: [(&[&str], &str, &[&str]); 24] = [
        (&["run", "q.sql", "--parallelism"], "between 1 and 256", &["0", "257", "-1"]),
        (
            &[&["run", "q.sql"], &state[..], &["--checkpoint-interval"]].concat(),
            "between 0 and 86400",
            &["-1", "NaN", "86401", "1e300"],
        ),
        (
            &[&["run", "q.sql"], &disk[..], &["--state-memory"]].concat(),
            "between 0 and 1048576GB",
            &["-1MB", "1048577GB", "1e30GB", "inf", "NaN"],
        ),
        (&["generate", "-o", "g.csv", "--events"], "between 0 and 10000000000", &["-1", "10000000001"]),
        (&["generate", "-o", "g.csv", "--devices"], "between 1 and 1000000000", &["0", "1000000001"]),
        (
            &["generate", "-o", "g.csv", "--start"],
            "between -1000000000000000 and 1000000000000000",
            &["9223372036854775807", "-1000000000000001"],
        ),
        (&["generate", "-o", "g.csv", "--disorder"], "between 0 and 1000000000", &["-1", "9223372036854775807"]),
        (&["generate", "-o", "g.csv", "--null-fraction"], "between 0 and 1", &["-0.5", "1.5", "NaN"]),
        (&["bench", "q.sql", "--repeat"], "between 1 and 1000", &["0", "1001"]),
        (&["bench", "q.sql", "--parallelism"], "between 1 and 256", &["0", "300"]),
        (&["bench", "slide", "--slide"], "between 1 and 1000000000", &["0", "-10", "9223372036854775807"]),
        (&["bench", "slide", "--events"], "between 1 and 20000000", &["0", "100000000000"]),
        (&["bench", "slide", "--eta"], "between 0.000001 and 1000000000", &["0", "1e300"]),
        (&["bench", "slide", "--keys"], "between 1 and 1000000000", &["0", "1000000001"]),
        (&["bench", "slide", "--naive-max-ratio"], "between 1 and 1048576", &["0", "1048577"]),
        (&["bench", "slide", "--repeat"], "between 1 and 1000", &["0"]),
        (
            &["bench", "slide", "--ratios"],
            "each item of --ratios must be between 1 and 1048576",
            &["0", "1,1048577", "9223372036854775807"],
        ),
        (&["bench", "wcg", "--sets"], "between 1 and 10000", &["0", "10001"]),
        (&["bench", "wcg", "--measure-sets"], "between 0 and 10000", &["10001"]),
        (&["bench", "wcg", "--events"], "between 1 and 20000000", &["0", "20000001"]),
        (&["bench", "wcg", "--eta"], "each item of --eta must be between 0.000001 and 1000000000", &["0", "1,1e10"]),
        (&["bench", "wcg", "--keys"], "between 1 and 1000000000", &["0"]),
        (&["bench", "wcg", "--repeat"], "between 1 and 1000", &["0", "1001"]),
        (&["explain", "q.sql", "--set"], "batch_size must be between 1 and 1048576", &["batch_size=0"]),
    ];
    for (args, range, values) in options {
        let (flag, command) = args.split_last().unwrap();
        for value in values {
            // `--flag=-1`: clap would take `-1` alone for a flag.
            let with_value = format!("{flag}={value}");
            let out = tessera(&[command, &[with_value.as_str()]].concat(), dir.path());
            assert_refused(&out, range, &with_value);
        }
    }
    assert!(!dir.path().join("g.csv").exists(), "nothing generated");
}

#[test]
fn usage_errors_exit_1_and_help_and_version_exit_0() {
    let dir = workspace(GOOD);
    let cases: [(&[&str], &str); 4] = [
        (&["run"], "the following required arguments were not provided"),
        (&["run", "q.sql", "--no-such-option"], "unexpected argument '--no-such-option'"),
        (&["run", "q.sql", "--format", "xml"], "invalid value 'xml' for '--format <FORMAT>'"),
        (&["frobnicate"], "unrecognized subcommand 'frobnicate'"),
    ];
    for (args, says) in cases {
        let out = tessera(args, dir.path());
        assert_refused(&out, says, &format!("{args:?}"));
        assert!(text(&out.stderr).contains("try '--help'"), "{}", text(&out.stderr));
    }
    for args in [&["--help"][..], &["--version"], &["run", "--help"]] {
        let out = tessera(args, dir.path());
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out.stderr));
        assert!(out.stdout.starts_with(b"tessera") || text(&out.stdout).contains("Usage: tessera"), "{args:?}");
    }
}

#[test]
fn scripts_without_queries_are_refused() {
    let dir = workspace(GOOD);
    for script in ["", "-- nothing here\n/* at all */\n", SOURCE, "SET batch_size = 10;"] {
        std::fs::write(dir.path().join("none.sql"), script).unwrap();
        for command in ["run", "explain"] {
            let out = tessera(&[command, "none.sql"], dir.path());
            assert_refused(&out, "the script has no queries (SELECT ... FROM a source): nothing to run", command);
        }
    }
}

#[test]
fn csv_errors_name_the_files_line_and_the_column() {
    let cases = [
        ("1,20.5,1\n2,warm,3\n", "readings.csv:3: cannot read 'warm' as DOUBLE in column `temperature` (field 2)"),
        ("1,20.5,1\n2,18.0,3,4\n", "readings.csv:3: expected 3 fields, got 4"),
        ("1,20.5,1\n2,18.0\n", "readings.csv:3: expected 3 fields, got 2"),
        (
            "1,20.5,1\n2\u{0}\u{ff},18.0,3\n",
            "readings.csv:3: cannot read '2\\u{0}\u{ff}' as BIGINT in column `device_id` (field 1)",
        ),
    ];
    for (rows, says) in cases {
        let dir = workspace(&format!("device_id,temperature,ts\n{rows}"));
        let out = tessera(&["run", "q.sql"], dir.path());
        assert_refused(&out, &format!("error: {says}\n"), rows);
        assert!(!text(&out.stderr).contains("line"), "one line number, the file's: {}", text(&out.stderr));
    }
    // Bytes that are not UTF-8, in a declared column and in one the script does not declare.
    let mut data = b"device_id,note,temperature,ts\n1,a,20.5,1\n".to_vec();
    data.extend_from_slice(b"2,\xff\xfe,18.0,3\n\xff,b,1.0,4\n");
    let dir = workspace("");
    std::fs::write(dir.path().join("readings.csv"), &data).unwrap();
    let out = tessera(&["run", "q.sql", "--on-error", "skip", "--dead-letter", "bad.jsonl", "-q"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dead = std::fs::read_to_string(dir.path().join("bad.jsonl")).unwrap();
    let reasons: Vec<String> = dead
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(reasons, ["invalid UTF-8 in field 2", "invalid UTF-8 in column `device_id` (field 1)"], "{dead}");
}

#[test]
fn a_byte_order_mark_before_the_first_record_is_skipped() {
    let dir = workspace(&format!("\u{feff}{GOOD}"));
    let out = tessera(&["run", "q.sql", "-q"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let expected = ["1,0,10,20.5,1", "1,10,20,19.0,1", "2,0,10,18.0,1", "device_id,window_start,window_end,lo,n"];
    assert_eq!(sorted_lines(&text(&out.stdout)), expected);
    let rows: String = GOOD
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            format!("{{\"device_id\": {}, \"temperature\": {}, \"ts\": {}}}\n", f[0], f[1], f[2])
        })
        .collect();
    std::fs::write(dir.path().join("readings.jsonl"), format!("\u{feff}{rows}")).unwrap();
    std::fs::write(dir.path().join("j.sql"), format!("{}{QUERY}", SOURCE.replace("readings.csv", "readings.jsonl")))
        .unwrap();
    let out = tessera(&["run", "j.sql", "-q"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sorted_lines(&text(&out.stdout)), expected);
}

#[test]
fn binary_input_is_escaped_and_cut_short_in_messages() {
    let long = "x".repeat(5000);
    let dir = workspace(&format!("device_id,temperature,ts\n1,20.5,1\n\u{1b}[31m\u{7}{long},18.0,3\n"));
    let out = tessera(&["run", "q.sql"], dir.path());
    let stderr = text(&out.stderr);
    assert_refused(&out, "readings.csv:3: cannot read '\\u{1b}[31m\\u{7}xxx", "escape sequence");
    assert!(!stderr.contains(['\u{1b}', '\u{7}']), "{stderr:?}");
    assert!(stderr.len() < 400 && stderr.contains("more characters)"), "{stderr}");
    // The dead-letter entry keeps the record whole, JSON-escaped.
    let out = tessera(&["run", "q.sql", "-q", "--on-error", "skip", "--dead-letter", "bad.jsonl"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dead = std::fs::read_to_string(dir.path().join("bad.jsonl")).unwrap();
    assert!(!dead.contains('\u{1b}') && dead.contains("\\u001b[31m"), "{dead}");
    let entry: serde_json::Value = serde_json::from_str(dead.trim()).unwrap();
    assert_eq!(entry["record"], format!("\u{1b}[31m\u{7}{long},18.0,3"));
}

/// `tail -f log | tessera run q.sql`: rows read from a pipe that stays open reach the queries
/// after the flush delay, and the windows they close are written at once.
#[test]
fn stdin_rows_are_handed_over_within_the_flush_delay() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    for format in ["csv", "jsonl"] {
        let source = SOURCE.replace("path = 'readings.csv'", "connector = 'stdin', format = 'csv'");
        std::fs::write(dir.path().join("q.sql"), format!("SET input_flush_ms = 100;\n{source}{QUERY}")).unwrap();
        let mut child = spawn_piped(&["run", "q.sql", "-q", "--format", format], dir.path());
        let mut stdin = child.stdin.take().unwrap();
        // The event at 15 moves the watermark to 13, which closes [0, 10).
        stdin.write_all(b"device_id,temperature,ts\n1,20.5,1\n2,18.0,3\n1,19.0,15\n").unwrap();
        stdin.flush().unwrap();
        let (lines, received) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                if lines.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while seen.len() < 2 + usize::from(format == "csv") {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match received.recv_timeout(left) {
                Ok(line) => seen.push(line),
                Err(_) => panic!("{format}: only {seen:?} within 10 s with stdin open"),
            }
        }
        seen.sort();
        let expected: &[&str] = match format {
            "csv" => &["1,0,10,20.5,1", "2,0,10,18.0,1", "device_id,window_start,window_end,lo,n"],
            _ => &[
                r#"{"device_id":1,"window_start":0,"window_end":10,"lo":20.5,"n":1}"#,
                r#"{"device_id":2,"window_start":0,"window_end":10,"lo":18.0,"n":1}"#,
            ],
        };
        assert_eq!(seen, expected, "{format}");
        drop(stdin);
        let status = child.wait().unwrap();
        reader.join().unwrap();
        assert!(status.success(), "{format}");
        let last: Vec<String> = received.try_iter().collect();
        assert_eq!(last.len(), 1, "{format}: the window [10, 20) at the end: {last:?}");
    }
}

#[test]
fn a_killed_runs_spill_folder_is_removed_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    generate(&["-o", "readings.csv", "--events", "400000", "--devices", "200000"], dir.path());
    std::fs::write(dir.path().join("q.sql"), format!("{SOURCE}{QUERY}")).unwrap();
    let spilled = || -> Vec<String> {
        let names = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
        names.filter(|n| n.starts_with("tessera-spill-")).collect()
    };
    let disk = ["run", "q.sql", "-q", "-o", "/dev/null", "--state-backend", "disk", "--state-memory", "0"];
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(disk)
        .env("TMPDIR", &tmp)
        .current_dir(dir.path())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !spilled().iter().any(|n| !n.ends_with(".lock")) {
        assert!(std::time::Instant::now() < deadline && child.try_wait().unwrap().is_none(), "no spill folder");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    let left = spilled();
    assert_eq!(left.len(), 2, "the folder and its lock stay behind the killed run: {left:?}");
    // The next run spilling there removes them, and its own folder when it ends.
    std::fs::write(dir.path().join("readings.csv"), GOOD).unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_tessera")).args(disk).env("TMPDIR", &tmp).current_dir(dir.path()).output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(spilled(), Vec::<String>::new());
}

#[test]
fn numbers_in_timestamp_columns_follow_time_unit_in_every_format_or_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [("a", "1764756000000", 1.5), ("a", "2025-12-03 10:00:05", 2.5), ("a", "1764756020000", 3.0)];
    let csv: String = rows.iter().map(|(d, t, v)| format!("{d},{t},{v}\n")).collect();
    std::fs::write(dir.path().join("r.csv"), format!("device,ts,v\n{csv}")).unwrap();
    let quoted = |t: &str| if t.contains('-') { format!("\"{t}\"") } else { t.to_string() };
    let json: String =
        rows.iter().map(|(d, t, v)| format!("{{\"device\":\"{d}\",\"ts\":{},\"v\":{v}}}\n", quoted(t))).collect();
    std::fs::write(dir.path().join("r.jsonl"), json).unwrap();
    let script = |path: &str, unit: &str| {
        format!(
            "CREATE SOURCE r (device VARCHAR, ts TIMESTAMP, v DOUBLE, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
               WITH (path = '{path}'{unit});
             SELECT device, window_start, window_end, SUM(v) AS s, COUNT(*) AS n
             FROM TUMBLE(r, ts, INTERVAL '10' SECOND) GROUP BY device, window_start, window_end;"
        )
    };
    for path in ["r.csv", "r.jsonl"] {
        // Without a unit, a number is refused where it stands, not read as microseconds.
        std::fs::write(dir.path().join("q.sql"), script(path, "")).unwrap();
        let out = tessera(&["run", "q.sql"], dir.path());
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{path}: {stderr}");
        let line = if path == "r.csv" { 2 } else { 1 };
        assert!(stderr.contains(&format!("{path}:{line}: column `ts` holds the number 1764756000000")), "{stderr}");
        assert!(stderr.contains("add time_unit"), "{stderr}");
        // With one, numbers and text agree.
        std::fs::write(dir.path().join("q.sql"), script(path, ", time_unit = 'ms'")).unwrap();
        let out = tessera(&["run", "q.sql", "-q"], dir.path());
        assert!(out.status.success(), "{path}: {}", text(&out.stderr));
        assert_eq!(
            sorted_lines(&text(&out.stdout)),
            [
                "a,2025-12-03T10:00:00,2025-12-03T10:00:10,4.0,2",
                "a,2025-12-03T10:00:20,2025-12-03T10:00:30,3.0,1",
                "device,window_start,window_end,s,n"
            ],
            "{path}"
        );
    }
    // Parquet: an integer column declared TIMESTAMP needs the unit too.
    generate(&["--output", "g.parquet", "--events", "2000"], dir.path());
    let parquet = |ts_type: &str, unit: &str| {
        format!(
            "CREATE SOURCE g (device_id BIGINT, temperature DOUBLE, ts {ts_type}, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
               WITH (path = 'g.parquet'{unit});
             SELECT COUNT(*) AS n FROM TUMBLE(g, ts, INTERVAL '1' MINUTE) GROUP BY device_id, window_start, window_end;"
        )
    };
    std::fs::write(dir.path().join("p.sql"), parquet("TIMESTAMP", "")).unwrap();
    let out = tessera(&["run", "p.sql"], dir.path());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("column `ts` holds numbers (Int64), but a TIMESTAMP number needs a unit"), "{stderr}");
    let mut outputs = Vec::new();
    for (ts_type, unit) in [("TIMESTAMP", ", time_unit = 's'"), ("BIGINT", ", time_unit = 's'")] {
        std::fs::write(dir.path().join("p.sql"), parquet(ts_type, unit)).unwrap();
        let out = tessera(&["run", "p.sql", "-q"], dir.path());
        assert!(out.status.success(), "{ts_type}: {}", text(&out.stderr));
        outputs.push(sorted_lines(&text(&out.stdout)));
    }
    assert!(outputs[0].len() > 10);
    assert_eq!(outputs[0], outputs[1], "the same windows whether ts is TIMESTAMP or BIGINT");
}

/// `tessera sql`: statements with -c or piped, the database kept in its folder between runs,
/// query rows as aligned tables, a failed statement's error with exit status 1.
#[test]
fn sql_runs_statements_against_a_database_folder() {
    let dir = tempfile::tempdir().expect("temp dir");
    let created = tessera(
        &[
            "sql",
            "--db",
            "shop",
            "-c",
            "CREATE TABLE item (id BIGINT PRIMARY KEY, price DOUBLE); INSERT INTO item VALUES (1, 2.5), (2, 4.0);",
        ],
        dir.path(),
    );
    assert!(created.status.success(), "{}", text(&created.stderr));
    assert_eq!(text(&created.stdout), "OK\n2 rows changed\n");
    let duplicate = tessera(&["sql", "--db", "shop", "-c", "INSERT INTO item VALUES (2, 9.0)"], dir.path());
    assert_eq!(duplicate.status.code(), Some(1));
    assert!(
        text(&duplicate.stderr).contains("duplicate primary key in `item`: (id) = (2)"),
        "{}",
        text(&duplicate.stderr)
    );
    let mut shell = spawn_piped(&["sql", "--db", "shop"], dir.path());
    shell
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"UPDATE item SET price = price * 2 WHERE id = 2;\nSELECT SUM(price) AS total\n  FROM item;\n")
        .expect("write");
    let out = shell.wait_with_output().expect("shell");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("1 row changed\n"), "{stdout}");
    assert!(stdout.contains("| total |") && stdout.contains("| 10.5  |"), "{stdout}");
}

/// Copies the files of folder `from` (and its subfolders) to `to`.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("folder");
    for entry in std::fs::read_dir(from).expect("read") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// `tessera sql` killed (SIGKILL) at 20 random points of a COPY with operations, of an UPDATE,
/// of an incremental REFRESH and of a `VACUUM FULL` (which changes files, not rows), each from
/// the same database: every time the database opens as it was before the statement or as it is
/// after it, never between.
#[test]
fn killed_statements_leave_the_database_before_or_after() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows = 60_000;
    let initial: String = (0..rows).map(|k| format!("{k},{}\n", k % 97)).collect();
    std::fs::write(dir.path().join("initial.csv"), format!("k,v\n{initial}")).expect("write");
    // Every other key updated, every tenth deleted, as many new keys inserted.
    let ops: String = (0..rows)
        .filter_map(|k| match k % 10 {
            0 => Some(format!("{k},,D\n")),
            2 | 4 | 6 | 8 => Some(format!("{k},{},U\n", k % 89)),
            _ => None,
        })
        .chain((rows..rows * 2).map(|k| format!("{k},{},I\n", k % 83)))
        .collect();
    std::fs::write(dir.path().join("ops.csv"), format!("k,v,op\n{ops}")).expect("write");
    let pristine = dir.path().join("pristine");
    let created = tessera(
        &[
            "sql",
            "--db",
            "pristine",
            "-c",
            "CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT) WITH (path = 'initial.csv');
             CREATE MATERIALIZED VIEW m AS SELECT v % 10 AS bucket, COUNT(*) AS n, SUM(k) AS keys FROM t GROUP BY v % 10;
             DELETE FROM t WHERE k % 2 = 1 AND k % 7 = 0;",
        ],
        dir.path(),
    );
    assert!(created.status.success(), "{}", text(&created.stderr));
    let summary = |db: &str| {
        let out = tessera(
            &[
                "sql",
                "--db",
                db,
                "-c",
                "SELECT COUNT(*) AS n, SUM(k) AS keys, SUM(v) AS vs FROM t; SELECT SUM(n) AS n, SUM(keys) AS keys FROM m",
            ],
            dir.path(),
        );
        assert!(out.status.success(), "{db}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let before = summary("pristine");
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64;
    let mut rng = seed | 1;
    let statements = [
        "COPY t FROM 'ops.csv' WITH (op_column = 'op')",
        "UPDATE t SET v = v + k % 7, k = k + 1000000 WHERE k % 3 = 0",
        "REFRESH MATERIALIZED VIEW m",
        "VACUUM FULL",
    ];
    for statement in statements {
        // The statement uninterrupted: the state after it, and how long it takes.
        copy_folder(&pristine, &dir.path().join("whole"));
        let started = std::time::Instant::now();
        let whole = tessera(&["sql", "--db", "whole", "-c", statement], dir.path());
        assert!(whole.status.success(), "{}", text(&whole.stderr));
        let took = started.elapsed().as_millis() as u64;
        let after = summary("whole");
        match statement.starts_with("VACUUM") {
            true => assert_eq!(before, after, "{statement} keeps the rows"),
            false => assert_ne!(before, after, "{statement} changes the table"),
        }
        std::fs::remove_dir_all(dir.path().join("whole")).expect("remove");
        let (mut saw_before, mut saw_after) = (0, 0);
        for kill in 0..20 {
            let db = format!("killed{kill}");
            copy_folder(&pristine, &dir.path().join(&db));
            let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(["sql", "--db", &db, "-c", statement])
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn");
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // From halfway through to a little past the end: the statement writes its files and
            // its manifest at the end, after reading the database and the file.
            std::thread::sleep(std::time::Duration::from_millis(took / 2 + rng % (took * 6 / 10 + 1)));
            let _ = child.kill();
            child.wait().expect("reap");
            let found = summary(&db);
            assert!(found == before || found == after, "seed {seed}, {statement}, kill {kill}: {found}");
            if found == before {
                saw_before += 1;
            } else {
                saw_after += 1;
            }
            std::fs::remove_dir_all(dir.path().join(&db)).expect("remove");
        }
        eprintln!("{statement}: {saw_before} kills left it before, {saw_after} after ({took} ms uninterrupted)");
    }
}

/// A script of table statements runs with `tessera run` (its database in memory, or in the
/// folder `--db` names), paths relative to the script: the example's view, stale and then
/// refreshed incrementally.
#[test]
fn run_takes_a_script_of_tables_and_views() {
    let dir = tempfile::tempdir().expect("temp dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tables/visits.sql");
    let out = tessera(&["run", example.to_str().expect("path"), "-q"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("video_id,visit_count\n1,2\n2,1\n3,3\n"), "stale first: {stdout}");
    assert!(stdout.contains("refresh,\"incremental:"), "{stdout}");
    assert!(stdout.ends_with("video_id,visit_count\n1,2\n2,3\n3,2\n"), "fresh last: {stdout}");
    let kept = tessera(&["run", "--db", "shop", example.to_str().expect("path"), "-q"], dir.path());
    assert!(kept.status.success(), "{}", text(&kept.stderr));
    let again = tessera(
        &["sql", "--db", "shop", "--format", "csv", "-c", "SELECT SUM(visit_count) AS n FROM visit_view"],
        dir.path(),
    );
    assert_eq!(text(&again.stdout), "n\n7\n");
}

/// The estimates example: the stale answer, then estimates with their intervals covering the
/// answer of the refreshed view at the end (its figures as the README shows them).
#[test]
fn run_estimates_fresh_answers_from_a_sampled_view() {
    let dir = tempfile::tempdir().expect("temp dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tables/estimates.sql");
    let out = tessera(&["run", example.to_str().expect("path"), "-q"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("n,d\n0,\n"), "stale first: {stdout}");
    assert!(stdout.contains("n,n_ci_low,n_ci_high,d,d_ci_low,d_ci_high\n900.0,723.60"), "{stdout}");
    assert!(stdout.contains("estimator,svc_corr"), "{stdout}");
    assert!(stdout.ends_with("n,d\n960,330.8125\n"), "exact last: {stdout}");
}

/// The outlier index example: the region holding the wholesale orders is estimated with an
/// interval that covers the refreshed answer and is far narrower than the sample's alone; the
/// other regions' estimates are the same either way. The index holds 103 orders: the 102 above
/// the threshold now and the one deleted since the view was created.
#[test]
fn run_outliers_keeps_the_long_tail_out_of_the_intervals() {
    let dir = tempfile::tempdir().expect("temp dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tables/outliers.sql");
    let out = tessera(&["run", example.to_str().expect("path"), "-q"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let north: Vec<Vec<f64>> = stdout
        .lines()
        .filter(|l| l.starts_with("north,"))
        .map(|l| l.split(',').skip(1).map(|c| c.parse().expect("a number")).collect())
        .collect();
    let [alone, indexed, truth] = north.as_slice() else { panic!("{stdout}") };
    let width = |e: &[f64]| e[2] - e[1];
    assert!(indexed[1] <= truth[0] && truth[0] <= indexed[2], "{indexed:?} against {truth:?}");
    assert!(width(indexed) * 20.0 < width(alone), "{indexed:?} against {alone:?}");
    let others = |from: &str| -> Vec<String> {
        stdout
            .split(from)
            .nth(1)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("south,") || l.starts_with("west,"))
            .take(2)
            .map(String::from)
            .collect()
    };
    assert_eq!(others("region,revenue,revenue_ci_low"), others("north,9254640"), "{stdout}");
    assert!(stdout.contains("outlier index,\"orders.amount > 10000: 103 keys of the view"), "{stdout}");
}

/// A script that fills a table from a window query over a stream and keeps a view over it:
/// the example's view before and after two devices move (figures as DuckDB computes them over
/// the readings file), and the events read in the summary.
#[test]
fn run_fills_a_table_from_a_stream_and_maintains_a_view_over_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/iot/sites.sql");
    let out = tessera(&["run", example.to_str().expect("path")], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("site,low,high,readings\nnorth,12.15,31.53,10036\nsouth,12.01,31.99,9964\n"),
        "{stdout}"
    );
    assert!(stdout.ends_with("site,low,high,readings\nnorth,12.36,31.53,8035\nsouth,12.01,31.99,11965\n"), "{stdout}");
    assert!(text(&out.stderr).contains("20000 events read from streams, 0 late"), "{}", text(&out.stderr));
}

/// The funnel example: per user, the (login, view, purchase) triples in time order, as DuckDB
/// counts them with a batch self-join of the same file; EXPLAIN shows the synopsis.
#[test]
fn the_funnel_example_counts_journeys_as_a_batch_self_join_does() {
    let dir = tempfile::tempdir().expect("temp dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/funnel/funnel.sql");
    let out = tessera(&["run", example.to_str().expect("path")], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut rows: Vec<&str> = stdout.lines().skip(1).collect();
    rows.sort_by_key(|r| r.split(',').next().and_then(|u| u.parse::<u32>().ok()));
    assert_eq!(rows.len(), 40, "{stdout}");
    assert_eq!(&rows[..3], ["1,353", "2,568", "3,1021"], "{stdout}");
    let explained = tessera(&["explain", example.to_str().expect("path")], dir.path());
    let plan = text(&explained.stdout);
    assert!(plan.contains("space class log-bounded") && plan.contains("c > b > a"), "{plan}");
    assert!(plan.contains("state partitioned by: user_id"), "{plan}");
}

/// The device examples, temporal formulas: alarms since each device's last service and failures
/// beyond successes, as DuckDB computes them over the same file (a NOT EXISTS of a later service;
/// filtered counts); EXPLAIN shows the formula and its counters.
#[test]
fn the_device_examples_answer_as_batch_sql_does() {
    let dir = tempfile::tempdir().expect("temp dir");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/devices");
    let sorted = |script: &str| {
        let out = tessera(&["run", examples.join(script).to_str().expect("path")], dir.path());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let mut rows: Vec<String> = stdout.lines().skip(1).map(String::from).collect();
        rows.sort_by_key(|r| r.split(',').next().and_then(|d| d.parse::<u32>().ok()));
        rows
    };
    let alarms = sorted("alarms_since_service.sql");
    assert_eq!(alarms.len(), 21, "{alarms:?}");
    assert_eq!(&alarms[..4], ["1,14", "2,5", "3,30", "4,7"]);
    assert_eq!(&alarms[16..], ["21,49", "22,34", "23,38", "24,31", "25,39"]);
    let failures = sorted("more_failures.sql");
    assert_eq!(failures, ["1,13", "2,16", "3,16", "4,25", "5,19", "6,20", "7,24", "8,11"]);
    let explained = tessera(&["explain", examples.join("more_failures.sql").to_str().expect("path")], dir.path());
    let plan = text(&explained.stdout);
    assert!(plan.contains("ONCE_COUNT(success[kind = 'success'](device_id)) (count), per (device_id)"), "{plan}");
}

/// A query no bounded synopsis answers is refused, saying why and what would bound it; with
/// `SET allow_unbounded_state = true` it runs kept whole (DataFusion over every event), with a
/// warning, and answers as the batch query does.
#[test]
fn an_unbounded_query_is_refused_unless_the_script_allows_keeping_every_event() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("p.csv"), "u,amount,ts\n1,5,1\n1,7,2\n2,3,2\n1,2,4\n2,9,5\n1,8,6\n").expect("write");
    let source = "CREATE SOURCE p (u BIGINT, amount BIGINT, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) \
                  WITH (path = 'p.csv', time_unit = 's');\n";
    let query = "SELECT a.u, COUNT(*) AS rises FROM p a, p b WHERE a.u = b.u AND a.ts < b.ts AND a.amount < b.amount \
                 GROUP BY a.u;\n";
    std::fs::write(dir.path().join("refused.sql"), format!("{source}{query}")).expect("write");
    let refused = tessera(&["run", "refused.sql"], dir.path());
    assert!(!refused.status.success());
    let stderr = text(&refused.stderr);
    assert!(stderr.contains("space class unbounded: `a.amount < b.amount`"), "{stderr}");
    assert!(stderr.contains("SET allow_unbounded_state = true"), "{stderr}");
    std::fs::write(dir.path().join("kept.sql"), format!("{source}SET allow_unbounded_state = true;\n{query}"))
        .expect("write");
    let kept = tessera(&["run", "kept.sql"], dir.path());
    assert!(kept.status.success(), "{}", text(&kept.stderr));
    // User 1: 5 < 7, 5 < 8, 7 < 8, 2 < 8; user 2: 3 < 9.
    // Rows ascending, whatever the batch engine's partitions did.
    assert_eq!(text(&kept.stdout), "u,rises\n1,4\n2,1\n");
    let stderr = text(&kept.stderr);
    assert!(stderr.contains("warning: query 1 keeps every event of its source"), "{stderr}");
    // A setting given outside the script holds while its queries are planned.
    let allowed = tessera(&["run", "--set", "allow_unbounded_state=true", "refused.sql"], dir.path());
    assert!(allowed.status.success(), "{}", text(&allowed.stderr));
    assert_eq!(text(&allowed.stdout), text(&kept.stdout));
}

/// `--set temporal_strategy=kept_whole` runs a funnel a synopsis answers by keeping every event
/// (with the warning), to the same rows; the script's own SET of it gives way.
#[test]
fn a_funnel_kept_whole_answers_as_its_synopsis() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("e.csv"),
        "u,kind,ts\n1,login,1\n1,buy,2\n2,login,2\n1,login,3\n2,buy,3\n1,buy,5\n2,buy,5\n1,buy,3\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("funnel.sql"),
        "CREATE SOURCE e (u BIGINT, kind VARCHAR, ts BIGINT, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) \
         WITH (path = 'e.csv', time_unit = 's');\nSET temporal_strategy = 'synopsis';\n\
         SELECT a.u, COUNT(*) AS pairs FROM e a, e b WHERE a.u = b.u AND a.kind = 'login' AND b.kind = 'buy' \
         AND a.ts < b.ts GROUP BY a.u;\n",
    )
    .expect("write");
    let rows = |out: &std::process::Output| {
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut rows: Vec<String> = text(&out.stdout).lines().skip(1).map(String::from).collect();
        rows.sort();
        rows
    };
    let synopsis = tessera(&["run", "funnel.sql"], dir.path());
    // User 1: login 1 before buys 2 and 5, login 3 before buy 5 (the buy at 3 comes after the
    // watermark passed 4: late); user 2: login 2 before buys 3 and 5.
    assert_eq!(rows(&synopsis), ["1,3", "2,2"]);
    assert!(!text(&synopsis.stderr).contains("keeps every event"), "{}", text(&synopsis.stderr));
    let kept = tessera(&["run", "--set", "temporal_strategy=kept_whole", "funnel.sql"], dir.path());
    assert_eq!(rows(&kept), ["1,3", "2,2"]);
    assert!(text(&kept.stderr).contains("SET temporal_strategy = 'kept_whole' asked for it"), "{}", text(&kept.stderr));
    // Flink has no form of the synopsis: compiling says so instead of printing a partial script.
    let flink = tessera(&["compile", "--target", "flink", "funnel.sql"], dir.path());
    assert_eq!(flink.status.code(), Some(1), "{}", text(&flink.stdout));
    assert!(text(&flink.stderr).contains("not compiled to Flink SQL yet"), "{}", text(&flink.stderr));
}

/// `tessera run --on-error skip` on a script of table statements: the malformed rows of a COPY
/// go to the dead-letter file and are counted; without it the run stops at the row's line.
#[test]
fn a_table_script_skips_malformed_rows_into_the_dead_letter_file_when_told() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("rows.csv"), "k,v\n1,2\n2,x\n3,4\n").expect("write");
    std::fs::write(
        dir.path().join("load.sql"),
        "CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT);\nCOPY t FROM 'rows.csv';\nSELECT COUNT(*) AS n FROM t;\n",
    )
    .expect("write");
    let stopped = tessera(&["run", "load.sql"], dir.path());
    assert!(!stopped.status.success());
    assert!(text(&stopped.stderr).contains("rows.csv:3: cannot read 'x' as BIGINT"), "{}", text(&stopped.stderr));
    let skipped = tessera(&["run", "--on-error", "skip", "--dead-letter", "bad.jsonl", "load.sql"], dir.path());
    assert!(skipped.status.success(), "{}", text(&skipped.stderr));
    assert_eq!(text(&skipped.stdout), "n\n2\n");
    let stderr = text(&skipped.stderr);
    assert!(
        stderr.contains("1 malformed row skipped into bad.jsonl") && stderr.contains(", 1 malformed rows skipped"),
        "{stderr}"
    );
    let letter = std::fs::read_to_string(dir.path().join("bad.jsonl")).expect("dead letter");
    assert!(letter.contains("\"line\":3") && letter.contains("\"record\":\"2,x\""), "{letter}");
}
