"""One host synchronisation per forward: the decode loops read values computed on the device (from
the logits) once per forward, at batch 1 and batched, reference and fast path. On a GPU every such
read waits for the device; here a TorchFunctionMode follows the values that come from the model's
logits and counts the reads of them (host-side bookkeeping tensors are not counted)."""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.registry import parse_solver_spec, solver_registry

pytestmark = pytest.mark.usefixtures("one_thread")
READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
         torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.nonzero, torch.nonzero,
         torch.Tensor.masked_select, torch.masked_select}


class DeviceReads(TorchFunctionMode):
    """Counts host reads of tensors computed from a tensor marked ``_from_device`` (the logits)."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not any(getattr(t, "_from_device", False) for t in inputs):
            return out
        if func in READS:
            self.reads += 1
            return out
        if func is torch.Tensor.__setitem__ or getattr(func, "__name__", "").endswith("_"):
            args[0]._from_device = True  # written in place with values from the device
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                t._from_device = True
        return out


@pytest.fixture()
def counted(monkeypatch):
    forward = Decoder.forward

    def marked(self, *args, **kwargs):
        logits = forward(self, *args, **kwargs)
        logits._from_device = True
        return logits

    monkeypatch.setattr(Decoder, "forward", marked)
    return DeviceReads


@pytest.mark.parametrize("fast", [False, True])
def test_one_device_read_per_forward(tiny_models, counted, fast):
    lm = load_model(tiny_models["llama"], device="cpu", dtype="float32")
    prompts = [lm.tokenizer(p)["input_ids"] for p in ["3*4=", "12+345=", "9-8*7="]]
    spec = "ntp+entropy_bounded:gamma=0.35+fixed_k+random_order+fixed_k:k=4;verify=on+random_order:verify=on"
    sampled = "+ntp:temperature=0.7+entropy_bounded:temperature=0.7;verify=on,off+random_order:verify=on;temperature=1"
    # solvers that read the previous forward, revoke with the shadow (wide drafts, so that they do), a schedule
    sampled += "+klass:verify=on,off+wino:tau_in=0;tau_out=1;verify=on,off+dilated+wino:tau_in=0;temperature=0.7;verify=on"
    for solver in parse_solver_spec(spec + sampled, solver_registry()):
        decoder = Decoder(lm, block_size=4, max_new_tokens=10, fast=fast, compile=False)
        with counted() as mode:
            decoder.generate(prompts[0], solver)
        assert mode.reads == decoder.nfe, solver.label
        before = decoder.nfe
        with counted() as mode:
            decoder.generate_batch(prompts, solver)
        assert mode.reads == decoder.nfe - before, solver.label  # batch forwards, each serving every row


def overflow_past(model, position: int) -> None:
    """Make ``model``'s logits +inf at every query position >= ``position``: what bf16 overflow on a
    long context does, after a run's first prompt has passed the check before decoding."""
    seen = {}

    def positions(module, args, kwargs):
        seen["ids"] = kwargs["position_ids"]

    def logits(module, args, out):  # out (B, kept, V): the last `kept` queries
        return out.masked_fill(seen["ids"][:, -out.shape[1]:, None] >= position, float("inf"))

    model.model.register_forward_pre_hook(positions, with_kwargs=True)
    model.lm_head.register_forward_hook(logits)


def test_logits_that_turn_non_finite_mid_sample_stop_it_at_that_forward(tiny_models, counted):
    """No read of its own: the flag rides on the forward's one read (still one per forward, counted),
    at batch 1 and batched, for NTP, block, verified and sampled decoding."""
    from sbd_bench.core.decoding import BrokenModelError

    lm = load_model(tiny_models["llama"], device="cpu", dtype="float32")
    overflow_past(lm.model, 13)
    prompt = lm.tokenizer("3*4=")["input_ids"]  # positions 0-4; 4 new tokens (a block) query up to 8 at most
    spec = "ntp+entropy_bounded:gamma=0.35+fixed_k:k=4;verify=on+ntp:temperature=0.7+entropy_bounded:temperature=0.7"
    for solver in parse_solver_spec(spec, solver_registry()):
        decoder = Decoder(lm, block_size=4, max_new_tokens=20, seed=1)  # seed 1: no sampled EOS before position 13
        for prompts in ([prompt], [prompt, prompt[:-1]]):
            before = decoder.nfe
            with counted() as mode, pytest.raises(BrokenModelError, match=r"NaN or infinite logits \(forward \d+ of "):
                decoder.generate_batch(prompts, solver)
            assert mode.reads == decoder.nfe - before, solver.label
            outputs = Decoder(lm, block_size=4, max_new_tokens=4, seed=1).generate_batch(prompts, solver)  # short of 13
            assert len(outputs[0].output_ids) == 4, solver.label


@pytest.mark.parametrize("batch", ["1", "2"])
def test_a_run_stops_at_a_model_that_breaks_mid_run_keeping_its_records(tiny_models, tmp_path, capsys, monkeypatch,
                                                                        batch):
    import json

    from sbd_bench.cli import main
    from sbd_bench.runner import harness

    def loaded(*args, **kwargs):
        lm = load_model(*args, **kwargs)
        overflow_past(lm.model, 40)
        return lm

    monkeypatch.setattr(harness, "load_model", loaded)
    task = tmp_path / "t.jsonl"  # the first prompt passes the check; the third decodes past position 40
    task.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(["1+1=", "2*3=", "9" * 30])))
    out = tmp_path / "run"
    rc = main(["run", "--model", str(tiny_models["llama"]), "--task", str(task), "--solver", "ntp,entropy_bounded",
               "--max-new-tokens", "16", "--block-size", "4", "--device", "cpu", "--threads", "1", "--warmup", "0",
               "--no-cost-curve", "--batch-size", batch, "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(err) == 1 and "computes NaN or infinite logits (forward" in err[0], err
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["id"], r["config"].split(":")[0]) for r in records] == [("0", "ntp"), ("0", "entropy_bounded"),
                                                                      ("1", "ntp"), ("1", "entropy_bounded")]
    assert not any(r["error"] for r in records)
