"""Batched decoding equals batch 1: greedy outputs, NFE and per-forward reveals, for every built-in
solver, with prompts of different lengths and rows that stop at different times and for different
reasons (stop token, stop string, budget, end of context)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from scale_models import build_tiny_model
from sbd_bench.batching import BatchDecoder
from sbd_bench.decoding import Decoder
from sbd_bench.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry

PROMPTS = ["1+2=", "12*3=", "abc", "9", "44+55-3=", "hij*hij*hij*hij*hij*hij*hij*hij*hij=", "c"]
FIELDS = ("output_ids", "output_text", "stop_reason", "nfe", "prefill_forwards", "revealed_per_forward",
          "forwards_per_block")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path_factory.mktemp("llama"), max_positions=48)
    model = load_model(path, device="cpu", dtype="float32")
    dash = model.tokenizer.convert_tokens_to_ids("-")
    # '-' is a stop token too: this random model emits it at varied points, so rows stop at different times
    return dataclasses.replace(model, stop_token_ids=(*model.stop_token_ids, dash))


def _solvers():
    extra = "+fixed_k:k=3+entropy_bounded:gamma=0,1.5+random_order:n=1,3+left_to_right:n=2"
    return parse_solver_spec("all" + extra, solver_registry())


def _records(gens):
    return [{f: getattr(g, f) for f in FIELDS} for g in gens]


@pytest.mark.parametrize("stop_strings", [(), ("dd",)], ids=["stop-token", "stop-string"])
def test_batch_equals_batch_one_for_every_solver(lm, stop_strings):
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]
    reasons = set()
    for solver in _solvers():
        decoder = Decoder(lm, block_size=4, max_new_tokens=14, stop_strings=stop_strings, seed=3)
        reference = _records(decoder.generate(p, solver) for p in prompts)
        reasons |= {r["stop_reason"] for r in reference}
        for batch_size in (3, len(prompts)):
            batched = []
            for i in range(0, len(prompts), batch_size):
                batched += _records(BatchDecoder(decoder).generate(prompts[i : i + batch_size], solver))
            assert batched == reference, f"{solver.label} at batch {batch_size}"
    # the cases the comparison must cover did occur
    assert {"max_new_tokens", "context"} <= reasons
    assert ("stop_string" if stop_strings else "stop_token") in reasons


def test_rows_stop_at_different_times(lm):
    prompts = [lm.tokenizer(p)["input_ids"] for p in PROMPTS]
    solver = parse_solver_spec("entropy_bounded", solver_registry())[0]
    gens = BatchDecoder(Decoder(lm, block_size=4, max_new_tokens=14)).generate(prompts, solver)
    assert len({g.tokens for g in gens}) >= 3
    assert len({g.nfe for g in gens}) >= 3
