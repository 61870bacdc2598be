#!/usr/bin/env python3
"""End-to-end benchmark of tessera against DuckDB on the same generated files.

W1: MIN(temperature) per device over tumbling 10, 20, 30, 40 minutes (four window queries).
W2: SUM and COUNT per device over HOP 1 minute / 30 minutes.
w1_<strategy>: W1 run with --set window_strategy=<strategy> (baseline, unshared_paired,
shared_paired, shared_sliding, wcg, wcg_factor); plain w1 lets the optimizer choose.

For each workload and input format it reports the median wall time of `tessera run` (whole
process, results written to a CSV file), tessera's compute-only time (`tessera bench`: input
preloaded in memory) and DuckDB's time for the same queries on the same file, writing the same
rows to a CSV file (timed inside the Python process, so DuckDB's import is not counted).
Usage: scripts/bench.sh (builds the release binary and the Python env first).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench-data")

DUCKDB_SOURCE = {
    "parquet": "read_parquet('{path}')",
    "csv": "read_csv('{path}', header = true, columns = {{'device_id': 'BIGINT', 'temperature': 'DOUBLE', 'ts': 'BIGINT'}})",
}


def duckdb_sql(workload, source, out):
    if workload.startswith("w1"):
        parts = [
            f"SELECT device_id, ts - ts % {r} AS window_start, ts - ts % {r} + {r} AS window_end, "
            f"MIN(temperature) AS min_temp FROM {source} GROUP BY ALL"
            for r in (600, 1200, 1800, 2400)
        ]
        query = " UNION ALL ".join(parts)
    else:
        query = (
            "SELECT device_id, ws AS window_start, ws + 1800 AS window_end, SUM(temperature) AS total, COUNT(*) AS n "
            f"FROM (SELECT device_id, temperature, unnest(generate_series(ts - ts % 60 - 1740, ts - ts % 60, 60)) AS ws FROM {source}) "
            "GROUP BY ALL"
        )
    return f"COPY ({query}) TO '{out}' (HEADER, DELIMITER ',')"


def median_time(fn, repeat):
    times = []
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, result


def ensure_data(tessera, events, devices):
    os.makedirs(DATA, exist_ok=True)
    for ext in ("parquet", "csv"):
        path = os.path.join(DATA, f"iot.{ext}")
        stamp = path + ".args"
        args = f"{events} {devices}"
        if os.path.exists(path) and os.path.exists(stamp) and open(stamp).read() == args:
            continue
        subprocess.run([tessera, "generate", "-o", path, "--events", str(events), "--devices", str(devices)], check=True)
        with open(stamp, "w") as f:
            f.write(args)


def count_rows(path):
    with open(path) as f:
        return sum(1 for _ in f) - 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default=os.path.join(ROOT, "target", "release", "tessera"))
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workloads", default="w1,w2")
    parser.add_argument("--formats", default="parquet,csv")
    parser.add_argument("--parallelism", type=int, help="fixed worker count (default: tessera chooses)")
    args = parser.parse_args()

    import duckdb

    ensure_data(args.tessera, args.events, args.devices)
    cpu = "unknown"
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    print(f"# {time.strftime('%Y-%m-%d')} · {cpu} · {os.cpu_count()} cores · {platform.system()} · duckdb {duckdb.__version__}")
    workers = args.parallelism or "auto"
    print(f"# {args.events} events, {args.devices} devices, median of {args.repeat} runs, tessera workers: {workers}")
    print("| workload | input | tessera end to end (s) | DuckDB (s) | ratio tessera/DuckDB | tessera compute only (s) | compute events/s | rows |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out_t = os.path.join(tmp, "tessera.csv")
        out_d = os.path.join(tmp, "duckdb.csv")
        for workload in args.workloads.split(","):
            for fmt in args.formats.split(","):
                name, _, variant = workload.partition("_")
                script = os.path.join(ROOT, "benches", f"{name}_{fmt}.sql")
                fixed = ["--parallelism", str(args.parallelism)] if args.parallelism else []
                if variant:
                    fixed += ["--set", f"window_strategy={variant}"]
                cmd = [args.tessera, "run", script, "-o", out_t, "-q", *fixed]
                t_med, t_all, _ = median_time(lambda: subprocess.run(cmd, check=True), args.repeat)
                bench = subprocess.run(
                    [args.tessera, "bench", script, "--repeat", str(args.repeat), "--json", *fixed],
                    check=True, capture_output=True, text=True,
                )
                compute = json.loads(bench.stdout)
                con = duckdb.connect()
                source = DUCKDB_SOURCE[fmt].format(path=os.path.join(DATA, f"iot.{fmt}"))
                sql = duckdb_sql(workload, source, out_d)
                d_med, d_all, _ = median_time(lambda: con.execute(sql), args.repeat)
                con.close()
                rows_t, rows_d = count_rows(out_t), count_rows(out_d)
                if rows_t != rows_d:
                    print(f"row counts differ for {workload}/{fmt}: tessera {rows_t}, duckdb {rows_d}", file=sys.stderr)
                    sys.exit(1)
                print(
                    f"| {workload} | {fmt} | {t_med:.3f} | {d_med:.3f} | {t_med / d_med:.2f} | "
                    f"{compute['compute_seconds_median']:.3f} | {compute['events_per_second'] / 1e6:.1f}M | {rows_t} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
