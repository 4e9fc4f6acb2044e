"""The main job, `python -m sbd_bench run --solver all` (every solver, the shipped model, the whole
suite): how long it takes, and whether its record set is still the committed one.

    python benchmarks/mainjob.py                 # run it, print wall and CPU time with the load, check records
    python benchmarks/mainjob.py --update        # after a change that is meant to change outputs: new fingerprints
    python benchmarks/mainjob.py --check RUN_DIR # check a run folder of the main job without decoding again

The record set is fingerprinted per (configuration, task): a hash of every record's fields but timings,
memory and the batch size (``RECORD_FINGERPRINTS``; the fields `scripts/same_records.py --ignore
batch_size` compares), so the check holds at any --batch-size and on any load, and names the rows that
moved. CI runs it once through benchmarks/test_mainjob.py; `tox -e mainjob` prints its time.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sbd_bench.analysis.metrics import TIMING_FIELDS  # noqa: E402
from sbd_bench.analysis.records import read_records  # noqa: E402

RECORD_FINGERPRINTS = ROOT / "benchmarks" / "mainjob_records.json"
IGNORED = (*TIMING_FIELDS, "peak_memory_bytes", "peak_memory_source", "memory", "batch_size")
MAIN_JOB = ["run", "--solver", "all"]


def fingerprints(records: list[dict]) -> dict[str, dict]:
    """"config | task" -> {records, sha256 of their fields but ``IGNORED``, in file order}."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(f"{r['config']} | {r['task']}", []).append({k: v for k, v in r.items() if k not in IGNORED})
    return {key: {"records": len(rows), "sha256": hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()}
            for key, rows in sorted(groups.items())}


def changes(expected: dict, found: dict) -> list[str]:
    """One line per (configuration, task) that is new, gone or holds other records."""
    lines = [f"{key}: not in the main job any more" for key in expected if key not in found]
    lines += [f"{key}: new in the main job" for key in found if key not in expected]
    lines += [f"{key}: {found[key]['records']} records, other outputs/NFE/counts than the committed "
              f"{expected[key]['records']}" for key in expected if key in found and expected[key] != found[key]]
    return lines


def run_main_job(out: Path, extra: list[str]) -> dict:
    """Run the main job into ``out`` in a child process; its wall and CPU seconds and the load around it."""
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sbd_bench", *MAIN_JOB, "--out", str(out), *extra], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_before": load_before,
            "load_after": os.getloadavg()[0]}


def check(run_dir: Path) -> list[str]:
    expected = json.loads(RECORD_FINGERPRINTS.read_text())["fingerprints"]
    return changes(expected, fingerprints(read_records(run_dir / "samples.jsonl")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help=f"write {RECORD_FINGERPRINTS.name} from this run")
    parser.add_argument("--check", type=Path, metavar="RUN_DIR", help="check this run folder; decode nothing")
    parser.add_argument("--out", type=Path, help="keep the run here (default: a temporary folder)")
    parser.add_argument("extra", nargs="*", help="more `run` flags after --, e.g. -- --batch-size 1")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.check)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = args.out or Path(tmp) / "mainjob"
            timing = run_main_job(out, args.extra)
            print(f"main job `python -m sbd_bench {' '.join(MAIN_JOB + args.extra)}`: {timing['wall_s']} s wall, "
                  f"{timing['cpu_s']} s CPU (user + sys), load average {timing['load_before']:.1f} before, "
                  f"{timing['load_after']:.1f} after")
            if args.update:
                records = read_records(out / "samples.jsonl")
                RECORD_FINGERPRINTS.write_text(json.dumps(
                    {"command": f"python -m sbd_bench {' '.join(MAIN_JOB)}", "records": len(records),
                     "ignored_fields": list(IGNORED), "fingerprints": fingerprints(records)}, indent=1) + "\n")
                print(f"wrote {RECORD_FINGERPRINTS.relative_to(ROOT)}")
                return 0
            problems = check(out)
    for line in problems:
        print(line)
    print(f"record set: {'changed in ' + str(len(problems)) + ' (configuration, task) rows' if problems else 'unchanged'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
