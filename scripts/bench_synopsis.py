#!/usr/bin/env python3
"""Continuous temporal queries: synopsis state and throughput as the stream grows, beside
DuckDB's batch self-join of the same file.

The input is written by DuckDB (not tessera's generator): --events events of --users users in
event-time order with millisecond timestamps (a few ms out of order), kinds login, view, cart,
purchase. Workloads:
  funnel2  (login, purchase) pairs per user, login first
  funnel3  (login, view, purchase) triples per user, in that order
  since_service  a temporal formula: views since the user's last login ("alarms since service")
  failures       a temporal formula: carts beyond purchases so far ("more failures than successes")
For each size (powers of ten up to --max-events) it reports tessera's wall time, events/s,
peak state bytes (from --stats-json) and peak RSS, and DuckDB's time for the same SQL as a batch
self-join over the same file (for the formulas, the equivalent SQL: a NOT EXISTS of a later login,
filtered counts; up to --duckdb-max-events; its threads as given by --duckdb-threads).
The answers are compared where both ran. The peer a streaming self-join is: the same SQL run by
tessera with `--set temporal_strategy=kept_whole` (every event kept, DataFusion joins them at the
end), its wall time, state bytes and peak RSS, up to --kept-max-events (SQL workloads only: a
TEMPORAL formula has no batch SQL). `cpu s` is the run's user + system time (both threads: the
reader's and the query's); `--cpus 0` pins tessera to one core for the one-core figure. A DuckDB
run that fails (out of memory on a self-join) is reported as failed, with its exit status.
With --state-memory SIZE each synopsis also runs with `--state-backend disk --state-memory SIZE`
(groups of partitions evicted to the LSM store beyond SIZE): its wall time, peak RSS, peak state
bytes in memory and the bytes it wrote to and read back from the store; its answer must be the
same as the memory backend's. --users sets the number of users (the state grows with it).

Usage: scripts/bench_synopsis.py [--tessera BIN] [--max-events 100000000] [--users 1000]
                                 [--duckdb-max-events 10000000] [--kept-max-events 10000000]
                                 [--workloads funnel2,funnel3] [--cpus 0] [--state-memory 64MB]
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SOURCE = """CREATE SOURCE events (
    user_id BIGINT,
    kind VARCHAR,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '1' SECOND
) WITH (connector = 'file', path = '{path}', time_unit = 'ms');
"""

# name: (tessera's SQL, DuckDB's SQL for the same answer or None for the same text)
WORKLOADS = {
    "funnel2": (
        "SELECT a.user_id, COUNT(*) AS pairs FROM events a, events b "
        "WHERE a.user_id = b.user_id AND a.kind = 'login' AND b.kind = 'purchase' AND a.ts < b.ts "
        "GROUP BY a.user_id",
        None,
    ),
    "funnel3": (
        "SELECT a.user_id, COUNT(*) AS journeys FROM events a, events b, events c "
        "WHERE a.user_id = b.user_id AND b.user_id = c.user_id AND a.kind = 'login' AND b.kind = 'view' "
        "AND c.kind = 'purchase' AND a.ts < b.ts AND b.ts < c.ts GROUP BY a.user_id",
        None,
    ),
    # "Alarms since the last service" with views as alarms and logins as services: per user, the
    # views with no login after them.
    "since_service": (
        "WITH alarm AS (SELECT user_id FROM events WHERE kind = 'view'), "
        "service AS (SELECT user_id FROM events WHERE kind = 'login') "
        "SELECT user_id, COUNT(*) AS alarms FROM TEMPORAL(alarm OR SINCE_COUNT(NOT service, alarm)) GROUP BY user_id",
        "SELECT a.user_id, COUNT(*) FROM events a WHERE a.kind = 'view' AND NOT EXISTS (SELECT 1 FROM events b "
        "WHERE b.user_id = a.user_id AND b.kind = 'login' AND b.ts > a.ts) GROUP BY a.user_id",
    ),
    # "More failures than successes so far" with carts as failures and purchases as successes.
    "failures": (
        "WITH failure AS (SELECT user_id FROM events WHERE kind = 'cart'), "
        "success AS (SELECT user_id FROM events WHERE kind = 'purchase') "
        "SELECT user_id, COUNT(*) AS excess FROM TEMPORAL(SO_FAR(failure) AND NOT SO_FAR(success)) GROUP BY user_id",
        "SELECT user_id, f - s FROM (SELECT user_id, COUNT(*) FILTER (WHERE kind = 'cart') AS f, "
        "COUNT(*) FILTER (WHERE kind = 'purchase') AS s FROM events GROUP BY user_id) WHERE f > s",
    ),
}


def python():
    return subprocess.run([os.path.join(ROOT, "scripts", "python-env.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]


def generate(path, events, users):
    # About 200 events per second of event time; kinds weighted login 2, view 5, cart 2, purchase 1.
    sql = f"""
        COPY (
            SELECT hash(i * 7919) % {users} AS user_id,
                   CASE WHEN hash(i * 31) % 10 < 2 THEN 'login' WHEN hash(i * 31) % 10 < 7 THEN 'view'
                        WHEN hash(i * 31) % 10 < 9 THEN 'cart' ELSE 'purchase' END AS kind,
                   1700000000000 + i * 5 - (hash(i) % 4) AS ts
            FROM range({events}) t(i) ORDER BY i
        ) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 1000000)
    """
    subprocess.run([python(), "-c", f"import duckdb; duckdb.sql({sql!r})"], check=True)


def run(cmd):
    start = time.perf_counter()
    process = subprocess.Popen(cmd)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        sys.exit(f"failed ({status}): {' '.join(cmd)}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def duckdb_run(path, sql, threads):
    code = f"""
