use super::*;

/// The rows of a query's outcome, sorted, as text.
fn rows(outcome: &Outcome) -> Vec<String> {
    let mut lines = rows_in_order(outcome);
    lines.sort();
    lines
}

/// The rows of a query's outcome, as text, in the order it gives them.
fn rows_in_order(outcome: &Outcome) -> Vec<String> {
    let Outcome::Rows { batches, .. } = outcome else { panic!("no rows: {outcome:?}") };
    let mut lines = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            let values: Vec<String> = (0..batch.num_columns())
                .map(|c| arrow::util::display::array_value_to_string(batch.column(c), row).unwrap())
                .collect();
            lines.push(values.join("|"));
        }
    }
    lines
}

fn query(db: &mut Database, sql: &str) -> Vec<String> {
    rows(&db.execute(sql).unwrap().pop().unwrap())
}

#[test]
fn tables_take_inserts_updates_and_deletes_and_answer_joins() {
    let mut db = Database::in_memory().unwrap();
    db.execute(
        "CREATE TABLE video (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE);
         CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT);
         CREATE MATERIALIZED VIEW owners AS SELECT owner_id, COUNT(*) AS videos FROM video GROUP BY owner_id;
         INSERT INTO video VALUES (1, 10, 3.5), (2, 10, 60.0), (3, 20, 12.25);
         INSERT INTO log VALUES (100, 1), (101, 1), (102, 2), (103, 3), (104, 3), (105, 3);",
    )
    .unwrap();
    let visits = "SELECT video_id, owner_id, COUNT(*) AS visits FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id";
    assert_eq!(query(&mut db, visits), ["1|10|2", "2|10|1", "3|20|3"]);
    db.execute("UPDATE video SET owner_id = 30 WHERE duration > 10; DELETE FROM log WHERE session_id IN (100, 104);")
        .unwrap();
    assert_eq!(query(&mut db, visits), ["1|10|1", "2|30|1", "3|30|2"]);
    // Columns left out of an INSERT are NULL; ORDER BY and LIMIT run in DataFusion.
    db.execute("INSERT INTO video (video_id) VALUES (4)").unwrap();
    assert_eq!(
        query(&mut db, "SELECT video_id, owner_id IS NULL FROM video ORDER BY video_id DESC LIMIT 2"),
        ["3|false", "4|true"]
    );
    // What each statement changed, in order: the change relations.
    let changes = db.table("video").unwrap().changes();
    let counts: Vec<(usize, usize)> = changes
        .iter()
        .map(|c| (c.inserted.as_ref().map_or(0, |r| r.num_rows()), c.deleted.as_ref().map_or(0, |r| r.num_rows())))
        .collect();
    assert_eq!(counts, [(3, 0), (2, 2), (1, 0)]);
    assert!(changes.windows(2).all(|w| w[0].sequence < w[1].sequence));
    // Kept while a view needs them: `log` is read by none, and a refresh takes `video`'s.
    assert!(db.table("log").unwrap().changes().is_empty());
    db.execute("REFRESH MATERIALIZED VIEW owners").unwrap();
    assert!(db.table("video").unwrap().changes().is_empty());
    let err = db.execute("DROP TABLE video").unwrap_err().to_string();
    assert!(err.contains("materialized view `owners` reads `video`: drop the view first"), "{err}");
}

#[test]
fn a_duplicate_key_names_it_and_applies_nothing() {
    let mut db = Database::in_memory().unwrap();
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v VARCHAR); INSERT INTO t VALUES (1, 'a'), (2, 'b');").unwrap();
    let err = db.execute("INSERT INTO t VALUES (3, 'c'), (2, 'again')").unwrap_err().to_string();
    assert!(err.contains("duplicate primary key in `t`: (k) = (2)"), "{err}");
    let err = db.execute("INSERT INTO t VALUES (5, 'x'), (5, 'y')").unwrap_err().to_string();
    assert!(err.contains("(k) = (5)"), "{err}");
    // An update that moves a key onto another row's is refused too; one that swaps is not.
    let err = db.execute("UPDATE t SET k = 2 WHERE k = 1").unwrap_err().to_string();
    assert!(err.contains("(k) = (2)"), "{err}");
    db.execute("UPDATE t SET k = 3 - k").unwrap();
    assert_eq!(query(&mut db, "SELECT k, v FROM t"), ["1|b", "2|a"]);
    let err = db.execute("INSERT INTO t VALUES (NULL, 'n')").unwrap_err().to_string();
    assert!(err.contains("cannot be NULL"), "{err}");
    assert_eq!(db.table("t").unwrap().rows(), 2);
}

