//! Stale View Cleaning: samples kept clean by their cleaning expressions, and the estimators.

use std::collections::HashMap;

use datafusion::logical_expr::col;

use super::*;

/// The rows users see of the clean sample of view `name` (or its stale sample), sorted, as
/// text, with the sample key last.
fn sample_rows(db: &Database, name: &str, stale: bool) -> Vec<String> {
    let view = db.view(name).unwrap();
    let plan = db.sample_plan(view, view.sample.as_ref().expect("a sample"), stale, None).unwrap();
    let (schema, batches) = db.run_plan(plan).unwrap();
    rows(&Outcome::Rows { schema, batches })
}

/// The view shapes of [`VIEWS`] that read tables and are maintained incrementally.
fn sampled_shapes() -> impl Iterator<Item = (&'static str, &'static str)> {
    VIEWS.iter().filter(|(name, _, incremental)| *incremental && !name.starts_with("over_")).map(|(n, q, _)| (*n, *q))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 8, ..Default::default() })]
    /// The sample of every view shape, cleaned by its cleaning expression (the sampling pushed
    /// down the maintenance plan) after random changes, is the sample of the fresh view: what
    /// a full refresh samples again (Theorem 1; Property 1 for the keys).
    #[test]
    fn cleaned_samples_are_samples_of_the_fresh_views(
        steps in proptest::collection::vec((0u8..8, 0i64..50, 0i64..4, proptest::option::weighted(0.8, -20i64..20)), 1..12),
        clean_every in 1usize..5,
        seed in 0i32..1000,
    ) {
        let mut db = Database::in_memory().unwrap();
        db.execute(
            "CREATE TABLE a (k BIGINT PRIMARY KEY, g BIGINT, x DOUBLE);
             CREATE TABLE b (id BIGINT PRIMARY KEY, k BIGINT, y BIGINT);
             CREATE TABLE c (w BIGINT);
             INSERT INTO a SELECT value, value % 5 AS g, CAST(value % 7 AS DOUBLE) - 3.0 AS x FROM generate_series(1, 40);
             INSERT INTO a VALUES (41, 1, NULL);
             INSERT INTO b SELECT value + 1000, value % 45 AS k, value % 11 AS y FROM generate_series(1, 120);
             INSERT INTO b VALUES (2000, 3, NULL);
             INSERT INTO c SELECT value % 9 FROM generate_series(1, 30);",
        )
        .unwrap();
        for (name, query) in sampled_shapes() {
            db.execute(&format!("CREATE MATERIALIZED VIEW {name} WITH (sample = 0.5, sample_seed = {seed}) AS {query}")).unwrap();
        }
        for (n, (kind, key, group, value)) in steps.iter().enumerate() {
            let sql = change_statement(n, *kind, *key, *group, *value);
            let _ = db.execute(&sql);
            if (n + 1) % clean_every == 0 {
                for (name, _) in sampled_shapes() {
                    db.execute(&format!("REFRESH MATERIALIZED VIEW {name} SAMPLE")).unwrap();
                }
            }
        }
        for (name, _) in sampled_shapes() {
            db.execute(&format!("REFRESH MATERIALIZED VIEW {name} SAMPLE")).unwrap();
            let cleaned = sample_rows(&db, name, false);
            db.execute(&format!("REFRESH MATERIALIZED VIEW {name}")).unwrap();
            let sampled = sample_rows(&db, name, false);
            // The stale sample of a fresh view is its clean sample.
            proptest::prop_assert_eq!(&sample_rows(&db, name, true), &sampled);
            proptest::prop_assert!(same_rows_within_rounding(&cleaned, &sampled), "{}: {:?} against {:?}", name, cleaned, sampled);
        }
    }
}

#[test]
fn the_sample_hash_goes_down_to_the_tables_and_explain_says_where() {
    let mut db = Database::in_memory().unwrap();
    db.execute(
        "CREATE TABLE video (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE);
         CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT);
         INSERT INTO video SELECT value, value % 7 AS o, CAST(value AS DOUBLE) AS d FROM generate_series(1, 200);
         INSERT INTO log SELECT value, value % 200 + 1 AS v FROM generate_series(1, 2000);
         CREATE MATERIALIZED VIEW visit_view WITH (sample = 0.1) AS
             SELECT video_id, owner_id, duration, COUNT(*) AS visit_count
             FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id, duration;
         CREATE MATERIALIZED VIEW per_owner WITH (sample = 0.5) AS
             SELECT owner_id, COUNT(*) AS n FROM log JOIN video USING (video_id) GROUP BY owner_id;
         INSERT INTO log VALUES (5000, 3), (5001, 4);",
    )
    .unwrap();
    let explained = query(&mut db, "EXPLAIN REFRESH MATERIALIZED VIEW visit_view");
    let item = |name: &str| explained.iter().find(|r| r.starts_with(&format!("{name}|"))).cloned().unwrap_or_default();
    assert!(
        item("sample key").contains("(log.video_id); video.owner_id left out: the primary key of `video`"),
        "{explained:?}"
    );
    assert!(item("sample hash").contains("to both sides of the Inner join"), "{explained:?}");
    let cleaning = item("cleaning plan");
    assert!(cleaning.matches("xxhash64").count() >= 2, "{cleaning}");
    // A sample of about a tenth of the 200 videos.
    let sampled = sample_rows(&db, "visit_view", false).len();
    assert!((5..=40).contains(&sampled), "{sampled}");
    // Grouped by a column of the dimension only, the hash reaches the dimension's side alone.
    let explained = query(&mut db, "EXPLAIN REFRESH MATERIALIZED VIEW per_owner");
    assert!(explained.iter().any(|r| r.contains("to the right side (video) of the Inner join only")), "{explained:?}");
    // A foreign-key join view of rows is sampled by the fact table's key, at the fact table.
    db.execute(
        "CREATE MATERIALIZED VIEW visits WITH (sample = 0.2) AS
             SELECT session_id, video_id, owner_id FROM log JOIN video USING (video_id)",
    )
    .unwrap();
    let explained = query(&mut db, "EXPLAIN REFRESH MATERIALIZED VIEW visits");
    assert!(explained.iter().any(|r| r.starts_with("sample hash|to `log`")), "{explained:?}");
    assert!(explained.iter().any(|r| r.contains("the key of `video` left out")), "{explained:?}");
    // Bad options are refused with the reason.
    for (options, message) in [
        ("sample = 0", "must be in (0, 1]"),
        ("sample = 1.5", "must be in (0, 1]"),
        ("sample_seed = 3", "without sample"),
        ("samples = 0.1", "unknown option `samples`"),
    ] {
        let err =
            db.execute(&format!("CREATE MATERIALIZED VIEW bad WITH ({options}) AS SELECT * FROM log")).unwrap_err();
        assert!(err.to_string().contains(message), "{options}: {err}");
    }
    let err = db
        .execute("CREATE MATERIALIZED VIEW ranked WITH (sample = 0.1) AS SELECT session_id, ROW_NUMBER() OVER () AS r FROM log")
        .unwrap_err();
    assert!(err.to_string().contains("recomputed on refresh"), "{err}");
    let err = db.execute("REFRESH MATERIALIZED VIEW visit_view SAMPLE; CREATE MATERIALIZED VIEW plain AS SELECT * FROM log; REFRESH MATERIALIZED VIEW plain SAMPLE").unwrap_err();
    assert!(err.to_string().contains("has no sample"), "{err}");
}

