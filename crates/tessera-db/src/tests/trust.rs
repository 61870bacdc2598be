//! What a database is given is stored as given or refused: values that do not fit their
//! column, numbers for timestamps without a unit, damaged files, and a second process writing.

use proptest::prelude::*;

use super::*;

fn error(db: &mut Database, sql: &str) -> String {
    db.execute(sql).unwrap_err().to_string()
}

const TYPED: &str =
    "CREATE TABLE u (k BIGINT PRIMARY KEY, i INT, d DOUBLE, day DATE, at TIMESTAMP, ok BOOLEAN, n DECIMAL(6, 2));";

#[test]
fn values_that_do_not_fit_their_column_are_refused_with_value_column_and_row() {
    let mut db = Database::in_memory().unwrap();
    db.execute(TYPED).unwrap();
    let cases = [
        (
            "INSERT INTO u (k, i) VALUES (1, 5), (2, 3000000000)",
            "column `i` of `u` is INT: 3000000000 is out of the range of INT (row 2",
        ),
        ("INSERT INTO u (k, d) VALUES (1, '1,5')", "column `d` of `u` is DOUBLE: '1,5' is not a DOUBLE (row 1"),
        ("INSERT INTO u (k, day) VALUES (1, '2024-02-30')", "column `day` of `u` is DATE: '2024-02-30' is not a DATE"),
        (
            "INSERT INTO u (k, at) VALUES (1, 'yesterday')",
            "column `at` of `u` is TIMESTAMP: 'yesterday' is not a TIMESTAMP",
        ),
        ("INSERT INTO u (k, ok) VALUES (1, 'maybe')", "column `ok` of `u` is BOOLEAN: 'maybe' is not a BOOLEAN"),
        ("INSERT INTO u (k, i) VALUES (1, 1.9)", "column `i` of `u` is INT: 1.9 is not a whole number"),
        (
            "INSERT INTO u (k, n) VALUES (1, 123456.5)",
            "column `n` of `u` is DECIMAL(6, 2): 123456.5 is out of the range",
        ),
        ("INSERT INTO u (k) VALUES ('eleven')", "column `k` of `u` is BIGINT: 'eleven' is not a BIGINT"),
        (
            "INSERT INTO u (k, at) VALUES (1, 1700000000)",
            "1700000000 is a number, and a number is a TIMESTAMP only in a unit",
        ),
    ];
    for (sql, expected) in cases {
        let err = error(&mut db, sql);
        assert!(err.contains(expected), "{sql}: {err}");
    }
    assert_eq!(db.table("u").unwrap().rows(), 0, "nothing of a refused statement is stored");
    // What fits is stored as given; whole floats and numeric text go into integers.
    db.execute(
        "INSERT INTO u VALUES (1, 2.0, 1.5, '2024-02-29', '2024-02-29 10:00:00', 'true', 12.345),
                              (2, '7', '2.5', NULL, NULL, 'f', NULL)",
    )
    .unwrap();
    assert_eq!(
        query(&mut db, "SELECT * FROM u"),
        ["1|2|1.5|2024-02-29|2024-02-29T10:00:00|true|12.35", "2|7|2.5|||false|"]
    );
}

#[test]
fn an_update_that_does_not_fit_changes_nothing() {
    let mut db = Database::in_memory().unwrap();
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, x DOUBLE); INSERT INTO t VALUES (1, 1.0), (2, 2.0);").unwrap();
    let err = error(&mut db, "UPDATE t SET x = 'abc'");
    assert!(err.contains("column `x` of `t` is DOUBLE: 'abc' is not a DOUBLE (row 1"), "{err}");
    let err = error(&mut db, "UPDATE t SET k = k + 0.5 WHERE k = 2");
    assert!(err.contains("is not a whole number"), "{err}");
    assert_eq!(query(&mut db, "SELECT * FROM t"), ["1|1.0", "2|2.0"]);
}

