#!/usr/bin/env python3
"""Benchmark of materialized views on TPC-H: incremental refresh against full recomputation in
tessera and against DuckDB recomputing the same view, and the load of lineitem against DuckDB's.

Usage:
    python scripts/bench_views.py --tessera BINARY [--scale 1] [--changes 0.001,0.01,0.1]

`tessera generate --tpch lineitem,orders --scale SF` writes the tables as CSV into
bench-data/tpch-SF/ (once). Both engines load them with the same column types; the view is
`lineitem JOIN orders` grouped by (o_custkey, l_returnflag) with SUM(l_extendedprice),
COUNT(*) and AVG(l_discount). For each change fraction p, DuckDB picks p of lineitem's rows
(a reservoir sample with a fixed seed): a third deleted, a third updated (price, discount and
return flag), and as many new rows inserted, written to one file with an operation column.
Both keep their database in a folder or file of the work directory (durable loads and views).
tessera applies it with `COPY ... WITH (op_column = 'op')` to a copy of the loaded database and
times, in one process (`tessera sql --timer`): the COPY, the incremental REFRESH, and a full
recomputation (the same query created as a new view). DuckDB applies the same changes with
DELETE, UPDATE and INSERT and times `CREATE OR REPLACE TABLE AS` of the view's query. Every
refreshed view is checked against DuckDB's (groups, revenue and counts). Times are seconds.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

try:
    import duckdb
except ImportError:
    sys.exit("bench-views: the duckdb module is missing; run it with the python of scripts/python-env.sh")

ORDERS = ("o_orderkey BIGINT PRIMARY KEY, o_custkey BIGINT, o_orderstatus VARCHAR, o_totalprice DECIMAL(15,2), "
          "o_orderdate DATE, o_orderpriority VARCHAR, o_clerk VARCHAR, o_shippriority INT, o_comment VARCHAR")
LINEITEM = ("l_orderkey BIGINT, l_partkey BIGINT, l_suppkey BIGINT, l_linenumber INT, l_quantity BIGINT, "
            "l_extendedprice DECIMAL(15,2), l_discount DECIMAL(15,2), l_tax DECIMAL(15,2), l_returnflag VARCHAR, "
            "l_linestatus VARCHAR, l_shipdate DATE, l_commitdate DATE, l_receiptdate DATE, l_shipinstruct VARCHAR, "
            "l_shipmode VARCHAR, l_comment VARCHAR, PRIMARY KEY (l_orderkey, l_linenumber)")
VIEW = ("SELECT o_custkey, l_returnflag, SUM(l_extendedprice) AS revenue, COUNT(*) AS n, AVG(l_discount) AS discount "
        "FROM lineitem JOIN orders ON l_orderkey = o_orderkey GROUP BY o_custkey, l_returnflag")
CHECK = "SELECT COUNT(*) AS groups, SUM(revenue) AS revenue, SUM(n) AS n FROM {}"


def tessera(binary, db, sql, cwd):
    """The statement times (s) and stdout of `tessera sql --timer`, the statements piped in (a
    long script does not fit in a command line)."""
    out = subprocess.run([binary, "sql", "--db", db, "--timer", "--format", "csv"], cwd=cwd, input=sql,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench-views: tessera failed on {sql[:80]}: {out.stderr}")
    return [float(t) for t in re.findall(r"time: ([0-9.]+) s", out.stderr)], out.stdout


def tpch_data(binary, scale):
    """The folder of TPC-H lineitem and orders at `scale` as CSV, written by `tessera generate`
    the first time."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = os.path.join(root, "bench-data", f"tpch-{scale:g}")
    if not os.path.exists(os.path.join(data, "lineitem.csv")):
        subprocess.run([binary, "generate", "--tpch", "lineitem,orders", "--scale", str(scale), "--output", data],
                       check=True)
    return data


