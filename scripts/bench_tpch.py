#!/usr/bin/env python3
"""TPC-H on a database folder against DuckDB, each statement in a fresh process (as a user
running one command at a time sees it): load time by COPY, open time, queries 1, 3, 5, 6, 9 and
18, and the peak RSS of each query under `memory_limit`.

Usage:
    python scripts/bench_tpch.py --tessera BINARY --duckdb DUCKDB_CLI [--scale 1]
        [--memory-limit 1GB] [--runs 5] [--work DIR]

`tessera generate --tpch ... --scale SF` writes the eight tables as CSV (once, into
WORK/data-SF). Both engines load them into a database of their own with the same DDL (primary
keys included) by one process each: `tessera sql --db WORK/tessera-SF --timer` with CREATE TABLE
and COPY per table, the DuckDB CLI with `.timer on` and `COPY ... (HEADER)`. Then hyperfine
(`-N --warmup 1`) times `SELECT 1` and each query, each in a fresh process of each engine; GNU
time gives each query's peak RSS once, tessera's after `SET memory_limit = 'LIMIT'`. The answers of
both engines are compared (row counts and every value, numbers within 1e-6 relative) before
anything is timed. Prints markdown tables: seconds, ratios to DuckDB, MB.
"""

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TABLES = {
    "region": "r_regionkey BIGINT PRIMARY KEY, r_name VARCHAR, r_comment VARCHAR",
    "nation": "n_nationkey BIGINT PRIMARY KEY, n_name VARCHAR, n_regionkey BIGINT, n_comment VARCHAR",
    "supplier": ("s_suppkey BIGINT PRIMARY KEY, s_name VARCHAR, s_address VARCHAR, s_nationkey BIGINT, "
                 "s_phone VARCHAR, s_acctbal DECIMAL(15,2), s_comment VARCHAR"),
    "customer": ("c_custkey BIGINT PRIMARY KEY, c_name VARCHAR, c_address VARCHAR, c_nationkey BIGINT, "
                 "c_phone VARCHAR, c_acctbal DECIMAL(15,2), c_mktsegment VARCHAR, c_comment VARCHAR"),
    "part": ("p_partkey BIGINT PRIMARY KEY, p_name VARCHAR, p_mfgr VARCHAR, p_brand VARCHAR, p_type VARCHAR, "
             "p_size INT, p_container VARCHAR, p_retailprice DECIMAL(15,2), p_comment VARCHAR"),
    "partsupp": ("ps_partkey BIGINT, ps_suppkey BIGINT, ps_availqty INT, ps_supplycost DECIMAL(15,2), "
                 "ps_comment VARCHAR, PRIMARY KEY (ps_partkey, ps_suppkey)"),
    "orders": ("o_orderkey BIGINT PRIMARY KEY, o_custkey BIGINT, o_orderstatus VARCHAR, o_totalprice DECIMAL(15,2), "
               "o_orderdate DATE, o_orderpriority VARCHAR, o_clerk VARCHAR, o_shippriority INT, o_comment VARCHAR"),
    "lineitem": ("l_orderkey BIGINT, l_partkey BIGINT, l_suppkey BIGINT, l_linenumber INT, l_quantity DECIMAL(15,2), "
                 "l_extendedprice DECIMAL(15,2), l_discount DECIMAL(15,2), l_tax DECIMAL(15,2), l_returnflag VARCHAR, "
                 "l_linestatus VARCHAR, l_shipdate DATE, l_commitdate DATE, l_receiptdate DATE, "
                 "l_shipinstruct VARCHAR, l_shipmode VARCHAR, l_comment VARCHAR, PRIMARY KEY (l_orderkey, l_linenumber)"),
}