#[test]
fn a_tables_time_unit_counts_numbers_in_timestamp_columns_of_every_input() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secs.csv"), "id,ts\n1,1700000000\n").unwrap();
    std::fs::write(dir.path().join("secs.jsonl"), "{\"id\": 2, \"ts\": 1700000001}\n").unwrap();
    std::fs::write(dir.path().join("millis.csv"), "id,ts\n3,1700000002000\n").unwrap();
    let parquet = dir.path().join("secs.parquet");
    {
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            Field::new("id", arrow::datatypes::DataType::Int64, false),
            Field::new("ts", arrow::datatypes::DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(arrow::array::Int64Array::from(vec![4])),
                Arc::new(arrow::array::Int64Array::from(vec![1700000003])),
            ],
        )
        .unwrap();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&parquet).unwrap(), schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
    let mut db = Database::in_memory().unwrap();
    db.set_base_dir(dir.path());
    db.execute(
        "CREATE TABLE e (id BIGINT PRIMARY KEY, ts TIMESTAMP) WITH (path = 'secs.csv', time_unit = 's');
         COPY e FROM 'secs.jsonl';
         COPY e FROM 'millis.csv' WITH (time_unit = 'ms');
         COPY e FROM 'secs.parquet';
         INSERT INTO e VALUES (5, 1700000004);",
    )
    .unwrap();
    assert_eq!(
        query(&mut db, "SELECT id, ts FROM e"),
        [
            "1|2023-11-14T22:13:20",
            "2|2023-11-14T22:13:21",
            "3|2023-11-14T22:13:22",
            "4|2023-11-14T22:13:23",
            "5|2023-11-14T22:13:24"
        ]
    );
    // Reopened, the table keeps its unit.
    let folder = dir.path().join("db");
    let mut db = Database::open(&folder).unwrap();
    db.execute("CREATE TABLE e (id BIGINT, ts TIMESTAMP) WITH (time_unit = 'ms')").unwrap();
    drop(db);
    let mut db = Database::open(&folder).unwrap();
    db.execute("INSERT INTO e VALUES (1, 1000)").unwrap();
    assert_eq!(query(&mut db, "SELECT ts FROM e"), ["1970-01-01T00:00:01"]);
    // Without a unit, a number in a TIMESTAMP column of a file is refused.
    let mut db = Database::in_memory().unwrap();
    db.set_base_dir(dir.path());
    let err = error(&mut db, "CREATE TABLE f (id BIGINT, ts TIMESTAMP) WITH (path = 'secs.csv')");
    assert!(err.contains("needs a unit"), "{err}");
}

#[test]
fn a_second_process_cannot_write_while_one_does_and_reads_what_it_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut writer = Database::open(&path).unwrap();
    writer.execute("CREATE TABLE t (id BIGINT PRIMARY KEY); INSERT INTO t VALUES (1);").unwrap();
    // A second session (the lock is per open file, so this stands for another process).
    let mut other = Database::open(&path).unwrap();
    assert_eq!(query(&mut other, "SELECT id FROM t"), ["1"]);
    let err = error(&mut other, "INSERT INTO t VALUES (2)");
    assert!(err.contains("is being written by another process (process "), "{err}");
    assert!(err.contains(&format!("process {}", std::process::id())), "the holder is named: {err}");
    writer.execute("INSERT INTO t VALUES (3)").unwrap();
    // The reader sees each committed statement.
    assert_eq!(query(&mut other, "SELECT id FROM t"), ["1", "3"]);
    // Once the writer ends, the other writes, from the last committed state.
    writer.execute("DELETE FROM t WHERE id = 1").unwrap();
    drop(writer);
    other.execute("INSERT INTO t VALUES (4)").unwrap();
    drop(other);
    let mut db = Database::open(&path).unwrap();
    assert_eq!(query(&mut db, "SELECT id FROM t"), ["3", "4"]);
}

#[test]
fn a_view_refreshed_by_a_new_process_reads_the_changes_from_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut db = Database::open(&path).unwrap();
    db.execute(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, v DOUBLE); INSERT INTO t VALUES (1, 1, 1.0), (2, 1, 2.0), \
         (3, 2, 3.0); CREATE MATERIALIZED VIEW s AS SELECT g, SUM(v) AS total, COUNT(*) AS n FROM t GROUP BY g;",
    )
    .unwrap();
    db.execute("DELETE FROM t WHERE id = 1; UPDATE t SET v = 30.0 WHERE id = 3; INSERT INTO t VALUES (4, 2, 4.0);")
        .unwrap();
    drop(db);
    // The deleted rows of each change are counted in the manifest, read when the refresh needs
    // them.
    let manifest = std::fs::read_to_string(path.join("MANIFEST")).unwrap();
    assert_eq!(manifest.matches("\"deleted_rows\": 1").count(), 2, "{manifest}");
    let mut db = Database::open(&path).unwrap();
    db.execute("REFRESH MATERIALIZED VIEW s").unwrap();
    // g 1: only 2.0 is left; g 2: 30.0 and 4.0.
    assert_eq!(query(&mut db, "SELECT g, total, n FROM s ORDER BY g"), ["1|2.0|1", "2|34.0|2"]);
}

