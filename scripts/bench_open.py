#!/usr/bin/env python3
"""Benchmark of a database opened by a fresh process, as a user running one command at a time
sees it: `tessera sql --db DIR -c STATEMENT` for each tessera binary given, against the DuckDB
CLI (`duckdb FILE -c STATEMENT`) on the same rows.

Usage:
    python scripts/bench_open.py --tessera NAME=BINARY [--tessera NAME=BINARY ...]
        [--duckdb BINARY] [--rows 6000000] [--work DIR] [--runs 15]

Data (written once into the work folder by the duckdb module, one thread): `big.parquet`,
ROWS rows of (id, grp, amount, note), and `small.parquet`, 50,000 rows of (id, grp, amount).
Each engine loads both into a database of its own (tessera: CREATE TABLE with a primary key,
then COPY; DuckDB: CREATE TABLE AS). Then hyperfine (`-N --warmup 2`) times, each in a fresh
process: SELECT 1; a COUNT of `small`; an INSERT and a DELETE of one row of `small`; a GROUP BY
over `big`; a range of 10,000 ids of `big`; one row of `big` by id. The peak RSS of each
statement is measured once with GNU time. Prints a table of medians (ms) and RSS (MB).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import duckdb
except ImportError:
    sys.exit("bench-open: the duckdb module is missing; run it with the python of scripts/python-env.sh")

STATEMENTS = [
    ("SELECT 1", "SELECT 1"),
    ("count small", "SELECT COUNT(*) FROM small"),
    ("insert+delete small",
     "INSERT INTO small VALUES (1000000, 1, 1.5); DELETE FROM small WHERE id = 1000000"),
    ("group by big", "SELECT grp, SUM(amount) AS total FROM big GROUP BY grp ORDER BY total DESC LIMIT 3"),
    ("range of big", "SELECT COUNT(*), SUM(amount) FROM big WHERE id BETWEEN 3000000 AND 3009999"),
    ("one row of big", "SELECT note FROM big WHERE id = 4242424"),
]


def data(work, rows):
    big, small = os.path.join(work, "big.parquet"), os.path.join(work, "small.parquet")
    if not os.path.exists(big):
        con = duckdb.connect()
        con.execute("SET threads = 1")
        con.execute(f"""COPY (SELECT i AS id, i % 1000 AS grp, (i * 7919 % 100003) / 7.0 AS amount,
            'note ' || (i % 5000) AS note FROM range({rows}) t(i)) TO '{big}' (FORMAT parquet)""")
        con.execute(f"""COPY (SELECT i AS id, i % 50 AS grp, i * 0.25 AS amount FROM range(50000) t(i))
            TO '{small}' (FORMAT parquet)""")
    return big, small


def load(engine, binary, work, big, small):
    """The command prefix that runs a statement against the engine's database, loaded once."""
    if engine == "duckdb":
        db = os.path.join(work, "duck.duckdb")
        if not os.path.exists(db):
            run([binary, db, "-c", f"CREATE TABLE big AS FROM '{big}'; CREATE TABLE small AS FROM '{small}'"])
        return [binary, db, "-c"]
    db = os.path.join(work, f"db-{engine}")
    if not os.path.exists(db):
        run([binary, "sql", "--db", db, "-c",
             "CREATE TABLE big (id BIGINT PRIMARY KEY, grp BIGINT, amount DOUBLE, note VARCHAR); "
             f"COPY big FROM '{big}'; "
             "CREATE TABLE small (id BIGINT PRIMARY KEY, grp BIGINT, amount DOUBLE); "
             f"COPY small FROM '{small}'"])
    return [binary, "sql", "--db", db, "-c"]


def run(command):
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench-open: {' '.join(command)} failed: {out.stderr}")
    return out


def quoted(command):
    return " ".join("'" + part.replace("'", "'\\''") + "'" for part in command)


def median_ms(commands, runs):
    """hyperfine's median (ms) of each command, measured in one run."""
    with tempfile.NamedTemporaryFile(suffix=".json") as export:
        run(["hyperfine", "-N", "--warmup", "2", "--runs", str(runs), "--export-json", export.name]
            + [quoted(c) for c in commands])
        results = json.load(open(export.name))["results"]
    return [r["median"] * 1000 for r in results]


def peak_rss_mb(command):
    out = subprocess.run(["/usr/bin/time", "-f", "%M"] + command, capture_output=True, text=True)
    return int(out.stderr.strip().splitlines()[-1]) / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", action="append", required=True, help="NAME=BINARY")
    parser.add_argument("--duckdb", help="the DuckDB CLI")
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--work", default="bench-data/open")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    work = os.path.abspath(args.work)
    big, small = data(work, args.rows)
    engines = [tuple(t.split("=", 1)) for t in args.tessera]
    if args.duckdb:
        engines.append(("duckdb", args.duckdb))
    prefixes = [load(name, binary, work, big, small) for name, binary in engines]
    names = [name for name, _ in engines]
    print("| statement | " + " | ".join(f"{n} ms" for n in names) + " | " + " | ".join(f"{n} MB" for n in names) + " |")
    print("|---" * (1 + 2 * len(names)) + "|")
    for label, sql in STATEMENTS:
        commands = [prefix + [sql] for prefix in prefixes]
        medians = median_ms(commands, args.runs)
        rss = [peak_rss_mb(c) for c in commands]
        print(f"| {label} | " + " | ".join(f"{m:.1f}" for m in medians) + " | "
              + " | ".join(f"{r:.0f}" for r in rss) + " |", flush=True)


if __name__ == "__main__":
    main()
