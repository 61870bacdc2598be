#!/usr/bin/env python3
"""Differential test: tessera's windowed aggregates against DuckDB on generated event files.

Usage:
    python scripts/duckdb_diff.py --tessera PATH_TO_BINARY [--cases N] [--seed S]
    python scripts/duckdb_diff.py --tessera PATH_TO_BINARY --case-seed X   # one case again

Each case writes a random event file (k BIGINT, v DOUBLE, i BIGINT, ts BIGINT seconds; a third
of the cases also as Parquet, written by DuckDB, which tessera then reads) and a
tessera script with a TUMBLE or HOP aggregate query to a temporary directory, runs
`tessera run`, and computes the same windows and aggregates in DuckDB by their definition:
a tumbling window of size r starts at floor(ts / r) * r; a hopping window (slide s, size r)
m * s holds every event with m * s <= ts < m * s + r; window_end = window_start + r.

No event is late: every event's timestamp is at most the watermark delay behind the largest
timestamp before it, so every event counts, as it does in DuckDB (which has no watermarks).

The results are compared as multisets of rows keyed by the grouping columns: integers exactly,
floats with a relative tolerance of 1e-9 (absolute 1e-9 near zero), APPROX_COUNT_DISTINCT against
DuckDB's exact count(DISTINCT x) within 2%, and NULL (an empty CSV field) only to NULL.
A failing case prints its seed, script and first differing rows and keeps its directory.
The last line is `duckdb-diff: N passed, M failed`; the exit status is 0 only if all passed.
"""

import argparse
import csv
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import duckdb
except ImportError:
    sys.exit("duckdb-diff: the duckdb module is missing; run it with the python of scripts/python-env.sh")

FLOAT_REL_TOL = 1e-9
FLOAT_ABS_TOL = 1e-9
DISTINCT_REL_TOL = 0.02
SHOW_ROWS = 5
TESSERA_TIMEOUT_S = 120

def percentile(column, p):
    """DuckDB's exact quantile_cont of `column` at `p`, with the two values it interpolates
    between: tessera's sketch promises to be within 1% of the larger of their magnitudes."""
    values = f"list_sort(list({column}) FILTER (WHERE {column} IS NOT NULL))"
    rank = f"{p} * (count({column}) - 1)"
    return f"[quantile_cont({column}, {p}), {values}[floor({rank})::BIGINT + 1], {values}[ceil({rank})::BIGINT + 1]]"


PERCENTILE_REL_TOL = 0.01

# (tessera call, DuckDB call, kind of the result). "int" results must be printed as integers and
# match exactly, "float" ones match within the float tolerance, "distinct" ones within 2%, "bool"
# ones are true or false, "percentile" ones within 1% of the neighbouring values' magnitude.
AGGREGATES = [
    ("MIN(v)", "min(v)", "float"),
    ("MIN(i)", "min(i)", "int"),
    ("MAX(v)", "max(v)", "float"),
    ("MAX(i)", "max(i)", "int"),
    ("SUM(v)", "sum(v)", "float"),
    ("SUM(i)", "sum(i)", "int"),
    ("COUNT(*)", "count(*)", "int"),
    ("COUNT(v)", "count(v)", "int"),
    ("COUNT(i)", "count(i)", "int"),
    ("AVG(v)", "avg(v)", "float"),
    ("AVG(i)", "avg(i)", "float"),
    ("STDDEV_SAMP(v)", "stddev_samp(v)", "float"),
    ("STDDEV_SAMP(i)", "stddev_samp(i)", "float"),
    ("VAR_SAMP(v)", "var_samp(v)", "float"),
    ("VAR_SAMP(i)", "var_samp(i)", "float"),
    ("MEDIAN(v)", "median(v)", "float"),
    ("MEDIAN(i)", "median(i)", "float"),
    ("APPROX_COUNT_DISTINCT(v)", "count(DISTINCT v)", "distinct"),
    ("APPROX_COUNT_DISTINCT(i)", "count(DISTINCT i)", "distinct"),
    # By event time, ties by arrival: `n` is each event's line in the file.
    ("FIRST_VALUE(v)", "first(v ORDER BY ts, n)", "float"),
    ("LAST_VALUE(i)", "last(i ORDER BY ts, n)", "int"),
    ("BOOL_AND(v > 0)", "bool_and(v > 0)", "bool"),
    ("BOOL_OR(i < 0)", "bool_or(i < 0)", "bool"),
    ("APPROX_PERCENTILE_CONT(v, 0.3)", percentile("v", 0.3), "percentile"),
    ("APPROX_MEDIAN(i)", percentile("i", 0.5), "percentile"),
]