#[test]
fn a_writer_waits_for_the_lock_as_long_as_lock_wait_ms_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut writer = Database::open(&path).unwrap();
    writer.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)").unwrap();
    let mut other = Database::open(&path).unwrap();
    other.execute("SET lock_wait_ms = 100").unwrap();
    let started = std::time::Instant::now();
    let err = error(&mut other, "INSERT INTO t VALUES (2)");
    assert!(err.contains("(waited 100 ms: SET lock_wait_ms)"), "{err}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(100), "it waited");
    // Waiting long enough, the statement runs once the writer ends, on what it committed.
    other.execute("SET lock_wait_ms = 60000").unwrap();
    let ends = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        writer.execute("INSERT INTO t VALUES (1)").unwrap();
    });
    other.execute("INSERT INTO t VALUES (2)").unwrap();
    ends.join().unwrap();
    assert_eq!(query(&mut other, "SELECT id FROM t ORDER BY id"), ["1", "2"]);
}

#[test]
fn a_damaged_data_file_is_named_and_a_damaged_manifest_is_recovered_from_the_previous() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut db = Database::open(&path).unwrap();
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v DOUBLE); INSERT INTO t VALUES (1, 1.0), (2, 2.0);").unwrap();
    db.execute("INSERT INTO t VALUES (3, 3.0)").unwrap();
    let data_files = |path: &std::path::Path| -> std::collections::BTreeSet<std::path::PathBuf> {
        std::fs::read_dir(path.join("data")).unwrap().map(|e| e.unwrap().path()).collect()
    };
    let of_t = data_files(&path);
    db.execute("CREATE TABLE other (id BIGINT PRIMARY KEY); INSERT INTO other VALUES (7);").unwrap();
    drop(db);
    // Flipped bytes in the middle of a data file of `t`.
    let file = of_t.iter().max_by_key(|p| std::fs::metadata(p).unwrap().len()).unwrap().clone();
    let original = std::fs::read(&file).unwrap();
    let mut flipped = original.clone();
    let middle = flipped.len() / 2;
    flipped[middle..middle + 8].iter_mut().for_each(|b| *b ^= 0xff);
    std::fs::write(&file, &flipped).unwrap();
    // Opening reads the manifest, not the rows: the other table is read and written as ever;
    // whatever reads `t` names the damaged file.
    let mut db = Database::open(&path).unwrap();
    db.execute("INSERT INTO other VALUES (8)").unwrap();
    assert_eq!(query(&mut db, "SELECT id FROM other"), ["7", "8"]);
    for statement in ["SELECT * FROM t", "INSERT INTO t VALUES (4, 4.0)", "DELETE FROM t WHERE id = 1"] {
        let err = error(&mut db, statement);
        assert!(
            err.contains(&format!("{} is damaged: its contents do not match its checksum", file.display())),
            "{statement}: {err}"
        );
    }
    drop(db);
    std::fs::write(&file, &original).unwrap();

    // A damaged manifest: named, with the way back.
    let manifest = path.join("MANIFEST");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("\"sequence\": 6"), "{text}");
    std::fs::write(&manifest, text.replacen("\"sequence\": 6", "\"sequence\": 9", 1)).unwrap();
    let err = Database::open(&path).err().unwrap().to_string();
    assert!(err.contains("is damaged (its contents do not match its checksum)"), "{err}");
    assert!(err.contains("the previous manifest (sequence 5, before the last statement) is intact"), "{err}");
    let said = storage::recover(&path).unwrap();
    assert!(said.contains("back at sequence 5"), "{said}");
    let mut db = Database::open(&path).unwrap();
    assert_eq!(query(&mut db, "SELECT id FROM t"), ["1", "2", "3"]);
    assert_eq!(query(&mut db, "SELECT id FROM other"), ["7"], "as before the last statement");
    assert!(path.join("MANIFEST.damaged-6").exists(), "the damaged manifest is kept");
}

#[test]
fn create_table_as_a_query_takes_its_columns_and_rows() {
    let mut db = Database::in_memory().unwrap();
    db.execute("CREATE TABLE a (k BIGINT PRIMARY KEY, v VARCHAR); INSERT INTO a VALUES (1, 'x'), (2, 'y');").unwrap();
    db.execute("CREATE TABLE b AS SELECT * FROM a WHERE k > 1; CREATE TABLE c AS VALUES (1), (2);").unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM b"), ["2|y"]);
    assert_eq!(query(&mut db, "SELECT column1 FROM c"), ["1", "2"]);
    // Declared columns take the query's values by position, with checked conversion.
    db.execute("CREATE TABLE d (id INT PRIMARY KEY, name VARCHAR) AS SELECT k, v FROM a").unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM d"), ["1|x", "2|y"]);
    let err = error(&mut db, "CREATE TABLE e (id INT) AS SELECT v FROM a");
    assert!(err.contains("column `id` of `e` is INT: 'x' is not a INT"), "{err}");
    assert!(db.table("e").is_none(), "a refused CREATE creates nothing");
    let err = error(&mut db, "CREATE TABLE f AS SELECT NULL AS n");
    assert!(err.contains("has no type"), "{err}");
    let err = error(&mut db, "CREATE TABLE g ()");
    assert!(err.contains("has no columns"), "{err}");
}

