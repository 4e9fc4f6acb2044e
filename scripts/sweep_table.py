"""A run's configurations side by side, one row each, one column per task, as Markdown: accuracy with its
95% interval, and the speed factors against NTP from forward counts and from decode wall-clock, each also
against a reference configuration (EB by default). Reads the run's summary.json only.

    python -m sbd_bench run --solver "ntp+entropy_bounded+klass+klass:tau=0.7,0.95" --threads 1 --out runs/sweep
    python scripts/sweep_table.py runs/sweep

Against the reference, a factor is the ratio of the two configurations' factors against NTP (each a mean
over examples paired with NTP's for NFE, a ratio of total decode times for wall-clock).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REFERENCE = "entropy_bounded:gamma=0.35,proxy=entropy"


def tables(rows: list[dict], reference: str) -> str:
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    cell = {(r["config"], r["task"]): r for r in rows}
    head = "| config | " + " | ".join(tasks) + " |\n|---|" + "---|" * len(tasks) + "\n"

    def accuracy(r: dict) -> str:
        if r["accuracy"] is None:
            return "-"
        return f"{100 * r['accuracy']:.1f} [{100 * r['accuracy_lo']:.0f}, {100 * r['accuracy_hi']:.0f}]"

    def speed(r: dict, ref: dict | None) -> str:
        nfe, wall = r["speed_factor_nfe"], r["speed_factor_wall"]
        if nfe is None:
            return "-"
        against = ""
        if ref is not None and ref["speed_factor_nfe"] and ref is not r:
            against = f" ({nfe / ref['speed_factor_nfe']:.2f}x EB)"
        return f"{nfe:.2f}x{against} / {wall:.2f}x" if wall is not None else f"{nfe:.2f}x{against}"

    first = head + "".join(f"| {c} | " + " | ".join(accuracy(cell[c, t]) if (c, t) in cell else "-" for t in tasks)
                           + " |\n" for c in configs)
    second = head + "".join(f"| {c} | " + " | ".join(speed(cell[c, t], cell.get((reference, t))) if (c, t) in cell
                                                     else "-" for t in tasks) + " |\n" for c in configs)
    return ("Accuracy (%) [95% interval]:\n\n" + first + "\nSpeed factor against NTP, from forward counts (against "
            f"{reference}) / from decode wall-clock:\n\n" + second)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--reference", default=REFERENCE, help=f"the configuration to compare with (default {REFERENCE})")
    args = parser.parse_args(argv)
    rows = json.loads((args.run_dir / "summary.json").read_text())["rows"]
    print(tables(rows, args.reference), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
