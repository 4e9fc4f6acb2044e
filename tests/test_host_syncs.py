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
        assert mode.reads == decoder.counters.nfe, solver.label
        with counted() as mode:
            decoder.generate_batch(prompts, solver)
        assert mode.reads == decoder.counters.nfe, solver.label  # batch forwards, each serving every row