#[test]
fn tablesample_is_refused_with_its_position() {
    let mut db = Database::in_memory().unwrap();
    db.execute("CREATE TABLE a (k BIGINT)").unwrap();
    let err = error(&mut db, "SELECT COUNT(*) FROM a\n  TABLESAMPLE BERNOULLI (10)");
    assert!(err.contains("TABLESAMPLE of `a` is not supported") && err.contains("line 1"), "{err}");
}

#[test]
fn errors_point_into_the_script_with_sql_names_and_what_datafusion_has_is_there() {
    let mut db = Database::in_memory().unwrap();
    db.execute("CREATE TABLE t (a BIGINT, d DATE, s VARCHAR); INSERT INTO t VALUES (1, '2024-03-05', 'hello');")
        .unwrap();
    let err = error(&mut db, "SELECT a\n  FROM t WHERE nosuch = 1");
    assert!(err.contains("column 'nosuch' not found at line 2, column 16"), "{err}");
    let err = error(&mut db, "DELETE FROM t WHERE nosuch = 1");
    assert!(err.contains("at line 1, column 21") && !err.contains("_tessera"), "{err}");
    let err = error(&mut db, "UPDATE t SET a = a + 'x'");
    assert!(err.contains("incompatible types (has type BIGINT; has type VARCHAR) at line 1, column 18"), "{err}");
    db.execute("CREATE MATERIALIZED VIEW v AS SELECT COUNT(*) AS n FROM t").unwrap();
    let err = error(&mut db, "DROP TABLE v");
    assert!(err.contains("`v` is a materialized view, not a table"), "{err}");
    assert_eq!(
        query(&mut db, "SELECT EXTRACT(month FROM d), substring(s, 1, 2), [a, a + 1], position('l' IN s) FROM t"),
        ["3|he|[1, 2]|3"]
    );
}

/// A number given to INSERT: an integer literal or a float literal.
#[derive(Debug, Clone, Copy)]
enum Given {
    Integer(i64),
    Float(f64),
}

/// What a numeric column of `sql_type` must store for `given`, by the rules of SQL rather than
/// by Arrow's casts: the same number (a float column: the nearest one it holds), or `None`
/// where it must refuse (out of range, a fraction for an integer column).
fn numeric_reference(sql_type: &str, given: Given) -> Option<f64> {
    // Integer columns hold [low, high).
    let (low, high) = match sql_type {
        "SMALLINT" => (i16::MIN as f64, -(i16::MIN as f64)),
        "INT" => (i32::MIN as f64, -(i32::MIN as f64)),
        "BIGINT" => (i64::MIN as f64, -(i64::MIN as f64)),
        "REAL" => {
            return match given {
                Given::Integer(v) => Some(v as f32 as f64),
                Given::Float(f) => Some(f as f32 as f64).filter(|v| v.is_finite()),
            }
        }
        _ => {
            return Some(match given {
                Given::Integer(v) => v as f64,
                Given::Float(f) => f,
            })
        }
    };
    match given {
        Given::Integer(v) => {
            let fits = match sql_type {
                "SMALLINT" => i16::try_from(v).is_ok(),
                "INT" => i32::try_from(v).is_ok(),
                _ => true,
            };
            Some(v as f64).filter(|_| fits)
        }
        Given::Float(f) => Some(f).filter(|f| f.fract() == 0.0 && (low..high).contains(f)),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 200, ..Default::default() })]

    /// INSERT of any number into a numeric column stores that number or is refused naming the
    /// column, never NULL or a truncated value in its place.
    #[test]
    fn a_number_is_stored_as_given_or_refused(
        sql_type in proptest::sample::select(vec!["SMALLINT", "INT", "BIGINT", "REAL", "DOUBLE"]),
        given in proptest::prop_oneof![
            proptest::num::i64::ANY.prop_map(Given::Integer),
            (-100_000i64..100_000).prop_map(Given::Integer),
            proptest::num::f64::NORMAL.prop_map(Given::Float),
            (-1e6f64..1e6).prop_map(Given::Float),
            (-40_000i64..40_000).prop_map(|v| Given::Float(v as f64)),
        ],
    ) {
        let mut db = Database::in_memory().unwrap();
        db.execute(&format!("CREATE TABLE t (x {sql_type})")).unwrap();
        let literal = match given {
            Given::Integer(v) => v.to_string(),
            // Rust writes the shortest text that reads back as the same double.
            Given::Float(f) => format!("{f:?}"),
        };
        let result = db.execute(&format!("INSERT INTO t VALUES ({literal})"));
        match (numeric_reference(sql_type, given), result) {
            (Some(expected), Ok(_)) => {
                let Outcome::Rows { batches, .. } = db.execute("SELECT CAST(x AS DOUBLE) FROM t").unwrap().remove(0) else {
                    panic!("no rows")
                };
                let stored = batches[0].column(0).as_any().downcast_ref::<arrow::array::Float64Array>().unwrap();
                prop_assert!(arrow::array::Array::is_valid(stored, 0), "{literal} into {sql_type} stored NULL");
                prop_assert_eq!(stored.value(0), expected, "{} into {}", literal, sql_type);
            }
            (None, Err(e)) => prop_assert!(e.to_string().contains("column `x` of `t`"), "{literal} into {sql_type}: {e}"),
            (expected, result) => prop_assert!(false, "{literal} into {sql_type}: expected {expected:?}, got {result:?}"),
        }
    }
}