#[test]
fn estimates_name_their_intervals_and_are_exact_with_the_whole_view_as_sample() {
    let mut db = Database::in_memory().unwrap();
    db.execute(
        "CREATE TABLE video (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE);
         CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT);
         INSERT INTO video SELECT value, value % 7 AS o, CAST(value AS DOUBLE) AS d FROM generate_series(1, 200);
         INSERT INTO log SELECT value, value % 200 + 1 AS v FROM generate_series(1, 3000);
         CREATE MATERIALIZED VIEW whole WITH (sample = 1) AS
             SELECT video_id, owner_id, duration, COUNT(*) AS visit_count
             FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id, duration;
         CREATE MATERIALIZED VIEW tenth WITH (sample = 0.1) AS
             SELECT video_id, owner_id, duration, COUNT(*) AS visit_count
             FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id, duration;
         CREATE MATERIALIZED VIEW plain AS SELECT video_id, COUNT(*) AS c FROM log GROUP BY video_id;
         INSERT INTO log SELECT value + 10000, value % 50 + 1 AS v FROM generate_series(1, 600);
         DELETE FROM log WHERE session_id % 10 = 3;",
    )
    .unwrap();
    // The fresh view, computed from the tables.
    let fresh = "(SELECT video_id, owner_id, duration, COUNT(*) AS visit_count \
                 FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id, duration) AS fresh";
    let global = "SELECT COUNT(*) AS n, AVG(duration) AS d FROM {v} WHERE visit_count > 15";
    let grouped = "SELECT owner_id, SUM(visit_count) AS v FROM {v} GROUP BY owner_id";
    // HAVING keeps the groups whose estimates meet it: some, not all, of the owners.
    let having = "SELECT owner_id, SUM(visit_count) AS v FROM {v} GROUP BY owner_id HAVING COUNT(*) > 25";
    let kept = query(&mut db, &having.replace("{v}", fresh)).len();
    assert!((1..7).contains(&kept), "{kept}");
    for freshness in ["svc_aqp", "svc_corr", "auto"] {
        db.execute(&format!("SET freshness = '{freshness}'")).unwrap();
        let Outcome::Rows { schema, .. } = db.execute(&global.replace("{v}", "tenth")).unwrap().pop().unwrap() else {
            panic!()
        };
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["n", "n_ci_low", "n_ci_high", "d", "d_ci_low", "d_ci_high"]);
        // A sample of the whole view estimates the fresh answer exactly, with no spread.
        for sql in [global, grouped, having] {
            let estimated = query(&mut db, &sql.replace("{v}", "whole"));
            let truth = query(&mut db, &sql.replace("{v}", fresh));
            let widened: Vec<String> = truth
                .iter()
                .map(|r| {
                    let mut cells: Vec<String> = r.split('|').map(String::from).collect();
                    let last = cells.len() - 1;
                    let value = cells[last].parse::<f64>().unwrap();
                    cells[last] = format!("{value}|{value}|{value}");
                    if sql == global {
                        let n = cells[0].parse::<f64>().unwrap();
                        cells[0] = format!("{n}|{n}|{n}");
                    }
                    cells.join("|")
                })
                .collect();
            assert!(
                same_rows_within_rounding(&estimated, &widened),
                "{freshness} {sql}: {estimated:?} against {widened:?}"
            );
        }
    }
    // Quantiles, MIN and MAX: the sample of the whole view gives the fresh answer; a 10%
    // sample an interval around the estimate.
    for medians in [
        "SELECT owner_id, MEDIAN(visit_count) AS md FROM {v} GROUP BY owner_id",
        "SELECT owner_id, PERCENTILE_CONT(visit_count, 0.9) AS p FROM {v} GROUP BY owner_id",
        "SELECT owner_id, APPROX_PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY duration) AS p FROM {v} GROUP BY owner_id",
        "SELECT owner_id, MAX(visit_count) AS mx FROM {v} GROUP BY owner_id",
        "SELECT owner_id, MIN(duration) AS mn FROM {v} WHERE visit_count > 10 GROUP BY owner_id",
    ] {
    // The fresh answer; APPROX_PERCENTILE_CONT's exact counterpart for the truth.
    let exact = medians.replace("APPROX_PERCENTILE_CONT", "PERCENTILE_CONT");
    let truth = query(&mut db, &exact.replace("{v}", fresh));
    for freshness in ["svc_aqp", "svc_corr"] {
        db.execute(&format!("SET freshness = '{freshness}'")).unwrap();
        let estimated: Vec<String> = query(&mut db, &medians.replace("{v}", "whole"))
            .iter()
            .map(|r| r.split('|').take(2).collect::<Vec<_>>().join("|"))
            .collect();
        let truth: Vec<String> = truth
            .iter()
            .map(|r| {
                format!("{}|{}", r.split('|').next().unwrap(), r.split('|').nth(1).unwrap().parse::<f64>().unwrap())
            })
            .collect();
        assert!(same_rows_within_rounding(&estimated, &truth), "{freshness} {medians}: {estimated:?} against {truth:?}");
        let rows = query(&mut db, &medians.replace("{v}", "tenth"));
        // Groups with sampled rows have an interval around the estimate (MIN's low and MAX's
        // high are NULL: nothing bounds them).
        let with_interval: Vec<Vec<f64>> = rows
            .iter()
            .filter_map(|row| {
                let cells: Vec<&str> = row.split('|').collect();
                let value = cells[1].parse::<f64>().ok()?;
                let low = cells[2].parse::<f64>().unwrap_or(f64::NEG_INFINITY);
                let high = cells[3].parse::<f64>().unwrap_or(f64::INFINITY);
                (low.is_finite() || high.is_finite()).then_some(vec![0.0, value, low, high])
            })
            .collect();
        assert!(with_interval.len() >= 3, "{freshness} {medians}: {rows:?}");
        for cells in with_interval {
            assert!(cells[2] <= cells[1] && cells[1] <= cells[3], "{freshness} {medians}: {cells:?}");
        }
    }
    }
    db.execute("SET freshness = 'svc_corr'").unwrap();
    // ORDER BY and LIMIT apply to the estimates.
    let top = "SELECT owner_id, SUM(visit_count) AS v FROM tenth GROUP BY owner_id ORDER BY v DESC LIMIT 3";
    let Outcome::Rows { batches, .. } = db.execute(top).unwrap().pop().unwrap() else { panic!() };
    let v: Vec<f64> = batches
        .iter()
        .flat_map(|b| b.column(1).as_primitive::<arrow::datatypes::Float64Type>().values().to_vec())
        .collect();
    assert!(v.len() == 3 && v[0] >= v[1] && v[1] >= v[2], "{v:?}");
    let explained = query(&mut db, &format!("EXPLAIN {}", global.replace("{v}", "tenth")));
    assert!(explained.iter().any(|r| r.starts_with("estimator|svc_corr")), "{explained:?}");
    assert!(explained.iter().any(|r| r.starts_with("sample key|(log.video_id)")), "{explained:?}");
    db.execute("SET freshness = 'auto'").unwrap();
    let explained = query(&mut db, &format!("EXPLAIN {}", global.replace("{v}", "tenth")));
    assert!(explained.iter().any(|r| r.starts_with("estimator|svc_") && r.contains("auto chose")), "{explained:?}");
    for (sql, message) in [
        ("SELECT COUNT(*) FROM plain", "`plain` has none"),
        ("SELECT STDDEV(duration) FROM tenth", "SUM, COUNT, AVG, MIN, MAX, MEDIAN and PERCENTILE_CONT"),
        ("SELECT PERCENTILE_CONT(duration, 1.5) FROM tenth", "the percentile is a number in [0, 1]"),
        ("SELECT COUNT(*) * 2 FROM tenth", "computed from aggregates"),
        (
            "SELECT t.owner_id, COUNT(*) FROM tenth t JOIN video v USING (video_id) GROUP BY t.owner_id",
            "reads tenth, video",
        ),
        ("SELECT video_id FROM tenth", "an estimate is of"),
    ] {
        let err = db.execute(sql).unwrap_err().to_string();
        assert!(err.contains(message), "{sql}: {err}");
    }
}

