"""What a math-verify verdict costs (docs/benchmarks.md, 'Scoring math answers'): the worker's start, the
time of each verdict of the answer table in tests/test_math_scoring.py (median and largest: the budget,
BUDGET_S, must hold the largest with room to spare on a loaded machine), the round trip to the worker
against the same verdict in this process, and a start after an overrun.

    python scripts/math_verify_speed.py
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sbd_bench.tasks.math_verifier import BUDGET_S, MathVerifier, _judge, _rules  # noqa: E402
from test_math_scoring import TABLE, TOWER  # noqa: E402

RULE = {"math500": "latex", "aime": "expression", "gsm8k": "expression"}


def timed(call):
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def main() -> None:
    verifier = MathVerifier()
    _, start = timed(verifier.start)
    rows = [(RULE[name], output, reference) for name, output, reference, *_ in TABLE]
    seconds = [timed(lambda: verifier.verdict(*row))[1] for row in rows]
    trivial = ("expression", "#### 3", "3")  # a verdict of about a millisecond: what is left is the round trip
    through_worker = [timed(lambda: verifier.verdict(*trivial))[1] for _ in range(300)]
    import logging

    logging.disable(logging.CRITICAL)  # as in the worker
    rules = _rules()
    here = [timed(lambda: _judge(rules, *trivial))[1] for _ in range(300)]
    _, overrun = timed(lambda: verifier.verdict("latex", TOWER, "3"))
    _, restart = timed(verifier.start)
    verifier.close()
    print(f"worker start (imports math-verify, one warm-up parse): {start:.2f} s")
    print(f"{len(rows)} verdicts of the table, first time: median {1e3 * statistics.median(seconds):.1f} ms, "
          f"largest {1e3 * max(seconds):.0f} ms, total {sum(seconds):.2f} s")
    worker_ms, here_ms = 1e3 * statistics.median(through_worker), 1e3 * statistics.median(here)
    print(f"a one-number verdict, median of 300: {worker_ms:.2f} ms through the worker, {here_ms:.2f} ms in this "
          f"process: the round trip adds {worker_ms - here_ms:.2f} ms")
    print(f"budget {BUDGET_S:g} s: the largest verdict is {max(seconds) / BUDGET_S:.1%} of it; "
          f"an overrun (10^(10^(10^10))) returned after {overrun:.2f} s, the next worker was ready {restart:.2f} s later")


if __name__ == "__main__":
    main()