#[test]
fn information_schema_lists_every_table_and_view_with_its_columns() {
    let mut db = Database::in_memory().unwrap();
    db.execute(
        "CREATE TABLE \"My T\" (id BIGINT PRIMARY KEY, d DATE);
         CREATE MATERIALIZED VIEW v AS SELECT COUNT(*) AS n FROM \"My T\";",
    )
    .unwrap();
    assert_eq!(
        query(&mut db, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"),
        ["My T", "v"]
    );
    assert_eq!(
        query(&mut db, "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'My T'"),
        ["d|Date32", "id|Int64"]
    );
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 300, ..Default::default() })]

    /// Any `SET name = value` in a database script is taken (and `SHOW name` gives a value that
    /// `SET` takes back to the same settings) or refused naming the setting: never ignored.
    #[test]
    fn any_setting_is_taken_and_shown_or_refused(
        name in proptest::prop_oneof![
            proptest::sample::select(tessera::settings::SETTINGS.iter().map(|s| s.name.to_string()).collect::<Vec<_>>()),
            "[a-z_]{1,12}".prop_map(|name| name),
        ],
        value in proptest::prop_oneof![
            Just("auto".to_string()), Just("many".to_string()), Just("wcg".to_string()), Just("exact".to_string()),
            Just("true".to_string()), Just("kept_whole".to_string()), Just("0.5".to_string()),
            (-5i64..2_000_000).prop_map(|n| n.to_string()),
            "[ -~]{0,10}",
        ],
    ) {
        let mut db = Database::in_memory().unwrap();
        let quoted = value.replace('\'', "''");
        match db.execute(&format!("SET {name} = '{quoted}'")) {
            Ok(_) => {
                let Outcome::Rows { batches, .. } = db.execute(&format!("SHOW {name}")).unwrap().remove(0) else {
                    panic!("SHOW gave no rows")
                };
                let shown = arrow::util::display::array_value_to_string(batches[0].column(0), 0).unwrap();
                let before = db.settings().clone();
                db.execute(&format!("SET {name} = '{shown}'")).unwrap();
                prop_assert_eq!(db.settings(), &before, "{} = {} shown as {}", name, value, shown);
            }
            Err(e) => prop_assert!(e.to_string().contains(&name), "{name} = {value}: {e}"),
        }
    }
}

