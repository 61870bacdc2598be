#!/usr/bin/env python3
"""Differential test: tessera's continuous temporal queries against DuckDB's batch self-joins.

Usage:
    python scripts/duckdb_temporal_diff.py --tessera PATH_TO_BINARY [--cases N] [--seed S]
    python scripts/duckdb_temporal_diff.py --tessera PATH_TO_BINARY --case-seed X   # one case again

Each case writes a random event stream (user BIGINT, kind VARCHAR, shop BIGINT, ts BIGINT
seconds, out of order by at most the watermark delay, many events per second) cut at a random
prefix (a quarter of the cases as Parquet written by DuckDB, with millisecond timestamps), and a
random query of the stable form: a self-join of 1 to 4 aliases with equalities between data
columns, per-alias predicates, <, <=, =, >=, >, <> between the aliases' event times, COUNT(*)
grouped by a data column or not at all, SELECT DISTINCT, UNION ALL of two blocks, EMIT CHANGES;
or (three cases in ten) a temporal formula over atoms named in WITH (SO_FAR, SINCE_COUNT,
SINCE_DURATION, ONCE_DURATION, PREVIOUS, FOR_SOME, DISTINCT, AND NOT, an atom binding no
variable), which DuckDB answers with the equivalent SQL over the whole file. Some self-joins
also relate two events in a way no synopsis bounds (`a.shop < b.shop`, `a.ts + 2 < b.ts`) and
run kept whole under SET allow_unbounded_state (every event kept, DataFusion answering).
Time conditions that contradict each other are refused by tessera; DuckDB must then find nothing.
tessera runs the query over the prefix as a stream; DuckDB runs the same SQL as a batch query
over the same file. The answers (for EMIT CHANGES, the changelog folded into its last rows) must
be equal as multisets. A failing case prints its seed and script and keeps its directory. The
last line is `duckdb-temporal-diff: N passed, M failed`; the exit status is 0 only if all passed.
"""

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

try:
    import duckdb
except ImportError:
    sys.exit("duckdb-temporal-diff: the duckdb module is missing; run it with the python of scripts/python-env.sh")

KINDS = ["login", "view", "cart", "purchase"]
TIME_OPS = ["<", "<=", "=", ">=", ">", "<>"]


