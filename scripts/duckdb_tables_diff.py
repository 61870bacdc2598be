#!/usr/bin/env python3
"""Differential test: tessera's tables, statements, batch queries and materialized views
against DuckDB.

Usage:
    python scripts/duckdb_tables_diff.py --tessera PATH_TO_BINARY [--cases N] [--seed S]
    python scripts/duckdb_tables_diff.py --tessera PATH_TO_BINARY --case-seed X   # one case again

Each case creates two tables, a(k BIGINT PRIMARY KEY, g BIGINT, x DOUBLE) and
b(id BIGINT PRIMARY KEY, k BIGINT, y BIGINT), in a fresh tessera database (`tessera sql --db`)
and in DuckDB, fills them, creates materialized views, then applies the same random statements
to both: INSERTs (some with a key already held), UPDATEs of values and of keys, DELETEs, and
COPYs of files with an operation column (in DuckDB the same rows applied one by one in a
transaction). A statement must succeed in both or fail in both. Then it compares every table,
the answers of queries of every kind (joins inner, left and full, GROUP BY aggregates,
IN and NOT EXISTS subqueries, UNION, INTERSECT, EXCEPT, window functions, ORDER BY ... LIMIT),
and materialized views of every maintenance shape (a grouped join, an outer join's rows,
EXCEPT, UNION, MIN/MAX/STDDEV with HAVING, a view over a view) as they were (stale: DuckDB's
answer when they were created) and after REFRESH (DuckDB's answer now).

Rows are compared as multisets (in order for ORDER BY ... LIMIT): integers exactly, floats
within a relative tolerance of 1e-9, NULL only to NULL. A failing case prints its seed and the
first differing rows and keeps its directory. The last line is
`duckdb-tables-diff: N passed, M failed`; the exit status is 0 only if all passed.
"""

import argparse
import csv
import io
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

try:
    import duckdb
except ImportError:
    sys.exit("duckdb-tables-diff: the duckdb module is missing; run it with the python of scripts/python-env.sh")

REL_TOL = 1e-9
SHOW_ROWS = 5

SCHEMA = [
    "CREATE TABLE a (k BIGINT PRIMARY KEY, g BIGINT, x DOUBLE)",
    "CREATE TABLE b (id BIGINT PRIMARY KEY, k BIGINT, y BIGINT)",
]
# Materialized views of every maintenance shape (DuckDB keeps them as plain views, so its
# answer is the fresh one); the last reads the first.
VIEWS = [
    ("v", "SELECT a.g, COUNT(*) AS n, SUM(b.y) AS s, AVG(a.x) AS mean FROM a JOIN b ON a.k = b.k GROUP BY a.g"),
    ("v_rows", "SELECT a.k AS ak, a.x, b.id, b.y FROM a LEFT JOIN b ON a.k = b.k"),
    ("v_except", "SELECT k FROM a EXCEPT SELECT k FROM b"),
    ("v_union", "SELECT g AS w FROM a UNION SELECT y FROM b"),
    ("v_extreme", "SELECT g, MIN(x) AS lo, MAX(x) AS hi, STDDEV(x) AS sd FROM a GROUP BY g HAVING COUNT(*) > 1"),
    ("v_over", "SELECT g, n * 2 AS twice FROM v WHERE s IS NOT NULL"),
]
QUERIES = [
    ("SELECT * FROM a", False),
    ("SELECT * FROM b", False),
    ("SELECT a.g, COUNT(*) AS n, SUM(b.y) AS s, AVG(a.x) AS m, MIN(b.y) AS lo, MAX(a.x) AS hi "
     "FROM a JOIN b ON a.k = b.k GROUP BY a.g", False),
    ("SELECT a.k, b.id FROM a LEFT JOIN b ON a.k = b.k", False),
    ("SELECT a.k AS ak, b.id FROM a FULL OUTER JOIN b ON a.k = b.k", False),
    ("SELECT k FROM a WHERE k IN (SELECT k FROM b WHERE y > 0)", False),
    ("SELECT k FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)", False),
    ("SELECT k FROM a UNION SELECT k FROM b", False),
    ("SELECT k FROM a INTERSECT SELECT k FROM b", False),
    ("SELECT k FROM a EXCEPT SELECT k FROM b", False),
    ("SELECT g, k, ROW_NUMBER() OVER (PARTITION BY g ORDER BY k) AS rn, "
     "SUM(x) OVER (PARTITION BY g ORDER BY k) AS running FROM a", False),
    ("SELECT k, x FROM a ORDER BY x DESC NULLS LAST, k LIMIT 5", True),
    ("SELECT g, COUNT(DISTINCT k) AS keys FROM b JOIN a USING (k) GROUP BY g HAVING COUNT(*) > 1", False),
]