def check_line(stdout):
    lines = [l for l in stdout.strip().splitlines() if l and not l.startswith("groups")]
    groups, revenue, n = lines[-1].split(",")
    return int(groups), round(float(revenue), 2), int(n)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tessera", required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--changes", default="0.001,0.01,0.1")
    args = parser.parse_args()
    binary = os.path.abspath(args.tessera)
    data = tpch_data(binary, args.scale)
    work = os.path.join(data, "work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} · TPC-H scale {args.scale:g} · {os.cpu_count()} cores · duckdb {duckdb.__version__}")

    # Loads.
    load_sql = (f"CREATE TABLE orders ({ORDERS}) WITH (path = '{data}/orders.csv'); "
                f"CREATE TABLE lineitem ({LINEITEM}); COPY lineitem FROM '{data}/lineitem.csv'; "
                f"CREATE MATERIALIZED VIEW rev AS {VIEW}")
    times, _ = tessera(binary, "base", load_sql, work)
    t_orders, _, t_copy, t_view = times
    # DuckDB keeps its database in a file, as tessera does: both loads are durable.
    con = duckdb.connect(os.path.join(work, "duckdb.db"))
    con.execute(f"CREATE TABLE orders ({ORDERS})")
    con.execute(f"CREATE TABLE lineitem ({LINEITEM})")
    started = time.perf_counter()
    con.execute(f"COPY orders FROM '{data}/orders.csv' (HEADER)")
    d_orders = time.perf_counter() - started
    started = time.perf_counter()
    con.execute(f"COPY lineitem FROM '{data}/lineitem.csv' (HEADER)")
    d_copy = time.perf_counter() - started
    rows = con.execute("SELECT count(*) FROM lineitem").fetchone()[0]
    print(f"| load | tessera (s) | DuckDB (s) | ratio |\n|---|---|---|---|")
    print(f"| orders (CREATE TABLE ... WITH path / COPY) | {t_orders:.3f} | {d_orders:.3f} | {t_orders / d_orders:.2f} |")
    print(f"| lineitem, {rows} rows (COPY) | {t_copy:.3f} | {d_copy:.3f} | {t_copy / d_copy:.2f} |")
    print(f"| the view, first computed | {t_view:.3f} | | |")
    con.execute("CREATE TABLE base_lineitem AS SELECT * FROM lineitem")

    print("\n| changes of lineitem | rows changed | tessera COPY of the changes (s) | tessera incremental REFRESH (s) | "
          "tessera full recomputation (s) | DuckDB CREATE TABLE AS (s) | recompute / incremental | DuckDB / incremental | same as DuckDB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in [float(x) for x in args.changes.split(",")]:
        n = max(3, int(rows * p))
        third = n // 3
        con.execute("CREATE OR REPLACE TABLE lineitem AS SELECT * FROM base_lineitem")
        con.execute(f"CREATE OR REPLACE TABLE chosen AS SELECT * FROM base_lineitem USING SAMPLE reservoir({2 * third} ROWS) REPEATABLE (42)")
        con.execute(f"""CREATE OR REPLACE TABLE changes AS
            SELECT *, 'D' AS op FROM (SELECT * FROM chosen ORDER BY l_orderkey, l_linenumber LIMIT {third})
            UNION ALL
            SELECT * REPLACE (l_extendedprice + 1.00 AS l_extendedprice, 0.07 AS l_discount, 'R' AS l_returnflag), 'U' AS op
              FROM (SELECT * FROM chosen ORDER BY l_orderkey, l_linenumber OFFSET {third})
            UNION ALL
            SELECT * REPLACE (100 + row_number() OVER () AS l_linenumber), 'I' AS op
              FROM (SELECT * FROM base_lineitem USING SAMPLE reservoir({n - 2 * third} ROWS) REPEATABLE (7))""")
        changes = os.path.join(work, f"changes-{p:g}.csv")
        con.execute(f"COPY changes TO '{changes}' (HEADER)")
        changed = con.execute("SELECT count(*) FROM changes").fetchone()[0]
        db = f"db-{p:g}"
        shutil.copytree(os.path.join(work, "base"), os.path.join(work, db))
        sql = (f"COPY lineitem FROM '{changes}' WITH (op_column = 'op'); REFRESH MATERIALIZED VIEW rev; "
               f"CREATE MATERIALIZED VIEW rev_full AS {VIEW}; {CHECK.format('rev')}")
        times, stdout = tessera(binary, db, sql, work)
        t_apply, t_refresh, t_full, _ = times
        ours = check_line(stdout)
        con.execute("DELETE FROM lineitem USING changes c WHERE lineitem.l_orderkey = c.l_orderkey "
                    "AND lineitem.l_linenumber = c.l_linenumber AND c.op <> 'I'")
        con.execute("INSERT INTO lineitem SELECT * EXCLUDE (op) FROM changes WHERE op <> 'D'")
        started = time.perf_counter()
        con.execute(f"CREATE OR REPLACE TABLE rev AS {VIEW}")
        d_full = time.perf_counter() - started
        theirs = con.execute(CHECK.format("rev")).fetchone()
        theirs = (int(theirs[0]), round(float(theirs[1]), 2), int(theirs[2]))
        print(f"| {p * 100:g}% | {changed} | {t_apply:.3f} | {t_refresh:.3f} | {t_full:.3f} | {d_full:.3f} | "
              f"{t_full / t_refresh:.1f}x | {d_full / t_refresh:.1f}x | {'yes' if ours == theirs else f'NO: {ours} against {theirs}'} |")
        shutil.rmtree(os.path.join(work, db))
    con.close()
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
