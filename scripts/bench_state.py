#!/usr/bin/env python3
"""State beyond memory and checkpoint cost on many keys: one hopping query over --keys device
keys, run with the memory backend, the disk backend within --state-memory, and the disk
backend with a checkpoint every --interval seconds.

The input is written by DuckDB (not tessera's generator): --events events of --keys devices
spread uniformly over --hours hours of event time, a few seconds out of order, temperatures
with one decimal (so float sums show any change in the order of additions). The query is
`HOP(readings, ts, INTERVAL '3600' SECOND, INTERVAL '14400' SECOND)` with SUM, COUNT and MAX
per device.

Reports per configuration the median wall time, peak RSS (of the tessera process), the spill
store's traffic and, for checkpointed runs, the checkpoints and the bytes each wrote beside
the state that changed since the previous one (from --stats-json); then whether the three
outputs are byte-identical.

Usage: scripts/bench_state.py [--tessera BIN] [--events 5000000] [--keys 1000000] [--hours 8]
                              [--memory 64MB] [--interval 1] [--repeat 1]
"""

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QUERY = """CREATE SOURCE readings (
    device_id BIGINT,
    temperature DOUBLE,
    ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (connector = 'file', path = '{path}', time_unit = 's');

SELECT device_id, window_start, window_end, SUM(temperature) AS total, COUNT(*) AS n, MAX(temperature) AS peak
FROM HOP(readings, ts, INTERVAL '3600' SECOND, INTERVAL '14400' SECOND)
GROUP BY device_id, window_start, window_end;
"""


def generate(path, events, keys, hours):
    """Writes the input with DuckDB, from the project's Python environment."""
    python = subprocess.run([os.path.join(ROOT, "scripts", "python-env.sh")], check=True,
                            capture_output=True, text=True).stdout.strip().splitlines()[-1]
    span = hours * 3600
    sql = f"""
        COPY (
            SELECT hash(i * 7919) % {keys} AS device_id,
                   round((hash(i * 104729) % 400000) / 1000.0 - 50, 1) AS temperature,
                   1700000000 + (i * {span}) // {events} - (hash(i) % 4) AS ts
            FROM range({events}) t(i) ORDER BY i
        ) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 1000000)
    """
    subprocess.run([python, "-c", f"import duckdb; duckdb.sql({sql!r})"], check=True)


def run(cmd):
    """Wall seconds and peak RSS in MB of one run."""
    start = time.perf_counter()
    process = subprocess.Popen(cmd)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    if status != 0:
        sys.exit(f"failed ({status}): {' '.join(cmd)}")
    return elapsed, usage.ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default=os.path.join(ROOT, "target", "release", "tessera"))
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--hours", type=int, default=8)
    parser.add_argument("--memory", default="64MB")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keep", help="keep the outputs in this folder")
    args = parser.parse_args()
    data = os.path.join(ROOT, "bench-data", f"hop-{args.events}-{args.keys}-{args.hours}h.parquet")
    if not os.path.exists(data):
        os.makedirs(os.path.dirname(data), exist_ok=True)
        generate(data, args.events, args.keys, args.hours)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "hop.sql")
        with open(script, "w") as f:
            f.write(QUERY.format(path=data))
        configs = {
            "memory": ["--state-backend", "memory"],
            f"disk {args.memory}": ["--state-backend", "disk", "--state-memory", args.memory],
            f"disk {args.memory}, checkpoint every {args.interval:g} s": [
                "--state-backend", "disk", "--state-memory", args.memory,
                "--state-dir", os.path.join(tmp, "state"), "--checkpoint-interval", str(args.interval)],
        }
        outputs, rows = {}, []
        for _ in range(args.repeat):
            for i, (name, flags) in enumerate(configs.items()):
                shutil.rmtree(os.path.join(tmp, "state"), ignore_errors=True)
                out, stats = os.path.join(tmp, f"{i}.csv"), os.path.join(tmp, "stats.json")
                wall, rss = run([args.tessera, "run", script, "-q", "-o", out, "--stats-json", stats] + flags)
                report = json.load(open(stats))
                outputs[name] = out
                rows.append((name, wall, rss, report))
        print(f"# {args.events:,} events, {args.keys:,} keys over {args.hours} h (DuckDB-written Parquet), "
              f"HOP 1 h / 4 h, SUM, COUNT, MAX; median of {args.repeat}")
        memory_wall = None
        for name in configs:
            mine = [r for r in rows if r[0] == name]
            wall = statistics.median(r[1] for r in mine)
            rss = statistics.median(r[2] for r in mine)
            report = mine[-1][3]
            memory_wall = memory_wall or wall
            line = f"{name}: {wall:.2f} s ({wall / memory_wall:.2f}x memory), peak RSS {rss:.0f} MB"
            spill = report.get("spill") or {}
            if spill.get("bytes_written") or spill.get("bytes_read"):
                line += (f"; spill store {spill['bytes_written'] / 1e6:,.0f} MB written, "
                         f"{spill['bytes_read'] / 1e6:,.0f} MB read")
            if report.get("checkpoints"):
                line += f"; {report['checkpoints']} checkpoints, {report['checkpoint_ms']} ms in all"
                for c in report.get("checkpoint_log", []):
                    line += (f"\n    checkpoint {c['sequence']}: wrote {c['tables_written'] / 1e6:,.1f} MB of tables "
                             f"and a {c['snapshot_bytes'] / 1e6:,.1f} MB snapshot; tables written since the previous "
                             f"one {c['tables_changed'] / 1e6:,.1f} MB; the store holds {c['tables_stored'] / 1e6:,.1f} MB")
            print(line)
        names = list(configs)
        same = all(filecmp.cmp(outputs[names[0]], outputs[n], shallow=False) for n in names[1:])
        print("outputs byte-identical:", "yes" if same else "NO")
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            for i, n in enumerate(names):
                shutil.copy(outputs[n], os.path.join(args.keep, f"{i}.csv"))
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
