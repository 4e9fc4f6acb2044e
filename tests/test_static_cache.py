"""The preallocated cache gives the reference cache's logits (float32, max abs diff <= 1e-5) on tiny
Llama and Qwen3 models with grouped-query attention, through prefill, NTP steps, block steps with
rollback, and a reset; and the decoder's fast path (static cache, eager on CPU) decodes the same."""
from __future__ import annotations

import pytest
import torch

from scale_models import build_scale_model as build_tiny_model
from sbd_bench.core.cache import CacheFullError, KVCache, StaticKVCache
from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def lm(request, tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp(request.param), family=request.param, max_positions=128)
    return load_model(path, device="cpu", dtype="float32")


def core_forwards(decoder: Decoder, cache, prompt: torch.Tensor) -> list[torch.Tensor]:
    """The core's forwards in the order generate uses them, every query shape it uses (prefill, 1, 1 + k,
    k, 2k) with rollbacks; returns every logits tensor (tests/test_fastpath.py runs it compiled)."""
    k, out = 4, []
    decoder.prefill(prompt[:, :-1], cache)
    token, position = prompt[:, -1:], prompt.shape[1] - 1
    for _ in range(3):  # NTP steps
        logits = decoder.ntp_step(token, position, cache)
        out.append(logits)
        token, position = logits.argmax(-1), position + 1
    block = torch.full((1, k), decoder.lm.mask_token_id)
    pending, start = token, position + 1
    for step in range(3):  # a first forward with pending tokens, then block-only forwards
        logits = decoder.block_step(pending if step == 0 else block[:, :0], block, start, cache)
        out.append(logits)
        block[0, step] = int(logits[0, step].argmax())
    out.append(decoder.block_step(block, torch.full((1, k), decoder.lm.mask_token_id), start + k, cache))
    assert cache.length == prompt.shape[1] + 3 + k  # prompt - 1 + 1 carried + 3 NTP + the pending block
    return out


def assert_same_logits(reference: list[torch.Tensor], got: list[torch.Tensor], tolerance: float) -> None:
    for ref, fast in zip(reference, got):
        assert ref.shape == fast.shape
        finite = torch.isfinite(ref)  # the mask token's logit is -inf in both
        assert torch.equal(finite, torch.isfinite(fast))
        assert (ref[finite] - fast[finite]).abs().max().item() <= tolerance


def test_static_cache_matches_reference_logits(lm):
    prompt = torch.tensor([lm.tokenizer("12+34=5*6")["input_ids"]])
    reference = core_forwards(Decoder(lm), KVCache(lm.model.config), prompt)
    static = StaticKVCache(lm.model.config, capacity=64)
    for _ in range(2):  # the second pass runs on the reset cache, over stale columns
        assert_same_logits(reference, core_forwards(Decoder(lm), static, prompt), 1e-5)
        static.reset()
        assert static.length == 0


def test_rollback_moves_the_position_only(lm):
    cache = StaticKVCache(lm.model.config, capacity=32)
    decoder = Decoder(lm)
    decoder.prefill(torch.tensor([[1, 5, 6, 7]]), cache)
    keys = cache.hf.layers[0].keys
    assert cache.length == 4 and keys.shape[2] == 32
    cache.rollback(2)
    assert cache.length == 2 and cache.hf.layers[0].keys is keys  # same buffer, position moved


def test_full_static_cache_is_a_clear_error(lm):
    cache = StaticKVCache(lm.model.config, capacity=4)
    with pytest.raises(CacheFullError, match="capacity 4"):
        Decoder(lm).prefill(torch.tensor([[1, 5, 6, 7, 8]]), cache)


def test_fast_decoder_decodes_like_the_reference(lm):
    prompt = lm.tokenizer("3*4=")["input_ids"]
    for solver in parse_solver_spec("ntp+entropy_bounded:gamma=0.35+fixed_k", solver_registry()):
        ref = Decoder(lm, block_size=4, max_new_tokens=12).generate(prompt, solver)
        fast = Decoder(lm, block_size=4, max_new_tokens=12, fast=True)
        for _ in range(2):  # the second decode reuses the model's preallocated cache
            got = fast.generate(prompt, solver)
            assert (got.output_ids, got.nfe, got.revealed_per_forward) == (ref.output_ids, ref.nfe,
                                                                          ref.revealed_per_forward)


def test_fast_path_reuses_one_cache_per_batch_size(lm):
    from sbd_bench.core.fastpath import CAPACITY_MIN, FastPath

    path = FastPath.for_model(lm)
    assert FastPath.for_model(lm) is path  # one per model: caches outlive each Decoder
    first = path.cache(2, 10)
    assert first.capacity == CAPACITY_MIN and path.cache(2, 100) is first and first.length == 0
    bigger = path.cache(2, CAPACITY_MIN + 1)  # powers of two: few reallocations, few recompiles
    assert bigger is not first and bigger.capacity == 2 * CAPACITY_MIN
    assert path.cache(2, 4 * CAPACITY_MIN).capacity == 4 * CAPACITY_MIN
    assert path.cache(3, 10) is not bigger
    FastPath.release(lm)  # after an out-of-memory: the buffers go, the next batch allocates its own
    assert path.cache(2, 10) is not bigger


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=pytest.mark.compile), False],
                         ids=["compiled", "eager"])