#[test]
fn a_table_without_a_key_keeps_duplicate_rows() {
    let mut db = Database::in_memory().unwrap();
    db.execute("CREATE TABLE t (a BIGINT, b DOUBLE); INSERT INTO t VALUES (1, 1.5), (1, 1.5), (2, NULL);").unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM t"), ["1|1.5", "1|1.5", "2|"]);
    db.execute("DELETE FROM t WHERE b IS NULL").unwrap();
    assert_eq!(query(&mut db, "SELECT COUNT(*) FROM t"), ["2"]);
}

#[test]
fn a_folder_keeps_the_database_and_refuses_what_is_not_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let mut db = Database::open(&path).unwrap();
        db.execute(
            "CREATE TABLE t (k BIGINT PRIMARY KEY, v DOUBLE);
             CREATE MATERIALIZED VIEW total AS SELECT k % 2 AS odd, SUM(v) AS v FROM t GROUP BY k % 2;
             INSERT INTO t VALUES (1, 1.0), (2, 2.0), (3, 3.0);
             DELETE FROM t WHERE k = 2;
             UPDATE t SET v = 30.0 WHERE k = 3;",
        )
        .unwrap();
    }
    let mut db = Database::open(&path).unwrap();
    assert_eq!(query(&mut db, "SELECT k, v FROM t"), ["1|1.0", "3|30.0"]);
    assert_eq!(db.table("t").unwrap().changes().len(), 3);
    let err = db.execute("INSERT INTO t VALUES (3, 0.0)").unwrap_err().to_string();
    assert!(err.contains("(k) = (3)"), "the key index is rebuilt on open: {err}");
    db.execute("DROP MATERIALIZED VIEW total; DROP TABLE t;").unwrap();
    // The previous manifest still names them, to recover to.
    assert!(std::fs::read_dir(path.join("data")).unwrap().count() > 0);
    db.execute("CREATE TABLE u (k BIGINT)").unwrap();
    drop(db);
    assert_eq!(std::fs::read_dir(path.join("data")).unwrap().count(), 0, "a dropped table's files go");

    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "hello").unwrap();
    let err = Database::open(&other).err().unwrap().to_string();
    assert!(err.contains("is not a tessera database"), "{err}");
    std::fs::write(other.join("MANIFEST"), "{\"kind\": \"something else\"}").unwrap();
    let err = Database::open(&other).err().unwrap().to_string();
    assert!(err.contains("is not a tessera database"), "{err}");
}

#[test]
fn files_a_statement_left_unnamed_are_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    Database::open(&path).unwrap().execute("CREATE TABLE t (k BIGINT PRIMARY KEY); INSERT INTO t VALUES (1);").unwrap();
    // As if a statement had written its file and been killed before its manifest.
    std::fs::write(path.join("data").join("99999999.arrow"), b"half").unwrap();
    let mut db = Database::open(&path).unwrap();
    assert!(!path.join("data").join("99999999.arrow").exists());
    assert_eq!(query(&mut db, "SELECT k FROM t"), ["1"]);
}

#[test]
fn initial_contents_come_from_csv_jsonl_and_parquet() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("v.csv"), "video_id,owner_id,duration\n1,10,3.5\n2,,60\n").unwrap();
    std::fs::write(dir.path().join("v.jsonl"), "{\"video_id\": 3, \"owner_id\": 30, \"duration\": 1.0}\n").unwrap();
    let mut db = Database::in_memory().unwrap();
    let csv = dir.path().join("v.csv");
    let jsonl = dir.path().join("v.jsonl");
    db.execute(&format!(
        "CREATE TABLE a (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE) WITH (path = '{}');
         CREATE TABLE b (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE) WITH (path = '{}', format = 'jsonl');",
        csv.display(),
        jsonl.display()
    ))
    .unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM a UNION ALL SELECT * FROM b"), ["1|10|3.5", "2||60.0", "3|30|1.0"]);
    let parquet = dir.path().join("v.parquet");
    let batch = db.table("a").unwrap().batches().unwrap().remove(0);
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&parquet).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    db.execute(&format!(
        "CREATE TABLE c (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE) WITH (path = '{}')",
        parquet.display()
    ))
    .unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM c"), ["1|10|3.5", "2||60.0"]);
}