/// A table of several row groups whose rows were deleted across them, read back by a new
/// process through the Parquet scan: the live rows, and only they, under filters, projections
/// and limits; a chunk with flipped bytes is named by any query that reads it.
#[test]
fn a_table_of_many_row_groups_is_scanned_without_its_deleted_rows_and_every_chunk_read_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let n: i64 = 300_000;
    let mut db = Database::open(&path).unwrap();
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, v DOUBLE)").unwrap();
    db.execute(&format!("INSERT INTO t SELECT value, value % 7, value * 0.5 FROM generate_series(1, {n})")).unwrap();
    db.execute("DELETE FROM t WHERE id % 3 = 0 OR id BETWEEN 130000 AND 140000").unwrap();
    drop(db);
    let live: Vec<i64> = (1..=n).filter(|id| id % 3 != 0 && !(130_000..=140_000).contains(id)).collect();
    let mut db = Database::open(&path).unwrap();
    assert_eq!(query(&mut db, "SELECT COUNT(*) FROM t"), [live.len().to_string()]);
    let sum: i64 = live.iter().sum();
    let g3: f64 = live.iter().filter(|id| *id % 7 == 3).map(|id| *id as f64 * 0.5).sum();
    assert_eq!(query(&mut db, "SELECT SUM(id) FROM t"), [sum.to_string()]);
    assert_eq!(query(&mut db, "SELECT SUM(v) FROM t WHERE g = 3"), [format!("{g3:.1}")]);
    let near: Vec<String> =
        live.iter().filter(|id| (129_990..=140_010).contains(*id)).map(|id| id.to_string()).collect();
    assert_eq!(query(&mut db, "SELECT id FROM t WHERE id BETWEEN 129990 AND 140010 ORDER BY id"), near);
    assert_eq!(
        query(&mut db, "SELECT id FROM t WHERE id > 299990 ORDER BY id LIMIT 3"),
        ["299992", "299993", "299995"]
    );
    drop(db);

    // UPDATE and DELETE name rows by position, read through the scan by a new process.
    let mut db = Database::open(&path).unwrap();
    db.execute("UPDATE t SET v = -1 WHERE id BETWEEN 250000 AND 250010").unwrap();
    db.execute("DELETE FROM t WHERE g = 5 AND id > 290000").unwrap();
    drop(db);
    let live: Vec<i64> = live.into_iter().filter(|id| !(id % 7 == 5 && *id > 290_000)).collect();
    let updated = live.iter().filter(|id| (250_000..=250_010).contains(*id)).count();
    let mut db = Database::open(&path).unwrap();
    assert_eq!(query(&mut db, "SELECT COUNT(*) FROM t"), [live.len().to_string()]);
    assert_eq!(query(&mut db, "SELECT COUNT(*) FROM t WHERE v = -1"), [updated.to_string()]);
    assert_eq!(query(&mut db, "SELECT SUM(id) FROM t"), [live.iter().sum::<i64>().to_string()]);
    drop(db);

    // Flipped bytes in the middle of the file: inside some column chunk.
    let file = std::fs::read_dir(path.join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle..middle + 4].iter_mut().for_each(|b| *b ^= 0x5a);
    std::fs::write(&file, &bytes).unwrap();
    let mut db = Database::open(&path).unwrap();
    let err = error(&mut db, "SELECT SUM(id), SUM(g), SUM(v) FROM t");
    assert!(err.contains(&format!("{} is damaged: its contents do not match its checksum", file.display())), "{err}");
}

/// A database of format 2 (Arrow IPC files, written by tessera before its tables were Parquet):
/// read as it is, and written as format 3 from its next statement on, its old files still read.
#[test]
fn a_database_of_format_2_is_read_and_carried_on_in_format_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/databases/format2");
    std::fs::create_dir_all(path.join("data")).unwrap();
    std::fs::copy(fixture.join("MANIFEST"), path.join("MANIFEST")).unwrap();
    for file in std::fs::read_dir(fixture.join("data")).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), path.join("data").join(file.file_name())).unwrap();
    }
    let mut db = Database::open(&path).unwrap();
    assert_eq!(query(&mut db, "SELECT id, v FROM t ORDER BY id"), ["1|a", "3|c"]);
    assert_eq!(query(&mut db, "SELECT rows FROM n"), ["2"]);
    db.execute("INSERT INTO t VALUES (4, 'd'); UPDATE t SET v = 'z' WHERE id = 1; REFRESH MATERIALIZED VIEW n")
        .unwrap();
    drop(db);
    let manifest = std::fs::read_to_string(path.join("MANIFEST")).unwrap();
    assert!(manifest.contains("\"format\": 3"), "{manifest}");
    let mut db = Database::open(&path).unwrap();
    assert_eq!(query(&mut db, "SELECT id, v FROM t ORDER BY id"), ["1|z", "3|c", "4|d"]);
    assert_eq!(query(&mut db, "SELECT rows FROM n"), ["3"]);
}

/// Under `SET memory_limit`, a sort larger than the limit spills to the folder's `tmp/` and
/// answers as without it; a join whose build side cannot spill stops with the limit named.
#[test]
fn a_statement_stays_within_the_memory_limit_or_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut db = Database::open(&path).unwrap();
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT, note VARCHAR)").unwrap();
    db.execute(
        "INSERT INTO t SELECT value, (value * 7919) % 1000003, 'note number ' || value FROM generate_series(1, 600000)",
    )
    .unwrap();
    drop(db);
    let mut db = Database::open(&path).unwrap();
    let sorted = "SELECT id, v, note FROM t ORDER BY v DESC, id";
    let unlimited = query_in_order(&mut db, sorted);
    db.execute("SET memory_limit = '16MB'").unwrap();
    assert_eq!(query(&mut db, "SHOW memory_limit"), ["16MB"]);
    assert_eq!(query_in_order(&mut db, sorted), unlimited);
    let err = error(&mut db, "SELECT COUNT(*) FROM t a JOIN t b ON a.note = b.note");
    assert!(err.contains("needs more memory than memory_limit (16MB) allows"), "{err}");
    assert!(error(&mut db, "SET memory_limit = '100KB'").contains("at least 1MB"));
    db.execute("SET memory_limit = none").unwrap();
    assert_eq!(query(&mut db, "SELECT COUNT(*) FROM t a JOIN t b ON a.note = b.note"), ["600000"]);
}

