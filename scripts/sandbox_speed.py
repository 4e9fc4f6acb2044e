"""How long scoring HumanEval's 164 canonical solutions takes, this checkout against an earlier commit,
alternating the two round by round so that the load of a busy machine hits both alike. Each round is a
fresh process (the sandbox's one-off probe is not timed); prints every round and the medians.

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
import sys, time
from concurrent.futures import ThreadPoolExecutor
from sbd_bench.tasks import load_task
from sbd_bench.tasks.sandbox import isolation
task = load_task("humaneval")
examples = task.examples()
isolation()
started = time.perf_counter()
with ThreadPoolExecutor(int(sys.argv[1])) as pool:
    passed = sum(pool.map(lambda e: bool(task.verdict(e, e.meta["canonical_solution"])[0]), examples))
print(passed, time.perf_counter() - started)
"""


def checkout(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (git archive), to import the package from."""
    archive = into / "tree.tar"
    with open(archive, "wb") as handle:
        subprocess.run(["git", "archive", rev], cwd=REPO, stdout=handle, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree")
    return into / "tree"


def score(tree: Path, workers: int) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SCORE, str(workers)], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    if done.returncode != 0:
        sys.exit(f"error: scoring with {tree} failed: {done.stderr.strip().splitlines()[-1:]}")
    passed, seconds = done.stdout.split()
    return int(passed), float(seconds)


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
                passed, seconds = score(tree, args.workers)
                times[name].append(seconds)
                print(f"round {round_} {name:6s} {passed}/164 passed in {seconds:6.2f} s", flush=True)
    before, now = statistics.median(times["before"]), statistics.median(times["now"])
    print(f"median: before ({args.against}) {before:.2f} s, now {now:.2f} s, ratio {now / before:.2f}")


if __name__ == "__main__":
    main()