#[test]
fn copy_inserts_a_file_or_applies_its_operations() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let mut db = Database::in_memory().unwrap();
    db.execute(
        "CREATE TABLE t (k BIGINT PRIMARY KEY, v DOUBLE, note VARCHAR);
         CREATE MATERIALIZED VIEW notes AS SELECT note, COUNT(*) AS n FROM t GROUP BY note;",
    )
    .unwrap();
    // Columns by name, in any order; a column the file lacks is NULL.
    let first = file("first.csv", "v,k\n1.5,1\n2.5,2\n3.5,3\n");
    db.execute(&format!("COPY t FROM '{first}'")).unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM t"), ["1|1.5|", "2|2.5|", "3|3.5|"]);
    let ops = file(
        "ops.csv",
        "k,v,note,op\n4,4.5,new,insert\n2,20.0,changed,U\n3,,,delete\n5,5.0,brief,I\n5,,,D\n4,40.0,twice,update\n",
    );
    db.execute(&format!("COPY t FROM '{ops}' WITH (format = 'csv', op_column = 'op')")).unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM t"), ["1|1.5|", "2|20.0|changed", "4|40.0|twice"]);
    let change = db.table("t").unwrap().changes().last().unwrap().clone();
    assert_eq!(
        (change.inserted.map(|r| r.num_rows()), change.deleted.map(|r| r.num_rows())),
        (Some(2), Some(2)),
        "the update of 2 and the delete of 3 as deletions; 2 and 4 inserted"
    );
    // A key inserted twice, or one deleted that no row holds, applies nothing of the file.
    let bad = file("bad.csv", "k,op\n6,I\n1,I\n");
    let err = db.execute(&format!("COPY t FROM '{bad}' WITH (op_column = 'op')")).unwrap_err().to_string();
    assert!(err.contains("row 2 of the file inserts a key `t` already holds"), "{err}");
    let missing = file("missing.csv", "k,op\n6,I\n99,D\n");
    let err = db.execute(&format!("COPY t FROM '{missing}' WITH (op_column = 'op')")).unwrap_err().to_string();
    assert!(err.contains("row 2 of the file (d) names a key of `t` that no row holds"), "{err}");
    let unknown = file("unknown.csv", "k,op\n6,upsert\n");
    let err = db.execute(&format!("COPY t FROM '{unknown}' WITH (op_column = 'op')")).unwrap_err().to_string();
    assert!(err.contains("expected insert, update or delete"), "{err}");
    assert_eq!(query(&mut db, "SELECT COUNT(*) FROM t"), ["3"]);
    // Options and columns are checked.
    let err = db.execute(&format!("COPY t FROM '{first}' WITH (colour = 'red')")).unwrap_err().to_string();
    assert!(err.contains("COPY has no option `colour`"), "{err}");
    let extra = file("extra.csv", "k,colour\n7,red\n");
    let err = db.execute(&format!("COPY t FROM '{extra}'")).unwrap_err().to_string();
    assert!(err.ends_with("extra.csv:1: the header has a column `colour`, which table `t` does not"), "{err}");
    // A table without a key takes rows, not operations.
    db.execute("CREATE TABLE bag (k BIGINT)").unwrap();
    let err = db.execute(&format!("COPY bag FROM '{missing}' WITH (op_column = 'op')")).unwrap_err().to_string();
    assert!(err.contains("has no primary key"), "{err}");
}

#[test]
fn sql_errors_point_at_the_line_and_column() {
    let mut db = Database::in_memory().unwrap();
    let err = db.execute("CREATE TABLE t (k BIGINT);\nINSERT INTO t VALUES (1,;").unwrap_err().to_string();
    assert!(err.contains("line 2"), "{err}");
    assert!(err.contains('^'), "{err}");
}

/// One statement of a random workload, and what it does to a model of the table.
#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<(i64, Option<i64>)>),
    Delete(i64),
    Bump(i64),
    MoveKey(i64, i64),
    Copy(Vec<(i64, Option<i64>, char)>),
    Reopen,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let value = proptest::option::weighted(0.8, -5i64..5);
    prop_oneof![
        3 => proptest::collection::vec((0i64..12, value.clone()), 0..4).prop_map(Op::Insert),
        1 => (0i64..12).prop_map(Op::Delete),
        1 => (0i64..12).prop_map(Op::Bump),
        1 => (0i64..12, 0i64..12).prop_map(|(a, b)| Op::MoveKey(a, b)),
        2 => proptest::collection::vec((0i64..12, value, proptest::sample::select(vec!['I', 'U', 'D'])), 0..5)
            .prop_map(Op::Copy),
        1 => Just(Op::Reopen),
    ]
}

/// What `op` does to `model`, or `None` if the statement must fail (and change nothing).
fn apply_to_model(model: &BTreeMap<i64, Option<i64>>, op: &Op) -> Option<BTreeMap<i64, Option<i64>>> {
    let mut next = model.clone();
    match op {
        Op::Insert(rows) => {
            for (k, v) in rows {
                if next.insert(*k, *v).is_some() {
                    return None;
                }
            }
        }
        Op::Delete(k) => {
            next.remove(k);
        }
        Op::Bump(below) => next.iter_mut().filter(|(k, _)| *k < below).for_each(|(_, v)| *v = v.map(|v| v + 1)),
        Op::MoveKey(from, to) => {
            if let Some(v) = next.remove(from) {
                if next.insert(*to, v).is_some() {
                    return None;
                }
            }
        }
        Op::Copy(rows) => {
            for (k, v, op) in rows {
                match op {
                    'I' if next.contains_key(k) => return None,
                    'I' => {
                        next.insert(*k, *v);
                    }
                    'U' if next.contains_key(k) => {
                        next.insert(*k, *v);
                    }
                    'D' if next.remove(k).is_some() => {}
                    _ => return None,
                }
            }
        }
        Op::Reopen => {}
    }
    Some(next)
}