import duckdb, time, json
con = duckdb.connect()
con.execute("SET threads = {threads}")
con.execute("SET enable_progress_bar = false")
con.execute("CREATE VIEW events AS SELECT * FROM read_parquet('{path}')")
start = time.perf_counter()
rows = con.execute({sql!r}).fetchall()
elapsed = time.perf_counter() - start
print(json.dumps({{"seconds": elapsed, "rows": sorted([list(r) for r in rows])}}))
"""
    return code


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default=os.path.join(ROOT, "target", "release", "tessera"))
    parser.add_argument("--max-events", type=int, default=100_000_000)
    parser.add_argument("--min-events", type=int, default=1000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--duckdb-max-events", type=int, default=10_000_000)
    parser.add_argument("--duckdb-threads", type=int, default=2)
    parser.add_argument("--kept-max-events", type=int, default=10_000_000)
    parser.add_argument("--workloads", default="funnel2,funnel3")
    parser.add_argument("--cpus", help="run tessera pinned to these CPUs (taskset -c), e.g. 0 for one core")
    parser.add_argument("--state-memory", help="also run each synopsis on the disk backend within this memory")
    args = parser.parse_args()
    pin = ["taskset", "-c", args.cpus] if args.cpus else []
    sizes = []
    n = args.min_events
    while n <= args.max_events:
        sizes.append(n)
        n *= 10
    py = python()
    for workload in args.workloads.split(","):
        sql, duck_sql = WORKLOADS[workload]
        print(f"# {workload}: {sql}")
        print("events, tessera s, events/s, cpu s, state bytes, peak RSS MB, kept-whole s, kept-whole state bytes, "
              "kept-whole RSS MB, duckdb s, tessera/duckdb, equal"
              + (", disk s, disk RSS MB, disk state bytes, spilled MB written, spilled MB read" if args.state_memory else ""))
        for events in sizes:
            data = os.path.join(ROOT, "bench-data", f"synopsis-{events}-{args.users}.parquet")
            if not os.path.exists(data):
                os.makedirs(os.path.dirname(data), exist_ok=True)
                generate(data, events, args.users)
            with tempfile.TemporaryDirectory() as tmp:
                script = os.path.join(tmp, "q.sql")
                with open(script, "w") as f:
                    f.write(SOURCE.format(path=data) + sql + ";\n")
                out, stats = os.path.join(tmp, "out.csv"), os.path.join(tmp, "stats.json")
                wall, rss, cpu = run(pin + [args.tessera, "run", script, "-q", "-o", out, "--stats-json", stats])
                state = json.load(open(stats)).get("state_bytes_peak", 0)
                with open(out) as f:
                    ours = sorted([int(x) for x in row] for row in list(csv.reader(f))[1:])
                disk = ""
                if args.state_memory:
                    disk_out = os.path.join(tmp, "disk.csv")
                    disk_s, disk_rss, _ = run(pin + [args.tessera, "run", script, "-q", "-o", disk_out, "--stats-json", stats,
                                               "--state-backend", "disk", "--state-memory", args.state_memory])
                    disk_stats = json.load(open(stats))
                    with open(disk_out) as f:
                        if sorted([int(x) for x in row] for row in list(csv.reader(f))[1:]) != ours:
                            sys.exit(f"{workload} at {events} events: the disk backend answers differently")
                    spill = disk_stats.get("spill", {})
                    disk = (f", {disk_s:.3f}, {disk_rss:.0f}, {disk_stats.get('state_bytes_peak', 0)}, "
                            f"{spill.get('bytes_written', 0) / 1e6:.1f}, {spill.get('bytes_read', 0) / 1e6:.1f}")
                kept = "n/a, n/a, n/a"
                if duck_sql is None and events <= args.kept_max_events:
                    kept_out = os.path.join(tmp, "kept.csv")
                    kept_s, kept_rss, _ = run(pin + [args.tessera, "run", script, "-q", "-o", kept_out, "--stats-json", stats,
                                               "--set", "temporal_strategy=kept_whole"])
                    kept_state = json.load(open(stats)).get("state_bytes_peak", 0)
                    with open(kept_out) as f:
                        if sorted([int(x) for x in row] for row in list(csv.reader(f))[1:]) != ours:
                            sys.exit(f"{workload} at {events} events: kept whole answers differently")
                    kept = f"{kept_s:.3f}, {kept_state}, {kept_rss:.0f}"
                duck_s, ratio, equal = "", "", ""
                if events <= args.duckdb_max_events:
                    code = duckdb_run(data, duck_sql or sql, args.duckdb_threads)
                    done = subprocess.run([py, "-c", code], capture_output=True, text=True)
                    if done.returncode != 0:
                        # DuckDB running out of memory on a self-join is a figure too, not a reason to stop.
                        reason = (done.stderr.strip().splitlines() or ["no message"])[-1][:80].replace(",", ";")
                        duck_s, ratio, equal = f"failed (exit {done.returncode}: {reason})", "n/a", "n/a"
                    else:
                        result = json.loads(done.stdout.strip().splitlines()[-1])
                        duck_s = f"{result['seconds']:.3f}"
                        ratio = f"{wall / result['seconds']:.2f}"
                        equal = "yes" if result["rows"] == ours else "NO"
                print(f"{events}, {wall:.3f}, {events / wall:,.0f}, {cpu:.2f}, {state}, {rss:.0f}, {kept}, {duck_s}, "
                      f"{ratio}, {equal}{disk}", flush=True)


if __name__ == "__main__":
    main()