# Filters applied to events before windowing (the same text in both engines).
WHERE_CLAUSES = ["v > 0", "i >= -200", "v > 0 OR i < 0", "k IS NOT NULL", "v IS NOT NULL AND i < 500"]

# HAVING clauses, written for tessera; DuckDB reads the same text.
HAVING_CLAUSES = [
    "COUNT(*) > 2",
    "SUM(i) > 0",
    "MAX(v) - MIN(v) > 20",
    "COUNT(v) >= 2 AND AVG(i) < 100",
    "MEDIAN(v) > 0",
]

# Tumbling window sizes and hopping window sizes, in seconds.
TUMBLE_SIZES = [1, 2, 3, 5, 7, 10, 15, 30, 45, 60, 90, 120, 180, 300, 600, 900]
HOP_SIZES = [2, 5, 10, 13, 20, 30, 50, 60, 90, 100, 120, 240, 300, 600]

# Events per group and window stay below this, so that APPROX_COUNT_DISTINCT is exact.
MAX_GROUP_EVENTS = 300
# The mean advance of the base time per event is 1.3 s (see `generate_events`).
EVENTS_PER_SECOND = 1 / 1.3


class Case:
    """One generated case: the event rows, the query and how to run it."""

    def __init__(self, seed):
        self.seed = seed
        rng = random.Random(seed)
        self.parallelism = rng.randint(1, 2)
        self.num_keys = rng.randint(1, 50)
        self.delay = rng.choice([0, 1, 2, 5, 10, 30, 60])
        self.rows = generate_events(rng, self.num_keys, self.delay)

        keyed = rng.random() < 0.8
        # Upper bound on a window's size so that no group gets more than MAX_GROUP_EVENTS events.
        # Events spread over the keys, but the NULL key can get up to a fifth of them.
        spread = min(self.num_keys, 4) if keyed else 1
        max_size = MAX_GROUP_EVENTS * spread / EVENTS_PER_SECOND / 1.5
        if rng.random() < 0.5:
            self.kind = "TUMBLE"
            self.size = rng.choice([r for r in TUMBLE_SIZES if r <= max_size])
            self.slide = self.size
        else:
            self.kind = "HOP"
            self.size = rng.choice([r for r in HOP_SIZES if r <= max_size])
            if rng.random() < 0.15:
                self.slide = self.size
            else:
                # At most 30 windows per event keeps the DuckDB side small.
                self.slide = rng.randint(max(1, math.ceil(self.size / 30)), self.size)

        groups = ["window_start"] if rng.random() < 0.2 else ["window_start", "window_end"]
        if keyed:
            groups.insert(rng.randint(0, len(groups)) if rng.random() < 0.2 else 0, "k")
        self.group_columns = groups
        group_by = list(groups)
        if rng.random() < 0.3:
            rng.shuffle(group_by)
        self.group_by = group_by

        aggregates = list(AGGREGATES)
        rng.shuffle(aggregates)
        self.aggregates = [(f"a{n}", t, d, kind) for n, (t, d, kind) in enumerate(aggregates, start=1)]
        self.where = rng.choice(WHERE_CLAUSES) if rng.random() < 0.25 else None
        self.having = rng.choice(HAVING_CLAUSES) if rng.random() < 0.2 else None
        # A quarter of the cases write an EMIT CHANGES changelog, folded into its final rows;
        # a third keep window state in key groups spilled to disk with no memory or a few KB
        # for them (rows then wait for the spilled group until they outgrow half of it).
        self.emit_changes = random.Random(seed ^ 0xE417).random() < 0.25
        disk = random.Random(seed ^ 0xD15C)
        self.disk_state = disk.choice(["0", "4KB", "64KB"]) if disk.random() < 0.33 else None
        # A third read the events from a Parquet copy written by DuckDB (dictionary-encoded
        # columns, read as dictionaries where the query allows), in row groups of 2,048 rows.
        self.parquet = random.Random(seed ^ 0xFA12).random() < 0.33

    @staticmethod
    def interval(seconds, in_minutes):
        """An INTERVAL literal of `seconds`, in minutes when asked and exact."""
        if seconds % 60 == 0 and in_minutes:
            return f"INTERVAL '{seconds // 60}' MINUTE"
        return f"INTERVAL '{seconds}' SECOND"

    def tessera_script(self):
        rng = random.Random(self.seed ^ 0x5EED)
        watermark = f"WATERMARK FOR ts AS ts - INTERVAL '{self.delay}' SECOND" if self.delay else "WATERMARK FOR ts AS ts"
        if self.kind == "TUMBLE":
            window = f"TUMBLE(s, ts, {self.interval(self.size, rng.random() < 0.5)})"
        else:
            slide = self.interval(self.slide, rng.random() < 0.5)
            size = self.interval(self.size, rng.random() < 0.5)
            window = f"HOP(s, ts, {slide}, {size})"
        select = ", ".join(self.group_columns + [f"{t} AS {alias}" for alias, t, _, _ in self.aggregates])
        query = f"SELECT {select}\nFROM {window}"
        if self.where:
            query += f"\nWHERE {self.where}"
        query += f"\nGROUP BY {', '.join(self.group_by)}"
        if self.having:
            query += f"\nHAVING {self.having}"
        if self.emit_changes:
            query += "\nEMIT CHANGES"
        return (
            f"-- duckdb-diff case, seed {self.seed}\n"
            f"CREATE SOURCE s (k BIGINT, v DOUBLE, i BIGINT, ts BIGINT, n BIGINT, {watermark})\n"
            f"  WITH (connector = 'file', path = '{self.events_file()}', time_unit = 's');\n"
            f"{query};\n"
        )

    def events_file(self):
        return "events.parquet" if self.parquet else "events.csv"

    @staticmethod
    def events_query(events_path):
        """The events of the CSV file at `events_path`, as DuckDB reads them."""
        path = events_path.replace("'", "''")
        return (
            f"SELECT k, v, i, ts, n FROM read_csv('{path}', header = true, auto_detect = false, delim = ',', "
            "columns = {'k': 'BIGINT', 'v': 'DOUBLE', 'i': 'BIGINT', 'ts': 'BIGINT', 'n': 'BIGINT'})"
        )

    def duckdb_query(self, events_path):
        r, s = self.size, self.slide
        events = self.events_query(events_path)
        if self.where:
            events += f" WHERE {self.where}"
        if self.kind == "TUMBLE":
            windows = f"SELECT *, {floor_to('ts', r)} AS window_start FROM e"
        else:
            first = f"{floor_div(f'ts - {r}', s)} + 1"
            last = floor_div("ts", s)
            windows = f"SELECT *, unnest(generate_series({first}, {last})) * {s} AS window_start FROM e"
        having = self.having
        if having:
            having = re.sub(r"APPROX_COUNT_DISTINCT\((\w+)\)", r"count(DISTINCT \1)", having)
        select = ", ".join(self.group_columns + [f"{d} AS {alias}" for alias, _, d, _ in self.aggregates])
        query = (
            f"WITH e AS ({events}),\n"
            f"h AS ({windows}),\n"
            f"w AS (SELECT *, window_start + {r} AS window_end FROM h)\n"
            f"SELECT {select}\nFROM w\nGROUP BY {', '.join(self.group_by)}"
        )
        if having:
            query += f"\nHAVING {having}"
        return query

    def columns(self):
        """(name, kind) of every output column, in order."""
        return [(c, "key") for c in self.group_columns] + [(alias, kind) for alias, _, _, kind in self.aggregates]