fn sql_value(v: &Option<i64>) -> String {
    v.map_or("NULL".into(), |v| v.to_string())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]
    /// Random inserts, deletes, updates (of values and of keys) and COPYs with operations, some
    /// refused for their keys, against a model of the table; the folder reopened at random
    /// points. After every statement the table holds exactly the model's rows, and a refused
    /// statement changed nothing.
    #[test]
    fn tables_follow_a_model_through_random_statements(ops in proptest::collection::vec(op(), 1..25)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let mut db = Database::open(&path).unwrap();
        db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT)").unwrap();
        let mut model = BTreeMap::new();
        for (n, op) in ops.iter().enumerate() {
            let sql = match op {
                Op::Insert(rows) if rows.is_empty() => continue,
                Op::Insert(rows) => format!(
                    "INSERT INTO t VALUES {}",
                    rows.iter().map(|(k, v)| format!("({k}, {})", sql_value(v))).collect::<Vec<_>>().join(", ")
                ),
                Op::Delete(k) => format!("DELETE FROM t WHERE k = {k}"),
                Op::Bump(below) => format!("UPDATE t SET v = v + 1 WHERE k < {below}"),
                Op::MoveKey(from, to) => format!("UPDATE t SET k = {to} WHERE k = {from}"),
                Op::Copy(rows) => {
                    let text: String = rows
                        .iter()
                        .map(|(k, v, op)| format!("{k},{},{op}\n", v.map_or(String::new(), |v| v.to_string())))
                        .collect();
                    let file = dir.path().join(format!("ops{n}.csv"));
                    std::fs::write(&file, format!("k,v,op\n{text}")).unwrap();
                    format!("COPY t FROM '{}' WITH (op_column = 'op')", file.display())
                }
                Op::Reopen => {
                    drop(db);
                    db = Database::open(&path).unwrap();
                    String::new()
                }
            };
            let expected = apply_to_model(&model, op);
            if !sql.is_empty() {
                let result = db.execute(&sql);
                proptest::prop_assert_eq!(result.is_ok(), expected.is_some(), "{} gave {:?}", sql, result.err());
            }
            if let Some(next) = expected {
                model = next;
            }
            let want: Vec<String> = model.iter().map(|(k, v)| format!("{k}|{}", v.map_or(String::new(), |v| v.to_string()))).collect();
            let mut want = want;
            want.sort();
            proptest::prop_assert_eq!(query(&mut db, "SELECT k, v FROM t"), want, "after {:?}", op);
        }
    }
}

#[test]
fn a_materialized_view_is_stale_until_refreshed_and_kept_in_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut db = Database::open(&path).unwrap();
    db.execute(
        "CREATE TABLE video (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE);
         CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT);
         INSERT INTO video VALUES (1, 10, 3.5), (2, 20, 60.0);
         INSERT INTO log VALUES (100, 1), (101, 1), (102, 2);
         CREATE MATERIALIZED VIEW visit_view AS
             SELECT video_id, owner_id, duration, COUNT(*) AS visit_count
             FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id, duration;",
    )
    .unwrap();
    let counts = "SELECT video_id, visit_count FROM visit_view";
    assert_eq!(query(&mut db, counts), ["1|2", "2|1"]);
    // Changes leave the view as it was until it is refreshed.
    db.execute("INSERT INTO log VALUES (103, 2), (104, 2); DELETE FROM log WHERE session_id = 100;").unwrap();
    assert_eq!(query(&mut db, counts), ["1|2", "2|1"]);
    let refreshed_before = db.view("visit_view").unwrap().refreshed_at;
    db.execute("REFRESH MATERIALIZED VIEW visit_view").unwrap();
    assert_eq!(query(&mut db, counts), ["1|1", "2|3"]);
    assert!(db.view("visit_view").unwrap().refreshed_at > refreshed_before);
    // A view answers joins with tables, and is kept with its query.
    drop(db);
    let mut db = Database::open(&path).unwrap();
    assert_eq!(
        query(
            &mut db,
            "SELECT v.owner_id, SUM(visit_count) FROM visit_view v JOIN video USING (video_id) GROUP BY v.owner_id"
        ),
        ["10|1", "20|3"]
    );
    db.execute("INSERT INTO log VALUES (105, 1); REFRESH MATERIALIZED VIEW visit_view;").unwrap();
    assert_eq!(query(&mut db, counts), ["1|2", "2|3"]);
    // `exact` refreshes what a query reads first; `stale` answers from the contents again.
    db.execute("INSERT INTO log VALUES (106, 1)").unwrap();
    assert_eq!(query(&mut db, counts), ["1|2", "2|3"]);
    let err = db.execute("SELECT 1;\n SET freshness = 'fresh'").unwrap_err().to_string();
    assert!(err.contains("line 2") && err.contains("not one of stale, svc_aqp"), "{err}");
    db.execute("SET freshness = 'exact'").unwrap();
    assert_eq!(query(&mut db, counts), ["1|3", "2|3"]);
    db.execute("INSERT INTO log VALUES (107, 1); SET freshness TO stale").unwrap();
    assert_eq!(query(&mut db, counts), ["1|3", "2|3"]);
    let err = db.execute("CREATE TABLE visit_view (a BIGINT)").unwrap_err().to_string();
    assert!(err.contains("`visit_view` already exists"), "{err}");
    let err = db.execute("REFRESH MATERIALIZED VIEW nothing").unwrap_err().to_string();
    assert!(err.contains("no materialized view `nothing`"), "{err}");
    db.execute("DROP MATERIALIZED VIEW visit_view").unwrap();
    assert!(db.execute(counts).is_err());
    drop(db);
    let db = Database::open(&path).unwrap();
    assert!(db.view("visit_view").is_none());
}

