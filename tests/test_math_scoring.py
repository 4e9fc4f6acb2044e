"""Math answers judged by math-verify (as lighteval uses it) and by the earlier hand-written rules
(``scorer=simple``): a table of answer pairs with the right verdict, both scorers' verdicts on it, the
table of their disagreements in docs/benchmarks.md (generated from this file: ``python
tests/test_math_scoring.py`` prints it), the time budget of each verdict against hostile outputs, and the
records and report of a run.

    python -m pytest -q tests/test_math_scoring.py
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sbd_bench.tasks import TaskError, load_task
from sbd_bench.tasks.math_verifier import BUDGET_S, MathVerifier, math_verifier
from sbd_bench.types import Example

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
FILES = {"math500": "math500_sample.jsonl", "aime": "aime_sample.jsonl", "gsm8k": "gsm8k_sample.jsonl"}


def box(answer: str) -> str:
    return f"$\\boxed{{{answer}}}$"


# (benchmark, model output, reference, the right verdict, the simple scorer's verdict, why they differ).
# math-verify's verdict is the right one on every row (scorer=math_verify, the default).
TABLE = [
    # the five pairs issue 32 names
    ("math500", box(r"\{1,2\}"), r"\{2,1\}", True, False, "a set is unordered"),
    ("math500", box(r"2\sqrt{3}"), r"\sqrt{12}", True, False, "equal radicals"),
    ("math500", box(r"\text{(A)}"), "A", True, False, "a choice letter, with or without its parentheses"),
    ("math500", box(r"\pi/2"), r"\frac{\pi}{2}", True, False, "the same fraction, written inline"),
    ("math500", box("x^2+2x+1"), "(x+1)^2", True, False, "the same polynomial, expanded"),
    # sets and intervals
    ("math500", box(r"\{1,2\}"), r"\{1,3\}", False, False, ""),
    ("math500", box("(1,2]"), "(1,2]", True, True, ""),
    ("math500", box("[1,2)"), "(1,2]", False, False, ""),
    ("math500", box(r"(-\infty, 3)"), r"(-\infty,3)", True, True, ""),
    ("math500", box(r"(1,\infty)\cup(-\infty,0)"), r"(-\infty, 0) \cup (1, \infty)", True, False,
     "a union in the other order"),
    ("math500", box(r"x \in [2,5]"), "[2,5]", True, False, "the interval, named as x's range"),
    ("math500", box("(0, 1)"), "[0,1]", False, False, ""),
    ("math500", box("(1,2)"), "(2,1)", False, False, ""),  # ordered pairs
    # units and text
    ("math500", box(r"10\text{ cm}"), "10", True, True, ""),
    ("math500", box(r"90^\circ"), "90", True, True, ""),
    ("math500", box(r"5\text{ cm}^2"), "5", True, False, "a unit with an exponent"),
    ("math500", box(r"\$5"), "5", True, True, ""),
    ("math500", box(r"\text{Tuesday}"), r"\text{Monday}", False, False, ""),
    ("math500", box(r"\text{no solution}"), r"\text{no solution}", True, True, ""),
    ("math500", box(r"\textbf{(C)}"), "C", True, False, "a choice letter in bold"),
    ("math500", box("B"), r"\text{(B)}", True, False, "a choice letter, with or without its parentheses"),
    ("math500", box("B"), r"\text{(C)}", False, False, ""),
    # percentages
    ("math500", box(r"50\%"), "50", True, True, ""),
    ("math500", box("25"), r"25\%", True, True, ""),
    ("math500", box("0.5"), r"50\%", True, False, "a percentage as a fraction"),
    ("math500", box(r"10\%"), "0.1", True, False, "a fraction as a percentage"),
    # fractions and decimals
    ("math500", box(r"\frac{3}{4}"), "0.75", True, True, ""),
    ("math500", box(r"\dfrac{1}{2}"), r"\frac12", True, True, ""),
    ("math500", box("0.333"), r"\frac{1}{3}", False, False, ""),
    ("math500", box("3/4"), r"\frac{3}{4}", True, True, ""),
    ("math500", box(r"-\frac{1}{2}"), "-0.5", True, True, ""),
    ("math500", box(r"\frac{1}{2}"), r"\frac{1}{3}", False, False, ""),
    ("math500", box("1{,}000"), "1000", True, True, ""),
    ("math500", box(r"1.5\times10^3"), "1500", True, False, "scientific notation"),
    ("math500", box("2^{100}"), "1267650600228229401496703205376", True, False, "a power, evaluated"),
    ("math500", box(r"\frac{9}{2}\pi"), r"4.5\pi", True, False, "a multiple of pi, as a fraction"),
    # equations
    ("math500", box("x=3"), "3", True, True, ""),
    ("math500", box("3"), "x=3", True, True, ""),
    ("math500", box("x=4"), "3", False, False, ""),
    ("math500", box("y=-2x+3"), "y = 3 - 2x", True, False, "the same line, terms in another order"),
    ("math500", box("x=2, y=3"), "(2,3)", True, False, "a point, written as two equations"),
    # matrices and vectors
    ("math500", box(r"\begin{pmatrix}1\\2\end{pmatrix}"), r"\begin{pmatrix}1\\2\end{pmatrix}", True, True, ""),
    ("math500", box(r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"), r"\begin{pmatrix}1\\2\end{pmatrix}", True, False,
     "blanks around a row break (the simple rule drops the '\\ ' of '\\\\ ')"),
    ("math500", box(r"\begin{pmatrix}2/4\\1\end{pmatrix}"), r"\begin{pmatrix}1/2\\1\end{pmatrix}", True, False,
     "equal entries, one unreduced"),
    ("math500", box(r"\begin{pmatrix}1&2\\3&4\end{pmatrix}"), r"\begin{pmatrix}1&2\\3&5\end{pmatrix}", False, False,
     ""),
    # several answers
    ("math500", box("1, 2"), "2, 1", True, False, "solutions in another order"),
    ("math500", box("-2, 3"), "3, -2", True, False, "solutions in another order"),
    ("math500", box(r"\pm 2"), "2, -2", True, False, "both signs, written with \\pm"),
    ("math500", box("1, 2"), "1, 3", False, False, ""),
    ("math500", r"so $\boxed{1}$ or $\boxed{2}$", "1, 2", True, False, "two solutions, each in its own box"),
    ("math500", r"it is $\boxed{3}$ or $\boxed{4}$", "4", False, True,
     "a hedge between two answers (the simple rule reads the last box only)"),
    # expressions
    ("math500", box("2x+1"), "1+2x", True, False, "terms in another order"),
    ("math500", box(r"\frac{\sqrt{3}}{3}"), r"\frac{1}{\sqrt{3}}", True, False, "a rationalised denominator"),
    ("math500", box("x+1"), "y+1", False, False, ""),
    ("math500", box(r"2\sqrt{3}"), r"3\sqrt{2}", False, False, ""),
    ("math500", box("3+4i"), "4i+3", True, False, "terms in another order"),
    # malformed LaTeX
    ("math500", box(r"\frac12"), r"\frac{1}{2}", True, True, ""),
    ("math500", box(r"\sqrt2"), r"\sqrt{2}", True, True, ""),
    ("math500", box(r"\left( 1, 2 \right)"), "(1,2)", True, True, ""),
    ("math500", r"so \boxed{\frac{1}{2} is it", r"\frac{1}{2}", True, False, "a box never closed"),
    ("math500", box(""), "3", False, False, ""),
    ("math500", box(r"\frac{1}{0}"), r"\infty", False, False, ""),
    # where the answer is: no box
    ("math500", "The answer is $2$.", "2", True, False, "no box: the answer after 'The answer is'"),
    ("math500", "I cannot solve this.", "3", False, False, ""),
    ("aime", box("033"), "33", True, True, ""),
    ("aime", box("240"), "24", False, False, ""),
    ("aime", r"$\boxed{1024}$ mod 1000 is $\boxed{24}$", "24", True, True, ""),
    ("aime", "The final answer is 24.", "24", True, False, "no box: the answer after 'The final answer is'"),
    # GSM8K: the final number first, math-verify when it fails
    ("gsm8k", "300 * 4 = 1,200.\n#### 1,200", "1200", True, True, ""),
    ("gsm8k", r"so $\boxed{\frac{3}{2}}$", "1.5", True, False, "a fraction in the box (the simple rule reads its last number, 2)"),
    ("gsm8k", r"so \boxed{\$1{,}200}", "1200", True, False, "a grouped thousands separator after a dollar sign"),
    ("gsm8k", r"It is $\boxed{18\text{ eggs}}$.", "18", True, True, ""),
    ("gsm8k", "#### 17", "18", False, False, ""),
    ("gsm8k", "The answer is 3 and a half", "3.5", False, False, ""),
]

# Where math-verify's verdict is not the right one (kept, with math-verify's verdict, so the docs stay
# true): it compares numbers rounded to 5 decimals, so a decimal approximation of an exact answer passes.
# (benchmark, model output, reference, the right verdict, math-verify's verdict, the simple scorer's, why)
MATH_VERIFY_WRONG = [
    ("math500", box("3.14159"), r"\pi", False, True, False, "an approximation of an exact answer (5 decimals)"),
    ("math500", box("1.41421"), r"\sqrt{2}", False, True, False, "an approximation of an exact answer (5 decimals)"),
    ("math500", box("0.33333"), r"\frac{1}{3}", False, True, False, "an approximation of an exact answer (5 decimals)"),
]


@pytest.fixture(scope="module")
def tasks():
    return {(name, scorer): load_task(f"{name}:path={DATA / file}", scorer=scorer)
            for name, file in FILES.items() for scorer in ("math_verify", "simple")}


def judged(tasks, name, output, reference, scorer="math_verify"):
    return tasks[(name, scorer)].verdict(Example("table", "", reference), output)


def test_the_table_is_as_large_as_promised():
    assert len(TABLE) >= 40 and len({(b, o, r) for b, o, r, *_ in TABLE}) == len(TABLE)
    assert sum(truth != simple for _, _, _, truth, simple, _ in TABLE) >= 20  # the simple rule's misses


def test_math_verify_gives_the_right_verdict_on_the_table(tasks):
    wrong = []
    for name, output, reference, truth, simple, _ in TABLE:
        ok, detail = judged(tasks, name, output, reference)
        if ok is not truth or "error" in detail["math_verify"]:
            wrong.append((name, output, reference, truth, detail))
    assert not wrong, wrong


def test_the_simple_scorer_gives_the_verdicts_the_table_says(tasks):
    """Both scorers run on every verdict; ``scorer`` picks which one counts, the other is recorded."""
    differ = []
    for name, output, reference, truth, simple, _ in TABLE:
        ok, detail = judged(tasks, name, output, reference, scorer="simple")
        if ok is not simple or detail["simple"]["correct"] is not simple or detail["other_correct"] is not truth:
            differ.append((name, output, reference, simple, detail))
    assert not differ, differ


def test_where_math_verify_is_wrong(tasks):
    for name, output, reference, truth, verified, simple, _ in MATH_VERIFY_WRONG:
        ok, detail = judged(tasks, name, output, reference)
        assert (ok, detail["simple"]["correct"]) == (verified, simple) and verified is not truth, detail


def test_a_record_says_what_was_compared(tasks):
    ok, detail = judged(tasks, "math500", box(r"2\sqrt{3}"), r"\sqrt{12}")
    assert ok is True and detail == {
        "scorer": "math_verify", "other_scorer": "simple", "other_correct": False,
        "math_verify": {"correct": True, "extracted": r"2\sqrt{3}", "parsed": ["2*sqrt(3)"],
                        "reference_parsed": ["sqrt(12)"]},
        "simple": {"correct": False, "extracted": r"2\sqrt{3}"}}
    ok, detail = judged(tasks, "gsm8k", r"so $\boxed{\frac{3}{2}}$", "1.5", scorer="simple")
    assert ok is False and detail["scorer"] == "simple" and detail["other_scorer"] == "math_verify"
    assert detail["other_correct"] is True and detail["simple"] == {"correct": False, "extracted": "2"}
    assert detail["math_verify"]["parsed"] == ["3/2"]


# ------------------------------------------------------------------------------- the docs' table
def cell(text: str) -> str:
    return "`" + text.replace("\n", "\\n").replace("|", "\\|") + "`"


def verdict_word(ok: bool) -> str:
    return "pass" if ok else "fail"


def disagreement_table() -> str:
    """The rows of TABLE and MATH_VERIFY_WRONG where a scorer is wrong, as docs/benchmarks.md shows them."""
    lines = ["| benchmark | model output | reference | right | math-verify | simple | why |",
             "|---|---|---|---|---|---|---|"]
    rows = [(b, o, r, t, t, s, why) for b, o, r, t, s, why in TABLE if s is not t] + MATH_VERIFY_WRONG
    for name, output, reference, truth, verified, simple, why in rows:
        lines.append(f"| {name} | {cell(output)} | {cell(reference)} | {verdict_word(truth)} | "
                     f"{verdict_word(verified)} | {verdict_word(simple)} | {why} |")
    return "\n".join(lines)


def test_the_docs_show_this_table():
    docs = (ROOT / "docs/benchmarks.md").read_text()
    assert disagreement_table() in docs, "docs/benchmarks.md: paste the output of `python tests/test_math_scoring.py`"
    assert all(why for b, o, r, t, s, why in TABLE if s is not t)  # each disagreement says why


# ------------------------------------------------------------------------------- the time budget
TOWER = box("10^{10^{10^{10}}}")
HOSTILE = {  # each ran for minutes in math-verify without a budget (10 MB: its regexes; the tower: sympy's powers)
    "10 MB box": "\\boxed{" + "1" * 10_000_000 + "}",
    "power tower": TOWER,
    "10,000 nested braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "unbalanced braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 5_000,
}


@pytest.fixture(scope="module")
def quick():
    """A verifier of its own with a budget of 1 s, so that the hostile outputs cost the tests little."""
    verifier = MathVerifier(budget_s=1.0)
    verifier.start()
    yield verifier
    verifier.close()


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_output_is_a_failed_verdict_within_the_budget(quick, kind):
    quick.start()  # a worker ready (the start after an overrun is no part of any verdict's budget)
    started = time.monotonic()
    reply = quick.verdict("latex", HOSTILE[kind], "3")
    elapsed = time.monotonic() - started
    assert reply["correct"] is False, reply
    assert elapsed < quick.budget_s + 1.0, f"{elapsed:.1f} s for a budget of {quick.budget_s} s"  # + killing it
    if "error" in reply:
        assert reply["error"].startswith("timed out: math-verify gave no verdict within the budget of 1 s"), reply
    assert quick.verdict("latex", box("3"), "3")["correct"] is True  # the next verdict: a fresh worker if need be


def test_the_default_budget_stops_a_runaway(tasks):
    """Through a task, at the budget a run uses: the tower's sympy power never finishes."""
    math_verifier().start()
    started = time.monotonic()
    ok, detail = judged(tasks, "math500", TOWER, "3")
    elapsed = time.monotonic() - started
    assert ok is False and detail["simple"]["correct"] is False
    assert detail["math_verify"] == {"correct": False, "error": (
        f"timed out: math-verify gave no verdict within the budget of {BUDGET_S:g} s (its worker was stopped and "
        "is started again)")}
    assert BUDGET_S <= elapsed < BUDGET_S + 1.0


