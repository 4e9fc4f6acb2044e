"""How long scoring HumanEval's 164 canonical solutions takes, this checkout against an earlier commit,
alternating the two round by round so that the load of a busy machine hits both alike. Each round is a
fresh process (the sandbox's one-off probe is not timed); prints every round's wall-clock time and the
CPU time it used (ours and the sandbox's processes', user + system: what load does not inflate), then
the medians.

    python scripts/sandbox_speed.py --against fe0c04e --rounds 5              # 4 at a time, as the tests judge
    python scripts/sandbox_speed.py --against fe0c04e --rounds 3 --workers 1  # one at a time, as a run judges
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCORE = """
import resource, sys, time
from concurrent.futures import ThreadPoolExecutor
from sbd_bench.tasks import load_task
from sbd_bench.sandbox import isolation
def cpu():
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
task = load_task("humaneval")
examples = task.examples()
isolation()
started, cpu_before = time.perf_counter(), cpu()
with ThreadPoolExecutor(int(sys.argv[1])) as pool:
    passed = sum(pool.map(lambda e: bool(task.verdict(e, e.meta["canonical_solution"])[0]), examples))
print(passed, time.perf_counter() - started, cpu() - cpu_before)
"""


def checkout(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (git archive), to import the package from."""
    archive = into / "tree.tar"
    with open(archive, "wb") as handle:
        subprocess.run(["git", "archive", rev], cwd=REPO, stdout=handle, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree")  # our own repository's files
    return into / "tree"


def score(tree: Path, workers: int) -> tuple[int, float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCORE, str(workers)], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    if done.returncode != 0:
        sys.exit(f"error: scoring with {tree} failed: {done.stderr.strip().splitlines()[-1:]}")
    passed, seconds, cpu = done.stdout.split()
    return int(passed), float(seconds), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4, help="problems judged at a time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sbd_speed_") as tmp:
        old = checkout(args.against, Path(tmp))
        times = {"before": [], "now": []}
        for round_ in range(1, args.rounds + 1):
            for name, tree in (("before", old), ("now", REPO)) if round_ % 2 else (("now", REPO), ("before", old)):
                passed, seconds, cpu = score(tree, args.workers)
                times[name].append((seconds, cpu))
                print(f"round {round_} {name:6s} {passed}/164 passed in {seconds:6.2f} s ({cpu:6.2f} s CPU)", flush=True)
    for what, i in (("wall clock", 0), ("CPU", 1)):
        before, now = (statistics.median(t[i] for t in times[name]) for name in ("before", "now"))
        print(f"median {what}: before ({args.against}) {before:.2f} s, now {now:.2f} s, ratio {now / before:.2f}")


if __name__ == "__main__":
    main()
