"""A parameter sweep as the SBD paper draws it: accuracy against the NFE speed factor, one curve per
task, one point per value of the swept parameter (labelled), NTP at (1×, its accuracy) for reference.
Reads a run folder's records only.

    python -m sbd_bench run --solver "entropy_bounded:gamma=0,0.1,0.35,0.8,1.5,4" --threads 1 --out runs/sweep
    python scripts/sweep_figure.py runs/sweep --solver entropy_bounded --param gamma --out sweep.png
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sbd_bench.analysis.metrics import BASELINE_SOLVER, summarize  # noqa: E402
from sbd_bench.analysis.records import load_run  # noqa: E402


def sweep_points(rows: list[dict], solver: str, param: str) -> dict[str, list[tuple[float, float, object]]]:
    """{task: [(speed_factor_nfe, accuracy, value of param), ...]} sorted by the parameter's value;
    rows of other solvers, or that do not vary ``param`` alone, are left out."""
    points: dict[str, list] = {}
    for r in rows:
        if r["solver"] != solver or param not in r["params"] or r["accuracy"] is None:
            continue
        points.setdefault(r["task"], []).append((r["speed_factor_nfe"], r["accuracy"], r["params"][param]))
    return {task: sorted(p, key=lambda item: item[2]) for task, p in points.items()}


def label_groups(pts: list[tuple[float, float, object]]) -> dict[tuple[float, float], str]:
    """{(speed, accuracy): "v1,v2,..."}: the parameter values that landed on the same spot, in order."""
    groups: dict[tuple[float, float], list[str]] = {}
    for x, acc, value in pts:
        groups.setdefault((round(x, 6), acc), []).append(f"{value:g}" if isinstance(value, (int, float)) else str(value))
    return {spot: (values[0] if len(values) == 1 else f"{values[0]}…{values[-1]}" if len(values) > 3 else ",".join(values))
            for spot, values in groups.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="run folder holding the sweep's records")
    parser.add_argument("--solver", default="entropy_bounded", help="the swept solver")
    parser.add_argument("--param", default="gamma", help="the swept parameter")
    parser.add_argument("--out", type=Path, required=True, help="PNG file to write")
    parser.add_argument("--title", default=None, help="figure title")
    args = parser.parse_args(argv)

    _, records = load_run(args.run_dir)
    rows = summarize(records)
    points = sweep_points(rows, args.solver, args.param)
    if not points:
        print(f"error: {args.run_dir} holds no {args.solver} rows with parameter {args.param}: "
              f"run a sweep such as --solver '{args.solver}:{args.param}=0,0.35,1'", file=sys.stderr)
        return 2
    ntp = {r["task"]: r["accuracy"] for r in rows if r["solver"] == BASELINE_SOLVER}

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(points)  # the run's task order (rows come in it)
    cols = min(2, len(tasks))
    rows_n = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.2 * cols, 3.8 * rows_n), squeeze=False)
    for i, task in enumerate(tasks):  # one panel per task, as the paper draws it: curves never hide each other
        ax = axes[i // cols][i % cols]
        pts = points[task]
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "o-", color="C0", label=args.solver)
        for n, ((x, acc), values) in enumerate(label_groups(pts).items()):  # one label per spot: equal points share it
            below = acc > 0.9 or n % 2  # neighbours alternate above and below, so close labels stay apart
            ax.annotate(values, (x, 100 * acc), textcoords="offset points", xytext=(4, -12 if below else 5),
                        fontsize=8, color="C0")
        xs = [p[0] for p in pts] + [1.0]
        ax.set_xlim(min(xs) / 1.25, max(xs) * 1.6)  # room for the rightmost label
        if task in ntp:
            ax.plot([1.0], [100 * ntp[task]], "s", color="C3", markerfacecolor="none", markersize=10, label="ntp")
        ax.set_title(task)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-8, 108)
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("speed factor from forward counts (NTP NFE / NFE)", fontsize=8)
        ax.set_ylabel("accuracy (%)", fontsize=8)
        ax.legend(fontsize=8, loc="lower left")
    for j in range(len(tasks), rows_n * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(args.title or f"{args.solver}: {args.param} sweep (labels: {args.param}; square: NTP)")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
