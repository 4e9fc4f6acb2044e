"""Whether two runs wrote the same records apart from timings and memory: the check for a change that
must not change a single output, NFE or per-forward record (a refactor of the core, a faster path).
Records are paired in file order; each one that differs is named with its fields. Exit 0 when all are
the same, 1 otherwise, 2 on a bad folder.

    python -m sbd_bench run --solver all --limit 5 --threads 1 --out runs/before     # on the old code
    python -m sbd_bench run --solver all --limit 5 --threads 1 --out runs/after      # on the new code
    python scripts/same_records.py runs/before runs/after
    python scripts/same_records.py runs/batch1 runs/batch16 --ignore batch_size    # the batch is a record field
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sbd_bench.analysis.metrics import TIMING_FIELDS  # noqa: E402
from sbd_bench.analysis.records import read_records  # noqa: E402

IGNORED = (*TIMING_FIELDS, "peak_memory_bytes", "peak_memory_source", "memory")  # vary from run to run


def differences(a: list[dict], b: list[dict], ignored: tuple[str, ...] = IGNORED) -> list[str]:
    """One line per record pair that differs beyond ``ignored`` (and one for unequal counts)."""
    lines = [f"{len(a)} records against {len(b)}"] if len(a) != len(b) else []
    for i, (x, y) in enumerate(zip(a, b)):
        fields = sorted(k for k in x.keys() | y.keys() if k not in ignored and x.get(k) != y.get(k))
        if fields:
            lines.append(f"record {i + 1} ({x.get('task')} {x.get('id')} {x.get('config')}): {', '.join(fields)}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--ignore", default="", metavar="FIELD,...",
                        help="more fields to leave out, e.g. batch_size between a batch-1 run and a batched one")
    args = parser.parse_args(argv)
    ignored = (*IGNORED, *(name.strip() for name in args.ignore.split(",") if name.strip()))
    runs = []
    for run in (args.run_a, args.run_b):
        if not (run / "samples.jsonl").is_file():
            print(f"{run} has no samples.jsonl: pass a run folder", file=sys.stderr)
            return 2
        runs.append(read_records(run / "samples.jsonl"))
    lines = differences(*runs, ignored)
    also = "".join(f", {name}" for name in ignored[len(IGNORED):])
    print("\n".join(lines + [f"{len(runs[0])} records, {len(lines)} differences (timings{also} and memory ignored)"]))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
