"""The fast path's pieces on CPU: the mask built from a pattern over a preallocated cache equals the
reference mask; the packed GQA attention equals transformers' sdpa; the compiled forward (torch.compile
runs on CPU too) gives the eager logits, compiles once for every query length, and decodes records equal
to the reference core's; a compile that fails falls back to eager and says why.

The compiled tests share one compile of one small model (about a minute on 2 cores); the heavier ones
(batched rows, Qwen3) run under ``-m compile`` (tox -e compile)."""
from __future__ import annotations

import pytest
import torch

from scale_models import build_scale_model
from sbd_bench.core import fastpath
from sbd_bench.core.cache import StaticKVCache
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.fastpath import FastPath, packed_sdpa
from sbd_bench.core.masks import Pattern, attention_mask, static_mask
from sbd_bench.core.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry
from test_static_cache import assert_same_logits, core_forwards

pytestmark = pytest.mark.usefixtures("one_thread")
SOLVERS = "ntp+entropy_bounded:gamma=0.35+fixed_k:k=2"


@pytest.mark.parametrize("past,n_causal,n_block,padded,shadow", [
    (0, 5, 0, False, False), (7, 1, 0, False, False), (7, 1, 4, False, False), (9, 4, 4, True, False),
    (6, 0, 4, True, False), (3, 1, 0, True, False), (5, 0, 4, False, True), (6, 2, 3, True, True)])
def test_static_mask_is_the_reference_mask_over_the_capacity(past, n_causal, n_block, padded, shadow):
    q, capacity, batch = n_causal + n_block * (2 if shadow else 1), 24, 3
    key_pad = None
    if padded:  # left padding of different widths, and a hidden block slot in row 1
        key_pad = torch.zeros(batch, past + q, dtype=torch.bool)
        for b, pad in enumerate([0, 2, min(past, 3)]):
            key_pad[b, :pad] = True
        key_pad[1, -1] = True
    pattern = Pattern(n_causal, n_block, key_pad, shadow)
    reference = pattern.mask(past, torch.float32, "cpu")  # (B or 1, 1, Q, past + Q)
    hidden = None
    if key_pad is not None:
        hidden = torch.ones(batch, capacity, dtype=torch.bool)  # beyond past + Q: never looked at
        hidden[:, : past + q] = key_pad
    for where in (past, torch.tensor(past)):  # the host's count, or the cache's device position
        got = static_mask(where, capacity, pattern.kinds("cpu"), hidden, torch.float32)
        assert torch.equal(got[..., : past + q], reference.expand_as(got[..., : past + q]))
        assert (got[..., past + q :] == torch.finfo(torch.float32).min).all()  # stale columns blocked


def test_the_shadow_query_of_a_slot_sees_every_other_slot_and_itself():
    """1 causal query, a block of 3, its shadow: what each query may see among the 7 new columns."""
    allowed = attention_mask(2, 1, 3, torch.float32, "cpu", shadow=True)[0, 0] == 0  # (7, 9)
    assert allowed[:, :2].all()  # every query sees the cache
    expected = [[1, 0, 0, 0, 0, 0, 0],  # the causal query: itself
                [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0],  # block: causal + block
                [1, 0, 1, 1, 1, 0, 0], [1, 1, 0, 1, 0, 1, 0], [1, 1, 1, 0, 0, 0, 1]]  # shadow i: all but slot i
    assert allowed[:, 2:].int().tolist() == expected


def test_packed_attention_equals_transformers_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    query = torch.randn(2, 6, 5, 8)  # (B, Hq, Q, D): 6 query heads over 2 key/value heads
    key, value = torch.randn(2, 2, 11, 8), torch.randn(2, 2, 11, 8)
    mask = attention_mask(6, 1, 4, torch.float32, "cpu", torch.rand(2, 11) < 0.2)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    got, _ = packed_sdpa(module, query, key, value, mask, scaling=0.3)
    assert got.shape == expected.shape == (2, 5, 6, 8)
    assert (got - expected).abs().max().item() < 1e-5


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path = build_scale_model(tmp_path_factory.mktemp("compiled-llama"), family="llama", max_positions=128)
    return load_model(path, device="cpu", dtype="float32")


