"""The built-in synthetic suite: verifiers accept references and reject corruptions; splits are
deterministic and disjoint."""
import json

import pytest

from sbd_bench.tasks import expand_tasks, task_registry
from sbd_bench.tasks import load_task
from sbd_bench.tasks.synthetic import scratchpad

SUITE = ["arith", "reverse", "record", "tag"]


def test_suite_is_the_four_tasks():
    assert sorted(expand_tasks("suite")) == sorted(SUITE)
    assert all(task_registry()[name].suite for name in SUITE)


def _corruptions(answer: str) -> list[str]:
    """Wrong outputs: one character changed at several places, truncated, extended, empty."""
    out = {answer[:-1], answer + "x", answer + "1", "", answer[1:]}
    for i in range(0, len(answer), max(1, len(answer) // 6)):
        swap = "7" if answer[i] != "7" else "8"
        out.add(answer[:i] + swap + answer[i + 1:])
    out.discard(answer)
    return sorted(out)


@pytest.mark.parametrize("name", SUITE)
def test_verifier_accepts_references_and_rejects_corruptions(name):
    task = load_task(name)
    task.n_train = 200
    for ex in task.examples("test") + task.examples("train")[:50]:
        assert task.score(ex, ex.answer), (name, ex)
        assert task.score(ex, f"  {ex.answer}\n"), "surrounding whitespace is not an error"
        for bad in _corruptions(ex.answer):  # for tag, one change breaks the name/capitals agreement
            assert not task.score(ex, bad), (name, ex.answer, bad)


def test_tag_accepts_any_consistent_name_only():
    task = load_task("tag")
    ex = task.examples("test")[0]
    number = ex.meta["number"]
    assert task.score(ex, f"abc {number} ABC") and task.score(ex, f"zzz {number} ZZZ")
    assert not task.score(ex, f"abc {number} ABD")  # the capitals disagree with the name
    assert not task.score(ex, f"abc {number + 1} ABC")  # wrong number
    assert not task.score(ex, f"abcd {number} ABCD")  # not 3 letters


def test_record_is_parsed_not_matched_textually():
    task = load_task("record")
    ex = task.examples("test")[0]
    value = json.loads(ex.answer)
    assert task.score(ex, json.dumps(value, separators=(",", ":")))  # other spacing, same record
    assert task.score(ex, json.dumps(dict(reversed(list(value.items())))))  # other key order
    assert not task.score(ex, json.dumps({**value, "age": str(value["age"])}))  # "42" is not 42
    assert not task.score(ex, json.dumps({**value, "ok": int(value["ok"])}))  # 1 is not true
    assert not task.score(ex, json.dumps({**value, "extra": 1}))
    assert not task.score(ex, "__import__('os')")  # never executed


def test_arith_scratchpad_steps_are_checked():
    assert scratchpad(347, 85) == "7+5+0=12,4+8+1=13,3+0+1=04;432"
    task = load_task("arith")
    ex = task.examples("test")[0]
    a, b = ex.meta["a"], ex.meta["b"]
    assert not task.score(ex, f"0+0+0=00;{a + b}")  # right total, wrong steps


@pytest.mark.parametrize("name", SUITE)
def test_splits_are_deterministic_and_disjoint(name):
    first, second = load_task(name), load_task(name)
    first.n_train = second.n_train = 2000
    assert first.examples("test") == second.examples("test")
    assert first.examples("train") == second.examples("train")
    test_prompts = [e.prompt for e in first.examples("test")]
    assert len(set(test_prompts)) == len(test_prompts) == first.n_test
    assert not set(test_prompts) & {e.prompt for e in first.examples("train")}
    other_seed = type(first)(seed=1)
    assert other_seed.examples("test") != first.examples("test")


def test_tag_train_split_shows_several_names_per_prompt():
    task = load_task("tag")
    names: dict[str, set[str]] = {}
    for ex in task.examples("train"):
        names.setdefault(ex.prompt, set()).add(ex.answer)
    assert max(len(v) for v in names.values()) >= 2


def test_n_test_draws_more_test_examples_that_start_with_the_default_ones():
    """`arith:n_test=520` (tune's calibration and held-out examples): the same first 40, then more
    distinct prompts of the same stream, none of them in the train split; `suite:...` gives every task
    the option; a bad value is one TaskError naming the fix."""
    from sbd_bench.tasks import TaskError

    default, more = load_task("arith"), load_task("arith:n_test=200")
    assert more.examples("test")[:40] == default.examples("test") and len(more.examples("test")) == 200
    assert len({e.prompt for e in more.examples("test")}) == 200
    more.n_train = 2000
    assert not {e.prompt for e in more.examples("test")} & {e.prompt for e in more.examples("train")}
    assert expand_tasks("suite:n_test=200") == [f"{name}:n_test=200" for name in SUITE]
    assert len(load_task("tag:n_test=900").examples("test")) == 900  # every prompt tag can make
    for spec, message in [("tag:n_test=901", "n_test <= 900"), ("arith:n_test=0", "integer >= 1"),
                          ("reverse:n_test=many", "integer >= 1"), ("record:seed=-1", "integer >= 0")]:
        with pytest.raises(TaskError, match=message):
            load_task(spec)
