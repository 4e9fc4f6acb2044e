"""Every metric on crafted records (exact figures), plus the record invariants the decoding core must
keep (nfe excludes prefill; tokens exclude the prompt, masks and whatever follows the stop)."""
import math

import pytest

from measure_fixtures import crafted_record, make_task_file, make_tiny_model, standard_records
from sbd_bench.analysis import metrics

EB = "entropy_bounded:gamma=0.35,proxy=entropy"


def row(rows, config, task="arith"):
    return next(r for r in rows if r["config"] == config and r["task"] == task)


def test_ntp_against_itself_is_exactly_one():
    rows = metrics.summarize(standard_records())
    ntp = row(rows, "ntp")
    assert ntp["speed_factor_nfe"] == 1.0 and ntp["speed_factor_wall"] == 1.0
    assert (ntp["speed_factor_nfe_lo"], ntp["speed_factor_nfe_hi"]) == (1.0, 1.0)


def test_nfe_excludes_prefill_and_tokens_exclude_prompt():
    rec = crafted_record("ntp", "arith", "0", nfe=6, tokens=6, correct=True, decode_time_s=0.06)
    rec["prefill_forwards"], rec["prompt_tokens"] = 3, 50
    r = metrics.summarize([rec])[0]
    assert r["nfe"] == 6 and r["tokens"] == 6 and r["tokens_per_forward"] == 1.0


def test_speed_factors_pair_per_example():
    records = [crafted_record("ntp", "t", "a", nfe=10, tokens=10, correct=True, decode_time_s=1.0),
               crafted_record("ntp", "t", "b", nfe=30, tokens=30, correct=True, decode_time_s=3.0),
               crafted_record(EB, "t", "a", nfe=5, tokens=10, correct=True, decode_time_s=0.25),
               crafted_record(EB, "t", "b", nfe=30, tokens=30, correct=False, decode_time_s=3.0),
               crafted_record(EB, "t", "c", nfe=1, tokens=30, correct=False, decode_time_s=3.0)]  # no NTP pair
    r = row(metrics.summarize(records), EB, "t")
    assert r["speed_factor_nfe"] == pytest.approx((2 + 1) / 2)  # mean of per-example ratios, c unpaired
    assert r["nfe"] == pytest.approx(12) and r["tokens_per_forward"] == pytest.approx(70 / 36)
    assert r["accuracy"] == pytest.approx(1 / 3)


def test_wall_speed_factors_are_ratios_of_totals_not_means_of_ratios():
    # a: 4x faster on a short example, b: as fast on a long one. Mean of ratios (4 + 1) / 2 = 2.5 would
    # say 2.5x; the same work took 4.0 s against 3.25 s: 1.23x. c has no NTP pair and counts nowhere.
    records = [crafted_record("ntp", "t", "a", nfe=10, tokens=10, correct=True, decode_time_s=1.0),
               crafted_record("ntp", "t", "b", nfe=30, tokens=30, correct=True, decode_time_s=3.0),
               crafted_record(EB, "t", "a", nfe=5, tokens=10, correct=True, decode_time_s=0.25),
               crafted_record(EB, "t", "b", nfe=30, tokens=30, correct=False, decode_time_s=3.0),
               crafted_record(EB, "t", "c", nfe=1, tokens=30, correct=False, decode_time_s=3.0)]
    for rec in records:  # end to end adds a prefill of 0.5 s to every sample
        rec["prefill_time_s"], rec["wall_time_s"] = 0.5, rec["decode_time_s"] + 0.5
    r = row(metrics.summarize(records), EB, "t")
    assert r["speed_factor_wall"] == pytest.approx(4.0 / 3.25)
    assert r["speed_factor_e2e"] == pytest.approx(5.0 / 4.25)
    # the bootstrap resamples examples and takes the ratio of totals again: it stays between the two
    # examples' own ratios (1 and 4) and holds the estimate
    assert 1.0 <= r["speed_factor_wall_lo"] <= r["speed_factor_wall"] <= r["speed_factor_wall_hi"] <= 4.0
    assert r["speed_factor_e2e_lo"] <= r["speed_factor_e2e"] <= r["speed_factor_e2e_hi"]
    ntp = row(metrics.summarize(records), "ntp", "t")
    assert ntp["speed_factor_wall"] == ntp["speed_factor_e2e"] == 1.0


def test_bootstrap_of_a_ratio_of_totals_is_seeded_and_exact_at_one_example():
    pairs = [(1.0, 0.25), (3.0, 3.0), (2.0, 1.0), (5.0, 2.5)]
    assert metrics.bootstrap_ratio_ci(pairs) == metrics.bootstrap_ratio_ci(pairs)
    assert metrics.bootstrap_ratio_ci([(2.0, 0.5)]) == (4.0, 4.0)
    assert metrics.bootstrap_ratio_ci([]) == (None, None) and metrics.ratio_of_totals([]) is None


def test_errors_are_counted_not_measured():
    records = standard_records(n=3)
    records.append(crafted_record("fixed_k:k=4", "arith", "9", nfe=0, tokens=0, correct=None, decode_time_s=0.0,
                                  error="OutOfMemoryError: boom"))
    r = row(metrics.summarize(records), "fixed_k:k=4")
    assert r["errors"] == 1 and r["n"] == 3