/// A small deterministic generator (xorshift64*), so the statistical tests are the same on
/// every run.
struct Random(u64);

impl Random {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Per group (its values as text): the value, low and high columns of an estimate of one
/// aggregate, or (`interval` false) the value of an exact answer.
fn answer(db: &mut Database, sql: &str, groups: usize, interval: bool) -> HashMap<Vec<String>, [f64; 3]> {
    rows(&db.execute(sql).unwrap().pop().unwrap())
        .iter()
        .map(|r| {
            let cells: Vec<&str> = r.split('|').collect();
            let number = |i: usize| cells[groups + i].parse::<f64>().unwrap_or(f64::NAN);
            let values = if interval { [number(0), number(1), number(2)] } else { [number(0); 3] };
            (cells[..groups].iter().map(|s| s.to_string()).collect(), values)
        })
        .collect()
}

/// A table `t (id, g, x)` of ids 1 to `rows`, `g` the id modulo 4 and `x` as `value` says.
fn random_table(db: &mut Database, random: &mut Random, rows: i64, value: impl Fn(i64, &mut Random) -> f64) {
    let values: Vec<String> = (1..=rows).map(|id| format!("({id}, {}, {:.3})", id % 4, value(id, random))).collect();
    db.execute(&format!(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, x DOUBLE); INSERT INTO t VALUES {};",
        values.join(", ")
    ))
    .unwrap();
}

/// `seeds` materialized views `{prefix}0` .. of `view`, each with the sample of its seed and
/// `options` (`sample = ...` and more).
fn sampled_views(db: &mut Database, prefix: &str, view: &str, seeds: usize, options: &str) {
    for seed in 0..seeds {
        db.execute(&format!(
            "CREATE MATERIALIZED VIEW {prefix}{seed} WITH ({options}, sample_seed = {seed}) AS {view}"
        ))
        .unwrap();
    }
}

