#!/usr/bin/env python3
"""Benchmark of Stale View Cleaning on TPC-H, after the paper's TPCD experiments: the time to
clean a view's 10% sample against its full incremental refresh, and the error of the stale
answer, of svc_aqp, svc_corr and auto against the fresh answer, with interval coverage.

Usage:
    python scripts/bench_svc.py --tessera BINARY [--scale 1] [--updates 0.1] [--ratio 0.1]
                                [--queries 100] [--breakeven 0.025,0.05,0.1,0.2,0.3,0.4]
                                [--outliers 1000] [--group-outliers 1000] [--views join,grouped]
                                [--rounds uniform,skewed,index] [--seeds 1]
                                [--only-breakeven]

Data: `tessera generate --tpch lineitem,orders` (as scripts/bench_views.py), and a skewed
variant as TPCD-Skew builds it with Zipf z = 2: each lineitem's order drawn from a Zipf
distribution over the orders (rank k with probability about 1/k^2; line numbers renumbered),
and its price multiplied by a Zipf-distributed factor. The view is the join view of
bench_views.py (lineitem JOIN orders grouped by o_custkey and l_returnflag with SUM, COUNT and
AVG), created WITH (sample = RATIO); and the paper's join view, the foreign-key join of lineitem
and orders (its key lineitem's, so the sample's hash reaches lineitem). Updates of UPDATES of lineitem's rows, as the paper's: half
updates of existing rows (price, discount, return flag), half insertions. Then, in one `tessera sql`
process: the sample cleaned (`REFRESH MATERIALIZED VIEW v SAMPLE`, timed), every query
answered stale, by svc_aqp, svc_corr and auto, the view refreshed incrementally (timed), and
every query answered again: the truth. The queries are TPC-H-style group-by aggregates over the
view with random conditions. Errors are relative, per group and aggregate, medians over all.
With --outliers K the skewed join view is run again with an outlier index on the K largest
l_extendedprice (Section 6), and with --group-outliers K the skewed grouped view with an
outlier index on its own K largest revenues (a base column's index cannot reach it: its key
has columns of both sides of the join); each query's time (estimates with the sample cleaned)
is reported for every round. Per aggregate function, svc_corr's median error and interval coverage go to
standard error. With --seeds S each round runs S times, each over another sample of the view
(`sample_seed`) and its own queries, and the figures are pooled: the answers of one sample
share its luck, so coverage over one sample moves with it. --rounds picks the rounds of each view (uniform, skewed, index: skewed with the
outlier index); --only-breakeven runs the break-even rounds alone (their errors only).
"""

import argparse
import math
import os
import random
import re
import shutil
import statistics
import sys
import time

try:
    import duckdb
except ImportError:
    sys.exit("bench-svc: the duckdb module is missing; run it with the python of scripts/python-env.sh")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_views import LINEITEM, ORDERS, VIEW, tessera, tpch_data  # noqa: E402

METHODS = ["stale", "svc_aqp", "svc_corr", "auto"]


# The paper's join view: the foreign-key join of lineitem and orders (its key is lineitem's).
JOIN_VIEW = ("SELECT l_orderkey, l_linenumber, l_quantity, l_extendedprice, l_discount, l_returnflag, l_shipmode, "
             "o_custkey, o_orderdate, o_orderpriority FROM lineitem JOIN orders ON l_orderkey = o_orderkey")


