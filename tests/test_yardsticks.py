"""AUP (d3LLM) and the PB score (ParallelBench), analysis/yardsticks.py: the published figures and every rule's edge."""
import math

import pytest

from sbd_bench.analysis.yardsticks import (aup, aup_curve, aup_weight, family_aups, family_of, family_pb_scores,
                                           mean_aups, pb_scores)


# d3LLM's leaderboard data (hao-ai-lab.github.io@025c1c0, static/blogs/text-diffusion/dLLM_Results.csv): the points
# of one (method, task), the task's y_max in its table, the published AUP
@pytest.mark.parametrize("points, y_max, published", [
    ([(1, 74.02), (9.08, 73.10)], 74.98, 635.7170),  # d3LLM-LLaDA, GSM8K-CoT
    ([(1, 74.98), (2.88, 73.24)], 74.98, 209.6769),  # D2F, LLaDA table, GSM8K-CoT
    ([(1, 76.57), (5.12, 76.57)], 83.94, 318.9862),  # EAGLE-3, Dream table, GSM8K-CoT
    ([(1, 83.94)], 83.94, 83.94),                    # Dream itself: one point at one token per forward
])
def test_aup_reproduces_the_published_leaderboard(points, y_max, published):
    assert aup(points, y_max) == pytest.approx(published, abs=1e-4)


def test_single_point_is_its_unweighted_rectangle():
    # the first rectangle carries no weight: a lone point far below y_max still scores rho * y
    assert aup([(2.5, 60.0)], y_max=90.0) == pytest.approx(150.0)


def test_weight_is_one_at_and_above_y_max_and_decays_below():
    assert aup_weight(80.0, 80.0) == 1.0 and aup_weight(85.0, 80.0) == 1.0
    assert aup_weight(0.0, 0.0) == 1.0  # every accuracy 0: no division by zero, the area is 0 anyway
    assert aup_weight(40.0, 80.0) == pytest.approx(math.exp(-1.5))


def test_point_more_than_margin_below_the_first_is_dropped_and_its_neighbours_bridged():
    # (2, 74.9) is 5.1 below the first: dropped (d3LLM's code would refuse the curve; we filter, as its blog does)
    value, kept = aup_curve([(3, 78.0), (1, 80.0), (2, 74.9)], y_max=80.0)
    assert kept == [(1, 80.0), (3, 78.0)]
    assert value == pytest.approx(80.0 + (3 - 1) * (78.0 * math.exp(-3 * (1 - 78 / 80)) + 80.0) / 2)
    # exactly 5 below stays (y >= y_1 - 5)
    assert aup_curve([(1, 80.0), (2, 75.0)], y_max=80.0)[1] == [(1, 80.0), (2, 75.0)]
    # the last point far below: only the first rectangle is left
    assert aup([(1, 80.0), (8, 60.0)], y_max=80.0) == pytest.approx(80.0)


def test_non_monotone_curve_joins_its_points_in_order_of_parallelism():
    w = lambda y: math.exp(-3 * (1 - y / 75.0))  # noqa: E731
    expected = 70.0 + (2 - 1) * (75.0 + 70.0 * w(70.0)) / 2 + (4 - 2) * (72.0 * w(72.0) + 75.0) / 2
    assert aup([(4, 72.0), (1, 70.0), (2, 75.0)], y_max=75.0) == pytest.approx(expected)


def test_equal_parallelism_adds_a_zero_width_trapezoid():
    assert aup([(1, 80.0), (1, 78.0)], y_max=80.0) == pytest.approx(80.0)


@pytest.mark.parametrize("points", [[], [(0.0, 50.0)], [(1, 50.0), (-1, 50.0)]])
def test_aup_refuses_no_point_and_non_positive_parallelism(points):
    with pytest.raises(ValueError):
        aup(points, y_max=50.0)


def _row(solver, config, task, tpf, accuracy, **params):
    return {"solver": solver, "config": config, "task": task, "tokens_per_forward": tpf, "accuracy": accuracy,
            "params": params}


ROWS = [
    _row("ntp", "ntp", "a", 1.0, 0.9),
    _row("fixed_k", "fixed_k:k=2", "a", 2.0, 0.88),
    _row("fixed_k", "fixed_k:k=4", "a", 4.0, 0.5),  # 40 points below NTP: dropped
    _row("confidence", "confidence:tau=0.9", "a", 3.0, 0.92),
    _row("confidence", "confidence:tau=0.9,verify=on", "a", 2.5, 0.9, verify="on"),
    _row("ntp", "ntp", "b", 1.0, 0.6),
    _row("fixed_k", "fixed_k:k=2", "b", 2.0, 0.6),
    _row("fixed_k", "fixed_k:k=4", "b", 4.0, 0.58),
    _row("confidence", "confidence:tau=0.9", "b", 3.0, None),  # no verdict on b
]


def test_families_are_solvers_apart_from_verify_and_sampling():
    assert family_of(ROWS[1]) == "fixed_k"
    assert family_of(ROWS[4]) == "confidence (verify=on)"
    assert family_of(_row("ntp", "ntp:temperature=0.7", "a", 1, 1, temperature=0.7)) == "ntp (temperature=0.7)"