/// Each estimator, over 125 samples (seeds) of one view after 10% of its rows were updated and
/// some deleted and inserted: unbiased (the mean over the samples within three standard errors
/// of the truth), 95% intervals (normal for SUM, COUNT and AVG, the bootstrap's for MEDIAN and
/// PERCENTILE_CONT)
/// covering the truth in 93-97% of 500 random queries, and the correction more accurate than
/// the clean sample alone.
#[test]
fn estimators_are_unbiased_and_their_intervals_cover_the_truth() {
    // Queries over one sample err alike, so each query draws its sample: had the sample
    // followed the query's number, as the aggregate does, each aggregate would be judged on a
    // fifth of the samples. Over 125 samples the coverage of 500 queries varies from run to run
    // by about 0.01 around its mean (0.015 over 50).
    const SEEDS: usize = 125;
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let mut db = Database::in_memory().unwrap();
    random_table(&mut db, &mut random, 3000, |_, random| 100.0 * random.next());
    let view = "SELECT id, g, SUM(x) AS x, COUNT(*) AS n FROM t GROUP BY id, g";
    sampled_views(&mut db, "v", view, SEEDS, "sample = 0.2");
    let inserted: Vec<String> =
        (5001..=5150).map(|id| format!("({id}, {}, {:.3})", id % 4, 100.0 * random.next())).collect();
    db.execute(&format!(
        "UPDATE t SET x = x * 1.5 + 7.0 WHERE id % 10 = 3;
         DELETE FROM t WHERE id % 33 = 1;
         INSERT INTO t VALUES {};",
        inserted.join(", ")
    ))
    .unwrap();
    let fresh = format!("({view}) AS f");
    let estimators = ["svc_aqp", "svc_corr"];
    let mut covered = [0usize; 2];
    let mut trials = 0usize;
    let mut errors: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    // Per estimator and aggregate: intervals, and those that cover the truth.
    let mut by_aggregate: HashMap<(usize, &str), (usize, usize)> = HashMap::new();
    for q in 0..500 {
        let aggregate = ["COUNT(*)", "SUM(x)", "AVG(x)", "MEDIAN(x)", "PERCENTILE_CONT(x, 0.8)"][q % 5];
        let groups = (q / 5) % 2;
        // Conditions on the values and on random halves to whole of the keys, so that the
        // queries over one sample do not all err alike.
        let bound = (60.0 * random.next()).round();
        let prime = [7919, 104729, 1299709, 15485863][(4.0 * random.next()) as usize];
        let share = 48 + (49.0 * random.next()) as i64;
        let sample = (SEEDS as f64 * random.next()) as usize;
        let (select, group_by) = if groups == 1 { ("g, ", " GROUP BY g") } else { ("", "") };
        let sql = format!(
            "SELECT {select}{aggregate} AS a FROM {{v}} WHERE x > {bound} AND (id * {prime}) % 97 < {share}{group_by}"
        );
        db.execute("SET freshness = 'stale'").unwrap();
        let truth = answer(&mut db, &sql.replace("{v}", &fresh), groups, false);
        for (e, freshness) in estimators.iter().enumerate() {
            db.execute(&format!("SET freshness = '{freshness}'")).unwrap();
            let estimated = answer(&mut db, &sql.replace("{v}", &format!("v{sample}")), groups, true);
            assert_eq!(estimated.len(), truth.len(), "{freshness} {sql}");
            for (key, [value, low, high]) in estimated {
                let expected = truth[&key][0];
                trials += usize::from(e == 0);
                covered[e] += usize::from(low <= expected && expected <= high);
                let counts = by_aggregate.entry((e, aggregate)).or_default();
                counts.0 += 1;
                counts.1 += usize::from(low <= expected && expected <= high);
                errors[e].push((value - expected).abs() / expected.abs());
            }
        }
    }
    for (e, name) in estimators.iter().enumerate() {
        let coverage = covered[e] as f64 / trials as f64;
        eprintln!("{name}: {coverage:.3} of {trials} intervals cover the truth");
        for ((_, aggregate), (n, c)) in by_aggregate.iter().filter(|((estimator, _), _)| *estimator == e) {
            eprintln!("  {aggregate}: {:.3} of {n}", *c as f64 / *n as f64);
        }
        assert!((0.93..=0.97).contains(&coverage), "{name}: {coverage} of {trials} intervals cover the truth");
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (aqp, corr) = (median(&mut errors[0]), median(&mut errors[1]));
    assert!(corr * 2.0 < aqp, "median relative error: svc_corr {corr} against svc_aqp {aqp}");
    // Unbiased: four queries over every sample.
    for sql in [
        "SELECT COUNT(*) AS a FROM {v} WHERE x > 30",
        "SELECT SUM(x) AS a FROM {v}",
        "SELECT AVG(x) AS a FROM {v} WHERE x > 50",
        "SELECT SUM(x) AS a FROM {v} WHERE g = 2",
    ] {
        db.execute("SET freshness = 'stale'").unwrap();
        let truth = answer(&mut db, &sql.replace("{v}", &fresh), 0, false)[&Vec::new()][0];
        for freshness in estimators {
            db.execute(&format!("SET freshness = '{freshness}'")).unwrap();
            let values: Vec<f64> = (0..SEEDS)
                .map(|seed| answer(&mut db, &sql.replace("{v}", &format!("v{seed}")), 0, true)[&Vec::new()][0])
                .collect();
            let mean = values.iter().sum::<f64>() / SEEDS as f64;
            let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (SEEDS - 1) as f64).sqrt();
            let error = sd / (SEEDS as f64).sqrt();
            assert!((mean - truth).abs() <= 3.0 * error, "{freshness} {sql}: mean {mean} ± {error} against {truth}");
        }
    }
}

/// Updates a tenth of `t`'s rows (an outlier among them), deletes some (an outlier, 334, among
/// them) and inserts 150, two of them outliers.
fn change_skewed_table(db: &mut Database, random: &mut Random) {
    let inserted: Vec<String> = (5001..=5150)
        .map(|id| {
            let x = if id <= 5002 { 80_000.0 } else { 100.0 * random.next() };
            format!("({id}, {}, {x:.3})", id % 4)
        })
        .collect();
    db.execute(&format!(
        "UPDATE t SET x = x * 1.5 + 7.0 WHERE id % 10 = 3;
         DELETE FROM t WHERE id % 33 = 1 OR id = 334;
         INSERT INTO t VALUES {};",
        inserted.join(", ")
    ))
    .unwrap();
}

