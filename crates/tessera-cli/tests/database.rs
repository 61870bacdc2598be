//! A database folder as users meet it from the command line: several processes writing it,
//! outputs that would destroy what a script reads, the options of `run` on a database script,
//! damaged files, deep expressions and readers that stop early.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn tessera(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).current_dir(dir).output().expect("tessera runs")
}

/// Runs `tessera` with `args` in `dir`, `input` on its stdin.
fn piped(args: &[&str], dir: &Path, input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tessera starts");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The CSV rows (header first) `tessera sql --db db --format csv -c sql` prints.
fn rows(dir: &Path, sql: &str) -> Vec<String> {
    let out = tessera(&["sql", "--db", "db", "--format", "csv", "-c", sql], dir);
    assert!(out.status.success(), "{sql}: {}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn concurrent_writers_are_serialised_and_nothing_committed_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let create = "CREATE TABLE t (id BIGINT PRIMARY KEY)";
    assert!(tessera(&["sql", "--db", "db", "-c", create], dir.path()).status.success());
    // One process holds the database for writing while it reads a stream from stdin.
    std::fs::write(
        dir.path().join("hold.sql"),
        "CREATE SOURCE s (id BIGINT, ts BIGINT, WATERMARK FOR ts AS ts) WITH (connector = 'stdin', format = 'csv');
         INSERT INTO t SELECT id FROM TUMBLE(s, ts, INTERVAL '1' SECOND) GROUP BY id, window_start, window_end;",
    )
    .unwrap();
    let mut holder = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["run", "--db", "db", "hold.sql"])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = holder.stdin.take().unwrap();
    writeln!(stdin, "id,ts\n1,1").unwrap();
    stdin.flush().unwrap();
    // It writes who it is into the lock file once it holds the lock.
    let started = std::time::Instant::now();
    let holding = format!("process {},", holder.id());
    while !std::fs::read_to_string(dir.path().join("db/LOCK")).unwrap_or_default().contains(&holding) {
        assert!(started.elapsed().as_secs() < 60, "the holder never took the lock");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = tessera(&["sql", "--db", "db", "-c", "INSERT INTO t VALUES (200)"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let refused = text(&out.stderr);
    assert!(
        refused.contains(&format!("is being written by another process (process {}", holder.id())),
        "the holder is named: {refused}"
    );
    assert!(refused.contains("hold.sql"), "with its command: {refused}");
    // Readers read the last committed state meanwhile.
    assert_eq!(rows(dir.path(), "SELECT COUNT(*) AS n FROM t"), ["n", "0"]);
    writeln!(stdin, "2,2").unwrap();
    drop(stdin);
    let held = holder.wait_with_output().unwrap();
    assert!(held.status.success(), "{}", text(&held.stderr));

    // Writers started at once, each retrying while another holds the database: every
    // statement each was told is committed is there.
    let writers: Vec<_> = (0..6)
        .map(|i| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let mut committed = Vec::new();
                for j in 0..3 {
                    let id = 1000 + i * 10 + j;
                    for attempt in 0.. {
                        let out = tessera(&["sql", "--db", "db", "-c", &format!("INSERT INTO t VALUES ({id})")], &dir);
                        if out.status.success() {
                            committed.push(id);
                            break;
                        }
                        let err = text(&out.stderr);
                        assert!(err.contains("is being written by another process"), "{err}");
                        assert!(attempt < 400, "never got the database");
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
                committed
            })
        })
        .collect();
    let mut expected: Vec<String> = vec!["1".into(), "2".into()];
    for writer in writers {
        expected.extend(writer.join().unwrap().iter().map(|id| id.to_string()));
    }
    expected.sort();
    let mut stored = rows(dir.path(), "SELECT id FROM t");
    stored.remove(0);
    stored.sort();
    assert_eq!(stored, expected);
}

#[test]
fn an_output_onto_what_a_database_script_reads_is_refused_before_anything_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("v.csv"), "id,x\n1,1.5\n").unwrap();
    std::fs::write(dir.path().join("more.csv"), "id,x\n2,2.5\n").unwrap();
    let script = "CREATE TABLE v (id BIGINT PRIMARY KEY, x DOUBLE) WITH (path = 'v.csv');
                  COPY v FROM 'more.csv';
                  SELECT * FROM v ORDER BY id;";
    std::fs::write(dir.path().join("s.sql"), script).unwrap();
    for (output, role) in [
        ("v.csv", "the initial contents of table `v`"),
        ("more.csv", "the file COPY reads into `v`"),
        ("s.sql", "the script"),
    ] {
        let out = tessera(&["run", "--db", "db", "s.sql", "--output", output], dir.path());
        assert_eq!(out.status.code(), Some(1), "{output}");
        let err = text(&out.stderr);
        assert!(err.contains(&format!("--output {output} is {role}")), "{err}");
    }
    assert_eq!(std::fs::read_to_string(dir.path().join("v.csv")).unwrap(), "id,x\n1,1.5\n");
    assert_eq!(std::fs::read_to_string(dir.path().join("s.sql")).unwrap(), script);
    assert!(!dir.path().join("db").exists(), "nothing was run");
    let out = tessera(&["run", "--db", "db", "s.sql", "--output", "rows.csv"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(dir.path().join("rows.csv")).unwrap(), "id,x\n1,1.5\n2,2.5\n");
    // Nor into the database folder, nor into a folder that does not exist.
    let manifest = std::fs::read(dir.path().join("db/MANIFEST")).unwrap();
    let out = tessera(&["run", "--db", "db", "s.sql", "--output", "db/MANIFEST"], dir.path());
    assert!(text(&out.stderr).contains("is inside the database folder"), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(dir.path().join("db/MANIFEST")).unwrap(), manifest);
    let out = tessera(&["run", "--db", "db", "s.sql", "--stats-json", "missing/stats.json"], dir.path());
    assert!(text(&out.stderr).contains("--stats-json missing/stats.json: its folder does not exist"));
}

#[test]
fn every_option_of_run_is_honoured_or_refused_on_a_database_script() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.csv"), "k,v,ts\n1,2.0,1\n1,4.0,2\n2,8.0,11\n").unwrap();
    std::fs::write(
        dir.path().join("s.sql"),
        "SET window_strategy = 'baseline';
         CREATE SOURCE r (k BIGINT, v DOUBLE, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'r.csv', time_unit = 's');
         CREATE TABLE t (k BIGINT PRIMARY KEY, total DOUBLE);
         INSERT INTO t SELECT k, SUM(v) FROM TUMBLE(r, ts, INTERVAL '1' MINUTE) GROUP BY k, window_start, window_end;
         CREATE MATERIALIZED VIEW m AS SELECT SUM(total) AS s FROM t;
         UPDATE t SET total = 100 WHERE k = 2;
         SELECT s FROM m;",
    )
    .unwrap();
    // The view answers stale by default, fresh when told on the command line.
    let out = tessera(&["run", "s.sql"], dir.path());
    assert_eq!(text(&out.stdout), "s\n14.0\n", "{}", text(&out.stderr));
    let out = tessera(
        &["run", "s.sql", "--set", "freshness=exact", "--format", "jsonl", "--stats-json", "st.json"],
        dir.path(),
    );
    assert_eq!(text(&out.stdout), "{\"s\":106.0}\n", "{}", text(&out.stderr));
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("st.json")).unwrap()).unwrap();
    assert_eq!((stats["events_in"].as_u64(), stats["rows_out"].as_u64()), (Some(3), Some(1)), "{stats}");
    for (args, says) in [
        (&["--set", "nonsense=1"][..], "unknown setting `nonsense`"),
        (&["--set", "batch_size=0"], "batch_size must be between 1 and 1048576"),
        (&["--late-output", "late.csv"], "--late-output writes the late events of a script of streams"),
        (&["--state-dir", "st", "--output", "o.csv"], "--state-dir checkpoints a script of streams"),
        (&["--state-backend", "disk"], "--state-backend and --state-memory place the window state"),
    ] {
        let out = tessera(&[&["run", "s.sql"], args].concat(), dir.path());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(text(&out.stderr).contains(says), "{args:?}: {}", text(&out.stderr));
    }
    // --parallelism runs the window query on that many workers, to the same rows.
    let out = tessera(&["run", "s.sql", "--parallelism", "2"], dir.path());
    assert_eq!(text(&out.stdout), "s\n14.0\n", "{}", text(&out.stderr));
}