def test_gpu_check_script_runs_tiny_on_cpu(tmp_path, compiled):
    """The H200 script cannot run here; --tiny runs the same code on a tiny CPU model to the end: every
    section, the targets with a verdict each. Compiled (the graphs aside) under tox -e compile: a cold
    torch.compile cache costs CI minutes, and tests/test_fastpath.py compiles the fast path once already."""
    import getpass
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "check.json"
    scratch = tmp_path / "tmp"  # the script's temp dir: its run folders (gpu-check-records-*) must not stay
    scratch.mkdir()
    # torch.compile's cache stays where it was (its default lives in the temp dir): a cold one costs minutes
    inductor_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    done = subprocess.run([sys.executable, str(root / "scripts" / "gpu_check.py"), "--tiny", "--tokens", "8",
                           "--out", str(out), *([] if compiled else ["--no-compile"])], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch),
                               "TORCHINDUCTOR_CACHE_DIR": inductor_cache})
    assert done.returncode == 0, done.stderr[-2000:]
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("gpu-check-records-")]
    result = json.loads(out.read_text())
    sections = ("model", "bandwidth", "warmup", "forward_batch_1", "ntp_batch_1", "fixed_k_batch_1", "cuda_rng",
                "records", "gpu_tests", "batch_sweep", "training", "targets")
    assert not result["skipped"] and all("error" not in result[s] for s in sections if isinstance(result[s], dict))
    assert result["ntp_batch_1"]["leading_tokens_equal"]["fast_vs_eager"] == 8  # float32: the same tokens
    assert result["warmup"]["status"] == ("static cache, torch.compile (graphs need CUDA)" if compiled else
                                          "static cache, eager (graphs need CUDA)")
    assert result["warmup"]["compile"] is compiled
    assert result["records"]["identical"] and result["records"]["samples"] > 0
    assert [row["batch"] for row in result["batch_sweep"]] == [1, 2]
    assert {t["verdict"] for t in result["targets"].values()} <= {"n/a", "PASS"}
    assert result["targets"]["records_identical"]["verdict"] == "PASS"
    assert "error" not in result["training"]["plain"], result["training"]["plain"]["error"]
    assert result["training"]["plain"]["steps_timed"] == 3 and result["training"]["plain"]["world_size"] == 2
    assert "PASS     records_identical" in done.stdout


def test_sliding_window_models_keep_the_reference_cache():
    from transformers import LlamaConfig, MistralConfig

    from sbd_bench.core.fastpath import _plain_static_layers

    assert _plain_static_layers(LlamaConfig(num_hidden_layers=2))
    assert not _plain_static_layers(MistralConfig(num_hidden_layers=2, sliding_window=64))  # windowed layers


def test_run_with_fast_records_the_same_samples_and_the_path(lm, tmp_path):
    import json

    from sbd_bench.analysis.records import read_records
    from sbd_bench.runner.harness import RunConfig, run

    task = tmp_path / "t.jsonl"
    task.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(["1+2=", "34*5="])))
    runs = {}
    for fast in (False, True):
        out = tmp_path / f"fast-{fast}"
        run(RunConfig(model=lm.path, tasks=[str(task)], solvers="entropy_bounded", out=out, block_size=4,
                      max_new_tokens=8, device="cpu", dtype="float32", fast=fast, cost_curve=False, report=False))
        runs[fast] = [(r["config"], r["output_ids"], r["nfe"]) for r in read_records(out / "samples.jsonl")]
        provenance = json.loads((out / "summary.json").read_text())["provenance"]
        assert provenance.get("fast_path") == ("static cache, eager (graphs need CUDA)" if fast else None)
        assert provenance.get("fast_path_warmup_s") == (0.0 if fast else None)  # nothing compiled or captured
    assert runs[True] == runs[False]


def test_read_only_block_forwards_equal_written_and_cropped_ones(lm, monkeypatch):
    """A block forward that carries nothing reads the reference cache without writing to it
    (KVCache.read_only): its logits and the cache after it are bit for bit those of a forward that
    writes and is cropped, and the layers' tensors are not replaced."""
    prompt = torch.tensor([lm.tokenizer("12+34=5*6")["input_ids"]])
    read_only = KVCache(lm.model.config)
    assert not read_only.read_only() and not read_only.hf.read_only  # an empty cache has nothing to read
    got = core_forwards(Decoder(lm), read_only, prompt)
    monkeypatch.setattr(KVCache, "read_only", lambda self: False)  # every forward writes, then is cropped
    written = KVCache(lm.model.config)
    reference = core_forwards(Decoder(lm), written, prompt)
    assert all(torch.equal(a, b) for a, b in zip(reference, got))
    for a, b in zip(written.hf.layers, read_only.hf.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    monkeypatch.undo()
    keys = read_only.hf.layers[0].keys
    mask = torch.full((1, 4), lm.mask_token_id)
    Decoder(lm).block_step(mask[:, :0], mask, read_only.length, read_only)
    assert read_only.hf.layers[0].keys is keys and not read_only.hf.read_only  # read, not written; switch off