/// The rows of view `name`'s clean (or stale) sample its outlier index flags, cleaned first:
/// their `columns`, sorted.
fn flagged(db: &mut Database, name: &str, stale: bool, columns: &[&str]) -> Vec<String> {
    db.clean_sample(name).unwrap();
    let view = db.view(name).unwrap();
    let sample = view.sample.as_ref().unwrap();
    let plan = db.sample_plan(view, sample, stale, sample.outlier_rows.as_ref()).unwrap();
    let plan = LogicalPlanBuilder::from(plan)
        .filter(col("__outlier"))
        .unwrap()
        .project(columns.iter().map(|c| col(*c)).collect::<Vec<_>>())
        .unwrap()
        .build()
        .unwrap();
    let (schema, batches) = db.run_plan(plan).unwrap();
    let mut rows = rows(&Outcome::Rows { schema, batches });
    rows.sort();
    rows
}

/// An outlier index picks its rows when the view is refreshed and keeps them in the database:
/// opened again, it flags the same rows, not the k largest of the table as it is by then; the
/// stale sample is the same too, and a refresh replaces it.
#[test]
fn the_outlier_index_keeps_the_rows_it_picked_at_refresh_across_opening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let values: Vec<String> = (1..=200).map(|id| format!("({id}, {}, {}.5)", id % 3, (id * 37) % 1000)).collect();
    let mut db = Database::open(&path).unwrap();
    db.execute(&format!(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, x DOUBLE); INSERT INTO t VALUES {};
         CREATE MATERIALIZED VIEW v WITH (sample = 0.2, outlier_index = 't.x', outlier_k = 5) AS
             SELECT id, g, x FROM t;
         INSERT INTO t VALUES (1001, 0, 5000.0), (1002, 1, 5001.0), (1003, 2, 5002.0), (1004, 0, 5003.0),
                              (1005, 1, 5004.0), (1006, 2, 1.0);",
        values.join(", ")
    ))
    .unwrap();
    // The five largest at the refresh and the five inserted above them since.
    let picked = flagged(&mut db, "v", false, &["id"]);
    assert_eq!(picked.len(), 10, "{picked:?}");
    // The stale sample kept from the refresh, and taken again from the view once opened.
    let stale = sample_rows(&db, "v", true);
    assert_ne!(stale, sample_rows(&db, "v", false));
    drop(db);
    let mut db = Database::open(&path).unwrap();
    assert_eq!(flagged(&mut db, "v", false, &["id"]), picked);
    assert_eq!(sample_rows(&db, "v", true), stale);
    // A refresh picks the five largest again, and its sample is the stale sample.
    db.execute("REFRESH MATERIALIZED VIEW v").unwrap();
    assert_eq!(flagged(&mut db, "v", false, &["id"]), ["1001", "1002", "1003", "1004", "1005"]);
    assert_eq!(sample_rows(&db, "v", true), sample_rows(&db, "v", false));
    assert_ne!(sample_rows(&db, "v", true), stale);
}

/// The outlier index (Section 6): the rows it keeps are the view's rows of the indexed rows'
/// keys, whole, clean or stale as asked; with it the estimates over a long-tailed column stay
/// unbiased and err far less than without; and its options are checked.
#[test]
fn the_outlier_index_keeps_the_extreme_rows_whole_and_tames_the_tail() {
    const SEEDS: usize = 30;
    let mut random = Random(0x005e_ed0f_0071_1e45);
    let mut db = Database::in_memory().unwrap();
    // Every 167th row's `x` is 50,000 or more: a long tail.
    random_table(&mut db, &mut random, 2000, |id, random| {
        if id % 167 == 0 {
            50_000.0 + 1000.0 * random.next()
        } else {
            100.0 * random.next()
        }
    });
    let view = "SELECT id, g, SUM(x) AS x, COUNT(*) AS n FROM t GROUP BY id, g";
    sampled_views(&mut db, "v", view, SEEDS, "sample = 0.1");
    sampled_views(&mut db, "o", view, SEEDS, "sample = 0.1, outlier_index = 't.x', outlier_threshold = 10000");
    db.execute(&format!(
        "CREATE MATERIALIZED VIEW top WITH (sample = 0.1, outlier_index = 't.x', outlier_k = 5) AS {view}"
    ))
    .unwrap();
    db.execute("CREATE TABLE created (id BIGINT PRIMARY KEY, g BIGINT, x DOUBLE); INSERT INTO created SELECT * FROM t")
        .unwrap();
    change_skewed_table(&mut db, &mut random);

    // The definition: the rows flagged as outliers are the fresh view's rows of the keys of
    // the rows of `t` above the threshold (clean), or the stale view's (stale), counting the
    // outlier deleted since the views were created; with a size, the rows of the k largest
    // when the view was created and of the rows changed since (old or new) that reach the k-th.
    let flagged = |db: &mut Database, name: &str, stale: bool| flagged(db, name, stale, &["id", "g", "x", "n"]);
    let sorted = |mut rows: Vec<String>| {
        rows.sort();
        rows
    };
    let fresh_outliers = query(
        &mut db,
        &format!("SELECT * FROM ({view}) AS f WHERE id IN (SELECT id FROM t WHERE x > 10000) ORDER BY id"),
    );
    assert_eq!(fresh_outliers.len(), 12, "{fresh_outliers:?}");
    let stale_outliers =
        query(&mut db, "SELECT * FROM o0 WHERE id IN (SELECT id FROM t WHERE x > 10000) OR id = 334 ORDER BY id");
    assert_eq!(stale_outliers.len(), 11, "{stale_outliers:?}");
    assert_eq!(flagged(&mut db, "o0", false), sorted(fresh_outliers));
    assert_eq!(flagged(&mut db, "o0", true), sorted(stale_outliers));
    let top_five = query(
        &mut db,
        &format!(
            "WITH top AS (SELECT id, x FROM created ORDER BY x DESC LIMIT 5),
                  changed AS ((SELECT id, x FROM created EXCEPT SELECT id, x FROM t)
                              UNION ALL (SELECT id, x FROM t EXCEPT SELECT id, x FROM created))
             SELECT * FROM ({view}) AS f
             WHERE id IN (SELECT id FROM top)
                OR id IN (SELECT id FROM changed WHERE x >= (SELECT MIN(x) FROM top))
             ORDER BY id"
        ),
    );
    let top_now = query(
        &mut db,
        &format!("SELECT * FROM ({view}) AS f WHERE id IN (SELECT id FROM t ORDER BY x DESC LIMIT 5) ORDER BY id"),
    );
    assert!(top_five.len() > top_now.len(), "{top_five:?} against {top_now:?}");
    assert_eq!(flagged(&mut db, "top", false), sorted(top_five.clone()));

    // Over the samples: unbiased with the index, and far more accurate than without.
    let queries = [
        ("SELECT SUM(x) AS a FROM {v}", true),
        ("SELECT SUM(x) AS a FROM {v} WHERE g = 1", true),
        ("SELECT AVG(x) AS a FROM {v} WHERE id % 3 = 0", true),
        ("SELECT COUNT(*) AS a FROM {v} WHERE x > 20", false),
    ];
    indexed_against_sample_alone(&mut db, &format!("({view}) AS f"), SEEDS, &queries);

    // The options are checked, with the reason.
    for (options, message) in [
        ("sample = 0.1, outlier_index = 't.x'", "needs outlier_threshold"),
        ("outlier_index = 't.x', outlier_k = 3", "give sample = m too"),
        ("sample = 0.1, outlier_threshold = 3", "without outlier_index"),
        ("sample = 0.1, outlier_index = 'x', outlier_k = 3", "as 'table.column'"),
        ("sample = 0.1, outlier_index = 't.x', outlier_k = 0", "positive integer"),
        ("sample = 0.1, outlier_index = 't.nope', outlier_k = 3", "has no column `nope`"),
        ("sample = 0.1, outlier_index = 'u.x', outlier_k = 3", "`u` is neither a table nor the view `bad`"),
        ("sample = 0.1, outlier_index = 'bad.nope', outlier_k = 3", "`bad` has no column `nope`"),
        ("sample = 0.1, outlier_index = 't.x', outlier_threshold = 'high'", "not a number"),
    ] {
        let err = db.execute(&format!("CREATE MATERIALIZED VIEW bad WITH ({options}) AS {view}")).unwrap_err();
        assert!(err.to_string().contains(message), "{options}: {err}");
    }
    // An index on a table the hash does not reach (grouped by `s`'s column only, the hash
    // stays on `s`'s side of the join).
    db.execute("CREATE TABLE s (id BIGINT PRIMARY KEY, w BIGINT, y DOUBLE)").unwrap();
    let err = db
        .execute(
            "CREATE MATERIALIZED VIEW bad WITH (sample = 0.1, outlier_index = 't.x', outlier_k = 3) AS
                 SELECT w, COUNT(*) AS n FROM t JOIN s ON t.g = s.id GROUP BY w",
        )
        .unwrap_err();
    assert!(err.to_string().contains("on a table the sample's hash reaches"), "{err}");
}