def test_math_verifys_own_timeout_needs_the_main_thread():
    """Why the worker: math-verify's timeout is signal.alarm, which a run's other threads cannot use."""
    math_verify = pytest.importorskip("math_verify")
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(ValueError, match="threaded environment"):
            pool.submit(math_verify.parse, r"$\frac{1}{2}$", parsing_timeout=5, raise_on_error=True).result()
        # the worker runs in a process of its own, so a verdict asked for from any thread is bounded alike
        assert pool.submit(math_verifier().verdict, "latex", box("1/2"), "0.5").result()["correct"] is True


def test_a_dead_worker_is_replaced(quick):
    quick.start()
    before = quick.starts
    os.kill(quick._proc.pid, signal.SIGKILL)
    quick._proc.wait()
    assert quick.verdict("latex", box("7"), "7")["correct"] is True and quick.starts == before + 1


def test_a_worker_that_cannot_start_is_a_failed_verdict(monkeypatch):
    from sbd_bench.tasks import math_verifier as module

    source = module._worker_source()
    main = 'if __name__ == "__main__":'
    assert main in source
    monkeypatch.setattr(module, "_worker_source", lambda: source.replace(main, "sys.modules['math_verify'] = None\n" + main))
    broken = MathVerifier(budget_s=1.0)
    reply = broken.verdict("latex", box("1"), "1")
    assert reply == {"correct": False, "error": "math-verify's worker did not start: ModuleNotFoundError: import of "
                                                "math_verify halted; None in sys.modules"}
    broken.close()


