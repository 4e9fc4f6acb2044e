"""The cache is exact: every cached forward equals a no-cache forward of the whole sequence under
the SBD inference mask (SBD.md §3), and the ntp solver reproduces generate(do_sample=False)."""
import dataclasses

import pytest
import torch

from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.registry import build_solver, solver_registry
from tiny_models import no_cache_block_logits

PROMPT = "12+34=46; 7*8="


class RecordingDecoder(Decoder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def block_step(self, pending, block, start, *args):
        logits = super().block_step(pending, block, start, *args)
        self.calls.append((start, pending.shape[1], block.clone(), logits.clone()))
        return logits

    def ntp_step(self, token, position, *args):
        logits = super().ntp_step(token, position, *args)
        self.calls.append((position, logits.clone()))
        return logits


def _loaded(path):
    lm = load_model(path, device="cpu", dtype="float32")
    return dataclasses.replace(lm, stop_token_ids=())  # a random model: never stop early


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("solver_spec", [("fixed_k", {"k": 2}), ("entropy_bounded", {"gamma": 0.0})])
def test_every_cached_block_forward_equals_a_full_forward(tiny_models, family, solver_spec):
    lm = _loaded(tiny_models[family])
    solver = build_solver(solver_registry()[solver_spec[0]], solver_spec[1])
    decoder = RecordingDecoder(lm, block_size=4, max_new_tokens=16)
    prompt = lm.tokenizer(PROMPT)["input_ids"]
    gen = decoder.generate(prompt, solver)
    sequence = prompt + gen.output_ids
    kinds = set()
    for start, n_pending, block, logits in decoder.calls:
        reference = no_cache_block_logits(lm.model, sequence[:start], block)
        reference[..., lm.mask_token_id] = float("-inf")
        assert torch.allclose(logits, reference, atol=1e-4, rtol=0), (start, (logits - reference).abs().max())
        kinds.add("first block after prompt" if start == len(prompt) and n_pending else
                  "first forward" if n_pending else "later forward")
    assert kinds == {"first block after prompt", "first forward", "later forward"}
    assert gen.nfe == len(decoder.calls) == sum(gen.forwards_per_block)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cached_ntp_logits_equal_a_full_causal_forward(tiny_models, family):
    lm = _loaded(tiny_models[family])
    decoder = RecordingDecoder(lm, block_size=4, max_new_tokens=12)
    prompt = lm.tokenizer(PROMPT)["input_ids"]
    gen = decoder.generate(prompt, solver_registry()["ntp"]())
    ids = torch.tensor([prompt + gen.output_ids])
    with torch.no_grad():
        full = lm.model(input_ids=ids).logits[0]
    for position, logits in decoder.calls:
        expected = full[position].clone()
        expected[lm.mask_token_id] = float("-inf")
        assert torch.allclose(logits[0], expected, atol=1e-4, rtol=0)
    assert gen.nfe == len(gen.output_ids) == 12 and gen.prefill_forwards == 1


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_ntp_solver_matches_generate(tiny_models, family):
    lm = _loaded(tiny_models[family])
    prompt = lm.tokenizer(PROMPT)["input_ids"]
    gen = Decoder(lm, block_size=4, max_new_tokens=40).generate(prompt, solver_registry()["ntp"]())
    with torch.no_grad():
        ref = lm.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=40,
                                eos_token_id=None, pad_token_id=lm.tokenizer.pad_token_id)
    assert gen.output_ids == ref[0, len(prompt):].tolist()


def test_mask_token_is_never_emitted(tiny_models):
    lm = _loaded(tiny_models["llama"])
    def favour_mask(module, inputs, output):  # make the mask token the model's top choice everywhere
        output[..., lm.mask_token_id] = 1e4
        return output

    lm.model.lm_head.register_forward_hook(favour_mask)
    prompt = lm.tokenizer(PROMPT)["input_ids"]
    for name in ("ntp", "entropy_bounded", "fixed_k"):
        gen = Decoder(lm, block_size=4, max_new_tokens=12).generate(prompt, solver_registry()[name]())
        assert lm.mask_token_id not in gen.output_ids and len(gen.output_ids) == 12