/// Rows as text, equal but for floats within a relative 1e-9 (incremental sums add in another
/// order than recomputed ones).
fn same_rows_within_rounding(ours: &[String], theirs: &[String]) -> bool {
    let close = |a: &str, b: &str| match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0),
        _ => a == b,
    };
    ours.len() == theirs.len()
        && ours.iter().zip(theirs).all(|(a, b)| {
            let (a, b): (Vec<&str>, Vec<&str>) = (a.split('|').collect(), b.split('|').collect());
            a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| close(x, y))
        })
}

/// View shapes: name, query, whether it is maintained incrementally.
const VIEWS: [(&str, &str, bool); 27] = [
    ("joined", "SELECT a.g, COUNT(*) AS n, SUM(b.y) AS s, AVG(a.x) AS m FROM a JOIN b ON a.k = b.k GROUP BY a.g", true),
    ("filtered", "SELECT g, COUNT(x) AS c, SUM(x) AS s FROM a WHERE x > 0 GROUP BY g", true),
    ("paired", "SELECT b.k, a.g, COUNT(*) AS n, AVG(b.y) AS m FROM b JOIN a USING (k) GROUP BY b.k, a.g", true),
    ("comma_join", "SELECT a.g, SUM(b.y) AS s FROM a, b WHERE a.k = b.k AND b.y > 0 GROUP BY a.g", true),
    ("extreme", "SELECT g, MAX(x) AS hi, MIN(x) AS lo, COUNT(*) AS n FROM a GROUP BY g", true),
    ("spread", "SELECT b.k, VAR(b.y) AS v, STDDEV_POP(b.y) AS sd FROM b GROUP BY b.k", true),
    ("having", "SELECT g, SUM(x) AS s FROM a GROUP BY g HAVING COUNT(*) > 1", true),
    ("outer", "SELECT a.g, COUNT(b.id) AS n FROM a LEFT JOIN b ON a.k = b.k GROUP BY a.g", true),
    ("full_rows", "SELECT a.k AS ak, a.x, b.id, b.y FROM a FULL JOIN b ON a.k = b.k", true),
    ("right_rows", "SELECT a.g, b.id FROM a RIGHT JOIN b ON a.k = b.k AND a.x > b.y", true),
    ("rows", "SELECT a.g, b.y FROM a JOIN b ON a.k = b.k WHERE b.y IS NOT NULL", true),
    ("self_join", "SELECT p.k, q.id FROM b p JOIN b q ON p.k = q.k AND p.id < q.id", true),
    ("distinct", "SELECT DISTINCT g FROM a", true),
    ("distinct_join", "SELECT DISTINCT a.g, b.k FROM a JOIN b ON a.k = b.k", true),
    ("union", "SELECT k FROM a UNION SELECT k FROM b", true),
    ("union_all", "SELECT k, g AS v FROM a UNION ALL SELECT k, y FROM b", true),
    ("intersect", "SELECT k FROM a INTERSECT SELECT k FROM b", true),
    ("except", "SELECT k FROM a EXCEPT SELECT k FROM b", true),
    ("semi", "SELECT k, g FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k)", false),
    ("nested", "SELECT s.g, COUNT(*) AS n FROM (SELECT a.g, b.id FROM a JOIN b ON a.k = b.k) s GROUP BY s.g", true),
    (
        "inner_aggregate",
        "SELECT a.g, t.total FROM a JOIN (SELECT k, SUM(y) AS total FROM b GROUP BY k) t ON a.k = t.k",
        true,
    ),
    ("keyless", "SELECT w, COUNT(*) AS n FROM c GROUP BY w", true),
    ("keyless_rows", "SELECT w FROM c WHERE w > 1", true),
    ("windowed", "SELECT k, SUM(x) OVER (PARTITION BY g) AS running FROM a", false),
    (
        "over_grouped",
        "SELECT j.g, SUM(j.n) AS total, MAX(j.m) AS hi FROM joined j JOIN a ON j.g = a.g GROUP BY j.g",
        true,
    ),
    ("over_rows", "SELECT y, COUNT(*) AS n FROM rows WHERE g > 0 GROUP BY y", true),
    ("over_recomputed", "SELECT k, running FROM windowed WHERE running > 0", true),
];