/// The rows of a query, as text, in the order it gives them.
fn query_in_order(db: &mut Database, sql: &str) -> Vec<String> {
    rows_in_order(&db.execute(sql).unwrap().pop().unwrap())
}

/// The segments of table `name` as the folder's manifest names them: (file, rows, whether
/// it has deleted rows).
fn segments(path: &std::path::Path, name: &str) -> Vec<(String, u64, bool)> {
    let text = std::fs::read_to_string(path.join("MANIFEST")).unwrap();
    let sealed: serde_json::Value = serde_json::from_str(&text).unwrap();
    let segments = sealed["manifest"]["tables"][name]["segments"].as_array().unwrap().clone();
    segments
        .iter()
        .map(|s| (s["file"].as_str().unwrap().to_string(), s["rows"].as_u64().unwrap(), !s["deleted"].is_null()))
        .collect()
}

fn data_files(path: &std::path::Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(path.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Small segments are merged as statements go, four of a size at a time, and segments a
/// quarter deleted are rewritten; `VACUUM FULL` leaves one segment. The rows, the keys, the
/// view's changes and a new process's reads stay as a model says.
#[test]
fn segments_are_compacted_as_statements_go_and_by_vacuum_keeping_rows_keys_and_views() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut db = Database::open(&path).unwrap();
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT)").unwrap();
    db.execute("CREATE MATERIALIZED VIEW m AS SELECT g, COUNT(*) AS n, SUM(id) AS s FROM t GROUP BY g").unwrap();
    let mut model: BTreeMap<i64, i64> = BTreeMap::new();
    for id in 1..=100 {
        db.execute(&format!("INSERT INTO t VALUES ({id}, {})", id % 3)).unwrap();
        model.insert(id, id % 3);
        // Tiers of four: never more than three segments of a size.
        let sizes = segments(&path, "t");
        let mut tiers: BTreeMap<u32, usize> = BTreeMap::new();
        for (_, rows, _) in &sizes {
            *tiers.entry(rows.ilog2() / 2).or_default() += 1;
        }
        assert!(tiers.values().all(|&n| n < 4), "after {id} inserts: {sizes:?}");
    }
    // 100 = 64 + 2 * 16 + 4 in tiers of 4^3, 4^2 and 4^1.
    let rows: Vec<u64> = segments(&path, "t").iter().map(|s| s.1).collect();
    assert_eq!(rows.iter().sum::<u64>(), 100);
    assert!(rows.len() <= 4, "{rows:?}");
    // A key held is refused after the merges renumbered the rows; a deleted one comes back.
    let err = error(&mut db, "INSERT INTO t VALUES (37, 0)");
    assert!(err.contains("duplicate primary key in `t`: (id) = (37)"), "{err}");
    db.execute("DELETE FROM t WHERE id BETWEEN 1 AND 40").unwrap();
    model.retain(|id, _| *id > 40);
    db.execute("INSERT INTO t VALUES (7, 2)").unwrap();
    model.insert(7, 2);
    db.execute("UPDATE t SET g = 5 WHERE id > 90").unwrap();
    model.range_mut(91..=100).for_each(|(_, g)| *g = 5);
    let expected = |model: &BTreeMap<i64, i64>| {
        let mut groups: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
        for (id, g) in model {
            let group = groups.entry(*g).or_default();
            group.0 += 1;
            group.1 += id;
        }
        let mut rows = groups.iter().map(|(g, (n, s))| format!("{g}|{n}|{s}")).collect::<Vec<_>>();
        rows.sort();
        rows
    };
    let ids = |model: &BTreeMap<i64, i64>| {
        let mut rows = model.iter().map(|(id, g)| format!("{id}|{g}")).collect::<Vec<_>>();
        rows.sort();
        rows
    };
    assert_eq!(query(&mut db, "SELECT id, g FROM t"), ids(&model));

    // VACUUM FULL: one segment without deleted rows, the same rows, and the view's changes
    // still there for its incremental refresh.
    let vacuumed = query(&mut db, "VACUUM FULL t");
    assert_eq!(vacuumed.len(), 1, "{vacuumed:?}");
    let fields: Vec<&str> = vacuumed[0].split('|').collect();
    assert_eq!(fields[..2], ["t", "table"], "{vacuumed:?}");
    assert_eq!(fields[3..5], ["1".to_string(), model.len().to_string()], "{vacuumed:?}");
    assert_eq!(segments(&path, "t"), vec![(segments(&path, "t")[0].0.clone(), model.len() as u64, false)]);
    assert_eq!(query(&mut db, "SELECT id, g FROM t"), ids(&model));
    assert!(query(&mut db, "EXPLAIN REFRESH MATERIALIZED VIEW m").concat().contains("incremental"));
    db.execute("REFRESH MATERIALIZED VIEW m").unwrap();
    assert_eq!(query(&mut db, "SELECT g, n, s FROM m"), expected(&model));
    // Nothing left to do, and the files replaced are gone once no manifest names them.
    assert!(query(&mut db, "VACUUM").contains(&"t|table|1|1|0|0".to_string()));
    let manifests = ["MANIFEST", "MANIFEST.prev"].map(|m| std::fs::read_to_string(path.join(m)).unwrap());
    for file in data_files(&path) {
        assert!(manifests.iter().any(|m| m.contains(&file)), "{file} is named by no manifest");
    }
    drop(db);
    let mut db = Database::open(&path).unwrap();
    assert_eq!(query(&mut db, "SELECT id, g FROM t"), ids(&model));
    assert!(error(&mut db, "INSERT INTO t VALUES (50, 1)").contains("(id) = (50)"));
    db.execute("INSERT INTO t VALUES (1, 1)").unwrap();
    model.insert(1, 1);
    db.execute("REFRESH MATERIALIZED VIEW m").unwrap();
    assert_eq!(query(&mut db, "SELECT g, n, s FROM m"), expected(&model));
    let err = error(&mut db, "VACUUM nothing");
    assert!(err.contains("no table or materialized view `nothing` to vacuum"), "{err}");
    let err = error(&mut db, "VACUUM SORT ONLY t");
    assert!(err.contains("VACUUM [FULL] [table or materialized view]"), "{err}");
}

