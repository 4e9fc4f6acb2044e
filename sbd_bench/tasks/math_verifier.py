"""Hugging Face's math-verify (the checker lighteval and open-r1 score MATH, AIME and GSM8K with), run in
a worker process of its own so that every verdict keeps a time budget.

    >>> verifier = math_verifier()
    >>> verifier.verdict("latex", r"so $\\boxed{2\\sqrt{3}}$", r"\\sqrt{12}")["correct"]
    True

Why a process: a verdict can run for minutes on a hostile output (``10^{10^{10^{10}}}``, a 10 MB
``\\boxed{}``, 10,000 nested braces), and math-verify's own timeouts are ``signal.alarm``: main thread
only (elsewhere ``parse`` and ``verify`` raise ValueError), between Python bytecodes only (a long call
into C runs on), per step (each parse, each compared pair) and silent (a timeout reads "not equal"). So
the whole verdict (both parses, the comparison, the parsed forms as strings) runs in one long-lived
worker, with math-verify's timeouts off, while this side waits at most ``budget_s`` of wall clock for
the reply. A worker that overruns, crashes or stops answering is killed, the verdict is a failed one with
the reason, and the next worker starts at once (its start, about a second, is no part of any verdict's
budget). Nothing here raises.

This file is also the worker: ``python -c <this file's text>`` runs ``serve()``. It imports only the
standard library at the top, so the run's own process never loads sympy.

Rules, as open-r1 evaluates with lighteval (src/open_r1/evaluate.py; lighteval's ``Metrics.expr_gold_metric``
is the second):
  latex       MATH500: its ``latex_gold_metric``: the reference, written as ``\\boxed{answer}`` (the
              solution's box, which open-r1 hands over), parsed as LaTeX
  expression  AIME, GSM8K: its ``expr_gold_metric``: the reference parsed as a plain expression
and in both the prediction parsed as a plain expression or as LaTeX, a ``\\boxed{}`` first (its
``boxed_match_priority=0``; boxes joined by 'or', 'and' or a comma are one set of answers), else a
final-answer phrase, else the last expression; compared with ``float_rounding=5`` (its ``precision=5``).
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time

BUDGET_S = 5.0  # wall clock per verdict: math-verify's own default per parse and per comparison
START_BUDGET_S = 120.0  # a worker's start (imports sympy; minutes only on a machine far over its cores)
MEMORY_BYTES = 4 << 30  # the worker's address space: a verdict that needs more fails, the machine keeps its memory
MAX_CHARS = 300  # of each string a verdict reports (a parsed form of a hostile output can be megabytes)


class _Overrun(Exception):
    pass


class _WorkerGone(Exception):
    pass


class MathVerifier:
    """One math-verify worker process, kept for every verdict of a run. Verdicts are taken one at a
    time (a lock), each within ``budget_s`` seconds of wall clock from its request to its reply."""

    def __init__(self, budget_s: float = BUDGET_S, start_budget_s: float = START_BUDGET_S):
        self.budget_s, self.start_budget_s = budget_s, start_budget_s
        self.version: str | None = None  # math-verify's, as the worker reports it
        self.starts = 0  # workers started so far (tests count restarts)
        self._proc: subprocess.Popen | None = None
        self._greeted = False  # the running worker's greeting has been read
        self._pending = bytearray()  # bytes read past the last reply
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------- verdicts
    def verdict(self, rule: str, prediction: str, reference: str, budget_s: float | None = None) -> dict:
        """``{"correct": bool, "extracted": the text math-verify took as the prediction's answer (or None),
        "parsed": its parsed forms, "reference_parsed": the reference's}`` (sympy's ``str`` of each), or
        ``{"correct": False, "error": why}`` when no verdict came: the budget ran out, the worker died,
        or math-verify raised. Never raises."""
        budget = self.budget_s if budget_s is None else budget_s
        with self._lock:
            try:
                self.start()
            except _WorkerGone as exc:
                return {"correct": False, "error": f"math-verify's worker did not start: {exc}"}
            request = json.dumps({"rule": rule, "prediction": prediction, "reference": reference}).encode() + b"\n"
            deadline = time.monotonic() + budget
            try:
                self._send(request, deadline)
                reply = self._receive(deadline)
            except _Overrun:
                self._replace()
                return {"correct": False, "error": f"timed out: math-verify gave no verdict within the budget of "
                                                   f"{budget:g} s (its worker was stopped and is started again)"}
            except _WorkerGone as exc:
                self._replace()
                return {"correct": False, "error": f"math-verify's worker stopped during the verdict: {exc}"}
        try:
            return json.loads(reply)
        except ValueError:
            return {"correct": False, "error": "math-verify's worker answered something that is not a verdict"}

    # ---------------------------------------------------------------------------------- the worker
    def start(self) -> None:
        """Start the worker if none runs, and wait (``start_budget_s``) until it has loaded math-verify."""
        if self._proc is not None and self._greeted and self._proc.poll() is None:
            return
        if self._proc is None or self._greeted:  # none, or one that has died since its greeting
            try:
                self._spawn()
            except OSError as exc:  # no process can be started now (a full process table, no memory)
                raise _WorkerGone(f"no process can be started: {exc}") from None
        self._greeted = True  # a worker that fails to greet is closed below
        try:
            hello = json.loads(self._receive(time.monotonic() + self.start_budget_s))
        except _Overrun:
            self.close(kill=True)
            raise _WorkerGone(f"not ready within {self.start_budget_s:g} s") from None
        except (_WorkerGone, ValueError) as exc:
            self.close(kill=True)
            raise _WorkerGone(str(exc) or "no greeting") from None
        if not hello.get("ready"):
            self.close(kill=True)
            raise _WorkerGone(hello.get("error", "unknown reason"))
        self.version = hello.get("version")

    def _spawn(self) -> None:
        self.close(kill=True)
        flags = ["-P"] if sys.version_info >= (3, 11) else []  # no working folder on sys.path: nothing shadows
        self._proc = subprocess.Popen([sys.executable, *flags, "-c", _worker_source()], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        self._greeted = False
        self.starts += 1
        os.set_blocking(self._proc.stdin.fileno(), False)  # a large request is written as the worker reads it

    def _replace(self) -> None:
        """Kill the worker and start the next one now: it loads math-verify while the run decodes on."""
        self.close(kill=True)
        try:
            self._spawn()
        except OSError:  # no process can be started now: the next verdict tries again
            self._proc = None

    def close(self, kill: bool = False) -> None:
        """Stop the worker: at once (``kill``), or by closing its input, which it reads to the end."""
        proc, self._proc = self._proc, None
        self._pending.clear()
        if proc is None:
            return
        if kill:
            proc.kill()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:  # a request left half-written in the pipe of a killed worker
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _send(self, data: bytes, deadline: float) -> None:
        fd, view = self._proc.stdin.fileno(), memoryview(data)
        while view:
            if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
                raise _Overrun
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                raise _WorkerGone(self._exit_reason()) from None

    def _receive(self, deadline: float) -> bytes:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._pending:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise _Overrun
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _WorkerGone(self._exit_reason())
            self._pending += chunk
        line, _, rest = bytes(self._pending).partition(b"\n")
        self._pending[:] = rest
        return line

    def _exit_reason(self) -> str:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it closed its output"
        return f"killed by signal {-code}" if code < 0 else f"it exited with status {code}"


_SHARED: MathVerifier | None = None


def math_verifier() -> MathVerifier:
    """The process's one verifier (its worker starts at the first verdict and ends with the process)."""
    global _SHARED
    if _SHARED is None:
        import atexit

        _SHARED = MathVerifier()
        atexit.register(_SHARED.close, True)  # killed: it holds nothing worth a graceful end
    return _SHARED


