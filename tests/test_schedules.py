"""Nemotron-Labs-Diffusion's own schedules (core/schedules.py, solvers/nld_dlm.py, nld_spec.py) equal
no-cache references written from the vendor's semantics, token for token and forward for forward (fp32,
CPU, greedy), on random weights in NLD's published shape and on the shipped sbd-tiny (which accepts
drafts); self-speculation's output is NTP's; rows decode alone, so batch 3 gives batch 1's records."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry
from sbd_bench.types import SamplingError, SolverError
from tiny_models import build_nld_model

PROMPTS = ["hello world, how are you?", "Say hi.", "what is 12 plus 30?"]
TINY_PROMPTS = ["12+34=", "reverse abcdef:", "7*8="]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    nld = load_model(build_nld_model(tmp_path_factory.mktemp("nld") / "NLD-tiny"), device="cpu", dtype="float32")
    tiny = load_model("sbd-tiny", device="cpu", dtype="float32")
    return {"nld": (dataclasses.replace(nld, stop_token_ids=()), PROMPTS),
            "sbd-tiny": (dataclasses.replace(tiny, stop_token_ids=()), TINY_PROMPTS)}


def _logits(lm, committed: list[int], slots: list[int] | None = None) -> torch.Tensor:
    """No cache: one forward over committed (+ slots), committed causal, slots bidirectional over all;
    float32 (Q, V) with the mask's logit -inf (the core's convention)."""
    slots = slots or []
    n, k = len(committed), len(slots)
    allowed = torch.ones(n + k, n + k, dtype=torch.bool)
    allowed[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    allowed[:n, n:] = False
    mask = torch.zeros(n + k, n + k).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([committed + slots]), attention_mask=mask,
                          position_ids=torch.arange(n + k)[None]).logits[0].float()
    logits[:, lm.mask_token_id] = float("-inf")
    return logits


def reference_dlm(lm, prompt: list[int], block: int, tau: float, budget: int) -> tuple[list[int], int]:
    """The vendor's generate (threshold mode) from its description, recomputing everything each forward."""
    mask, forwards = lm.mask_token_id, 1
    out = [int(_logits(lm, prompt)[-1].argmax())]  # the seed: the prompt's next-token argmax
    while len(out) < budget:
        slots = [out[-1]] + [mask] * (min(block, budget - len(out) + 1) - 1)
        while mask in slots[1:]:
            probs = torch.softmax(_logits(lm, prompt + out[:-1], slots)[-len(slots):], dim=-1)
            confidence, tokens = probs.max(-1)
            masked = [i > 0 and slots[i] == mask for i in range(len(slots))]
            best = max((i for i in range(len(slots)) if masked[i]), key=lambda i: (confidence[i], -i))
            for i in range(len(slots)):
                if masked[i] and (confidence[i] >= tau or i == best):
                    slots[i] = int(tokens[i])
            forwards += 1
        out += slots[1:]
        out.append(int(_logits(lm, prompt + out)[-1].argmax()))  # the commit forward: causal, its last logit
        forwards += 1
    return out[:budget], forwards


def reference_linear_spec(lm, prompt: list[int], block: int, budget: int) -> tuple[list[int], int, list[int]]:
    mask, forwards, accepted_per_block = lm.mask_token_id, 1, []
    out = [int(_logits(lm, prompt)[-1].argmax())]
    while len(out) < budget:
        width = min(block, budget - len(out) + 1)
        drafts = []
        if width > 1:
            drafts = _logits(lm, prompt + out[:-1], [out[-1]] + [mask] * (width - 1))[-width + 1:].argmax(-1).tolist()
            forwards += 1
        ntp = _logits(lm, prompt + out + drafts)[len(prompt) + len(out) - 1:].argmax(-1).tolist()
        forwards += 1
        accepted = next((i for i, (d, t) in enumerate(zip(drafts, ntp)) if d != t), len(drafts))
        accepted_per_block.append(accepted)
        out += ntp[: accepted + 1]
    return out[:budget], forwards, accepted_per_block


def _spec(text):
    return parse_solver_spec(text, solver_registry())[-1]