def value(v):
    return "NULL" if v is None else repr(v)


def random_row_a(rng, k):
    x = None if rng.random() < 0.15 else round(rng.uniform(-100, 100), 3)
    return (k, rng.randrange(4), x)


def random_row_b(rng, i):
    return (i, rng.randrange(30), None if rng.random() < 0.1 else rng.randrange(-50, 50))


def random_statements(rng, count):
    """(tessera SQL or a COPY file's rows, DuckDB statements) pairs."""
    out = []
    for _ in range(count):
        kind = rng.choice(["insert_a", "insert_b", "update", "update_key", "delete", "copy"])
        if kind == "insert_a":
            rows = [random_row_a(rng, rng.randrange(40)) for _ in range(rng.randrange(1, 4))]
            sql = "INSERT INTO a VALUES " + ", ".join(f"({k}, {g}, {value(x)})" for k, g, x in rows)
            out.append((sql, [sql]))
        elif kind == "insert_b":
            rows = [random_row_b(rng, rng.randrange(60)) for _ in range(rng.randrange(1, 4))]
            sql = "INSERT INTO b VALUES " + ", ".join(f"({i}, {k}, {value(y)})" for i, k, y in rows)
            out.append((sql, [sql]))
        elif kind == "update":
            sql = rng.choice([
                f"UPDATE a SET x = x * 2 + 1 WHERE g = {rng.randrange(4)}",
                f"UPDATE b SET y = NULL WHERE k < {rng.randrange(30)}",
                f"UPDATE b SET k = k + 1, y = COALESCE(y, 0) - 3 WHERE id % 3 = {rng.randrange(3)}",
            ])
            out.append((sql, [sql]))
        elif kind == "update_key":
            sql = f"UPDATE a SET k = {rng.randrange(40)} WHERE k = {rng.randrange(40)}"
            out.append((sql, [sql]))
        elif kind == "delete":
            sql = rng.choice([f"DELETE FROM a WHERE x < {rng.uniform(-100, 100):.1f}", f"DELETE FROM b WHERE k = {rng.randrange(30)}"])
            out.append((sql, [sql]))
        else:
            rows = []
            for _ in range(rng.randrange(1, 6)):
                op = rng.choice("IIUD")
                _, g, x = random_row_a(rng, 0)
                rows.append((rng.randrange(40), g, x, op))
            out.append((rows, None))
    return out


def duckdb_copy(con, rows):
    """The rows of an operation file applied in DuckDB as tessera applies them: all or nothing,
    an update or delete of a key no row holds (or an insert of one held) refusing the file."""
    con.execute("BEGIN TRANSACTION")
    try:
        for k, g, x, op in rows:
            held = con.execute("SELECT count(*) FROM a WHERE k = ?", [k]).fetchone()[0] > 0
            if op == "I":
                con.execute("INSERT INTO a VALUES (?, ?, ?)", [k, g, x])
            elif not held:
                raise ValueError(f"no row holds key {k}")
            elif op == "U":
                con.execute("UPDATE a SET g = ?, x = ? WHERE k = ?", [g, x, k])
            else:
                con.execute("DELETE FROM a WHERE k = ?", [k])
        con.execute("COMMIT")
        return True
    except Exception:
        con.execute("ROLLBACK")
        return False


def tessera_sql(binary, db, sql, cwd):
    return subprocess.run([binary, "sql", "--db", db, "--format", "csv", "-c", sql], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def parse_field(text):
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def tessera_rows(binary, db, sql, cwd):
    out = tessera_sql(binary, db, sql, cwd)
    if out.returncode != 0:
        raise RuntimeError(f"tessera failed on {sql}: {out.stderr}")
    reader = csv.reader(io.StringIO(out.stdout))
    next(reader, None)
    return [tuple(parse_field(f) for f in row) for row in reader]


def normalize(row):
    return tuple(float(v) if isinstance(v, float) else v for v in row)


def same_value(a, b):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=REL_TOL) or (math.isnan(a) and math.isnan(b))
    return a == b


def same_rows(ours, theirs, ordered):
    if len(ours) != len(theirs):
        return False
    if not ordered:
        key = lambda r: tuple((v is None, str(type(v) is str), round(v, 6) if isinstance(v, float) else v) for v in r)
        ours, theirs = sorted(ours, key=key), sorted(theirs, key=key)
    return all(len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b)) for a, b in zip(ours, theirs))


