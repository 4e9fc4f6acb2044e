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

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for i, (task, pts) in enumerate(sorted(points.items())):
        color = f"C{i}"
        xs, ys = [p[0] for p in pts], [100 * p[1] for p in pts]
        ax.plot(xs, ys, "o-", color=color, label=f"{task} ({args.solver})")
        for x, y, value in pts:
            ax.annotate(f"{value:g}" if isinstance(value, (int, float)) else str(value), (x, y),
                        textcoords="offset points", xytext=(4, 4), fontsize=8, color=color)
        if task in ntp:
            ax.plot([1.0], [100 * ntp[task]], "s", color=color, markerfacecolor="none", markersize=9,
                    label=f"{task} (ntp)")
    ax.set_xlabel("speed factor from forward counts (NTP NFE / NFE, paired per example)")
    ax.set_ylabel("accuracy (%)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-3, 103)
    ax.grid(True, alpha=0.3)
    ax.set_title(args.title or f"{args.solver}: {args.param} sweep (labels: {args.param}; squares: NTP)")
    ax.legend(fontsize=8, ncol=2, loc="lower left")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
