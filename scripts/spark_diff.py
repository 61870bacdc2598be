#!/usr/bin/env python3
"""Differential test of `tessera compile --target spark` against tessera itself: a database
script with a sampled view and the same view with an outlier index (the longest videos, by
`outlier_k`; for the second seed the view's own rows of the most visits at its refresh, above
a threshold and by `outlier_k`), changes to both tables, estimates
(svc_aqp, svc_corr, auto; COUNT, SUM, AVG, MIN, MAX, MEDIAN, PERCENTILE_CONT; WHERE, GROUP BY,
HAVING, ORDER BY, LIMIT)
over both views, and the stale and the exact answer, is run by `tessera run` and, compiled to
Spark SQL, by a local PySpark on the machine's Java. Every answer must agree: the sample's keys
(the groups of a query grouped by the key that the clean sample holds) and each estimate with
its interval, within floating-point rounding.

Then the README's table examples (examples/tables/*.sql: inserts, updates, deletes, COPY,
views with and without samples), each compiled and run by Spark and by `tessera run`: every
query's rows must agree (numbers within rounding, text as written).

Usage:
    python scripts/spark_diff.py --tessera BINARY

PySpark comes from PyPI into .venv-spark by scripts/python-env.sh (see scripts/test.sh).
"""

import argparse
import math
import os
import random
import subprocess
import sys
import tempfile

SEEDS = [7, 1234]


def write_data(folder, seed):
    """Videos, sessions and a change file of deletions, updates and insertions (each key once)."""
    rng = random.Random(seed)
    with open(os.path.join(folder, "video.csv"), "w") as f:
        f.write("video_id,owner_id,duration\n")
        for v in range(1, 301):
            # Some durations missing: NULLs are not counted by AVG.
            duration = "" if v % 41 == 0 else round(rng.uniform(10, 600), 2)
            f.write(f"{v},{v % 7},{duration}\n")
    with open(os.path.join(folder, "log.csv"), "w") as f:
        f.write("session_id,video_id\n")
        for s in range(1, 5001):
            f.write(f"{s},{rng.randint(1, 300)}\n")
    with open(os.path.join(folder, "log_changes.csv"), "w") as f:
        f.write("session_id,video_id,op\n")
        for s in range(1, 5001):
            if s % 9 == 1:
                f.write(f"{s},0,D\n")
            elif s % 23 == 2:
                f.write(f"{s},{rng.randint(1, 60)},U\n")
        for s in range(10001, 11001):
            f.write(f"{s},{rng.randint(1, 80)},I\n")
    # Durations changed: some videos become the longest (they join the outlier index from the
    # changes), the longest of some others shrink, a few videos are deleted.
    with open(os.path.join(folder, "video_changes.csv"), "w") as f:
        f.write("video_id,owner_id,duration,op\n")
        for v in range(1, 301):
            if v % 37 == 3:
                f.write(f"{v},{v % 7},{round(rng.uniform(2000, 5000), 2)},U\n")
            elif v % 11 == 5:
                f.write(f"{v},{v % 7},{round(rng.uniform(10, 100), 2)},U\n")
            elif v % 53 == 7:
                f.write(f"{v},0,0,D\n")


QUERIES = [
    # The sample's keys: the groups with a value are the clean sample's.
    "SELECT video_id, COUNT(*) AS n FROM visit_view GROUP BY video_id",
    "SELECT COUNT(*) AS n, AVG(duration) AS d FROM visit_view WHERE visit_count > 18",
    "SELECT owner_id, SUM(visit_count) AS v, AVG(visit_count) AS a, COUNT(duration) AS c FROM visit_view "
    "GROUP BY owner_id",
    "SELECT owner_id, SUM(visit_count) AS v FROM visit_view WHERE duration < 300 GROUP BY owner_id "
    "ORDER BY v DESC LIMIT 3",
    "SELECT SUM(duration) AS s FROM visit_view WHERE owner_id = 3",
    "SELECT owner_id, MIN(duration) AS shortest, MAX(visit_count) AS most FROM visit_view GROUP BY owner_id",
    "SELECT MAX(duration) AS longest, MIN(visit_count) AS fewest FROM visit_view WHERE visit_count > 10",
    "SELECT owner_id, SUM(visit_count) AS v, COUNT(*) AS n FROM visit_view GROUP BY owner_id "
    "HAVING SUM(visit_count) > 760 AND owner_id <> 2",
]
ESTIMATORS = ["svc_aqp", "svc_corr", "auto"]
# Quantiles by the bootstrap, the same draws in Spark (each of these costs Spark about ten
# seconds, most of it planning and running a plan of some forty stages).
QUANTILE_QUERIES = [
    "SELECT owner_id, MEDIAN(duration) AS md, PERCENTILE_CONT(visit_count, 0.8) AS p8 FROM visit_view GROUP BY owner_id",
    "SELECT APPROX_PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY duration) AS q1, COUNT(*) AS n FROM visit_view "
    "WHERE visit_count > 12",
]
# The view without and with an outlier index.
VIEWS = ["visit_view", "visit_index"]