def run_case(binary, case_seed, workdir):
    rng = random.Random(case_seed)
    con = duckdb.connect()
    db = "db"
    problems = []
    for sql in SCHEMA:
        con.execute(sql)
        out = tessera_sql(binary, db, sql, workdir)
        if out.returncode != 0:
            return [f"tessera refused `{sql}`: {out.stderr}"]
    initial = [(f"INSERT INTO a VALUES " + ", ".join(f"({k}, {g}, {value(x)})" for k, g, x in
                 [random_row_a(rng, k) for k in rng.sample(range(40), 20)])),
               (f"INSERT INTO b VALUES " + ", ".join(f"({i}, {k}, {value(y)})" for i, k, y in
                 [random_row_b(rng, i) for i in rng.sample(range(60), 30)]))]
    for sql in initial:
        con.execute(sql)
        out = tessera_sql(binary, db, sql, workdir)
        if out.returncode != 0:
            return [f"tessera refused `{sql}`: {out.stderr}"]
    stale = {}
    for name, query in VIEWS:
        out = tessera_sql(binary, db, f"CREATE MATERIALIZED VIEW {name} AS {query}", workdir)
        if out.returncode != 0:
            return [f"tessera refused the view {name}: {out.stderr}"]
        con.execute(f"CREATE VIEW {name} AS {query}")
        stale[name] = [normalize(r) for r in con.execute(f"SELECT * FROM {name}").fetchall()]
    for n, (statement, duck) in enumerate(random_statements(rng, rng.randrange(5, 15))):
        if duck is None:
            path = os.path.join(workdir, f"ops{n}.csv")
            with open(path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["k", "g", "x", "op"])
                for k, g, x, op in statement:
                    w.writerow([k, g, "" if x is None else repr(x), op])
            sql = f"COPY a FROM 'ops{n}.csv' WITH (op_column = 'op')"
            theirs_ok = duckdb_copy(con, statement)
        else:
            sql = statement
            try:
                for d in duck:
                    con.execute(d)
                theirs_ok = True
            except duckdb.Error:
                theirs_ok = False
        ours = tessera_sql(binary, db, sql, workdir)
        if (ours.returncode == 0) != theirs_ok:
            problems.append(f"`{sql}`: tessera {'succeeded' if ours.returncode == 0 else 'failed: ' + ours.stderr.strip()}, "
                            f"DuckDB {'succeeded' if theirs_ok else 'failed'}")
            return problems
    checks = [(q, ordered, None) for q, ordered in QUERIES]
    checks.extend((f"SELECT * FROM {name}", False, stale[name]) for name, _ in VIEWS)
    for sql, ordered, expected in checks:
        ours = tessera_rows(binary, db, sql, workdir)
        theirs = expected if expected is not None else [normalize(r) for r in con.execute(sql).fetchall()]
        if not same_rows(ours, theirs, ordered):
            problems.append(f"{sql}\n  tessera {len(ours)} rows: {ours[:SHOW_ROWS]}\n  DuckDB  {len(theirs)} rows: {theirs[:SHOW_ROWS]}")
    for name, _ in VIEWS:
        refreshed = tessera_sql(binary, db, f"REFRESH MATERIALIZED VIEW {name}", workdir)
        if refreshed.returncode != 0:
            problems.append(f"REFRESH of {name} failed: {refreshed.stderr}")
            continue
        ours = tessera_rows(binary, db, f"SELECT * FROM {name}", workdir)
        theirs = [normalize(r) for r in con.execute(f"SELECT * FROM {name}").fetchall()]
        if not same_rows(ours, theirs, False):
            problems.append(f"{name} after REFRESH\n  tessera: {ours[:SHOW_ROWS]}\n  DuckDB:  {theirs[:SHOW_ROWS]}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tessera", required=True)
    parser.add_argument("--cases", type=int, default=25)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--case-seed", type=int, default=None)
    args = parser.parse_args()
    binary = os.path.abspath(args.tessera)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    seeds = [args.case_seed] if args.case_seed is not None else [seed * 1000 + i for i in range(args.cases)]
    print(f"duckdb-tables-diff: seed {seed}, {len(seeds)} cases")
    passed = failed = 0
    for case_seed in seeds:
        workdir = tempfile.mkdtemp(prefix="tessera-tables-diff-")
        problems = run_case(binary, case_seed, workdir)
        if problems:
            failed += 1
            print(f"case {case_seed} FAILED (kept in {workdir}):")
            for p in problems:
                print("  " + p)
        else:
            passed += 1
            shutil.rmtree(workdir)
    print(f"duckdb-tables-diff: {passed} passed, {failed} failed")
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
