#!/usr/bin/env python3
"""Instructions each window strategy executes for a script's compute, against its modeled cost.

Wall-clock times cannot order strategies whose modeled costs differ by less than the machine's
run-to-run noise (W1's four shared plans are 0.25% apart in the model, their times 3-6% apart
from round to round in any order). Instruction counts are that order's deterministic measure:
every strategy runs `tessera bench SCRIPT --repeat 1` under callgrind, which dumps its counts
when the compute starts (`run_script_with_readers`), so decoding the input into memory before
it is not counted; what follows (the operators, on every thread, and the process's exit) is.
Runs go two at a time: counts do not depend on load.
Usage: scripts/bench_instructions.py [--script benches/w1_parquet.sql] (needs valgrind and a
release build: `cargo build --release`).
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

from bench import ROOT, ensure_data, spearman

STRATEGIES = "baseline,unshared_paired,shared_paired,shared_sliding,wcg,wcg_factor"


def compute_instructions(tessera, script, strategy, tmp):
    out = os.path.join(tmp, strategy)
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--dump-before=*run_script_with_readers*", f"--callgrind-out-file={out}",
         tessera, "bench", script, "--repeat", "1", "--set", f"window_strategy={strategy}"],
        check=True, capture_output=True,
    )
    # `out.1` holds what ran before the compute started; `out` the rest.
    with open(out) as f:
        return int(re.search(r"^summary: (\d+)", f.read(), re.M).group(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tessera", default=os.path.join(ROOT, "target", "release", "tessera"))
    parser.add_argument("--script", default=os.path.join(ROOT, "benches", "w1_parquet.sql"))
    parser.add_argument("--strategies", default=STRATEGIES)
    args = parser.parse_args()
    ensure_data(args.tessera, 10_000_000, 1000)  # the benches' files, as scripts/bench.py makes them
    explained = json.loads(subprocess.run([args.tessera, "explain", args.script, "--format", "json"], check=True,
                                          capture_output=True, text=True).stdout)
    query = explained["queries"][0]
    strategies = args.strategies.split(",")
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(strategies, pool.map(lambda s: compute_instructions(args.tessera, args.script, s, tmp), strategies)))
    chosen = counts.get(query["chosen_strategy"]) or min(counts.values())
    print(f"# {os.path.relpath(args.script, ROOT)}: instructions of the compute (callgrind), chosen `{query['chosen_strategy']}`")
    print("| strategy | modeled cost | instructions | over the chosen plan |")
    print("|---|---|---|---|")
    for strategy in sorted(strategies, key=lambda s: (query["costs"][s], counts[s])):
        print(f"| {strategy} | {query['costs'][strategy]:g} | {counts[strategy]:,} | {counts[strategy] / chosen:.4f} |")
    rho = spearman([query["costs"][s] for s in strategies], [counts[s] for s in strategies])
    print(f"Spearman of modeled cost and instructions over {len(strategies)} strategies (equal costs share a rank): {rho:.2f}")


if __name__ == "__main__":
    sys.exit(main())