def floor_div(a, b):
    """Integer floor division of the SQL expression `a` by the positive constant `b` (DuckDB's % truncates)."""
    return f"((({a}) - (((({a}) % {b}) + {b}) % {b})) // {b})"


def floor_to(a, b):
    """The largest multiple of `b` not above `a`."""
    return f"(({a}) - (((({a}) % {b}) + {b}) % {b}))"


def generate_events(rng, num_keys, delay):
    """Event rows (k, v, i, ts), none of them late for a watermark `delay` seconds behind."""
    roll = rng.random()
    if roll < 0.06:
        n = 0
    elif roll < 0.25:
        n = rng.randint(1, 30)
    else:
        n = rng.randint(1, 3000)
    roll = rng.random()
    if roll < 0.45:
        base = rng.randint(-500, 500)
    elif roll < 0.8:
        base = 1_700_000_000 + rng.randint(-1000, 1000)
    else:
        base = rng.randint(0, 100_000)
    jitter = rng.randint(0, delay)
    # NULL rates: usually the nominal ones, sometimes high so that all-NULL windows show up.
    if rng.random() < 0.8:
        k_null, v_null, i_null = 0.05, 0.10, 0.10
    else:
        k_null, v_null, i_null = 0.2, rng.uniform(0.4, 0.9), rng.uniform(0.4, 0.9)
    # Sometimes few distinct values, for duplicates in MEDIAN and the distinct counts.
    narrow = rng.random() < 0.2
    rows = []
    for _ in range(n):
        base += rng.choices((0, 1, 2, 3), weights=(25, 35, 25, 15))[0]
        ts = base - rng.randint(0, jitter)
        k = None if rng.random() < k_null else rng.randrange(num_keys)
        if rng.random() < v_null:
            v = None
        elif narrow:
            v = rng.randint(-8, 8) / 4 + 0.0
        else:
            v = round(rng.random() * 100 - 50, 2) + 0.0  # + 0.0 turns -0.0 into 0.0
        if rng.random() < i_null:
            i = None
        elif narrow:
            i = rng.randint(-10, 10)
        else:
            i = rng.randint(-1000, 1000)
        rows.append((k, v, i, ts))
    return rows