def test_compiled_forward_gives_the_eager_logits_with_one_compile(lm):
    from torch._dynamo.utils import counters

    prompt = torch.tensor([lm.tokenizer("12+34=5*6")["input_ids"]])
    eager = core_forwards(Decoder(lm), StaticKVCache(lm.model.config, capacity=64), prompt)
    decoder = Decoder(lm, fast=True, compile=True)
    path = FastPath.for_model(lm)
    before = counters["stats"]["unique_graphs"]
    for _ in range(2):  # the second pass reuses the model's cache (reset) and the compiled code
        assert_same_logits(eager, core_forwards(decoder, path.cache(1, 64), prompt), 1e-4)
    assert counters["stats"]["unique_graphs"] - before == 1  # Q = 1, 5, 8 and 4: one compiled graph
    assert path.status == "static cache, torch.compile (graphs need CUDA)" and path.warmup_s > 0


def test_compiled_decoder_decodes_like_the_reference_core(lm):
    prompt = lm.tokenizer("3*4=")["input_ids"]
    for solver in parse_solver_spec(SOLVERS, solver_registry()):
        ref = Decoder(lm, block_size=4, max_new_tokens=12).generate(prompt, solver)
        got = Decoder(lm, block_size=4, max_new_tokens=12, fast=True, compile=True).generate(prompt, solver)
        assert (got.output_ids, got.nfe, got.revealed_per_forward) == (ref.output_ids, ref.nfe,
                                                                      ref.revealed_per_forward)
    assert FastPath.for_model(lm).use_compile


def test_a_compile_that_fails_falls_back_to_eager_and_says_why(lm, monkeypatch):
    def broken(fn, **kw):
        def raises(*args):
            raise RuntimeError("inductor is unhappy")
        return raises

    monkeypatch.setattr(torch, "compile", broken)
    fastpath._BY_MODEL.pop(lm.model, None)
    prompt = lm.tokenizer("3*4=")["input_ids"]
    solver = parse_solver_spec("fixed_k:k=2", solver_registry())[0]
    ref = Decoder(lm, block_size=4, max_new_tokens=12).generate(prompt, solver)
    got = Decoder(lm, block_size=4, max_new_tokens=12, fast=True, compile=True).generate(prompt, solver)
    assert (got.output_ids, got.nfe) == (ref.output_ids, ref.nfe)
    assert FastPath.for_model(lm).status == ("static cache, eager "
                                             "(torch.compile failed: RuntimeError: inductor is unhappy)")
    fastpath._BY_MODEL.pop(lm.model, None)  # the next test compiles for real


@pytest.mark.compile
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_compiled_batches_decode_like_batch_one(family, tmp_path):
    """Batched rows (left padding, rows that stop apart) through the compiled path: one more compile
    for every batch size above 1, and a longer prompt's larger cache, without recompiling."""
    from torch._dynamo.utils import counters

    model = load_model(build_scale_model(tmp_path / family, family=family, max_positions=512), device="cpu",
                       dtype="float32")
    prompts = [model.tokenizer(p)["input_ids"] for p in ["3*4=", "12+345=", "9-8*7=", "1"]]
    before = counters["stats"]["unique_graphs"]
    for spec in ("ntp", "entropy_bounded:gamma=0.35"):
        solver = parse_solver_spec(spec, solver_registry())[0]
        for batch, budget in [(2, 12), (4, 12), (3, 300)]:
            ref = [Decoder(model, block_size=4, max_new_tokens=budget).generate(p, solver) for p in prompts[:batch]]
            got = Decoder(model, block_size=4, max_new_tokens=budget, fast=True, compile=True).generate_batch(
                prompts[:batch], solver)
            assert [(g.output_ids, g.nfe) for g in got] == [(r.output_ids, r.nfe) for r in ref]
    assert counters["stats"]["unique_graphs"] - before == 1


def test_compile_flag_needs_the_fast_path_and_turns_it_on(lm):
    from sbd_bench.runner.samples import RunConfig, use_fast_path
    from sbd_bench.types import UsageError

    with pytest.raises(UsageError, match="--compile compiles the fast path's forward, which --no-fast turns off"):
        RunConfig(compile=True, fast=False)
    assert use_fast_path(RunConfig(compile=True), lm)  # on CPU: asking to compile asks for the fast path
    assert not use_fast_path(RunConfig(), lm) and not use_fast_path(RunConfig(compile=False), lm)