/// A random change of the property tests' tables a, b and c: step `n` of kind `kind` (0 to 7)
/// with key, group and value.
fn change_statement(n: usize, kind: u8, key: i64, group: i64, value: Option<i64>) -> String {
    let x = value.map_or("NULL".to_string(), |v| format!("{}.5", v));
    let y = value.map_or("NULL".to_string(), |v| v.to_string());
    match kind {
        6 => format!("INSERT INTO c VALUES ({group})"),
        7 => format!("DELETE FROM c WHERE w = {group}"),
        0 => format!("INSERT INTO a VALUES ({key}, {group}, {x})"),
        1 => format!("INSERT INTO b VALUES ({}, {}, {y})", 100 + n, key % 8),
        2 => format!("UPDATE a SET x = {x}, g = {group} WHERE k = {key}"),
        3 => format!("UPDATE b SET y = {y}, k = {} WHERE id % 4 = {group}", key % 8),
        4 => format!("DELETE FROM a WHERE k = {key}"),
        _ => format!("DELETE FROM b WHERE k = {}", key % 8),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 16, ..Default::default() })]
    /// Views of every shape refreshed after random inserts, updates and deletes of both tables
    /// (incrementally where EXPLAIN says so) hold what their queries compute from scratch.
    #[test]
    fn refreshed_views_equal_their_recomputation(
        steps in proptest::collection::vec((0u8..8, 0i64..8, 0i64..4, proptest::option::weighted(0.8, -20i64..20)), 1..20),
        refresh_every in 1usize..7,
    ) {
        let mut db = Database::in_memory().unwrap();
        db.execute(
            "CREATE TABLE a (k BIGINT PRIMARY KEY, g BIGINT, x DOUBLE);
             CREATE TABLE b (id BIGINT PRIMARY KEY, k BIGINT, y BIGINT);
             CREATE TABLE c (w BIGINT);
             INSERT INTO a VALUES (1, 0, 1.5), (2, 1, -2.25), (3, 1, NULL);
             INSERT INTO b VALUES (10, 1, 5), (11, 1, NULL), (12, 3, 7);
             INSERT INTO c VALUES (1), (2), (2);",
        )
        .unwrap();
        for (name, query, _) in VIEWS {
            db.execute(&format!("CREATE MATERIALIZED VIEW {name} AS {query}")).unwrap();
        }
        for (name, _, incremental) in VIEWS {
            let explained = query(&mut db, &format!("EXPLAIN REFRESH MATERIALIZED VIEW {name}"));
            let strategy = explained.iter().find(|r| r.starts_with("refresh|")).unwrap();
            proptest::prop_assert_eq!(strategy.contains("incremental"), incremental, "{}: {:?}", name, explained);
        }
        for (n, (kind, key, group, value)) in steps.iter().enumerate() {
            let sql = change_statement(n, *kind, *key, *group, *value);
            // A duplicate key is refused, and changes nothing.
            let _ = db.execute(&sql);
            if (n + 1) % refresh_every == 0 || n + 1 == steps.len() {
                for (name, view_query, _) in VIEWS {
                    db.execute(&format!("REFRESH MATERIALIZED VIEW {name}")).unwrap();
                    let stored = query(&mut db, &format!("SELECT * FROM {name}"));
                    let fresh = query(&mut db, view_query);
                    proptest::prop_assert!(same_rows_within_rounding(&stored, &fresh), "{} after {}: {:?} against {:?}", name, sql, stored, fresh);
                }
            }
        }
    }
}