# The queries with the substitution parameters of the TPC-H specification's validation run.
QUERIES = {
    "Q1": """SELECT l_returnflag, l_linestatus, SUM(l_quantity) AS sum_qty, SUM(l_extendedprice) AS sum_base_price,
  SUM(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
  SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, AVG(l_quantity) AS avg_qty,
  AVG(l_extendedprice) AS avg_price, AVG(l_discount) AS avg_disc, COUNT(*) AS count_order
FROM lineitem WHERE l_shipdate <= DATE '1998-12-01' - INTERVAL '90' DAY
GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    "Q3": """SELECT l_orderkey, SUM(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority
FROM customer, orders, lineitem
WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey
  AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
GROUP BY l_orderkey, o_orderdate, o_shippriority ORDER BY revenue DESC, o_orderdate LIMIT 10""",
    "Q5": """SELECT n_name, SUM(l_extendedprice * (1 - l_discount)) AS revenue
FROM customer, orders, lineitem, supplier, nation, region
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey AND c_nationkey = s_nationkey
  AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'ASIA'
  AND o_orderdate >= DATE '1994-01-01' AND o_orderdate < DATE '1995-01-01'
GROUP BY n_name ORDER BY revenue DESC""",
    "Q6": """SELECT SUM(l_extendedprice * l_discount) AS revenue FROM lineitem
WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
  AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""",
    "Q9": """SELECT nation, o_year, SUM(amount) AS sum_profit FROM (
  SELECT n_name AS nation, EXTRACT(YEAR FROM o_orderdate) AS o_year,
    l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity AS amount
  FROM part, supplier, lineitem, partsupp, orders, nation
  WHERE s_suppkey = l_suppkey AND ps_suppkey = l_suppkey AND ps_partkey = l_partkey AND p_partkey = l_partkey
    AND o_orderkey = l_orderkey AND s_nationkey = n_nationkey AND p_name LIKE '%green%') AS profit
GROUP BY nation, o_year ORDER BY nation, o_year DESC""",
    "Q18": """SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, SUM(l_quantity) AS quantity
FROM customer, orders, lineitem
WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING SUM(l_quantity) > 300)
  AND c_custkey = o_custkey AND o_orderkey = l_orderkey
GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
ORDER BY o_totalprice DESC, o_orderdate LIMIT 100""",
}


def run(command, what, stdin=None):
    out = subprocess.run(command, input=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench-tpch: {what} failed: {out.stderr[-2000:]}")
    return out


def data(binary, folder, scale):
    """The folder of the eight tables as CSV, written by `tessera generate` the first time."""
    if not os.path.exists(os.path.join(folder, "region.csv")):
        partial = folder + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        run([binary, "generate", "--tpch", ",".join(TABLES), "--scale", str(scale), "--output", partial],
            "tessera generate")
        os.rename(partial, folder)
    return folder


def load_tessera(binary, db, folder):
    """Loads the tables into a new folder `db`; each COPY's seconds."""
    shutil.rmtree(db, ignore_errors=True)
    script = "".join(f"CREATE TABLE {t} ({ddl});\nCOPY {t} FROM '{folder}/{t}.csv';\n" for t, ddl in TABLES.items())
    out = run([binary, "sql", "--db", db, "--timer", "--format", "csv"], "tessera's load", script)
    times = [float(t) for t in re.findall(r"time: ([0-9.]+) s", out.stderr)]
    return dict(zip(TABLES, times[1::2]))


def load_duckdb(duckdb, db, folder):
    """Loads the tables into a new database file `db`; each COPY's seconds."""
    if os.path.exists(db):
        os.remove(db)
    script = ".timer on\n" + "".join(
        f"CREATE TABLE {t} ({ddl});\nCOPY {t} FROM '{folder}/{t}.csv' (HEADER);\n" for t, ddl in TABLES.items())
    out = run([duckdb, db], "DuckDB's load", script)
    times = [float(t) for t in re.findall(r"Run Time \(s\): real ([0-9.]+)", out.stdout)]
    return dict(zip(TABLES, times[1::2]))


def rows(text):
    """The rows of a CSV answer, numbers as floats."""
    def value(v):
        try:
            return float(v)
        except ValueError:
            return v
    return [[value(v) for v in row] for row in list(csv.reader(io.StringIO(text)))[1:]]


def same(ours, theirs):
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs):
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if isinstance(x, float) and isinstance(y, float):
                if abs(x - y) > 1e-6 * max(1.0, abs(x), abs(y)):
                    return False
            elif str(x) != str(y):
                return False
    return True