def test_bad_scorer_and_missing_package_are_one_line(monkeypatch):
    with pytest.raises(TaskError, match=r"^task 'math500' has no scorer 'sympy': write scorer=math_verify"):
        load_task(f"math500:path={DATA / FILES['math500']};scorer=sympy")
    from sbd_bench.tasks import math_tasks

    monkeypatch.setattr(math_tasks, "find_spec", lambda name: None if name == "math_verify" else object())
    with pytest.raises(TaskError, match=r"math_verify is not installed: pip install -c constraints.txt "
                                        r"math-verify$"):
        load_task(f"gsm8k:path={DATA / FILES['gsm8k']}")


def test_the_run_process_does_not_load_sympy():
    """Tasks (and so a run of the synthetic suite) import no math-verify and no sympy: only the worker does."""
    code = "import sys, sbd_bench.tasks, sbd_bench.analysis.report; print(sorted(m for m in ('sympy', " \
           "'math_verify', 'latex2sympy2_extended') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------------------- records and report
def test_records_and_report_of_a_run(tmp_path, capsys):
    from tiny_models import build_tiny_model

    from sbd_bench.cli import main

    model = build_tiny_model(tmp_path / "model", max_positions=1024)
    out = tmp_path / "run"
    spec = f"math500:path={DATA / FILES['math500']};scorer=simple"
    assert main(["run", "--model", str(model), "--task", spec, "--solver", "ntp", "--limit", "2", "--no-report",
                 "--max-new-tokens", "4", "--threads", "1", "--no-cost-curve", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:  # a random model's 4 tokens hold no answer: both scorers fail it
        d = r["score_detail"]
        assert r["correct"] is False and d["scorer"] == "simple" and d["other_scorer"] == "math_verify"
        assert d["other_correct"] is False and d["simple"]["correct"] is False and d["math_verify"]["correct"] is False
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["math_verify"].startswith("math-verify 0.9.0, ")
    # the report reads the records only: one that the other scorer passes is counted from its record
    records[0]["score_detail"]["other_correct"] = True
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "| math500 | ntp | simple | 2 | math_verify | 1 | 0 | 0 |" in report
    assert f"- math_verify: `{summary['provenance']['math_verify']}`" in report


if __name__ == "__main__":
    print(disagreement_table())