# Answered from the stale view, then from the view over the tables as they are.
PLAIN = "SELECT owner_id, SUM(visit_count) AS v, COUNT(*) AS n FROM visit_view GROUP BY owner_id"


def script(seed):
    definition = ("SELECT video_id, owner_id, duration, COUNT(*) AS visit_count "
                  "FROM log JOIN video USING (video_id) GROUP BY video_id, owner_id, duration;")
    index = ("outlier_index = 'video.duration', outlier_k = 12" if seed == SEEDS[0]
             else "outlier_index = 'visit_index.visit_count', outlier_threshold = 20, outlier_k = 40")
    lines = [
        "CREATE TABLE video (video_id BIGINT PRIMARY KEY, owner_id BIGINT, duration DOUBLE) WITH (path = 'video.csv');",
        "CREATE TABLE log (session_id BIGINT PRIMARY KEY, video_id BIGINT) WITH (path = 'log.csv');",
        f"CREATE MATERIALIZED VIEW visit_view WITH (sample = 0.2, sample_seed = {seed}) AS {definition}",
        f"CREATE MATERIALIZED VIEW visit_index WITH (sample = 0.2, sample_seed = {seed}, "
        f"{index}) AS {definition}",
        "COPY log FROM 'log_changes.csv' WITH (op_column = 'op');",
        "COPY video FROM 'video_changes.csv' WITH (op_column = 'op');",
    ]
    for freshness in ESTIMATORS:
        lines.append(f"SET freshness = '{freshness}';")
        lines.extend(q.replace("visit_view", view) + ";" for view in VIEWS for q in QUERIES + QUANTILE_QUERIES)
    for freshness in ["stale", "exact"]:
        lines.append(f"SET freshness = '{freshness}';")
        lines.append(PLAIN + ";")
    return "\n".join(lines) + "\n"


def tessera_answers(lines, headers):
    """The result sets of `tessera run` (CSV, a header before each), read by their headers."""
    answers, i = [], 0
    for header in headers:
        while lines[i] != ",".join(header):
            i += 1
        i += 1
        rows = []
        while i < len(lines) and lines[i] and not lines[i][0].isalpha():
            rows.append([None if c == "" else float(c) for c in lines[i].split(",")])
            i += 1
        answers.append(rows)
    return answers


def close(a, b):
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def same(ours, theirs):
    key = lambda row: [(-math.inf if c is None else c) for c in row]
    ours, theirs = sorted(ours, key=key), sorted(theirs, key=key)
    return len(ours) == len(theirs) and all(
        len(a) == len(b) and all(close(x, y) for x, y in zip(a, b)) for a, b in zip(ours, theirs))


EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "tables")


def spark_rows(spark, compiled):
    """The rows of every query of a compiled script, as text (None for NULL), and its columns."""
    answers = []
    for statement in compiled.split(";\n"):
        sql = "\n".join(l for l in statement.splitlines() if not l.startswith("--")).strip()
        if not sql:
            continue
        frame = spark.sql(sql)
        if sql.startswith(("SELECT", "WITH")):
            answers.append((frame.columns, [[None if v is None else str(v) for v in row] for row in frame.collect()]))
    return answers


def tessera_result_sets(stdout, answers):
    """tessera's CSV output cut at the headers of the queries Spark answered (and the `item,value`
    of an EXPLAIN, which Spark does not answer), in order."""
    import csv
    lines = list(csv.reader(stdout.splitlines()))
    sets, i = [], 0
    for columns, _ in answers:
        while i < len(lines) and lines[i] != columns:
            i += 1
        i += 1
        rows = []
        while i < len(lines) and lines[i] != ["item", "value"] and not any(lines[i] == c for c, _ in answers):
            rows.append([None if v == "" else v for v in lines[i]])
            i += 1
        sets.append(rows)
    return sets