def describe(budget_s: float = BUDGET_S) -> str:
    """What judged the math answers, for a run's provenance: the versions a verdict depends on, and the
    budget (read from the installed packages' metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    packages = ("math-verify", "latex2sympy2_extended", "antlr4-python3-runtime", "sympy")
    return f"{', '.join(f'{name} {installed(name)}' for name in packages)}; {budget_s:g} s per verdict"


def _worker_source() -> str:
    from pathlib import Path

    return Path(__file__).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------ the worker side
def serve() -> None:
    """The worker: a greeting, then one JSON reply line per JSON request line on stdin, until its end."""
    import logging

    logging.disable(logging.CRITICAL)  # math-verify logs whole predictions on errors
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # what libraries print (antlr does) is not a reply
    sys.stdout = sys.stderr
    _die_with_parent()
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ImportError, ValueError, OSError):  # a lower hard limit already: keep it
        pass
    try:
        from importlib.metadata import version

        rules = _rules()
        _judge(rules, "latex", r"\boxed{\frac{1}{2}}", "0.5")  # warm up: the first LaTeX parse builds antlr's tables
        greeting = {"ready": True, "version": version("math-verify")}
    except Exception as exc:  # noqa: BLE001 - not installed, or broken: said to the other side
        greeting = {"ready": False, "error": f"{type(exc).__name__}: {exc}"[:MAX_CHARS]}
    _reply(replies, greeting)
    if not greeting["ready"]:
        return
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            reply = _judge(rules, request["rule"], request["prediction"], request["reference"])
        except Exception as exc:  # noqa: BLE001 - MemoryError, RecursionError, a bug of the parser: no verdict
            reply = {"correct": False, "error": f"math-verify raised {type(exc).__name__}: {exc}"[:MAX_CHARS]}
        _reply(replies, reply)


def _rules() -> dict:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    prediction = (ExprExtractionConfig(), LatexExtractionConfig(boxed_match_priority=0))
    return {"latex": ((LatexExtractionConfig(),), prediction, "\\boxed{%s}"),
            "expression": ((ExprExtractionConfig(),), prediction, "%s")}


def _judge(rules: dict, rule: str, prediction: str, reference: str) -> dict:
    from math_verify import parse, verify

    gold_targets, prediction_targets, reference_form = rules[rule]
    gold = parse(reference_form % reference, gold_targets, fallback_mode="first_match", parsing_timeout=None)
    answer = parse(prediction, prediction_targets, fallback_mode="first_match", parsing_timeout=None)
    correct = bool(gold and answer) and verify(gold, answer, float_rounding=5, timeout_seconds=None)
    text = [a for a in answer if isinstance(a, str)]  # with fallback_mode="first_match": the matched text
    return {"correct": bool(correct), "extracted": _cut(text[0]) if text else None,
            "parsed": [_cut(str(a)) for a in answer if not isinstance(a, str)],
            "reference_parsed": [_cut(str(g)) for g in gold if not isinstance(g, str)]}


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else f"{text[:MAX_CHARS]}... ({len(text)} characters)"


def _reply(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _die_with_parent() -> None:
    """On Linux, the kernel kills the worker when the run's process dies (else it would finish a runaway
    verdict first); elsewhere it ends at the end of its input."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    serve()