/// An outlier index on the view's own column: the view's groups of the largest sums at its
/// refresh are kept whole (clean and stale), and where a few groups hold most of the rows and
/// of their change, the estimates stay unbiased and err far less than from the sample alone.
#[test]
fn the_outlier_index_on_the_views_column_keeps_its_largest_groups_whole() {
    const SEEDS: usize = 30;
    let mut random = Random(0x0b5e_55ed_9a0f_c0de);
    let mut db = Database::in_memory().unwrap();
    // Customers 1 to 6 hold half the rows; 500 others share the other half.
    let customer = |random: &mut Random| match random.next() {
        u if u < 0.5 => 1 + (u * 12.0) as i64,
        _ => 7 + (random.next() * 500.0) as i64,
    };
    let values: Vec<String> =
        (1..=3000).map(|id| format!("({id}, {}, {:.3})", customer(&mut random), 100.0 * random.next())).collect();
    db.execute(&format!(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, c BIGINT, x DOUBLE); INSERT INTO t VALUES {};",
        values.join(", ")
    ))
    .unwrap();
    let view = "SELECT c, SUM(x) AS x, COUNT(*) AS n FROM t GROUP BY c";
    sampled_views(&mut db, "v", view, SEEDS, "sample = 0.1");
    for seed in 0..SEEDS {
        db.execute(&format!(
            "CREATE MATERIALIZED VIEW o{seed} WITH (sample = 0.1, sample_seed = {seed}, outlier_index = 'o{seed}.x', \
             outlier_k = 6) AS {view}"
        ))
        .unwrap();
    }
    let top_at_refresh = query(&mut db, "SELECT c FROM o0 ORDER BY x DESC LIMIT 6");
    let inserted: Vec<String> =
        (5001..=5300).map(|id| format!("({id}, {}, {:.3})", customer(&mut random), 100.0 * random.next())).collect();
    db.execute(&format!(
        "UPDATE t SET x = x * 1.5 + 7.0 WHERE id % 10 = 3; DELETE FROM t WHERE id % 33 = 1; INSERT INTO t VALUES {};",
        inserted.join(", ")
    ))
    .unwrap();

    // The definition: the rows flagged are the fresh view's rows (clean) or the stale view's
    // (stale) of the six groups of the largest `x` at the refresh, whatever the changes did.
    // Sums compared to six places: they are added up in another order.
    let rounded = |rows: Vec<String>| {
        let mut rows: Vec<String> = rows
            .iter()
            .map(|row| {
                let cells: Vec<&str> = row.split('|').collect();
                format!("{}|{:.6}|{}", cells[0], cells[1].parse::<f64>().unwrap(), cells[2])
            })
            .collect();
        rows.sort();
        rows
    };
    let keys = top_at_refresh.join(", ");
    let fresh = format!("({view}) AS f");
    let fresh_top = rounded(query(&mut db, &format!("SELECT c, x, n FROM {fresh} WHERE c IN ({keys})")));
    let stale_top = rounded(query(&mut db, &format!("SELECT c, x, n FROM o0 WHERE c IN ({keys})")));
    assert_eq!(fresh_top.len(), 6);
    assert_ne!(fresh_top, stale_top);
    assert_eq!(rounded(flagged(&mut db, "o0", false, &["c", "x", "n"])), fresh_top);
    assert_eq!(rounded(flagged(&mut db, "o0", true, &["c", "x", "n"])), stale_top);
    let explained = query(&mut db, "EXPLAIN REFRESH MATERIALIZED VIEW o0").join("\n");
    assert!(explained.contains("the 6 largest of o0.x: the view's own rows, ranked as of its refresh"), "{explained}");

    // Over the samples: unbiased with the index, and far more accurate than without.
    let queries = [
        ("SELECT SUM(x) AS a FROM {v}", true),
        ("SELECT SUM(n) AS a FROM {v} WHERE c % 2 = 1", true),
        ("SELECT AVG(x) AS a FROM {v}", false),
        ("SELECT COUNT(*) AS a FROM {v} WHERE n > 2", false),
    ];
    indexed_against_sample_alone(&mut db, &fresh, SEEDS, &queries);
}

