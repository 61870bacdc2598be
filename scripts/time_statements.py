#!/usr/bin/env python3
"""Per-statement times of one SQL script on one database, for several tessera binaries side by
side: each binary runs the script (`tessera sql --db DB --timer`, statements piped in) in
turn, ROUNDS times, and the median over the statements after the first SKIP is printed per
binary. Binaries alternate, so a noisy machine slows them alike; compare the medians of one
run, not across runs.

Usage:
    python scripts/time_statements.py --db DB --sql FILE [--rounds 3] [--skip 2] BINARY...

The statements must not change the database (queries, SET), or each run sees another one.
"""

import argparse
import re
import statistics
import subprocess


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True)
    parser.add_argument("--sql", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", type=int, default=2,
                        help="statements left out first (settings, and a first query that loads what later ones reuse)")
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()
    sql = open(args.sql).read()
    times = {b: [] for b in args.binaries}
    for round_ in range(args.rounds):
        for binary in args.binaries:
            out = subprocess.run([binary, "sql", "--db", args.db, "--timer", "--format", "csv"], input=sql,
                                 capture_output=True, text=True, check=True)
            these = [float(t) for t in re.findall(r"time: ([0-9.]+) s", out.stderr)][args.skip:]
            times[binary] += these
            print(f"round {round_ + 1}: {binary}: median {statistics.median(these):.3f} s", flush=True)
    for binary in args.binaries:
        print(f"{binary}: median of {len(times[binary])} statements {statistics.median(times[binary]):.3f} s")


if __name__ == "__main__":
    main()