/// A statement of the kinds tables take, possibly mangled: characters cut out or put in.
fn mangled_statement() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let statements = vec![
        "INSERT INTO t VALUES (1, 2.5, 'a'), (2, NULL, 'b')",
        "INSERT INTO t (k, note) SELECT k + 10, note FROM t WHERE v > 0",
        "UPDATE t SET v = v * 2, note = 'x' WHERE k < 3",
        "UPDATE t SET k = k + 1",
        "DELETE FROM t WHERE note = 'a' OR v IS NULL",
        "SELECT k, SUM(v) FROM t GROUP BY k HAVING COUNT(*) > 0 ORDER BY 1 LIMIT 2",
        "CREATE MATERIALIZED VIEW m AS SELECT note, COUNT(*) AS n FROM t GROUP BY note",
        "REFRESH MATERIALIZED VIEW m",
        "COPY t FROM 'ops.csv' WITH (op_column = 'op')",
        "DROP TABLE t",
    ];
    (
        proptest::sample::select(statements),
        proptest::collection::vec((0usize..80, proptest::option::of(any::<char>())), 0..3),
    )
        .prop_map(|(statement, edits)| {
            let mut chars: Vec<char> = statement.chars().collect();
            for (at, insert) in edits {
                let at = at.min(chars.len());
                match insert {
                    Some(c) => chars.insert(at, c),
                    None if at < chars.len() => {
                        chars.remove(at);
                    }
                    None => {}
                }
            }
            chars.into_iter().collect()
        })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]
    /// Mangled statements and COPY files of random bytes never panic, and a statement that
    /// fails changes nothing.
    #[test]
    fn bad_statements_and_files_change_nothing(
        statements in proptest::collection::vec(mangled_statement(), 1..6),
        file in proptest::collection::vec(proptest::sample::select(b"0123456789,.-\n\"'IUDxn ko\xff".to_vec()), 0..60),
        header in proptest::sample::select(vec!["k,v,note,op\n", "k,op\n", "op,k\n", "", "k,v\n"]),
    ) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ops.csv"), [header.as_bytes(), &file].concat()).unwrap();
        let mut db = Database::in_memory().unwrap();
        db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v DOUBLE, note VARCHAR); INSERT INTO t VALUES (1, 1.5, 'a'), (5, NULL, 'c');")
            .unwrap();
        for statement in statements {
            let statement = statement.replace("'ops.csv'", &format!("'{}'", dir.path().join("ops.csv").display()));
            let before = db.table("t").is_some().then(|| query(&mut db, "SELECT * FROM t"));
            if db.execute(&statement).is_err() {
                let after = db.table("t").is_some().then(|| query(&mut db, "SELECT * FROM t"));
                proptest::prop_assert_eq!(before, after, "{} failed and changed the table", statement);
            }
        }
    }
}

#[test]
fn a_view_over_a_view_is_refreshed_after_it_and_reopens_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut db = Database::open(&path).unwrap();
    db.execute(
        "CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT, seconds DOUBLE);
         INSERT INTO log VALUES (1, 7, 10.0), (2, 7, 20.0), (3, 8, 5.0);
         CREATE MATERIALIZED VIEW per_video AS
             SELECT video_id, COUNT(*) AS visits, SUM(seconds) AS watched FROM log GROUP BY video_id;
         CREATE MATERIALIZED VIEW popular AS SELECT video_id, watched FROM per_video WHERE visits > 1;",
    )
    .unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM popular"), ["7|30.0"]);
    drop(db);
    // Views load after the views they read.
    let mut db = Database::open(&path).unwrap();
    db.execute("INSERT INTO log VALUES (4, 8, 1.5); DELETE FROM log WHERE session_id = 1;").unwrap();
    let explained = query(&mut db, "EXPLAIN REFRESH MATERIALIZED VIEW popular");
    assert!(explained.iter().any(|r| r.starts_with("refresh|incremental")), "{explained:?}");
    assert!(explained.iter().any(|r| r.starts_with("key|(per_video._tessera_row_id)")), "{explained:?}");
    // Refreshing the outer view refreshes the inner one first.
    db.execute("REFRESH MATERIALIZED VIEW popular").unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM per_video"), ["7|1|20.0", "8|2|6.5"]);
    assert_eq!(query(&mut db, "SELECT * FROM popular"), ["8|6.5"]);
    let err = db.execute("DROP MATERIALIZED VIEW per_video").unwrap_err().to_string();
    assert!(err.contains("`popular` reads"), "{err}");
}