def test_family_curves_start_at_ntp_and_share_the_task_y_max():
    entries = {(e["family"], e["task"]): e for e in family_aups(ROWS)}
    fixed = entries[("fixed_k", "a")]
    assert fixed["y_max"] == pytest.approx(92.0) and fixed["anchor"] == "ntp"
    assert fixed["points"] == [[1.0, 90.0], [2.0, 88.0], [4.0, 50.0]] and fixed["kept"] == 2
    assert fixed["aup"] == pytest.approx(aup([(1, 90), (2, 88)], 92.0))
    assert entries[("ntp", "a")]["aup"] == pytest.approx(90.0)
    assert entries[("confidence", "a")]["aup"] == pytest.approx(aup([(1, 90), (3, 92)], 92.0))
    assert ("confidence", "b") not in entries  # no verdict: no point of its own, no AUP
    means = mean_aups(list(entries.values()), ["a", "b"])
    assert means["fixed_k"] == pytest.approx((fixed["aup"] + entries[("fixed_k", "b")]["aup"]) / 2)
    assert means["confidence"] is None  # lacks task b: no mean comparable with the others'


def test_comparison_y_max_replaces_the_rows_best():
    e = next(e for e in family_aups(ROWS, y_max={"a": 100.0}) if e["family"] == "fixed_k" and e["task"] == "a")
    assert e["y_max"] == 100.0 and e["aup"] == pytest.approx(aup([(1, 90), (2, 88)], 100.0))


def _records(config, solver, task, correct, tokens, nfe):
    return [{"config": config, "solver": solver, "task": task, "id": i, "correct": c, "tokens": t, "nfe": n,
             "params": {}} for i, (c, t, n) in enumerate(zip(correct, tokens, nfe))]


def test_bootstrap_interval_brackets_the_estimate_and_collapses_when_examples_agree():
    records = (_records("ntp", "ntp", "a", [1, 1, 0, 1], [4, 4, 4, 4], [4, 4, 4, 4])
               + _records("fixed_k:k=2", "fixed_k", "a", [1, 0, 0, 1], [4, 4, 4, 4], [2, 2, 4, 1]))
    rows = [_row("ntp", "ntp", "a", 1.0, 0.75), _row("fixed_k", "fixed_k:k=2", "a", 16 / 9, 0.5)]
    e = next(e for e in family_aups(rows, records) if e["family"] == "fixed_k")
    assert e["aup_lo"] < e["aup"] < e["aup_hi"]
    same = (_records("ntp", "ntp", "a", [1, 1, 1], [4, 4, 4], [4, 4, 4])
            + _records("fixed_k:k=2", "fixed_k", "a", [1, 1, 1], [4, 4, 4], [2, 2, 2]))
    rows = [_row("ntp", "ntp", "a", 1.0, 1.0), _row("fixed_k", "fixed_k:k=2", "a", 2.0, 1.0)]
    e = next(e for e in family_aups(rows, same) if e["family"] == "fixed_k")
    assert e["aup_lo"] == pytest.approx(e["aup"]) == pytest.approx(e["aup_hi"]) == pytest.approx(200.0)


def test_pb_score_is_the_fastest_configuration_at_or_above_each_threshold():
    assert pb_scores([(1.0, 100.0), (2.0, 85.0), (4.0, 72.0), (8.0, 30.0)]) == {
        "PB90": 1.0, "PB80": 2.0, "PB70": 4.0, "PB60": 4.0}
    assert pb_scores([(2.0, 80.0)]) == {"PB90": None, "PB80": 2.0, "PB70": 2.0, "PB60": 2.0}  # at x counts
    assert pb_scores([]) == {"PB90": None, "PB80": None, "PB70": None, "PB60": None}


def test_family_pb_scores_average_each_configuration_over_the_tasks():
    scores = family_pb_scores(ROWS, ["a", "b"])
    # fixed_k: k=2 means (2.0, 74.0), k=4 (4.0, 54.0); no interpolation between them
    assert scores["fixed_k"] == {"PB90": None, "PB80": None, "PB70": 2.0, "PB60": 2.0}
    assert scores["ntp"] == {"PB90": None, "PB80": None, "PB70": 1.0, "PB60": 1.0}
    assert "confidence" not in scores  # no verdict on b: its one configuration does not cover the tasks


def test_a_sampled_family_is_anchored_at_ntp_sampled_alike_and_a_run_without_ntp_is_unanchored():
    rows = [_row("ntp", "ntp", "a", 1.0, 1.0), _row("ntp", "ntp:temperature=0.7", "a", 1.0, 0.8, temperature=0.7),
            _row("fixed_k", "fixed_k:k=2,temperature=0.7", "a", 2.0, 0.78, temperature=0.7)]
    e = next(e for e in family_aups(rows) if e["family"] == "fixed_k (temperature=0.7)")
    assert e["anchor"] == "ntp:temperature=0.7" and e["points"] == [[1.0, 80.0], [2.0, 78.0]]
    e = next(e for e in family_aups(rows[2:]) if e["family"] == "fixed_k (temperature=0.7)")
    assert e["anchor"] is None and e["aup"] == pytest.approx(2.0 * 78.0)  # its bare rectangle