def write_events(path, rows):
    with open(path, "w", newline="") as f:
        f.write("k,v,i,ts,n\n")
        for n, (k, v, i, ts) in enumerate(rows):
            f.write(f"{'' if k is None else k},{'' if v is None else repr(v)},{'' if i is None else i},{ts},{n}\n")


INT_RE = re.compile(r"^-?[0-9]+$")


def parse_tessera(path, columns):
    """The rows of tessera's CSV output, typed by `columns`; raises ValueError on a bad field."""
    with open(path, newline="") as f:
        records = list(csv.reader(f))
    names = [name for name, _ in columns]
    if not records:
        # No header when there are no rows: accepted as an empty result.
        return []
    if records[0] != names:
        raise ValueError(f"header {records[0]} differs from the expected {names}")
    rows = []
    for line_no, record in enumerate(records[1:], start=2):
        if len(record) != len(columns):
            raise ValueError(f"line {line_no}: {len(record)} fields, expected {len(columns)}: {record}")
        row = []
        for field, (name, kind) in zip(record, columns):
            if kind == "op":
                row.append(field)
            elif field == "":
                row.append(None)
            elif kind in ("key", "int", "distinct"):
                if not INT_RE.match(field):
                    raise ValueError(f"line {line_no}: column {name} should be an integer, got {field!r}")
                row.append(int(field))
            elif kind == "bool":
                if field not in ("true", "false"):
                    raise ValueError(f"line {line_no}: column {name} should be true or false, got {field!r}")
                row.append(field == "true")
            else:
                row.append(float(field))
        rows.append(tuple(row))
    return rows