/// A reader keeps the files of the state it reads while the writer deletes, compacts and
/// inserts past it; they are removed once it ends, as are the registrations of readers that
/// ended without saying so.
#[test]
fn a_reader_keeps_the_files_of_the_state_it_reads_until_it_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut writer = Database::open(&path).unwrap();
    writer.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR)").unwrap();
    writer.execute("INSERT INTO t SELECT value, 'v' || value FROM generate_series(1, 1000)").unwrap();
    writer.execute("DELETE FROM t WHERE id % 2 = 0").unwrap();
    let mut reader = Database::open(&path).unwrap();
    assert_eq!(query(&mut reader, "SELECT COUNT(*) FROM t"), ["500"]);
    let read = segments(&path, "t");
    // The writer moves on: the reader's files are neither its manifest's nor the previous one's.
    writer.execute("DELETE FROM t WHERE id < 100").unwrap();
    writer.execute("INSERT INTO t VALUES (2000, 'new')").unwrap();
    writer.execute("VACUUM FULL").unwrap();
    writer.execute("INSERT INTO t VALUES (2001, 'newer')").unwrap();
    let prev = std::fs::read_to_string(path.join("MANIFEST.prev")).unwrap();
    assert!(read.iter().all(|(file, _, _)| !prev.contains(file)), "{read:?}");
    assert!(segments(&path, "t").iter().all(|s| !read.contains(s)));
    let files = data_files(&path);
    assert!(read.iter().all(|(file, _, _)| files.contains(file)), "{read:?} in {files:?}");
    // The reader reads its state from them (not the newest: it has not run a statement since).
    let rows: usize = reader.table("t").unwrap().batches().unwrap().iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 500);
    // Its next statement reads the newest state, and the writer's next commit drops the old.
    assert_eq!(query(&mut reader, "SELECT COUNT(*) FROM t"), ["452"]);
    writer.execute("INSERT INTO t VALUES (2002, 'newest')").unwrap();
    let files = data_files(&path);
    assert!(read.iter().all(|(file, _, _)| !files.contains(file)), "{read:?} in {files:?}");
    // A registration whose reader ended without removing it (killed) holds nothing.
    drop(reader);
    assert_eq!(std::fs::read_dir(path.join("readers")).unwrap().count(), 0);
    let stale = std::fs::read(path.join("MANIFEST")).unwrap();
    std::fs::write(path.join("readers").join("999999-0"), stale).unwrap();
    let kept = segments(&path, "t");
    writer.execute("VACUUM FULL").unwrap();
    writer.execute("INSERT INTO t VALUES (2003, 'last')").unwrap();
    writer.execute("INSERT INTO t VALUES (2004, 'last')").unwrap();
    assert_eq!(std::fs::read_dir(path.join("readers")).unwrap().count(), 0);
    let files = data_files(&path);
    assert!(kept.iter().all(|(file, _, _)| !files.contains(file)), "{kept:?} in {files:?}");
}