def test_accuracy_is_none_without_verdicts():
    rec = crafted_record("ntp", "open", "0", nfe=4, tokens=4, correct=None, decode_time_s=0.1)
    r = metrics.summarize([rec])[0]
    assert r["accuracy"] is None and r["accuracy_lo"] is None


def test_repeats_collapse_to_median_timings():
    records = [crafted_record("ntp", "t", "a", nfe=8, tokens=8, correct=True, decode_time_s=t, repeat=i)
               for i, t in enumerate([0.3, 0.1, 0.2])]
    [r] = metrics.collapse_repeats(records)
    assert r["decode_time_s"] == 0.2 and r["repeats"] == 3 and r["nfe"] == 8
    assert metrics.summarize(records)[0]["repeats"] == 3


def test_forwards_per_block_mean():
    rec = crafted_record(EB, "t", "a", nfe=6, tokens=8, correct=True, decode_time_s=0.1)
    rec["forwards_per_block"] = [4, 2]
    assert metrics.summarize([rec])[0]["forwards_per_block"] == 3.0


def test_output_length_against_ntp_is_paired_and_marked_above_ten_percent():
    def records(eb_tokens):
        out = []
        for i, (ntp, eb) in enumerate(zip([10, 30], eb_tokens)):
            out.append(crafted_record("ntp", "t", str(i), nfe=ntp, tokens=ntp, correct=True, decode_time_s=0.1))
            out.append(crafted_record(EB, "t", str(i), nfe=2, tokens=eb, correct=True, decode_time_s=0.1))
        out.append(crafted_record(EB, "t", "unpaired", nfe=1, tokens=1, correct=True, decode_time_s=0.1))
        return out

    def length(eb_tokens):
        r = row(metrics.summarize(records(eb_tokens)), EB, "t")
        return r["tokens_vs_ntp"], r["tokens_differ_from_ntp"]

    assert length([10, 30]) == (1.0, False)
    assert length([12, 32]) == (1.1, False)  # exactly 10% longer (44 vs 40 tokens): not more than 10%
    assert length([12, 33]) == (pytest.approx(45 / 40), True)
    assert length([6, 30]) == (0.9, False) and length([5, 30]) == (pytest.approx(35 / 40), True)
    ntp = row(metrics.summarize(records([5, 30])), "ntp", "t")
    assert (ntp["tokens_vs_ntp"], ntp["tokens_differ_from_ntp"]) == (1.0, False)
    alone = metrics.summarize([crafted_record(EB, "t", "0", nfe=2, tokens=8, correct=True, decode_time_s=0.1)])[0]
    assert alone["tokens_vs_ntp"] is None and alone["tokens_differ_from_ntp"] is None  # no NTP to compare with


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [1.0, 2.0, 2.5, 4.0, 3.0, 1.5]
    lo, hi = metrics.bootstrap_ci(values)
    assert (lo, hi) == metrics.bootstrap_ci(values)
    assert lo < sum(values) / len(values) < hi
    assert metrics.bootstrap_ci([2.0]) == (2.0, 2.0) and metrics.bootstrap_ci([]) == (None, None)


def test_wilson_interval():
    lo, hi = metrics.wilson_ci(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = metrics.wilson_ci(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)
    assert metrics.wilson_ci(0, 0) == (None, None)


def test_json_safe():
    assert metrics.json_safe({"a": [math.inf, 1.0], "b": math.nan}) == {"a": [None, 1.0], "b": None}


# ---------------------------------------------------------------------- invariants of real records
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from sbd_bench.core.model import load_model

    folder = tmp_path_factory.mktemp("tiny")
    return load_model(make_tiny_model(folder / "model"), device="cpu"), make_task_file(folder / "t.jsonl", n=2)


@pytest.mark.parametrize("spec", ["ntp", "fixed_k:k=3", "entropy_bounded:gamma=0.35"])
def test_records_count_tokens_and_forwards_consistently(tiny, spec):
    from sbd_bench.runner.samples import RunConfig, decode_sample
    from sbd_bench.registry import parse_solver_spec, solver_registry
    from sbd_bench.tasks import load_task

    lm, task_file = tiny
    task = load_task(str(task_file))
    solver = parse_solver_spec(spec, solver_registry())[-1]
    cfg = RunConfig(model=lm.path, block_size=4, max_new_tokens=10)
    example = task.examples()[0]
    ids = task.encode(example, lm.tokenizer)
    free = decode_sample(lm, task, example, ids, solver, cfg)
    assert free["tokens"] == len(free["output_ids"]) == sum(free["revealed_per_forward"]) == 10
    assert free["nfe"] == len(free["revealed_per_forward"]) == sum(free["forwards_per_block"])
    assert free["prefill_forwards"] == 1 and lm.mask_token_id not in free["output_ids"]
    # make the 4th generated token a stop token: nothing after it may be kept or counted
    stop = free["output_ids"][3]
    first = free["output_ids"].index(stop)
    saved = lm.stop_token_ids
    lm.stop_token_ids = (stop,)
    try:
        cut = decode_sample(lm, task, example, ids, solver, cfg)
    finally:
        lm.stop_token_ids = saved
    assert cut["output_ids"] == free["output_ids"][: first + 1] and cut["stop_reason"] == "stop_token"
    assert cut["tokens"] == first + 1 == sum(cut["revealed_per_forward"])
    assert cut["nfe"] == len(cut["revealed_per_forward"]) <= free["nfe"]
    assert cut["memory"]["peak_memory_bytes"] > 0