def hyperfine(commands, runs):
    """Median seconds of each named command, each in a fresh process."""
    with tempfile.NamedTemporaryFile(suffix=".json") as export:
        args = ["hyperfine", "-N", "--warmup", "1", "--runs", str(runs), "--export-json", export.name]
        for name, command in commands:
            args += ["-n", name, command]
        run(args, "hyperfine")
        results = json.load(open(export.name))["results"]
    return {r["command"]: r["median"] for r in results}


def peak_rss_mb(command):
    out = run(["/usr/bin/time", "-f", "%M"] + command, "GNU time")
    return int(out.stderr.strip().splitlines()[-1]) / 1024


def quote(argument):
    return "'" + argument.replace("'", "'\\''") + "'"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tessera", required=True)
    parser.add_argument("--duckdb", required=True, help="the DuckDB CLI")
    parser.add_argument("--scale", type=float, default=1)
    parser.add_argument("--memory-limit", default="1GB")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", default="bench-data/tpch")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    work = os.path.abspath(args.work)
    tessera, duckdb = os.path.abspath(args.tessera), os.path.abspath(args.duckdb)
    folder = data(tessera, os.path.join(work, f"data-{args.scale:g}"), args.scale)
    tdb, ddb = os.path.join(work, f"tessera-{args.scale:g}"), os.path.join(work, f"duckdb-{args.scale:g}.duckdb")
    t_load, d_load = load_tessera(tessera, tdb, folder), load_duckdb(duckdb, ddb, folder)
    print(f"TPC-H scale {args.scale:g}\n\n| COPY | tessera (s) | DuckDB (s) | ratio |\n|---|---|---|---|")
    for table in TABLES:
        print(f"| {table} | {t_load[table]:.3f} | {d_load[table]:.3f} | {t_load[table] / d_load[table]:.2f} |")
    total_t, total_d = sum(t_load.values()), sum(d_load.values())
    print(f"| all | {total_t:.3f} | {total_d:.3f} | {total_t / total_d:.2f} |")

    for name, sql in QUERIES.items():
        ours = rows(run([tessera, "sql", "--db", tdb, "--format", "csv", "-c", sql], f"tessera {name}").stdout)
        theirs = rows(run([duckdb, ddb, "-csv", "-c", sql], f"DuckDB {name}").stdout)
        if not same(ours, theirs):
            sys.exit(f"bench-tpch: {name} answers differ:\ntessera {ours[:5]}\nDuckDB  {theirs[:5]}")

    commands = [("open tessera", f"{tessera} sql --db {tdb} -c 'SELECT 1'"),
                ("open duckdb", f"{duckdb} {ddb} -c 'SELECT 1'")]
    for name, sql in QUERIES.items():
        one_line = " ".join(sql.split())
        commands.append((f"{name} tessera", f"{tessera} sql --db {tdb} --format csv -c {quote(one_line)}"))
        commands.append((f"{name} duckdb", f"{duckdb} {ddb} -csv -c {quote(one_line)}"))
    medians = hyperfine(commands, args.runs)
    print(f"\n| statement (fresh process) | tessera (s) | DuckDB (s) | ratio | tessera peak RSS, "
          f"memory_limit = {args.memory_limit} (MB) | DuckDB peak RSS (MB) |\n|---|---|---|---|---|---|")
    ratios = []
    for name in ["open"] + list(QUERIES):
        t, d = medians[f"{name} tessera"], medians[f"{name} duckdb"]
        if name == "open":
            rss = (peak_rss_mb([tessera, "sql", "--db", tdb, "-c", "SELECT 1"]),
                   peak_rss_mb([duckdb, ddb, "-c", "SELECT 1"]))
        else:
            ratios.append(t / d)
            limited = f"SET memory_limit = '{args.memory_limit}'; {QUERIES[name]}"
            rss = (peak_rss_mb([tessera, "sql", "--db", tdb, "--format", "csv", "-c", limited]),
                   peak_rss_mb([duckdb, ddb, "-csv", "-c", QUERIES[name]]))
        print(f"| {name} | {t:.4f} | {d:.4f} | {t / d:.2f} | {rss[0]:.0f} | {rss[1]:.0f} |")
    ratios.sort()
    middle = len(ratios) // 2
    median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    print(f"\nmedian query ratio (tessera / DuckDB): {median:.2f} (all: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