def fold_changelog(rows, num_keys):
    """The rows standing at the end of an EMIT CHANGES changelog (`op` first, then the group
    columns): `+I` starts a group's row, `+U` replaces it, `-D` deletes it."""
    standing = {}
    for line_no, (op, *row) in enumerate(rows, start=2):
        key = tuple(row[:num_keys])
        if (op == "+I") == (key in standing) or op not in ("+I", "+U", "-D"):
            raise ValueError(f"line {line_no}: {op} for group {key} out of order")
        if op == "-D":
            del standing[key]
        else:
            standing[key] = tuple(row)
    return list(standing.values())


def values_match(kind, ours, theirs):
    if kind == "percentile" and theirs is not None and theirs[0] is None:
        theirs = None  # no value: DuckDB's quantile and neighbours are all NULL
    if ours is None or theirs is None:
        return ours is None and theirs is None
    if kind in ("key", "int"):
        return isinstance(ours, int) and ours == int(theirs)
    if kind == "bool":
        return ours is theirs
    if kind == "percentile":
        exact, low, high = theirs
        if exact is None:
            return False
        return abs(ours - exact) <= PERCENTILE_REL_TOL * max(abs(low), abs(high)) + FLOAT_ABS_TOL
    if kind == "distinct":
        return abs(ours - int(theirs)) <= DISTINCT_REL_TOL * abs(int(theirs))
    return math.isclose(float(ours), float(theirs), rel_tol=FLOAT_REL_TOL, abs_tol=FLOAT_ABS_TOL)


def sort_key(key):
    return tuple((0, 0) if v is None else (1, v) for v in key)


def compare(columns, tessera_rows, duckdb_rows, calls):
    """A list of report lines describing the differences (empty when the results agree).

    `calls` maps an aggregate's alias to its tessera call, for the report.
    """
    num_keys = sum(1 for _, kind in columns if kind == "key")
    problems = []

    def index(rows, side):
        by_key = {}
        for row in rows:
            key = row[:num_keys]
            if key in by_key:
                problems.append(f"{side}: more than one row for group {key}")
            by_key[key] = row
        return by_key

    ours = index(tessera_rows, "tessera")
    theirs = index(duckdb_rows, "duckdb")
    missing = sorted((k for k in theirs if k not in ours), key=sort_key)
    extra = sorted((k for k in ours if k not in theirs), key=sort_key)
    differing = []
    for key in sorted((k for k in ours if k in theirs), key=sort_key):
        a, b = ours[key], theirs[key]
        bad = [name for (name, kind), x, y in zip(columns, a, b) if not values_match(kind, x, y)]
        if bad:
            differing.append((key, bad))
    if not (problems or missing or extra or differing):
        return []
    names = [name for name, _ in columns]
    lines = [f"rows: tessera {len(tessera_rows)}, duckdb {len(duckdb_rows)}; columns {', '.join(names)}"]
    lines += problems[:SHOW_ROWS]
    if missing:
        lines.append(f"{len(missing)} groups only in duckdb, first ones:")
        lines += [f"  duckdb:  {format_row(theirs[k])}" for k in missing[:SHOW_ROWS]]
    if extra:
        lines.append(f"{len(extra)} groups only in tessera, first ones:")
        lines += [f"  tessera: {format_row(ours[k])}" for k in extra[:SHOW_ROWS]]
    if differing:
        lines.append(f"{len(differing)} groups with different values, first ones:")
        for key, bad in differing[:SHOW_ROWS]:
            lines.append(f"  differing columns: {', '.join(f'{name} ({calls.get(name, name)})' for name in bad)}")
            lines.append(f"  tessera: {format_row(ours[key])}")
            lines.append(f"  duckdb:  {format_row(theirs[key])}")
    return lines


def format_row(row):
    return "(" + ", ".join("NULL" if v is None else repr(v) for v in row) + ")"