def same_text(ours, theirs):
    def value(v):
        try:
            return ("n", float(v))
        except (TypeError, ValueError):
            return ("t", "" if v is None else v)
    def row(r):
        return [value(v) for v in r]
    ours, theirs = sorted(map(row, ours)), sorted(map(row, theirs))
    return len(ours) == len(theirs) and all(
        len(a) == len(b) and all(x == y or (x[0] == y[0] == "n" and math.isclose(x[1], y[1], rel_tol=1e-9, abs_tol=1e-9))
                                 for x, y in zip(a, b)) for a, b in zip(ours, theirs))


def diff_examples(spark, binary):
    passed = failed = 0
    for name in sorted(os.listdir(EXAMPLES)):
        if not name.endswith(".sql"):
            continue
        path = os.path.join(EXAMPLES, name)
        compiled = subprocess.run([binary, "compile", "--target", "spark", path], capture_output=True, text=True)
        if compiled.returncode != 0:
            failed += 1
            print(f"spark-diff: {name} does not compile: {compiled.stderr}")
            continue
        theirs = spark_rows(spark, compiled.stdout)
        run = subprocess.run([binary, "run", path, "-q"], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"spark-diff: tessera run {name} failed: {run.stderr}")
        ours = tessera_result_sets(run.stdout, theirs)
        for n, ((columns, b), a) in enumerate(zip(theirs, ours)):
            if same_text(a, b):
                passed += 1
            else:
                failed += 1
                print(f"DIFFERS ({name}, query {n + 1}, {columns}):\n  tessera: {a[:6]}\n  spark:   {b[:6]}")
        print(f"{name}: {len(theirs)} queries")
    return passed, failed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tessera", required=True)
    args = parser.parse_args()
    binary = os.path.abspath(args.tessera)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark on this machine only.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("tessera-spark-diff")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    passed = failed = 0
    for seed in SEEDS:
        with tempfile.TemporaryDirectory() as folder:
            write_data(folder, seed)
            path = os.path.join(folder, "script.sql")
            with open(path, "w") as f:
                f.write(script(seed))
            compiled = subprocess.run([binary, "compile", "--target", "spark", path], capture_output=True, text=True)
            if compiled.returncode != 0:
                sys.exit(f"spark-diff: compile failed: {compiled.stderr}")
            theirs, headers = [], []
            for statement in compiled.stdout.split(";\n"):
                sql = "\n".join(l for l in statement.splitlines() if not l.startswith("--")).strip()
                if not sql:
                    continue
                frame = spark.sql(sql)
                if sql.startswith(("SELECT", "WITH")):
                    # Collected at once: a query's plan is large, and many held at once exhaust the driver.
                    theirs.append([[None if v is None else float(v) for v in row] for row in frame.collect()])
                    headers.append(frame.columns)
            run = subprocess.run([binary, "run", path, "-q"], capture_output=True, text=True, cwd=folder)
            if run.returncode != 0:
                sys.exit(f"spark-diff: tessera run failed: {run.stderr}")
            ours = tessera_answers(run.stdout.splitlines(), headers)
            asked = [(q.replace("visit_view", view), e) for e in ESTIMATORS for view in VIEWS for q in QUERIES + QUANTILE_QUERIES]
            asked += [(PLAIN, "stale"), (PLAIN, "exact")]
            for (query, estimator), a, b in zip(asked, ours, theirs):
                if same(a, b):
                    passed += 1
                else:
                    failed += 1
                    print(f"DIFFERS (seed {seed}, {estimator}): {query}\n  tessera: {sorted(a, key=str)[:6]}\n"
                          f"  spark:   {sorted(b, key=str)[:6]}")
            # The sample is a real sample: some of the videos, not none or all.
            sampled = [row for row in ours[0] if row[1] is not None]
            if not 0 < len(sampled) < len(ours[0]):
                failed += 1
                print(f"seed {seed}: {len(sampled)} of {len(ours[0])} videos sampled")
            print(f"seed {seed}: {len(sampled)} of {len(ours[0])} videos in the sample, the same keys in Spark")
            # The outlier index changes the estimates: some of the indexed view's differ.
            n = len(QUERIES + QUANTILE_QUERIES)
            if all(same(ours[i], ours[n + i]) for i in range(n)):
                failed += 1
                print(f"seed {seed}: the outlier index changed no estimate")
    examples_passed, examples_failed = diff_examples(spark, binary)
    passed, failed = passed + examples_passed, failed + examples_failed
    spark.stop()
    print(f"spark: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