#[test]
fn a_window_query_fills_a_table_that_a_view_reads() {
    let dir = tempfile::tempdir().unwrap();
    // Two devices; device 1 twice in the first minute, out of order; device 2 once per minute;
    // a last reading at 3 s, late for its minute (the watermark is at 70 by then: counted, not
    // aggregated) but not for its hour.
    std::fs::write(
        dir.path().join("readings.csv"),
        "device_id,temperature,ts\n1,20.5,10\n2,7.0,15\n1,19.0,5\n2,9.5,70\n1,30.0,75\n2,1.0,3\n",
    )
    .unwrap();
    let mut db = Database::in_memory().unwrap();
    db.set_base_dir(dir.path());
    db.execute(
        "CREATE SOURCE readings (device_id BIGINT, temperature DOUBLE, ts BIGINT,
             WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
             WITH (connector = 'file', path = 'readings.csv', format = 'csv', time_unit = 's');
         CREATE TABLE per_minute (device_id BIGINT, window_start TIMESTAMP, low DOUBLE, n BIGINT)
             WITH (time_unit = 's');
         INSERT INTO per_minute
             SELECT device_id, window_start, MIN(temperature), COUNT(*)
             FROM TUMBLE(readings, ts, INTERVAL '1' MINUTE) GROUP BY device_id, window_start, window_end;
         CREATE MATERIALIZED VIEW coldest AS SELECT device_id, MIN(low) AS low, SUM(n) AS n FROM per_minute GROUP BY device_id;",
    )
    .unwrap();
    assert_eq!(
        query(&mut db, "SELECT device_id, low, n FROM per_minute"),
        ["1|19.0|2", "1|30.0|1", "2|7.0|1", "2|9.5|1"]
    );
    assert_eq!(query(&mut db, "SELECT * FROM coldest"), ["1|19.0|3", "2|7.0|2"]);
    // The window's start in seconds, as the table's time_unit says.
    assert_eq!(
        query(&mut db, "SELECT DISTINCT window_start FROM per_minute"),
        ["1970-01-01T00:00:00", "1970-01-01T00:01:00"]
    );
    // The stream answers queries too, and a second run appends its rows.
    assert_eq!(
        query(&mut db, "SELECT device_id, COUNT(*) AS n FROM TUMBLE(readings, ts, INTERVAL '1' HOUR) GROUP BY device_id, window_start, window_end"),
        ["1|3", "2|3"]
    );
    db.execute(
        "INSERT INTO per_minute SELECT device_id, window_start, MAX(temperature), 1
             FROM TUMBLE(readings, ts, INTERVAL '1' HOUR) GROUP BY device_id, window_start, window_end;
         REFRESH MATERIALIZED VIEW coldest;",
    )
    .unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM coldest"), ["1|19.0|4", "2|7.0|3"]);
    let totals = db.read_totals();
    assert_eq!((totals.events, totals.late_events, totals.skipped_rows), (18, 1, 0));
    for taken in [
        "CREATE SOURCE readings (a BIGINT, WATERMARK FOR a AS a) WITH (connector = 'file', path = 'x.csv')",
        "CREATE TABLE readings (a BIGINT)",
    ] {
        let err = db.execute(taken).unwrap_err();
        assert!(err.to_string().contains("`readings` already exists"), "{err}");
    }
    let err = db
        .execute("CREATE MATERIALIZED VIEW live AS SELECT device_id, COUNT(*) AS n FROM readings GROUP BY device_id")
        .unwrap_err();
    assert!(err.to_string().contains("`live` reads a stream"), "{err}");
    // Errors of a window query point into the statement as written.
    let err = db
        .execute("INSERT INTO per_minute\n  SELECT device_id, window_start, MIN(temprature), 1\n  FROM TUMBLE(readings, ts, INTERVAL '1' MINUTE) GROUP BY device_id, window_start, window_end")
        .unwrap_err();
    assert!(err.to_string().contains("unknown column `temprature` at line 2, column 39"), "{err}");
}

#[test]
fn malformed_rows_of_a_file_stop_the_statement_at_their_line_or_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.csv"), "k,v\n1,2\n2,x\n3,4\n").unwrap();
    std::fs::write(dir.path().join("b.tsv"), "4\t5\n5\t6\t7\n6\t\"quoted\nacross lines\"\n").unwrap();
    let mut db = Database::in_memory().unwrap();
    db.set_base_dir(dir.path());
    db.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT)").unwrap();
    let err = db.execute("COPY t FROM 'a.csv'").unwrap_err().to_string();
    assert!(err.ends_with("a.csv:3: cannot read 'x' as BIGINT in column `v` (field 2)"), "{err}");
    assert_eq!(query(&mut db, "SELECT COUNT(*) FROM t"), ["0"]);
    // Skipped rows of two statements go to one dead-letter file, one after the other.
    db.execute(
        "COPY t FROM 'a.csv' WITH (on_error = 'skip', dead_letter = 'bad.jsonl');
         COPY t FROM 'b.tsv' WITH (format = 'csv', delimiter = '\\t', header = 'false', on_error = 'skip', dead_letter = 'bad.jsonl')",
    )
    .unwrap();
    assert_eq!(query(&mut db, "SELECT * FROM t ORDER BY k"), ["1|2", "3|4", "4|5"]);
    let totals = db.read_totals();
    assert_eq!(totals.skipped_rows, 3);
    assert_eq!(totals.dead_letter, Some(dir.path().join("bad.jsonl")));
    let letters = std::fs::read_to_string(dir.path().join("bad.jsonl")).unwrap();
    let lines: Vec<(String, u64)> = letters
        .lines()
        .map(|l| {
            let entry: serde_json::Value = serde_json::from_str(l).unwrap();
            (entry["file"].as_str().unwrap().rsplit('/').next().unwrap().to_string(), entry["line"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(lines, [("a.csv".to_string(), 3), ("b.tsv".to_string(), 2), ("b.tsv".to_string(), 3)]);
    let err = db.execute("COPY t FROM 'a.csv' WITH (on_eror = 'skip')").unwrap_err().to_string();
    assert!(err.contains("COPY has no option `on_eror`"), "{err}");
}

mod slt;
mod svc;
mod trust;
