#!/usr/bin/env python3
"""Checkpoint overhead and recovery time of `tessera run` on one workload.

Runs the script plainly and with `--state-dir` at `--interval` seconds between checkpoints,
alternating, and reports the median wall times and their ratio. Then, `--kills` times, starts
a checkpointed run, kills it with SIGKILL late in the run (after a checkpoint), restarts it
and reports the restarted run's recovery time (restoring the state and moving the input to
the checkpoint: a Parquet reader starts at the checkpoint's row, CSV and JSON skip the bytes
before it unparsed; from --stats-json) and wall time; the restarted output must equal the
plain run's rows.

By default the workload is W2 (HOP 1 minute / 30 minutes, SUM and COUNT per device) over a
generated Parquet file of --events events (100M: a run of several seconds, so checkpoints
every second matter), written once to bench-data/.

Usage: scripts/bench_recovery.py [--events N] [--script FILE.sql] [--repeat 5] [--interval 1]
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def sorted_lines(path):
    with open(path) as f:
        return sorted(f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default=os.path.join(ROOT, "target", "release", "tessera"))
    parser.add_argument("--script", help="the script to run (default: W2 over --events generated events)")
    parser.add_argument("--events", type=int, default=100_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.script is None:
            data = os.path.join(ROOT, "bench-data", f"iot-{args.events}.parquet")
            if not os.path.exists(data):
                subprocess.run([args.tessera, "generate", "-o", data, "--events", str(args.events)], check=True)
            with open(os.path.join(ROOT, "benches", "w2_parquet.sql")) as f:
                text = f.read().replace("../bench-data/iot.parquet", data)
            args.script = os.path.join(tmp, "w2.sql")
            with open(args.script, "w") as f:
                f.write(text)
        plain_out, out, state, stats = (os.path.join(tmp, n) for n in ("plain.csv", "out.csv", "state", "stats.json"))
        plain = [args.tessera, "run", args.script, "-q", "-o", plain_out]
        checkpointed = [args.tessera, "run", args.script, "-q", "-o", out, "--state-dir", state,
                        "--checkpoint-interval", str(args.interval), "--stats-json", stats]
        plain_times, checkpointed_times, checkpoints, checkpoint_s = [], [], [], []
        for _ in range(args.repeat):
            plain_times.append(timed(plain))
            shutil.rmtree(state, ignore_errors=True)
            checkpointed_times.append(timed(checkpointed))
            report = json.load(open(stats))
            checkpoints.append(report["checkpoints"])
            checkpoint_s.append(report["checkpoint_ms"] / 1000)
        p, c = statistics.median(plain_times), statistics.median(checkpointed_times)
        print(f"# {args.script}, median of {args.repeat} alternating runs")
        print(f"plain: {p:.3f} s; checkpoints every {args.interval} s: {c:.3f} s "
              f"({statistics.median(checkpoints)} checkpoints taking {statistics.median(checkpoint_s):.3f} s): {c / p:.3f}x")
        expected = sorted_lines(plain_out)
        # Late enough in the run for a checkpoint to exist.
        kill_at = max(0.8 * p, 1.3 * args.interval)
        for k in range(args.kills):
            shutil.rmtree(state, ignore_errors=True)
            child = subprocess.Popen(checkpointed)
            time.sleep(kill_at)
            child.send_signal(signal.SIGKILL)
            child.wait()
            restart = timed(checkpointed)
            report = json.load(open(stats))
            same = sorted_lines(out) == expected
            print(f"kill {k + 1} at {kill_at:.2f} s: restart resumed at {report['resumed_events']} events, "
                  f"recovery {report['recovery_ms'] / 1000:.3f} s, restarted run {restart:.3f} s, output equal: {same}")
            if not same:
                sys.exit(1)


if __name__ == "__main__":
    main()