def run_case(tessera, case, workdir):
    """Runs one case in `workdir`; returns a list of failure lines (empty when it passed)."""
    events_path = os.path.join(workdir, "events.csv")
    script_path = os.path.join(workdir, "script.sql")
    out_path = os.path.join(workdir, "out.csv")
    write_events(events_path, case.rows)
    if case.parquet:
        con = duckdb.connect()
        try:
            parquet_path = os.path.join(workdir, "events.parquet").replace("'", "''")
            events = case.events_query(events_path)
            con.execute(f"COPY ({events}) TO '{parquet_path}' (FORMAT parquet, ROW_GROUP_SIZE 2048)")
        finally:
            con.close()
    script = case.tessera_script()
    with open(script_path, "w") as f:
        f.write(script)
    oracle = case.duckdb_query(events_path)
    with open(os.path.join(workdir, "oracle.sql"), "w") as f:
        f.write(oracle + ";\n")

    command = [tessera, "run", script_path, "--output", out_path, "--parallelism", str(case.parallelism), "-q"]
    if case.disk_state is not None:
        command += ["--state-backend", "disk", "--state-memory", case.disk_state]
    try:
        done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=TESSERA_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [f"tessera did not finish within {TESSERA_TIMEOUT_S} s: {' '.join(command)}"]
    with open(os.path.join(workdir, "tessera.stderr"), "w") as f:
        f.write(done.stderr)
    if done.returncode != 0:
        # The message (and where a panic happened), without the backtrace: that stays in tessera.stderr.
        stderr = []
        for line in done.stderr.strip().splitlines():
            if line.startswith("stack backtrace:") or len(stderr) == 12:
                break
            stderr.append(line)
        return [f"tessera exited with status {done.returncode}: {' '.join(command)}"] + ["  " + l for l in stderr]
    if not os.path.exists(out_path):
        return [f"tessera wrote no {out_path}"]

    columns = case.columns()
    try:
        if case.emit_changes:
            tessera_rows = fold_changelog(parse_tessera(out_path, [("op", "op")] + columns), len(case.group_columns))
        else:
            tessera_rows = parse_tessera(out_path, columns)
    except ValueError as e:
        return [f"tessera output {out_path}: {e}"]
    con = duckdb.connect()
    try:
        duckdb_rows = [tuple(row) for row in con.execute(oracle).fetchall()]
    finally:
        con.close()
    calls = {alias: call for alias, call, _, _ in case.aggregates}
    return compare(columns, tessera_rows, duckdb_rows, calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tessera", required=True, help="the tessera binary")
    parser.add_argument("--cases", type=int, default=40, help="number of cases (default 40)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the whole run (default 1)")
    parser.add_argument("--case-seed", type=int, help="run only the case with this seed (as printed on a failure)")
    args = parser.parse_args()

    tessera = os.path.abspath(args.tessera)
    if not os.access(tessera, os.X_OK):
        sys.exit(f"duckdb-diff: {tessera} is not an executable")

    if args.case_seed is not None:
        seeds = [args.case_seed]
    else:
        master = random.Random(args.seed)
        seeds = [master.randrange(2**32) for _ in range(args.cases)]

    started = time.monotonic()
    passed = failed = 0
    for number, seed in enumerate(seeds, start=1):
        case = Case(seed)
        workdir = tempfile.mkdtemp(prefix=f"duckdb-diff-{seed}-")
        try:
            problems = run_case(tessera, case, workdir)
        except Exception as e:  # a harness or DuckDB error fails the case, with its directory kept
            problems = [f"error: {type(e).__name__}: {e}"]
        if not problems:
            passed += 1
            shutil.rmtree(workdir, ignore_errors=True)
            continue
        failed += 1
        print(f"FAIL case {number} (seed {seed}): {len(case.rows)} events, parallelism {case.parallelism}")
        print(f"  rerun: {sys.argv[0]} --tessera {args.tessera} --case-seed {seed}")
        print(f"  kept: {workdir} (events.csv or .parquet, script.sql, oracle.sql, out.csv, tessera.stderr)")
        print("  script:")
        for line in case.tessera_script().splitlines():
            print(f"    {line}")
        for line in problems:
            print(f"  {line}")
        sys.stdout.flush()

    elapsed = time.monotonic() - started
    print(f"({len(seeds)} cases in {elapsed:.1f} s)", file=sys.stderr)
    print(f"duckdb-diff: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