def queries(view, count, seed):
    """Random group-by aggregate queries over `view` (`join` or `grouped`): (SQL, its group
    column or None)."""
    rng = random.Random(seed)
    out = []
    for q in range(count):
        if view == "join":
            aggregate = ["SUM(l_extendedprice)", "COUNT(*)", "AVG(l_discount)", "SUM(l_quantity)"][q % 4]
            group = [None, "l_returnflag", "l_shipmode", "o_orderpriority"][q % 3 + (q // 3) % 2]
            conditions = [f"l_quantity < {rng.randint(10, 50)}"] if rng.random() < 0.6 else []
            if rng.random() < 0.5:
                conditions.append(f"o_orderdate < DATE '199{rng.randint(3, 8)}-0{rng.randint(1, 9)}-01'")
        else:
            aggregate = ["SUM(revenue)", "SUM(n)", "COUNT(*)", "AVG(discount)"][q % 4]
            group = None if q % 3 == 0 else "l_returnflag"
            conditions = [f"n > {rng.randint(1, 12)}"] if rng.random() < 0.7 else []
            if rng.random() < 0.5:
                conditions.append(f"o_custkey % {rng.choice([2, 3, 5, 7])} <> {rng.randint(0, 1)}")
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        table = "v"
        if group:
            out.append((f"SELECT {group}, {aggregate} AS a{q} FROM {table}{where} GROUP BY {group}", group))
        else:
            out.append((f"SELECT {aggregate} AS a{q} FROM {table}{where}", None))
    return out


def parse(lines, i, qs, interval):
    """Per query, per group: [value, low, high] from the result sets of `qs` in `lines` from
    line `i`; and the line after them."""
    answers = []
    for q, (_, group) in enumerate(qs):
        name = f"a{q}"
        groups = 1 if group else 0
        header = ([group] if group else []) + [name] + ([f"{name}_ci_low", f"{name}_ci_high"] if interval else [])
        while lines[i].split(",") != header:
            i += 1
        i += 1
        rows = {}
        while i < len(lines) and not re.match(r"^[a-z_]", lines[i]):
            cells = lines[i].split(",")
            values = [float(c) if c else None for c in cells[groups:]]
            rows[tuple(cells[:groups])] = (values + [None, None])[:3]
            i += 1
        answers.append(rows)
    return answers, i


def skewed(con, data, work):
    """lineitem with its orders and prices Zipf-skewed (z = 2), written next to the data."""
    path = os.path.join(data, "lineitem_skew.csv")
    if os.path.exists(path):
        return path
    # One thread: random() after setseed repeats only when one thread draws every value.
    con.execute("SET threads = 1")
    con.execute("SELECT setseed(0.42)")
    con.execute(f"CREATE OR REPLACE TABLE ranked AS SELECT row_number() OVER (ORDER BY o_orderkey) AS r, o_orderkey "
                f"FROM read_csv('{data}/orders.csv', header = true, columns = {{'o_orderkey': 'BIGINT', 'o_custkey': 'BIGINT', "
                f"'o_orderstatus': 'VARCHAR', 'o_totalprice': 'DECIMAL(15,2)', 'o_orderdate': 'DATE', 'o_orderpriority': 'VARCHAR', "
                f"'o_clerk': 'VARCHAR', 'o_shippriority': 'INT', 'o_comment': 'VARCHAR'}})")
    orders = con.execute("SELECT count(*) FROM ranked").fetchone()[0]
    # A rank k with probability 1/k - 1/(k+1), about 1/k^2: floor(1/u) for u uniform in (0, 1].
    con.execute(f"""CREATE OR REPLACE TABLE skewed AS
        WITH drawn AS (
            SELECT l.* EXCLUDE (l_orderkey, l_linenumber, l_extendedprice),
                   least(floor(1.0 / (1.0 - random())), {orders})::BIGINT AS r,
                   least(floor(1.0 / (1.0 - random())), 1000) AS factor,
                   l_extendedprice
            FROM lineitem l)
        SELECT k.o_orderkey AS l_orderkey, l_partkey, l_suppkey,
               row_number() OVER (PARTITION BY k.o_orderkey ORDER BY l_partkey, l_suppkey)::INT AS l_linenumber,
               l_quantity, (l_extendedprice * factor)::DECIMAL(15,2) AS l_extendedprice, l_discount, l_tax,
               l_returnflag, l_linestatus, l_shipdate, l_commitdate, l_receiptdate, l_shipinstruct, l_shipmode, l_comment
        FROM drawn JOIN ranked k USING (r)""")
    con.execute(f"COPY skewed TO '{path}' (HEADER)")
    con.execute("DROP TABLE skewed")
    con.execute(f"SET threads = {os.cpu_count()}")
    return path


def changes(con, table, fraction, path):
    """Updates of `fraction` of `table`'s rows written to `path` with an operation column, as
    the paper's: half of them updates of existing rows (price, discount, return flag), half
    new rows."""
    rows = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    n = max(2, int(rows * fraction))
    half = n // 2
    con.execute(f"""CREATE OR REPLACE TABLE changes AS
        SELECT * REPLACE (l_extendedprice * 1.25 + 1.00 AS l_extendedprice, 0.07 AS l_discount, 'R' AS l_returnflag), 'U' AS op
          FROM (SELECT * FROM {table} USING SAMPLE reservoir({half} ROWS) REPEATABLE (42))
        UNION ALL
        SELECT * REPLACE (10000000 + row_number() OVER () AS l_linenumber), 'I' AS op
          FROM (SELECT * FROM {table} USING SAMPLE reservoir({n - half} ROWS) REPEATABLE (7))""")
    con.execute(f"COPY changes TO '{path}' (HEADER)")
    return con.execute("SELECT count(*) FROM changes").fetchone()[0]


def relative(value, truth):
    if truth is None or value is None:
        return None
    return abs(value - truth) / max(abs(truth), 1e-9)


def run(binary, work, base, lineitem_table, con, fraction, qs, label):
    """One round: the changes applied to a copy of `base`, the sample cleaned, the queries
    answered every way, the view refreshed, the truth. Returns the figures."""
    changes_path = os.path.join(work, f"changes-{label}-{fraction:g}.csv")
    changed = changes(con, lineitem_table, fraction, changes_path)
    db = f"db-{label}-{fraction:g}"
    shutil.rmtree(os.path.join(work, db), ignore_errors=True)
    shutil.copytree(os.path.join(work, base), os.path.join(work, db))
    statements = [f"COPY lineitem FROM '{changes_path}' WITH (op_column = 'op')", "REFRESH MATERIALIZED VIEW v SAMPLE"]
    for method in METHODS:
        statements.append(f"SET freshness = '{method}'")
        statements.extend(sql for sql, _ in qs)
    statements += ["SET freshness = 'stale'", "REFRESH MATERIALIZED VIEW v"]
    statements.extend(sql for sql, _ in qs)
    times, stdout = tessera(binary, db, "; ".join(statements), work)
    t_clean = times[1]
    t_refresh = times[2 + len(METHODS) * (len(qs) + 1) + 1]
    lines, i, per = stdout.splitlines(), 0, []
    for method in METHODS + ["truth"]:
        answers, i = parse(lines, i, qs, method in ("svc_aqp", "svc_corr", "auto"))
        per.append(answers)
    truth = per[-1]
    errors = {m: [] for m in METHODS}
    covered = {m: [0, 0] for m in METHODS[1:]}
    # Per aggregate function: svc_corr's errors and interval coverage, to see which one errs.
    by_aggregate = {}
    for q, (sql, _) in enumerate(qs):
        aggregate = re.search(r"(\w+\([^)]*\)) AS a", sql).group(1)
        detail = by_aggregate.setdefault(aggregate, {"svc_corr": [], "covered": [0, 0]})
        for group, (value, _, _) in truth[q].items():
            for m, answers in zip(METHODS, per):
                got = answers[q].get(group)
                e = relative(got[0] if got else 0.0, value)
                if e is not None:
                    errors[m].append(e)
                    if m == "svc_corr":
                        detail["svc_corr"].append(e)
                # A bound that is NULL is no bound (the far side of MIN and MAX).
                if m in covered and got and (got[1], got[2]) != (None, None) and value is not None:
                    low = -math.inf if got[1] is None else got[1]
                    high = math.inf if got[2] is None else got[2]
                    covered[m][0] += low <= value <= high
                    covered[m][1] += 1
                    if m == "svc_corr":
                        detail["covered"][0] += low <= value <= high
                        detail["covered"][1] += 1
    report_aggregates(label, by_aggregate)
    shutil.rmtree(os.path.join(work, db))
    corr = 2 + METHODS.index("svc_corr") * (len(qs) + 1) + 1
    return {"changed": changed, "clean": [t_clean], "refresh": [t_refresh], "errors": errors, "covered": covered,
            "by_aggregate": by_aggregate, "queries": times[corr:corr + len(qs)]}


def report_aggregates(label, by_aggregate):
    for aggregate, detail in by_aggregate.items():
        hit, total = detail["covered"]
        print(f"#   {label}: {aggregate}: svc_corr median error {statistics.median(detail['svc_corr']):.4f}, "
              f"coverage {hit}/{total}", file=sys.stderr, flush=True)


def pooled(rounds):
    """The figures of rounds over several samples as one: errors, answers and coverage counts
    pooled, times as lists."""
    out = {"changed": rounds[0]["changed"], "clean": [], "refresh": [], "errors": {m: [] for m in METHODS},
           "covered": {m: [0, 0] for m in METHODS[1:]}, "by_aggregate": {}, "queries": []}
    for r in rounds:
        for key in ("clean", "refresh", "queries"):
            out[key] += r[key]
        for m in METHODS:
            out["errors"][m] += r["errors"][m]
        for m in METHODS[1:]:
            out["covered"][m] = [a + b for a, b in zip(out["covered"][m], r["covered"][m])]
        for aggregate, detail in r["by_aggregate"].items():
            into = out["by_aggregate"].setdefault(aggregate, {"svc_corr": [], "covered": [0, 0]})
            into["svc_corr"] += detail["svc_corr"]
            into["covered"] = [a + b for a, b in zip(into["covered"], detail["covered"])]
    return out


def medians(figures):
    return {m: statistics.median(e) if e else float("nan") for m, e in figures["errors"].items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tessera", required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--updates", type=float, default=0.1)
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--breakeven", default="")
    parser.add_argument("--outliers", type=int, default=0)
    parser.add_argument("--group-outliers", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1,
                        help="run each round over this many samples (sample_seed 1, 2, ...), --queries each, pooled")
    parser.add_argument("--views", default="join,grouped")
    parser.add_argument("--rounds", default="uniform,skewed,index",
                        help="which rounds of each view to run: uniform, skewed, index (skewed with the outlier index)")
    parser.add_argument("--only-breakeven", action="store_true",
                        help="run only the break-even rounds (the skewed join view at each --breakeven size)")
    args = parser.parse_args()
    binary = os.path.abspath(args.tessera)
    data = tpch_data(binary, args.scale)
    # One folder per run: two runs side by side must not remove each other's databases.
    work = os.path.join(data, f"svc-work-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    con = duckdb.connect()
    con.execute(f"CREATE TABLE lineitem ({LINEITEM})")
    con.execute(f"COPY lineitem FROM '{data}/lineitem.csv' (HEADER)")
    skew_path = skewed(con, data, work)
    con.execute(f"CREATE TABLE lineitem_skew ({LINEITEM})")
    con.execute(f"COPY lineitem_skew FROM '{skew_path}' (HEADER)")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} · TPC-H scale {args.scale:g} · {os.cpu_count()} cores · "
          f"sample {args.ratio:g} · updates {args.updates:g} of lineitem · {args.queries} queries per view"
          + (f" and sample, {args.seeds} samples" if args.seeds > 1 else ""))
    print("\n| view | data | rows changed | clean the sample (s) | full incremental refresh (s) | speedup | "
          "median relative error: stale | svc_aqp | svc_corr | auto | stale / svc_corr | svc_aqp / svc_corr | "
          "coverage (95%): svc_aqp | svc_corr | answers | median svc_corr query (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    views = [("join", "lineitem JOIN orders (the paper's join view)", JOIN_VIEW),
             ("grouped", "grouped by o_custkey, l_returnflag", VIEW)]
    views = [v for v in views if v[0] in args.views.split(",")]
    rounds = [("uniform", "uniform", "lineitem", f"{data}/lineitem.csv", ""),
              ("skewed", "skewed z=2", "lineitem_skew", skew_path, "")]
    for view, description, definition in views:
        qs = queries(view, args.queries, 7)
        extra = []
        if view == "join" and args.outliers:
            extra = [("index", f"skewed z=2, outlier index on the {args.outliers} largest l_extendedprice", "lineitem_skew",
                      skew_path, f", outlier_index = 'lineitem.l_extendedprice', outlier_k = {args.outliers}")]
        if view == "grouped" and args.group_outliers:
            extra = [("index", f"skewed z=2, outlier index on the view's {args.group_outliers} largest revenue",
                      "lineitem_skew", skew_path, f", outlier_index = 'v.revenue', outlier_k = {args.group_outliers}")]
        for name, label, table, path, options in rounds + extra:
            if name not in args.rounds.split(","):
                continue
            if args.only_breakeven and (view != "join" or table != "lineitem_skew" or options):
                continue
            base = f"base-{view}-{table}"
            figures = []
            # With several samples, each its own seed and its own queries.
            for seed in range(1, args.seeds + 1) if args.seeds > 1 else [None]:
                seeded = f", sample_seed = {seed}" if seed else ""
                load = (f"CREATE TABLE orders ({ORDERS}) WITH (path = '{data}/orders.csv'); "
                        f"CREATE TABLE lineitem ({LINEITEM}); COPY lineitem FROM '{path}'; "
                        f"CREATE MATERIALIZED VIEW v WITH (sample = {args.ratio}{options}{seeded}) AS {definition}")
                tessera(binary, base, load, work)
                if not args.only_breakeven:
                    label_seed = f"{view}-{table}{'-index' if options else ''}{f'-seed{seed}' if seed else ''}"
                    figures.append(run(binary, work, base, table, con, args.updates,
                                       queries(view, args.queries, 7 + (seed or 0)), label_seed))
                if view == "join" and table == "lineitem_skew" and not options and args.breakeven:
                    breakeven = [(f, medians(run(binary, work, base, table, con, f, qs, f"be-{f:g}")))
                                 for f in [float(x) for x in args.breakeven.split(",")]]
                shutil.rmtree(os.path.join(work, base))
            if figures:
                f = pooled(figures)
                if len(figures) > 1:
                    report_aggregates(f"{view}-{table}{'-index' if options else ''} over {len(figures)} samples",
                                      f["by_aggregate"])
                med = medians(f)
                cov = {m: c[0] / c[1] if c[1] else float("nan") for m, c in f["covered"].items()}
                t_clean, t_refresh = statistics.median(f["clean"]), statistics.median(f["refresh"])
                print(f"| {description} | {label} | {f['changed']} | {t_clean:.3f} | {t_refresh:.3f} | "
                      f"{t_refresh / t_clean:.1f}x | {med['stale']:.4f} | {med['svc_aqp']:.4f} | {med['svc_corr']:.4f} | "
                      f"{med['auto']:.4f} | {med['stale'] / med['svc_corr']:.1f}x | {med['svc_aqp'] / med['svc_corr']:.1f}x | "
                      f"{cov['svc_aqp']:.3f} | {cov['svc_corr']:.3f} | {len(f['errors']['stale'])} | "
                      f"{statistics.median(f['queries']):.3f} |", flush=True)
    if args.breakeven:
        print("\n| updates of lineitem (join view, skewed) | median relative error: stale | svc_aqp | svc_corr | auto | "
              "more accurate |")
        print("|---|---|---|---|---|---|")
        for fraction, med in breakeven:
            better = "svc_corr" if med["svc_corr"] < med["svc_aqp"] else "svc_aqp"
            print(f"| {fraction * 100:g}% | {med['stale']:.4f} | {med['svc_aqp']:.4f} | {med['svc_corr']:.4f} | "
                  f"{med['auto']:.4f} | {better} |")
    con.close()
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
