#!/usr/bin/env python3
"""Differential test of `tessera compile --target flink`: the emitted Flink SQL, run on a local
Flink (PyFlink), must produce exactly the rows `tessera run` produces for the same script and data.

Each case is a script over generated JSON lines (out of order within the watermark bound, so
neither engine drops an event: Flink's watermarks are periodic, tessera's per row). The Flink
script's views and queries run in one streaming TableEnvironment; window bounds come back as
UTC timestamps and are compared as epoch seconds; floats to 9 significant digits.
Usage: scripts/flink_diff.py --tessera target/debug/tessera  (run by scripts/test.sh)
"""

import argparse
import calendar
import csv
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
from collections import Counter

SOURCE = """CREATE SOURCE readings (
    device_id BIGINT, temperature DOUBLE, ts BIGINT,
    WATERMARK FOR ts AS ts - INTERVAL '5' SECOND
) WITH (path = 'readings.jsonl', format = 'jsonl', time_unit = 's');
"""

CASES = {
    # W1 and a sliding window in the compact form: a factor window of one minute feeds them all.
    "min_tumbling_and_sliding": """
SELECT device_id, window_name, window_start, window_end, MIN(temperature) AS lo
FROM WINDOWS(readings, ts, m10 => TUMBLE(INTERVAL '10' MINUTE), m20 => TUMBLE(INTERVAL '20' MINUTE),
             m30 => TUMBLE(INTERVAL '30' MINUTE), m40 => TUMBLE(INTERVAL '40' MINUTE),
             s30 => HOP(INTERVAL '1' MINUTE, INTERVAL '30' MINUTE))
GROUP BY device_id, window_name, window_start, window_end;
""",
    # MIN and MAX share overlapping parts: hopping windows cascade over hopping parents.
    "min_max_hopping_parents": """
SELECT device_id, window_name, window_start, window_end, MIN(temperature) AS lo, MAX(temperature) AS hi
FROM WINDOWS(readings, ts, h10 => HOP(INTERVAL '5' MINUTE, INTERVAL '10' MINUTE), h20 => HOP(INTERVAL '10' MINUTE, INTERVAL '20' MINUTE),
             h25 => HOP(INTERVAL '5' MINUTE, INTERVAL '25' MINUTE), t40 => TUMBLE(INTERVAL '40' MINUTE))
GROUP BY device_id, window_name, window_start, window_end;
""",
    # A computed group key, named in the views; HAVING on it and on an aggregate.
    "computed_key": """
SELECT device_id % 3 AS bucket, window_start, window_end, SUM(temperature) AS s, COUNT(*) AS n, MIN(temperature) AS lo
FROM WINDOWS(readings, ts, a => TUMBLE(INTERVAL '10' MINUTE), b => TUMBLE(INTERVAL '30' MINUTE),
             c => HOP(INTERVAL '10' MINUTE, INTERVAL '20' MINUTE))
GROUP BY device_id % 3, window_start, window_end HAVING device_id % 3 <> 1 AND COUNT(*) > 1;
""",
    # Example 7's windows, every mergeable aggregate, WHERE and HAVING, as a UNION ALL.
    "example_7_sum_count_avg": """
SELECT device_id, window_start, window_end, SUM(temperature) AS s, COUNT(*) AS n, AVG(temperature) AS a, MAX(temperature) AS hi
FROM TUMBLE(readings, ts, INTERVAL '20' MINUTE) WHERE temperature > 15 GROUP BY device_id, window_start, window_end HAVING COUNT(*) > 3
UNION ALL
SELECT device_id, window_start, window_end, SUM(temperature) AS s, COUNT(*) AS n, AVG(temperature) AS a, MAX(temperature) AS hi
FROM TUMBLE(readings, ts, INTERVAL '30' MINUTE) WHERE temperature > 15 GROUP BY device_id, window_start, window_end HAVING COUNT(*) > 3
UNION ALL
SELECT device_id, window_start, window_end, SUM(temperature) AS s, COUNT(*) AS n, AVG(temperature) AS a, MAX(temperature) AS hi
FROM TUMBLE(readings, ts, INTERVAL '40' MINUTE) WHERE temperature > 15 GROUP BY device_id, window_start, window_end HAVING COUNT(*) > 3;
""",
}


def write_events(path, events, devices, seed):
    rng = random.Random(seed)
    base = 1_700_000_000
    with open(path, "w") as f:
        for i in range(events):
            ts = base + i // devices * 2 - rng.randint(0, 4)  # at most 4 s behind: never late
            f.write(json.dumps({"device_id": rng.randrange(devices), "temperature": round(rng.uniform(0, 40), 2), "ts": ts}) + "\n")


def normalise(value):
    if isinstance(value, datetime.datetime):
        return calendar.timegm(value.timetuple())
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value else float(f"{number:.9g}")
    return value


def tessera_rows(tessera, script, out):
    subprocess.run([tessera, "run", script, "-q", "-o", out], check=True)
    with open(out) as f:
        reader = csv.reader(f)
        next(reader)
        return Counter(tuple(normalise(v) for v in row) for row in reader)


def flink_rows(sql):
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", "1")
    statements = [s.strip() for s in sql.split(";\n") if s.strip()]
    rows = Counter()
    for statement in statements:
        body = "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--")).strip()
        if not body:
            continue
        if body.upper().startswith("SET "):
            key, value = body[4:].split("=", 1)
            env.get_config().set(key.strip().strip("'"), value.strip().rstrip(";").strip().strip("'"))
        elif body.upper().startswith("SELECT"):
            with env.execute_sql(body.rstrip(";")).collect() as results:
                for row in results:
                    rows[tuple(normalise(v) for v in row)] += 1
        else:
            env.execute_sql(body.rstrip(";"))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", required=True)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        write_events(os.path.join(tmp, "readings.jsonl"), args.events, args.devices, args.seed)
        for name, query in CASES.items():
            script = os.path.join(tmp, f"{name}.sql")
            with open(script, "w") as f:
                f.write(SOURCE + query)
            expected = tessera_rows(args.tessera, script, os.path.join(tmp, f"{name}.csv"))
            sql = subprocess.run([args.tessera, "compile", "--target", "flink", script], check=True, capture_output=True, text=True).stdout
            actual = flink_rows(sql)
            if actual == expected and expected:
                print(f"flink-diff: {name}: {sum(expected.values())} rows equal")
            else:
                failed += 1
                print(f"flink-diff: {name}: tessera {sum(expected.values())} rows, flink {sum(actual.values())} rows", file=sys.stderr)
                print("  only tessera:", list((expected - actual).items())[:5], file=sys.stderr)
                print("  only flink:  ", list((actual - expected).items())[:5], file=sys.stderr)
                print(sql, file=sys.stderr)
    print(f"flink-diff: {len(CASES) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