@pytest.mark.parametrize("model", ["nld", "sbd-tiny"])
@pytest.mark.parametrize("block, tau", [(8, 0.9), (4, 0.3), (5, 0.99), (1, 0.9)])
def test_dlm_equals_its_no_cache_reference(models, model, block, tau):
    lm, prompts = models[model]
    solver = _spec(f"nld_dlm:block={block};tau={tau}")
    for text in prompts:
        prompt = lm.tokenizer(text)["input_ids"]
        gen = Decoder(lm, max_new_tokens=19).generate(prompt, solver)
        out, forwards = reference_dlm(lm, prompt, block, tau, 19)
        assert gen.output_ids == out, (model, text)
        assert gen.nfe == forwards == sum(gen.forwards_per_block) and gen.vendor_nfe == forwards - 1
        assert sum(gen.revealed_per_forward) == len(out) == 19 and len(gen.revealed_per_forward) == gen.nfe
        assert gen.prefill_forwards == 0 and gen.stop_reason == "max_new_tokens"
        # per block: its denoising forwards + the commit (the first block also the prompt's forward)
        assert len(gen.forwards_per_block) == -(-(19 - 1) // block)  # each block commits block tokens (its seed the last)


@pytest.mark.parametrize("model", ["nld", "sbd-tiny"])
@pytest.mark.parametrize("block", [32, 4, 1])
def test_linear_spec_equals_its_reference_and_ntp(models, model, block):
    lm, prompts = models[model]
    ntp = _spec("ntp")
    accepted = 0
    for text in prompts:
        prompt = lm.tokenizer(text)["input_ids"]
        gen = Decoder(lm, max_new_tokens=19).generate(prompt, _spec(f"nld_spec:block={block}"))
        out, forwards, per_block = reference_linear_spec(lm, prompt, block, 19)
        assert gen.output_ids == out == Decoder(lm, max_new_tokens=19).generate(prompt, ntp).output_ids
        assert gen.nfe == gen.vendor_nfe == forwards == sum(gen.forwards_per_block)
        assert gen.accepted_per_block == per_block and sum(gen.revealed_per_forward) == 19
        accepted += sum(per_block)
    if model == "sbd-tiny" and block > 1:
        assert accepted > 0  # the acceptance path ran


def test_stops_end_both_schedules_where_the_core_stops(models):
    lm, _ = models["sbd-tiny"]
    lm = dataclasses.replace(lm, stop_token_ids=load_model("sbd-tiny", device="cpu").stop_token_ids)
    prompt = lm.tokenizer("12+34=")["input_ids"]
    ntp = Decoder(lm, max_new_tokens=64).generate(prompt, _spec("ntp"))
    assert ntp.stop_reason == "stop_token"
    spec = Decoder(lm, max_new_tokens=64).generate(prompt, _spec("nld_spec"))
    assert (spec.output_ids, spec.stop_reason) == (ntp.output_ids, "stop_token")
    dlm = Decoder(lm, max_new_tokens=64).generate(prompt, _spec("nld_dlm"))
    assert dlm.stop_reason == "stop_token" and dlm.output_ids[-1] in lm.stop_token_ids
    assert sum(dlm.revealed_per_forward) == len(dlm.output_ids)


def test_rows_decode_alone(models):
    lm, prompts = models["nld"]
    ids = [lm.tokenizer(p)["input_ids"] for p in prompts]
    for spec in ("nld_dlm", "nld_spec:block=8"):
        decoder = Decoder(lm, max_new_tokens=12)
        one = [decoder.generate(p, _spec(spec)) for p in ids]
        three = decoder.generate_batch(ids, _spec(spec))
        assert [(g.output_ids, g.nfe, g.vendor_nfe) for g in three] == [(g.output_ids, g.nfe, g.vendor_nfe) for g in one]


@pytest.mark.parametrize("spec, error, message", [
    ("nld_dlm:block=0", SolverError, "block must be >= 1"),
    ("nld_dlm:tau=0", SolverError, "tau must be in (0, 1]"),
    ("nld_spec:block=0", SolverError, "block must be >= 1"),
    ("nld_spec:verify=on", SolverError, "outside the core's block loop"),
    ("nld_dlm:temperature=0.7", SamplingError, "run greedily only"),
])
def test_bad_specs(spec, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_solver_spec(spec, solver_registry())


def test_not_in_all():
    names = {s.name for s in parse_solver_spec("all", solver_registry())}
    assert not names & {"nld_dlm", "nld_spec"}


def test_run_records_both_counts(tmp_path):
    from sbd_bench.cli import main

    out = tmp_path / "run"
    assert main(["run", "--solver", "nld_dlm+nld_spec", "--task", "arith", "--limit", "2", "--threads", "1",
                 "--no-cost-curve", "--no-report", "--trace", "0", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    by = {r["solver"]: r for r in records}
    assert "vendor_nfe" not in by["ntp"]
    assert by["nld_dlm"]["vendor_nfe"] == by["nld_dlm"]["nfe"] - 1 and by["nld_spec"]["vendor_nfe"] == by["nld_spec"]["nfe"]
    rows = {r["config"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    row = rows["nld_dlm:block=8,tau=0.9"]
    assert row["vendor_tokens_per_forward"] == pytest.approx(sum(r["tokens"] for r in records if r["solver"] == "nld_dlm")
                                                             / sum(r["vendor_nfe"] for r in records if r["solver"] == "nld_dlm"))
    assert rows["ntp"]["vendor_nfe"] is None
