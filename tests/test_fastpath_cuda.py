"""GPU-only checks of the fast path (skipped without CUDA; scripts/gpu_check.py runs them on the GPU
machine): CUDA random numbers still work after the fast path captured graphs, also after a capture
that failed (issue 11: torch 2.11 raised "Offset increment outside graph capture encountered
unexpectedly"), and the compiled graphs decode exactly what the eager path decodes, in float32."""
from __future__ import annotations

import pytest
import torch

from scale_models import build_scale_model
from sbd_bench.core import fastpath
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.fastpath import FastPath, recover_from_failed_capture
from sbd_bench.core.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path = build_scale_model(tmp_path_factory.mktemp("cuda-llama"), family="llama", max_positions=128)
    return load_model(path, device="cuda", dtype="float32")


def _draws(seed: int) -> list[int]:
    torch.cuda.manual_seed(seed)
    return torch.randint(0, 1000, (16,), device="cuda").tolist()


def _decodes(lm, compile, spec="ntp+entropy_bounded:gamma=0.35+fixed_k:k=4"):
    prompt = lm.tokenizer("12+34=")["input_ids"]
    out = []
    for solver in parse_solver_spec(spec, solver_registry()):
        gen = Decoder(lm, block_size=4, max_new_tokens=16, fast=True, compile=compile).generate(prompt, solver)
        out.append((gen.output_ids, gen.nfe, gen.revealed_per_forward))
    return out


@pytest.mark.parametrize("compile", [False, True])
def test_cuda_random_numbers_work_after_the_fast_path_captured(lm, compile):
    before = _draws(3)
    _decodes(lm, compile)
    assert FastPath.for_model(lm).status == ("cuda graphs + torch.compile" if compile else
                                             "cuda graphs (torch.compile off)")
    assert _draws(3) == before  # no error, and the generator's stream is untouched


def test_cuda_random_numbers_work_after_a_failed_capture(lm, monkeypatch):
    """A step that synchronises while captured makes every capture fail: the fast path falls back to
    eager, says why, decodes the same, and the device's random numbers still work."""
    reference = [(g.output_ids, g.nfe, g.revealed_per_forward) for g in
                 (Decoder(lm, block_size=4, max_new_tokens=16).generate(lm.tokenizer("12+34=")["input_ids"], s)
                  for s in parse_solver_spec("ntp+entropy_bounded:gamma=0.35+fixed_k:k=4", solver_registry()))]
    real_step = fastpath._step

    def syncing_step(*args):
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # not allowed during a capture: the capture is invalidated
        return real_step(*args)

    monkeypatch.setattr(fastpath, "_step", syncing_step)
    fastpath._BY_MODEL.pop(lm.model, None)  # a fresh path: no graphs captured before the patch
    before = _draws(5)
    assert _decodes(lm, False) == reference
    assert "CUDA graph capture failed" in FastPath.for_model(lm).status
    assert _draws(5) == before


def test_recovery_after_a_capture_that_failed_outside_the_fast_path():
    graph = torch.cuda.CUDAGraph()
    x = torch.ones(4, device="cuda")
    with pytest.raises(Exception):
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            (x * 2).sum().item()  # a host read inside a capture
    recover_from_failed_capture(torch.device("cuda"))
    assert _draws(9) == _draws(9)


def test_compiled_graphs_decode_like_the_eager_core(lm):
    prompt = lm.tokenizer("7*8=")["input_ids"]
    for solver in parse_solver_spec("ntp+entropy_bounded:gamma=0.35+fixed_k:k=4", solver_registry()):
        ref = Decoder(lm, block_size=4, max_new_tokens=16).generate(prompt, solver)
        cpu = Decoder(load_model(lm.path, device="cpu", dtype="float32"), block_size=4,
                      max_new_tokens=16).generate(prompt, solver)
        got = Decoder(lm, block_size=4, max_new_tokens=16, fast=True, compile=True).generate(prompt, solver)
        assert (got.output_ids, got.nfe) == (ref.output_ids, ref.nfe) == (cpu.output_ids, cpu.nfe)
    assert FastPath.for_model(lm).warmup_s > 0 and FastPath.for_model(lm).captures >= 3