def write_events(rng, directory, parquet):
    """A random stream, cut at a random prefix; returns its path and the FROM of DuckDB."""
    users, shops = rng.randint(1, 12), rng.randint(1, 4)
    t, rows = 1_000, []
    for _ in range(rng.randint(0, 400)):
        t += rng.choice([0, 0, 0, 1, 1, 2, 7])
        late_by = rng.choice([0, 0, 0, 1, 2, 3])  # within the 3-second watermark delay
        ts = t - late_by
        user = rng.randint(1, users)
        shop = rng.randint(1, shops) if rng.random() > 0.1 else None
        rows.append((user, rng.choice(KINDS), shop, ts * 1000 if parquet else ts))
    rows = rows[: rng.randint(0, len(rows))]
    csv_path = os.path.join(directory, "events.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user_id", "kind", "shop", "ts"])
        for user, kind, shop, ts in rows:
            w.writerow([user, kind, "" if shop is None else shop, ts])
    if not parquet:
        return csv_path, f"read_csv('{csv_path}', header=true, columns={{'user_id': 'BIGINT', 'kind': 'VARCHAR', 'shop': 'BIGINT', 'ts': 'BIGINT'}})"
    path = os.path.join(directory, "events.parquet")
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * FROM read_csv('{csv_path}', header=true, columns={{'user_id': 'BIGINT', 'kind': 'VARCHAR', "
        f"'shop': 'BIGINT', 'ts': 'BIGINT'}})) TO '{path}' (FORMAT PARQUET, ROW_GROUP_SIZE 64)"
    )
    return path, f"read_parquet('{path}')"


def random_block(rng, group, distinct, unbounded=False):
    k = rng.randint(1, 4) if not distinct else rng.randint(2, 3)
    aliases = [chr(ord("a") + i) for i in range(k)]
    where = []
    joins_shop = rng.random() < 0.3
    for x, y in zip(aliases, aliases[1:]):
        where.append(f"{x}.user_id = {y}.user_id")
        if joins_shop:
            where.append(f"{x}.shop = {y}.shop")
    for x in aliases:
        if rng.random() < 0.85:
            where.append(f"{x}.kind = '{rng.choice(KINDS)}'")
        elif rng.random() < 0.5:
            where.append(f"{x}.kind <> '{rng.choice(KINDS)}'")
    # Conditions that some order of the aliases' times satisfies (a random one of ranks).
    ranks = {x: rng.randint(0, 2) for x in aliases}
    holds = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, "=": lambda a, b: a == b,
             ">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<>": lambda a, b: a != b}
    for _ in range(rng.randint(0, k)):
        x, y = rng.sample(aliases, 2) if k > 1 else (aliases[0], aliases[0])
        ops = [op for op in TIME_OPS if holds[op](ranks[x], ranks[y])]
        if x != y:
            where.append(f"{x}.ts {rng.choice(ops)} {y}.ts")
    if unbounded and k > 1:
        # A relation no synopsis bounds: the query runs kept whole (SET allow_unbounded_state).
        x, y = aliases[0], aliases[1]
        where.append(rng.choice([f"{x}.shop < {y}.shop", f"{x}.ts + 2 < {y}.ts", f"{x}.shop + {y}.shop > 3"]))
    rng.shuffle(where)
    from_clause = ", ".join(f"events {x}" for x in aliases)
    where_clause = f" WHERE {' AND '.join(where)}" if where else ""
    if distinct:
        return f"SELECT DISTINCT a.user_id FROM {from_clause}{where_clause}"
    if group:
        return f"SELECT a.user_id, COUNT(*) AS n FROM {from_clause}{where_clause} GROUP BY a.user_id"
    return f"SELECT COUNT(*) AS n FROM {from_clause}{where_clause}"


def random_query(rng, unbounded):
    distinct = rng.random() < 0.15
    group = distinct or rng.random() < 0.6
    blocks = [random_block(rng, group, distinct, unbounded)]
    if rng.random() < 0.25:
        blocks.append(random_block(rng, group, distinct))
    return " UNION ALL ".join(blocks), group, len(blocks)


# Temporal formulas (FROM TEMPORAL(...)) and what DuckDB computes for them over the whole file,
# T being the last instant: {x} and {y} are kinds of event.
T = "(SELECT max(ts) FROM ev)"
FORMULAS = [
    # More x than y so far, by how many.
    ("SO_FAR(fx) AND NOT SO_FAR(fy)",
     "SELECT user_id, f - s AS n FROM (SELECT user_id, count(*) FILTER (WHERE kind = '{x}') AS f, "
     "count(*) FILTER (WHERE kind = '{y}') AS s FROM ev GROUP BY user_id) WHERE f > s"),
    # x since the user's last y (this instant's x included).
    ("fx OR SINCE_COUNT(NOT fy, fx)",
     "SELECT a.user_id, count(*) AS n FROM ev a WHERE a.kind = '{x}' AND NOT EXISTS "
     "(SELECT 1 FROM ev b WHERE b.user_id = a.user_id AND b.kind = '{y}' AND b.ts > a.ts) GROUP BY a.user_id"),
    # x since anyone's last y: an atom binding no variable.
    ("fx OR SINCE_COUNT(NOT gy, fx)",
     "SELECT a.user_id, count(*) AS n FROM ev a WHERE a.kind = '{x}' AND NOT EXISTS "
     "(SELECT 1 FROM ev b WHERE b.kind = '{y}' AND b.ts > a.ts) GROUP BY a.user_id"),
    # Instants since the user's last y.
    ("SINCE_DURATION(NOT fy, fy)",
     f"SELECT user_id, {T} - max(ts) AS n FROM ev WHERE kind = '{{y}}' GROUP BY user_id HAVING max(ts) < {T}"),
    # Instants since the user's first x.
    ("ONCE_DURATION(fx)",
     f"SELECT user_id, {T} - min(ts) AS n FROM ev WHERE kind = '{{x}}' GROUP BY user_id HAVING min(ts) < {T}"),
    # x one instant before the last.
    ("PREVIOUS(fx)", f"SELECT user_id, count(*) AS n FROM ev WHERE kind = '{{x}}' AND ts = {T} - 1 GROUP BY user_id"),
    # Kinds of event seen so far.
    ("FOR_SOME(kind, DISTINCT(SO_FAR(fk)))", "SELECT user_id, count(DISTINCT kind) AS n FROM ev GROUP BY user_id"),
]
ATOMS = {
    "fx": "fx AS (SELECT user_id FROM events WHERE kind = '{x}')",
    "fy": "fy AS (SELECT user_id FROM events WHERE kind = '{y}')",
    "gy": "gy AS (SELECT 1 FROM events WHERE kind = '{y}')",
    "fk": "fk AS (SELECT user_id, kind FROM events)",
}


def random_formula_query(rng):
    """A temporal formula query and DuckDB's query for the same answer."""
    formula, duck = rng.choice(FORMULAS)
    x, y = rng.choice(KINDS), rng.choice(KINDS)
    atoms = [ATOMS[a].format(x=x, y=y) for a in ATOMS if a in formula]
    duck = duck.format(x=x, y=y)
    group = rng.random() < 0.7
    select = "SELECT user_id, COUNT(*) AS n" if group else "SELECT COUNT(*) AS n"
    query = f"WITH {', '.join(atoms)} {select} FROM TEMPORAL({formula}){' GROUP BY user_id' if group else ''}"
    return query, duck if group else f"SELECT sum(n) AS n FROM ({duck})", group


def tessera_rows(output, changes):
    """The answer's rows: for a changelog, each group's last row unless deleted."""
    rows = [json.loads(line) for line in open(output) if line.strip()]
    if not changes:
        return [tuple(r.values()) for r in rows]
    last = {}
    for r in rows:
        op = r.pop("op")
        key = r.get("user_id")
        if op == "-D":
            last.pop(key, None)
        else:
            last[key] = tuple(r.values())
    return list(last.values())


def run_case(tessera, case_seed, keep_failures):
    rng = random.Random(case_seed)
    directory = tempfile.mkdtemp(prefix="tessera-temporal-diff-")
    parquet = rng.random() < 0.25
    path, duck_from = write_events(rng, directory, parquet)
    unbounded = False
    if rng.random() < 0.3:
        query, duck_query, group = random_formula_query(rng)
        blocks = 1
    else:
        unbounded = rng.random() < 0.15
        query, group, blocks = random_query(rng, unbounded)
        duck_query = query.replace("events ", "ev ")
    # A changelog is folded by its group key, which two blocks of a UNION ALL may share.
    changes = group and blocks == 1 and rng.random() < 0.3
    unit = "ms" if parquet else "s"
    delay = "3000" if parquet else "3"
    script = (
        f"CREATE SOURCE events (user_id BIGINT, kind VARCHAR, shop BIGINT, ts BIGINT, "
        f"WATERMARK FOR ts AS ts - INTERVAL '{delay}' SECOND) "
        f"WITH (connector = 'file', path = '{os.path.basename(path)}', time_unit = '{unit}');\n"
        f"{'SET allow_unbounded_state = true;' if unbounded else ''}\n"
        f"{query}{' EMIT CHANGES' if changes else ''};\n"
    )
    if parquet:
        # Millisecond times, the delay three seconds of them.
        script = script.replace(f"INTERVAL '{delay}' SECOND", "INTERVAL '3' SECOND")
    script_path = os.path.join(directory, "query.sql")
    with open(script_path, "w") as f:
        f.write(script)
    output = os.path.join(directory, "out.jsonl")
    run = subprocess.run(
        [tessera, "run", script_path, "--format", "jsonl", "--output", output],
        capture_output=True,
        text=True,
        timeout=120,
    )
    ok, why = True, ""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE ev AS SELECT * FROM {duck_from}")
    expected = [tuple(r) for r in con.execute(duck_query).fetchall()]
    # A count over no tuples is one row of 0 (or NULL) in DuckDB; a synopsis writes no row.
    # A query kept whole answers exactly as the batch query does, once it has events.
    has_events = con.execute("SELECT count(*) FROM ev").fetchone()[0] > 0
    expected = sorted((r for r in expected if (unbounded and has_events) or not (len(r) == 1 and r[0] in (0, None) and not group)), key=repr)
    if run.returncode != 0:
        # tessera refuses time conditions that contradict each other, where DuckDB finds nothing.
        if not ("contradict each other" in run.stderr and not expected):
            ok, why = False, f"tessera failed: {run.stderr.strip()}"
    else:
        got = sorted(tessera_rows(output, changes), key=repr)
        if got != expected:
            ok, why = False, f"tessera {got[:6]}... ({len(got)} rows) != duckdb {expected[:6]}... ({len(expected)} rows)"
    if ok or not keep_failures:
        shutil.rmtree(directory, ignore_errors=True)
    if not ok:
        print(f"case seed {case_seed} FAILED in {directory}: {why}\n{script}", file=sys.stderr)
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", required=True)
    parser.add_argument("--cases", type=int, default=120)
    parser.add_argument("--seed", type=int, default=20261205)
    parser.add_argument("--case-seed", type=int)
    args = parser.parse_args()
    seeds = [args.case_seed] if args.case_seed is not None else [args.seed * 1000 + i for i in range(args.cases)]
    passed = failed = 0
    for seed in seeds:
        if run_case(args.tessera, seed, keep_failures=True):
            passed += 1
        else:
            failed += 1
    print(f"duckdb-temporal-diff: {passed} passed, {failed} failed")
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