/// Each of `queries` (`{v}` for the view; whether its error must be 3x lower with the index)
/// answered by svc_aqp and svc_corr over the sampled views `o0` .. (with an outlier index) and
/// `v0` .. (without), `seeds` of each, against the answer over `fresh` (the view's query):
/// unbiased with the index (the mean within three standard errors), at least 80% of its
/// intervals covering the truth, and the root mean square error as asked.
fn indexed_against_sample_alone(db: &mut Database, fresh: &str, seeds: usize, queries: &[(&str, bool)]) {
    for &(sql, sharper) in queries {
        db.execute("SET freshness = 'stale'").unwrap();
        let truth = answer(db, &sql.replace("{v}", fresh), 0, false)[&Vec::new()][0];
        for freshness in ["svc_aqp", "svc_corr"] {
            db.execute(&format!("SET freshness = '{freshness}'")).unwrap();
            let mut estimates = |prefix: &str| -> Vec<[f64; 3]> {
                (0..seeds)
                    .map(|seed| answer(db, &sql.replace("{v}", &format!("{prefix}{seed}")), 0, true)[&Vec::new()])
                    .collect()
            };
            let (with, without) = (estimates("o"), estimates("v"));
            let mean = with.iter().map(|e| e[0]).sum::<f64>() / seeds as f64;
            let sd = (with.iter().map(|e| (e[0] - mean).powi(2)).sum::<f64>() / (seeds - 1) as f64).sqrt();
            let error = sd / (seeds as f64).sqrt();
            assert!(
                (mean - truth).abs() <= 3.0 * error + 1e-9 * truth.abs(),
                "{freshness} {sql}: mean {mean} ± {error} against {truth}"
            );
            let rmse = |e: &[[f64; 3]]| (e.iter().map(|e| (e[0] - truth).powi(2)).sum::<f64>() / seeds as f64).sqrt();
            let covered = with.iter().filter(|e| e[1] <= truth && truth <= e[2]).count();
            eprintln!(
                "{freshness} {sql}: root mean square error {:.4e} with the outlier index, {:.4e} without; {covered} of {seeds} intervals cover",
                rmse(&with),
                rmse(&without)
            );
            if sharper {
                assert!(
                    rmse(&with) * 3.0 < rmse(&without),
                    "{freshness} {sql}: {} against {}",
                    rmse(&with),
                    rmse(&without)
                );
            }
            assert!(covered as f64 >= 0.8 * seeds as f64, "{freshness} {sql}: {covered} of {seeds} intervals cover");
        }
    }
}

/// MIN and MAX (the Appendix's method): the extreme of the clean sample is a bound that
/// always holds, nothing bounds the other side (NULL), and the estimate is never short of the
/// bound: `svc_aqp`'s is the bound itself.
#[test]
fn min_and_max_are_bounded_by_the_extreme_seen() {
    const SEEDS: usize = 20;
    let mut random = Random(0x3141_5926_5358_9793);
    let mut db = Database::in_memory().unwrap();
    random_table(&mut db, &mut random, 3000, |_, random| 100.0 * random.next());
    let view = "SELECT id, g, SUM(x) AS x FROM t GROUP BY id, g";
    sampled_views(&mut db, "v", view, SEEDS, "sample = 0.1");
    db.execute("UPDATE t SET x = x * 1.2 + 5.0 WHERE id % 10 = 3; DELETE FROM t WHERE id % 33 = 1;").unwrap();
    let fresh = format!("({view}) AS f");
    let mut trials = 0usize;
    for q in 0..200 {
        let max = q % 2 == 0;
        let aggregate = if max { "MAX(x)" } else { "MIN(x)" };
        let bound = (50.0 * random.next()).round();
        let share = 20 + (77.0 * random.next()) as i64;
        let sql = format!(
            "SELECT g, {aggregate} AS a FROM {{v}} WHERE x > {bound} AND (id * 7919) % 97 < {share} GROUP BY g"
        );
        db.execute("SET freshness = 'stale'").unwrap();
        let truth = answer(&mut db, &sql.replace("{v}", &fresh), 1, false);
        for freshness in ["svc_aqp", "svc_corr"] {
            db.execute(&format!("SET freshness = '{freshness}'")).unwrap();
            let estimated = answer(&mut db, &sql.replace("{v}", &format!("v{}", q % SEEDS)), 1, true);
            for (key, [value, low, high]) in estimated {
                let expected = truth[&key][0];
                let (seen, far) = if max { (low, high) } else { (high, low) };
                assert!(far.is_nan(), "{freshness} {sql}: {far} bounds the far side");
                // The bound the sample proves, and the estimate on its far side.
                let beyond = |a: f64, b: f64| if max { a >= b - 1e-9 } else { a <= b + 1e-9 };
                assert!(beyond(expected, seen), "{freshness} {sql}: {seen} against {expected}");
                assert!(beyond(value, seen), "{freshness} {sql}: {value} short of {seen}");
                if freshness == "svc_aqp" {
                    assert_eq!(value, seen, "{sql}");
                }
                trials += 1;
            }
        }
    }
    assert!(trials > 500, "{trials} estimates");
}

