"""The cost model: real dimensions, the SBD paper's H100 observation, and predicted speed factors."""
import pytest

from measure_fixtures import crafted_record, crafted_run, make_tiny_model, standard_records
from sbd_bench.analysis import roofline
from sbd_bench.cli import main
from sbd_bench.analysis.metrics import summarize

LLAMA = roofline.PRESETS["llama-3.1-8b"]


def test_llama_dimensions_give_eight_billion_parameters():
    assert LLAMA.parameters == pytest.approx(8.03e9, rel=0.01)  # gated FFN, GQA, embeddings + LM head


def test_block_forward_is_nearly_free_at_batch_one_on_h100():
    h100 = roofline.HARDWARE["H100"]
    t1, t16, t32 = (roofline.forward_time(LLAMA, h100, q, context=1024) for q in (1, 16, 32))
    assert 1.0 < t16 / t1 < 1.02 and t32 / t1 < 1.05  # SBD.md §5: ~1.004x at k=16
    weights = (LLAMA.parameters - LLAMA.hidden * LLAMA.vocab) * 2  # bf16; the embedding table is not read
    assert t1 == pytest.approx(weights / 3.35e12, rel=0.02)  # memory-bound: one pass over the weights


def test_large_batch_and_block_become_compute_bound():
    h100 = roofline.HARDWARE["H100"]
    ratio = roofline.forward_time(LLAMA, h100, 32, 1024, batch=64) / roofline.forward_time(LLAMA, h100, 1, 1024, batch=64)
    assert ratio > 4


def test_dims_from_hf_config():
    dims = roofline.ModelDims.from_config({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100})
    assert dims.head_dim == 16 and dims.kv_heads == 2
    assert dims.matrices()[1] == (64, 32)  # K projection: 2 KV heads x 16


def test_flat_cost_curve_predicts_the_ratio_of_total_forwards():
    # every forward costs the same: the prediction is NTP's total NFE over the configuration's (a ratio
    # of totals, like the measured wall speed factor), not the mean of per-example NFE ratios
    records = standard_records()
    flat = roofline.measured_time_fn({"query_tokens": [1, 8], "time_s": [0.01, 0.01]})
    predicted = roofline.predicted_speed_factors(records, flat)
    ntp = {(r["task"], r["id"]): r["nfe"] for r in records if r["solver"] == "ntp"}
    for row in summarize(records):
        mine = [r for r in records if (r["config"], r["task"]) == (row["config"], row["task"])]
        expected = sum(ntp[(r["task"], r["id"])] for r in mine) / sum(r["nfe"] for r in mine)
        assert predicted[(row["config"], row["task"])] == pytest.approx(expected)
    assert predicted[("fixed_k:k=4", "arith")] != pytest.approx(row_of(records, "fixed_k:k=4")["speed_factor_nfe"])


def row_of(records, config, task="arith"):
    return next(r for r in summarize(records) if (r["config"], r["task"]) == (config, task))


def test_block_cost_counts_the_first_forward_of_each_block():
    rec = crafted_record("fixed_k:k=2", "t", "a", nfe=5, tokens=8, correct=True, decode_time_s=0.1, block_size=4)
    rec["forwards_per_block"] = [2, 3]
    t = roofline.measured_time_fn({"query_tokens": [1, 4, 5, 8], "time_s": [1.0, 2.0, 3.0, 5.0]})
    assert t(6, 0) == pytest.approx(3.0 + 2.0 * 1 / 3)  # interpolated between q=5 and q=8
    assert roofline.sample_cost(rec, t) == pytest.approx((3.0 + 1 * 2.0) + (5.0 + 2 * 2.0))


def test_measured_cost_curve_on_a_tiny_model(tmp_path):
    from sbd_bench.core.model import load_model
    from sbd_bench.runner.costcurve import measure_cost_curve

    lm = load_model(make_tiny_model(tmp_path / "m"), device="cpu")
    curve = measure_cost_curve(lm, block_size=4, context=20, reps=2, warmup=1)
    assert curve["query_tokens"] == [1, 4, 5, 8] and all(t > 0 for t in curve["time_s"])
    assert curve["context"] == 20


def test_roofline_cli(tmp_path, capsys):
    assert main(["roofline", "--dims", "llama-3.1-8b"]) == 0
    assert "| H100 |" in capsys.readouterr().out
    run = crafted_run(tmp_path / "run", standard_records(), cost_curve={
        "block_size": 4, "context": 16, "reps": 5, "device": "cpu", "query_tokens": [1, 4], "time_s": [1e-3, 2e-3]})
    assert main(["roofline", str(run), "--hardware", "H200", "--dims", "qwen3-8b"]) == 0
    out = capsys.readouterr().out
    assert "pred_measured" in out and "pred_H200_qwen3-8b" in out and "pred_H200_this_model" in out
    assert main(["roofline", str(run), "--hardware", "B300"]) == 2
    assert "unknown --hardware B300" in capsys.readouterr().err