#[test]
fn a_damaged_file_is_named_and_recover_goes_back_one_statement() {
    let dir = tempfile::tempdir().unwrap();
    let create = "CREATE TABLE t (id BIGINT PRIMARY KEY); INSERT INTO t VALUES (1), (2);";
    assert!(tessera(&["sql", "--db", "db", "-c", create], dir.path()).status.success());
    assert!(tessera(&["sql", "--db", "db", "-c", "INSERT INTO t VALUES (3)"], dir.path()).status.success());
    let manifest = dir.path().join("db/MANIFEST");
    let mut bytes = std::fs::read(&manifest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&manifest, bytes).unwrap();
    let out = tessera(&["sql", "--db", "db", "-c", "SELECT * FROM t"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("is damaged") && err.contains("`tessera recover --db db` goes back to it"), "{err}");
    let out = tessera(&["recover", "--db", "db"], dir.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(rows(dir.path(), "SELECT id FROM t ORDER BY id"), ["id", "1", "2"]);
}

#[test]
fn long_expressions_in_the_shell_are_balanced_or_refused_with_their_position() {
    let dir = tempfile::tempdir().unwrap();
    let ors = (0..30_000).map(|i| format!("x = {i}")).collect::<Vec<_>>().join(" OR ");
    let sql = format!("CREATE TABLE t (x BIGINT); INSERT INTO t VALUES (5), (40000); SELECT x FROM t WHERE {ors};");
    let out = piped(&["sql", "--format", "csv"], dir.path(), &sql);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "x\n5\n");
    let sum = (0..30_000).map(|i| i.to_string()).collect::<Vec<_>>().join(" + ");
    let out = piped(&["sql"], dir.path(), &format!("SELECT {sum} AS s;"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("nested more than 1000 levels deep"), "{}", text(&out.stderr));
}

#[test]
fn a_reader_that_stops_early_ends_the_process_quietly() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["sql", "--format", "csv", "-c", "SELECT value FROM generate_series(1, 200000)"][..],
        &["sql", "-c", "SELECT value FROM generate_series(1, 200000)"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        // The pipe is closed here, with most rows unread.
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert!(!err.contains("panicked") && out.status.code() != Some(101), "{args:?}: {:?} {err}", out.status);
    }
}

#[test]
fn misspelt_keywords_get_a_hint_and_nested_nots_parse() {
    let dir = tempfile::tempdir().unwrap();
    for (sql, hint) in [
        ("CREATE TABLE t (a BIGINT); SELECT COUNT(*) FORM t", "did you mean `FROM`?"),
        ("CREATE TABLE t (a BIGINT); SELECT a FROM t GRUOP BY a", "did you mean `GROUP`?"),
        ("CREAT TABLE t (a BIGINT)", "did you mean `CREATE`?"),
    ] {
        let out = tessera(&["sql", "-c", sql], dir.path());
        assert_eq!(out.status.code(), Some(1), "{sql}");
        assert!(text(&out.stderr).contains(hint), "{sql}: {}", text(&out.stderr));
    }
    std::fs::write(dir.path().join("r.csv"), "k,ts\n1,1\n").unwrap();
    std::fs::write(
        dir.path().join("s.sql"),
        "CREATE SOURCE r (k BIGINT, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'r.csv');
         SELECT k, COUNT(*) FROM TUMBLE(r, ts, INTERVAL '1' SECOND) GRUOP BY k, window_start, window_end;",
    )
    .unwrap();
    let out = tessera(&["run", "s.sql"], dir.path());
    assert!(text(&out.stderr).contains("did you mean `GROUP`?"), "{}", text(&out.stderr));
    // 49 and 500 nested NOTs: an answer, not a parser's recursion limit.
    for depth in [49, 500] {
        let sql = format!("SELECT {} TRUE AS x", "NOT ".repeat(depth));
        let out = tessera(&["sql", "--format", "csv", "-c", &sql], dir.path());
        assert!(out.status.success(), "{depth}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), format!("x\n{}\n", depth % 2 == 0), "{depth}");
    }
}

#[test]
fn generate_writes_the_format_its_file_name_says_or_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let out = tessera(&["generate", "--events", "10", "-o", "x.json"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("generate writes .csv or .parquet, not .json"), "{}", text(&out.stderr));
    assert!(!dir.path().join("x.json").exists());
}

#[test]
fn commands_for_scripts_of_streams_say_what_does_it_for_a_database_script() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.sql"), "CREATE TABLE t (a BIGINT);\nSELECT * FROM t;\n").unwrap();
    for (args, says) in [
        (&["explain", "t.sql"][..], "EXPLAIN SELECT ... and EXPLAIN REFRESH MATERIALIZED VIEW"),
        (&["bench", "t.sql"], "tessera sql --timer"),
        (&["compile", "--target", "flink", "t.sql"], "compiles with --target spark"),
    ] {
        let out = tessera(args, dir.path());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(text(&out.stderr).contains("this is a database script: "), "{args:?}");
        assert!(text(&out.stderr).contains(says), "{args:?}: {}", text(&out.stderr));
    }
}

#[test]
fn an_empty_csv_file_is_refused_for_streams_and_tables_alike() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty.csv"), "").unwrap();
    std::fs::write(
        dir.path().join("s.sql"),
        "CREATE SOURCE r (k BIGINT, ts BIGINT, WATERMARK FOR ts AS ts) WITH (path = 'empty.csv');
         SELECT k, COUNT(*) AS n FROM TUMBLE(r, ts, INTERVAL '1' SECOND) GROUP BY k, window_start, window_end;",
    )
    .unwrap();
    std::fs::write(dir.path().join("t.sql"), "CREATE TABLE t (k BIGINT, ts BIGINT) WITH (path = 'empty.csv');")
        .unwrap();
    for script in ["s.sql", "t.sql"] {
        let out = tessera(&["run", script], dir.path());
        assert_eq!(out.status.code(), Some(1), "{script}");
        let err = text(&out.stderr);
        assert!(
            err.contains(
                "empty.csv:1: the file is empty: a CSV file starts with a header row naming its columns (k,ts)"
            ),
            "{script}: {err}"
        );
    }
    // Its header alone is a file without rows.
    std::fs::write(dir.path().join("empty.csv"), "k,ts\n").unwrap();
    assert!(tessera(&["run", "s.sql"], dir.path()).status.success());
}

#[test]
fn a_database_script_with_a_syntax_error_is_told_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.sql"), "CREATE TABLE t (a BIGINT);\nSELECT a FROM t WHERE;\n").unwrap();
    let out = tessera(&["run", "t.sql"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    // The database statements' parser read further than the stream one (which stops at CREATE).
    assert!(text(&out.stderr).contains("line 2"), "{}", text(&out.stderr));
}