/// `tessera compile --target spark`: the sample's hash as Spark writes it over the view's key
/// columns, a table's versions after a COPY of operations, an outlier index's rows picked at the
/// refresh and from the changes since, and the shapes it refuses, with the reason. (Spark
/// itself runs the output in scripts/spark_diff.py.)
#[test]
fn spark_sql_hashes_the_sample_as_tessera_does_and_refuses_what_it_cannot_compile() {
    let tables =
        "CREATE TABLE video (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE) WITH (path = 'video.csv');
                  CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT) WITH (path = 'log.csv');";
    let view = "CREATE MATERIALIZED VIEW visit_view WITH (sample = 0.25, sample_seed = 7) AS
                    SELECT video_id, owner_id, duration, COUNT(*) AS visit_count
                    FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id, duration;";
    let script = format!(
        "{tables} {view} COPY log FROM 'changes.csv' WITH (op_column = 'op');
         SET freshness = 'svc_corr'; SELECT owner_id, SUM(visit_count) AS v FROM visit_view GROUP BY owner_id;"
    );
    let spark = spark_of(&script, Path::new("/data")).unwrap();
    assert!(spark.contains("USING csv OPTIONS (path '/data/video.csv', header 'true')"), "{spark}");
    assert!(spark.contains("LEFT ANTI JOIN log__file1 ON log__0.session_id = log__file1.session_id"), "{spark}");
    assert!(
        spark.contains("(xxhash64(CAST(7 AS INT), CAST(video_id AS BIGINT)) & 4294967295) < 1073741824"),
        "{spark}"
    );
    assert!(spark.contains("FROM log__1 JOIN video__0"), "the fresh view reads the tables' last versions: {spark}");
    // Changes by statement are versions too; a query over tables alone reads their last ones.
    let script = format!(
        "{tables} INSERT INTO log (video_id, session_id) VALUES (2, 1);
         UPDATE video SET duration = duration * 2 WHERE owner_id = 3; DELETE FROM log WHERE session_id > 10;
         SET freshness = 'svc_aqp'; SELECT COUNT(*) AS n FROM log;"
    );
    let spark = spark_of(&script, Path::new("/data")).unwrap();
    for version in [
        "VIEW log__1 AS SELECT * FROM log__0 UNION ALL SELECT CAST(__c1 AS BIGINT) AS session_id, CAST(__c0 AS BIGINT) AS \
         video_id FROM (VALUES (2, 1)) AS __given(__c0, __c1)",
        "VIEW video__1 AS SELECT * FROM video__0 AS video WHERE NOT COALESCE(owner_id = 3, false) UNION ALL SELECT \
         video_id, owner_id, CAST(duration * 2 AS DOUBLE) AS duration FROM video__0 AS video WHERE COALESCE(owner_id = 3, false)",
        "VIEW log__2 AS SELECT * FROM log__1 AS log WHERE NOT COALESCE(session_id > 10, false) UNION ALL SELECT * FROM log__1 WHERE false",
        "SELECT COUNT(*) AS n FROM log__2",
    ] {
        assert!(spark.contains(version), "{version} in {spark}");
    }
    let indexed = view.replace("sample_seed = 7)", "sample_seed = 7, outlier_index = 'video.duration', outlier_k = 5)");
    let script = format!(
        "{tables} {indexed} COPY video FROM 'changes.csv' WITH (op_column = 'op');
         SET freshness = 'svc_aqp'; SELECT SUM(duration) AS d FROM visit_view;"
    );
    let spark = spark_of(&script, Path::new("/data")).unwrap();
    for picked in [
        "VIEW visit_view__obase1 AS SELECT * FROM (SELECT xxhash64(CAST(7 AS INT), CAST(video_id AS BIGINT)) AS __hash, \
         CAST(duration AS DOUBLE) AS __value FROM video__0 WHERE duration IS NOT NULL) ORDER BY __value DESC, __hash ASC LIMIT 5",
        "VIEW video__changes1 AS SELECT video__0.* FROM video__0 LEFT SEMI JOIN video__file1 ON video__0.video_id = video__file1.video_id",
        "WHEN COUNT(*) >= 5 THEN MIN(__value) END FROM visit_view__obase1) IS NULL",
        "FROM (SELECT * FROM video__changes1)",
    ] {
        assert!(spark.contains(picked), "{picked} in {spark}");
    }
    for (statements, message) in [
        (
            "SET freshness = 'svc_aqp'; SELECT STDDEV(duration) AS m FROM visit_view;",
            "COUNT, SUM, AVG, MIN, MAX, MEDIAN and PERCENTILE_CONT",
        ),
        (
            "SET freshness = 'svc_aqp'; SELECT PERCENTILE_CONT(duration, 1.5) AS m FROM visit_view;",
            "COUNT, SUM, AVG, MIN, MAX, MEDIAN and PERCENTILE_CONT",
        ),
        (
            "SET freshness = 'auto'; SELECT owner_id, COUNT(*) AS n FROM visit_view GROUP BY owner_id HAVING SUM(duration) > 3;",
            "HAVING on `SUM(duration)`, which the query does not select",
        ),
        ("SET freshness = 'svc_aqp'; SELECT COUNT(*) FROM visit_view;", "without AS name"),
        ("DROP TABLE log;", "does not take `DROP TABLE log`"),
        (
            "CREATE MATERIALIZED VIEW plain AS SELECT video_id, COUNT(*) AS n FROM log GROUP BY video_id;
             SET freshness = 'svc_aqp'; SELECT COUNT(*) AS n FROM plain;",
            "`plain`, which is not a sampled view",
        ),
    ] {
        let err = spark_of(&format!("{tables} {view} {statements}"), Path::new(".")).unwrap_err();
        assert!(err.to_string().contains(message), "{statements}: {err}");
    }
}

/// The Spark SQL of database script `text` (paths under `dir`), compiled by a session.
fn spark_of(text: &str, dir: &Path) -> tessera::error::Result<String> {
    let session = crate::Session::open(crate::SessionOptions { base_dir: dir.into(), ..Default::default() })?;
    session.compile(text, crate::CompileTarget::Spark)
}
