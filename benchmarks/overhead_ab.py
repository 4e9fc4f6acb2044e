"""benchmarks/overhead.py of two checkouts side by side, in one run: processes interleaved (A B, B A,
...) so that the machine's load falls on both alike; medians over rounds of each configuration's model
time and host overhead per forward, and the overhead's ratio B/A. For a change to the core that must
not cost host time per forward (make the A checkout with `git worktree add ../before main`).

    python benchmarks/overhead_ab.py ../before . --rounds 8 --model sbd-tiny --repeats 15
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from statistics import median

ROW = re.compile(r"\| (\S+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \|")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="checkout A (before)")
    parser.add_argument("b", type=Path, help="checkout B (after)")
    parser.add_argument("--rounds", type=int, default=6)
    args, passed = parser.parse_known_args(argv)  # the rest goes to overhead.py (--model, --solver, ...)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    times: dict[Path, dict[str, list[tuple[float, float]]]] = {args.a: {}, args.b: {}}
    for r in range(args.rounds):
        for checkout in (args.a, args.b) if r % 2 == 0 else (args.b, args.a):
            out = subprocess.run([sys.executable, str(checkout / "benchmarks" / "overhead.py"), *passed], env=env,
                                 capture_output=True, text=True, check=True).stdout
            for config, _, model_ms, overhead_ms in ROW.findall(out):
                times[checkout].setdefault(config, []).append((float(model_ms), float(overhead_ms)))
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    print(f"{args.rounds} rounds, interleaved; medians, ms per forward (A: {args.a}, B: {args.b})")
    # the machine's speed swings between processes (the same model call moved by 25% here): the overhead as a
    # fraction of each process's own model call is the steadier comparison, the last column
    print("| config | model A | overhead A | model B | overhead B | overhead B/A | overhead per model call, B/A |")
    print("|---|---|---|---|---|---|---|")
    for config, a in times[args.a].items():
        b = times[args.b][config]
        (ma, oa), (mb, ob) = [(median(x[0] for x in t), median(x[1] for x in t)) for t in (a, b)]
        fa, fb = (median(x[1] / x[0] for x in t) for t in (a, b))
        print(f"| {config} | {ma:.3f} | {oa:.3f} | {mb:.3f} | {ob:.3f} | {ob / oa:.3f} | {fb / fa:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
