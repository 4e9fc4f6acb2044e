"""What crosses between the judge and the candidate (sbd_bench/sandbox/sandboxed/proxy.py): plain data
only, with its types kept, within its limits; anything else fails with the reason. The codec is tested
here directly; the sessions through the sandbox."""
from __future__ import annotations

import math
import struct

import pytest

from sbd_bench.sandbox import Limits, Session, run_session
from sbd_bench.sandbox.sandboxed import proxy
from sbd_bench.sandbox.sandboxed.proxy import CandidateError, Handle, decode, encode

FAST = Limits(timeout_s=5)
PLAIN_VALUES = [None, True, False, 0, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 63, -(10 ** 100), 10 ** 5000, 0.1, -0.0,
                float("inf"), "", "héllo\n", "\udc80", b"", b"\x00\xff", [], (), set(), frozenset(), {},
                [1, (2, 3), {4: [5, {6}]}, frozenset({(7, "8")})], {(1, 2): "tuple key", 3: None, "x": b"y"},
                (True, 1, 1.0)]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=[f"{type(v).__name__}-{i}" for i, v in enumerate(PLAIN_VALUES)])
def test_plain_data_crosses_with_its_types(value):
    back = decode(encode(value))
    assert back == value and type(back) is type(value)
    if isinstance(value, (list, tuple)):
        assert [type(v) for v in back] == [type(v) for v in value]  # True stays True, 1.0 stays a float
    assert math.copysign(1, decode(encode(-0.0))) == -1 and math.isnan(decode(encode(float("nan"))))


def test_what_is_not_plain_stays_with_the_candidate():
    class Pair:
        pass

    handles = []
    wire = encode([Pair(), 1], handles)
    assert len(handles) == 1 and isinstance(handles[0], Pair)
    got = decode(wire)  # the judge's side
    assert type(got[0]) is Handle and got[1] == 1 and repr(got[0]) == "<the candidate's Pair object>"
    for use in (lambda h: h == 1, lambda h: 1 == h, bool, hash, len, iter, lambda h: h.x, lambda h: h in [1],
                lambda h: h < 1, lambda h: h(), lambda h: {h}, int, float):
        with pytest.raises(CandidateError, match="returned an object of type Pair, not plain data"):
            use(got[0])
    assert decode(encode([got[0]]), handles) == [handles[0]]  # passed back: the same object there
    with pytest.raises(TypeError, match="the test passed a function to the candidate"):
        encode(lambda: 0)  # the judge's side makes no handles


def test_subclasses_of_plain_types_are_not_plain():
    class Forged(int):
        def __eq__(self, other):
            return True

    handles = []
    assert type(decode(encode(Forged(3), handles))) is Handle and handles


@pytest.mark.parametrize("wire, why", [
    (b"", "not plain data"), (b"Q", "unknown tag"), (b"i\x01", "unpack"), (b"s" + struct.pack("<I", 5) + b"abc", "cut short"),
    (b"l" + struct.pack("<I", 10 ** 6) + b"N", "count larger than the message"), (b"NN", "bytes after the value"),
    (b"S" + struct.pack("<I", 1) + b"l" + struct.pack("<I", 0), "unhashable"),
    (b"h" + struct.pack("<I", 0), "unknown tag"),  # handles are the candidate's to make, not to pass in
    ((b"l" + struct.pack("<I", 1)) * 101 + b"N", "deeper than 100"),
], ids=["empty", "tag", "short-int", "short-str", "count", "trailing", "unhashable", "handle", "deep"])
def test_anything_else_is_refused_with_a_reason(wire, why):
    with pytest.raises(CandidateError, match=why):
        decode(wire)


def test_limits_on_what_is_sent():
    deep: list = []
    for _ in range(proxy.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        encode(deep)
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        encode(loop, [])
    with pytest.raises(ValueError, match="over the limit"):
        proxy.send(-1, "x" * (proxy.MAX_MESSAGE + 1))


def test_exceptions_arrive_as_builtins_but_never_as_stop_iteration():
    assert type(proxy._as_exception("ValueError", "ValueError: broken")) is ValueError
    assert str(proxy._as_exception("KeyError", "KeyError")) == ""
    for name in ("StopIteration", "StopAsyncIteration", "SystemExit", "MyError", "BaseException"):
        assert type(proxy._as_exception(name, f"{name}: x")) is CandidateError


# ------------------------------------------------------------------------------------------ sessions
def session(candidate: str, judge: str):
    return run_session(Session(candidate, judge), FAST)


def test_the_judge_binds_the_names_it_uses():
    candidate = ("import math\nfrom math import pi\nTABLE = {'a': (1, 2)}\n"
                 "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
                 "def longest(pairs):\n    return max(p.b - p.a for p in pairs)\n"
                 "def area(r):\n    return pi * r * r\n")
    judge = ("assert longest([Pair(1, 5), Pair(2, 3)]) == 4\n"  # instances stay with the candidate, passed back
             "assert math.isclose(area(1.0), math.pi)\n"  # math: the judge's own import of it
             "assert TABLE == {'a': (1, 2)}\n")  # a plain value: a copy
    out = session(candidate, judge)
    assert out.passed, out.detail


def test_a_stop_iteration_cannot_end_the_judges_loop():
    candidate = "def f(x):\n    raise StopIteration\n"
    out = session(candidate, "assert all(map(lambda x: f(x) == 1, [1, 2]))\n")
    assert out.status == "failed" and out.detail == "the candidate raised StopIteration"
    assert session("def f(x):\n    raise ValueError('no')\n", "try:\n    f(1)\nexcept ValueError:\n    pass\n").passed


def test_a_program_that_does_not_load_says_why():
    out = session("def f(x)\n    return x\n", "assert f(1) == 1\n")
    assert out.status == "failed" and out.detail.startswith("SyntaxError")
    out = session("raise SystemExit(0)\n", "assert f(1) == 1\n")
    assert out.status == "failed" and out.detail == "SystemExit: 0"


def test_builtins_and_the_tests_own_names_are_never_the_candidates():
    candidate = "def len(x):\n    return 3\ndef sorted(x):\n    return 'forged'\ndef check(c):\n    pass\n"
    judge = "def check(c):\n    assert c('ab') == 3\nassert len('ab') == 2 and sorted([2, 1]) == [1, 2]\ncheck(__candidate__.function('len'))\n"
    assert session(candidate, judge).passed


def test_the_candidates_limits_are_its_own():
    out = session("def f():\n    while True:\n        pass\n", "f()\n")
    assert out.status == "timed_out"
    out = session("import sys\ndef f():\n    sys.stdout.write('x' * (64 << 20))\n", "f()\n")
    assert out.status in ("crashed", "failed") and out.detail
