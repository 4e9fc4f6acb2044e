"""Training features in one process: activation checkpointing (same loss and gradients, fewer bytes
kept for the backward pass), the --plan arithmetic against a real model, chat data (loss on assistant
tokens only), the tokenised-data cache, over-long lines, LoRA (merged at export)."""
from __future__ import annotations

import json

import pytest
import torch

from sbd_bench.training.config import TrainConfig, TrainError
from sbd_bench.training.data import chat_pairs, training_groups
from sbd_bench.training.model import build_model
from sbd_bench.training.objective import IGNORE, make_batch
from sbd_bench.training.parallel import Parallel, wrap
from sbd_bench.training.plan import plan
from sbd_bench.training.tokenizer import char_tokenizer
from sbd_bench.training.train import draw_step, train, train_step

TINY = dict(data="reverse", steps=20, train_examples=64, hidden_size=32, layers=2, heads=4, intermediate_size=64,
            max_positions=96, threads=1, log_every=1, lr=3e-3, warmup=5, batch_size=4)
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")
CPU = Parallel("single", 0, 0, 1, torch.device("cpu"))


def saved_bytes(model, batch, cfg) -> int:
    """Bytes the autograd graph keeps for the backward pass (parameters aside)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    from sbd_bench.training.objective import losses

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = losses(model, batch.rows(0, cfg.batch_size), "cpu")[0]
    loss.backward()
    return sum(v for k, v in seen.items() if k not in params)


@pytest.mark.parametrize("objective", ["sbd", "ntp"])
def test_activation_checkpointing_same_loss_and_grads_fewer_saved_bytes(objective):
    results = {}
    for ac in (False, True):
        cfg = TrainConfig(out="", activation_checkpointing=ac, objective=objective, **{**TINY, "layers": 4})
        model, tok = build_model(cfg, None)
        model = wrap(model.train(), cfg, CPU)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        groups = training_groups(cfg.data, tok, cfg.train_examples, cfg.seed)
        steps = [train_step(model, optimizer, draw_step(groups, cfg, s, tok.pad_token_id, tok.mask_token_id,
                                                        with_mask=False), cfg, CPU, s) for s in range(3)]
        batch = draw_step(groups, cfg, 3, tok.pad_token_id, tok.mask_token_id, with_mask=False)
        results[ac] = ([(s["ntp"] + s["matp"], s["grad_norm"]) for s in steps], saved_bytes(model, batch, cfg))
    (plain, plain_bytes), (checkpointed, ac_bytes) = results[False], results[True]
    for (loss_a, norm_a), (loss_b, norm_b) in zip(plain, checkpointed):
        assert abs(loss_a - loss_b) <= 1e-6 * abs(loss_a) and abs(norm_a - norm_b) <= 1e-6 * abs(norm_a)
    assert ac_bytes < 0.75 * plain_bytes, (ac_bytes, plain_bytes)


def test_plan_counts_the_real_models_parameters_and_adamw_state():
    cfg = TrainConfig(out="", **TINY)
    model, _ = build_model(cfg, None)
    predicted = plan(model, 1, "single", 4, 48, cuda=False)
    params = list(model.parameters())
    assert predicted.parameters == sum(p.numel() for p in params)
    assert predicted.weights * 1e9 == sum(p.numel() * p.element_size() for p in params)
    assert predicted.gradients == predicted.weights
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values())
    assert abs(predicted.optimizer * 1e9 - state) < 1  # exp_avg, exp_avg_sq and the step count of each tensor


def test_plan_fsdp_shards_and_lora():
    cfg = TrainConfig(out="", **TINY)
    model, _ = build_model(cfg, None)
    one, two = plan(model, 1, "single", 4, 48, cuda=False), plan(model, 2, "fsdp", 4, 48, cuda=False)
    expected = sum(-(-p.shape[0] // 2) * (p.numel() // p.shape[0]) for p in model.parameters())  # rows split, padded
    assert two.optimizer * 1e9 == 8 * expected + 4 * len(list(model.parameters()))
    assert two.gradients < one.gradients and two.optimizer < one.optimizer / 1.9
    lora = build_model(TrainConfig(out="", lora_rank=2, **TINY), None)[0]
    trained = [n for n, p in lora.named_parameters() if p.requires_grad]
    small = plan(lora, 1, "single", 4, 48, cuda=False, trained=trained)
    assert small.trained == sum(p.numel() for p in lora.parameters() if p.requires_grad) < one.parameters / 5


def test_plan_activations_match_the_bytes_the_backward_keeps():
    """The per-layer activation formula, against what autograd saves for a real Llama in fp32."""
    for ac in (False, True):
        cfg = TrainConfig(out="", activation_checkpointing=ac, **{**TINY, "layers": 3, "hidden_size": 64,
                                                                  "intermediate_size": 160})
        model, tok = build_model(cfg, None)
        model = wrap(model.train(), cfg, CPU)
        groups = training_groups(cfg.data, tok, cfg.train_examples, cfg.seed)
        batch = draw_step(groups, cfg, 0, tok.pad_token_id, tok.mask_token_id, with_mask=False)
        part = batch.rows(0, cfg.batch_size)
        L = part.ids.shape[1]
        measured = saved_bytes(model, batch, cfg)
        shallower = TrainConfig(out="", activation_checkpointing=ac, **{**TINY, "layers": 1, "hidden_size": 64,
                                                                        "intermediate_size": 160})
        small = wrap(build_model(shallower, None)[0].train(), shallower, CPU)
        per_layer = (measured - saved_bytes(small, batch, shallower)) / 2
        p3, p1 = (plan(m, 1, "single", cfg.batch_size, L, checkpointing=ac, cuda=False) for m in (model, small))
        assert (p3.activations - p1.activations) * 1e9 / 2 == pytest.approx(per_layer, rel=0.02), ac


def chat_tokenizer():
    tok = char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_chat_lines_put_the_loss_on_assistant_tokens_only(tmp_path):
    tok = chat_tokenizer()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"}]
    pairs = chat_pairs(messages, tok, "x:1")
    assert len(pairs) == 2  # one per assistant turn
    for (prompt, completion), answer in zip(pairs, ("hello", "4")):
        assert tok.decode(completion, skip_special_tokens=False) == answer + "\n<eos>"
        assert tok.decode(prompt, skip_special_tokens=False).endswith("assistant: ")
        batch = make_batch([(prompt, completion)], [0], 4, "sbd", torch.Generator().manual_seed(0),
                           tok.pad_token_id, tok.mask_token_id)
        ntp_targets = batch.ntp_labels[batch.ntp_labels != IGNORE].tolist()
        assert ntp_targets == completion  # every target is an assistant token (and EOS)
        assert set(batch.matp_labels[batch.matp_labels != IGNORE].tolist()) <= set(completion) | {tok.pad_token_id}
        masked = (batch.noisy == tok.mask_token_id).nonzero()[:, 1]
        assert masked.numel() == 0 or masked.min() >= len(prompt)  # no masked slot in the conversation so far
    # the second turn's prompt holds the first answer: its tokens are context there, not targets
    assert tok.decode(pairs[1][0], skip_special_tokens=False).count("hello") == 1
    with pytest.raises(TrainError, match="no assistant turn"):
        chat_pairs(messages[:2], tok, "x:2")


def test_chat_file_trains_through_the_template_and_is_cached(tmp_path):
    from sbd_bench.training.data import CACHE_FILE, file_pairs

    tok = chat_tokenizer()
    data = tmp_path / "chat.jsonl"
    lines = [{"messages": [{"role": "user", "content": f"{i}+1"}, {"role": "assistant", "content": str(i + 1)}]}
             for i in range(5)] + [{"prompt": "café=", "completion": "x"}]
    data.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    warnings = []
    pairs = file_pairs(data, tok, tmp_path, warnings.append)
    assert len(pairs) == 6 and (tmp_path / CACHE_FILE).is_file()
    assert len(warnings) == 1 and "1 token(s) in 1 line(s) (lines 6)" in warnings[0] and "'é'" in warnings[0]
    again = []
    assert file_pairs(data, tok, tmp_path, again.append)[5] == pairs[5] and again == warnings  # from the cache
    data.write_text(data.read_text(encoding="utf-8").replace("café", "cafe"), encoding="utf-8")
    assert file_pairs(data, tok, tmp_path, again.append)[5] != pairs[5]  # another file: tokenised again


def test_over_long_lines_are_counted_and_skipped(tmp_path):
    data = tmp_path / "d.jsonl"
    rows = [{"prompt": "1+1=", "completion": "2"}] * 3 + [{"prompt": "x" * 200, "completion": "y"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = []
    train(TrainConfig(out=str(tmp_path / "o"), **{**TINY, "data": str(data), "steps": 2, "block_size": 4}),
          log=lines.append)
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "skipped 1 of 4" in warnings[0] and "(lines 4)" in warnings[0]
    assert "3 examples" in next(line for line in lines if line.startswith("train:"))


def test_lora_trains_adapters_and_the_mask_row_and_exports_a_plain_model(tmp_path):
    from safetensors.torch import load_file

    from sbd_bench.core.model import load_model

    base = tmp_path / "base"
    train(TrainConfig(out=str(base), **{**TINY, "steps": 2}), log=lambda line: None)
    out = tmp_path / "lora"
    lines = []
    train(TrainConfig(out=str(out), base=str(base), lora_rank=2, **{**TINY, "steps": 5}), log=lines.append)
    assert "M trained)" in lines[0]
    before, after = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(before) == sorted(after)  # merged: no adapter tensors in the export
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(before[q], after[q])  # the adapters are folded into the weights
    mask_id = json.loads((out / "config.json").read_text())["mask_token_id"]
    emb = "model.embed_tokens.weight"
    changed = (before[emb] != after[emb]).any(dim=1).nonzero().flatten().tolist()
    assert changed == [mask_id]  # of the embeddings, only the mask token's row trained
    lm = load_model(out, device="cpu")
    assert lm.mask_token_id == mask_id


PEAK_CHILD = """
import json, sys
import torch
from sbd_bench.training.config import TrainConfig
from sbd_bench.training.model import build_model
from sbd_bench.training.parallel import Parallel, wrap
from sbd_bench.training.data import training_groups
from sbd_bench.training.train import draw_step, train_step

def rss(key):  # bytes of this process: VmRSS now, VmHWM its peak since the last reset
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))

def steps(batch, **dims):  # a run's model, optimizer and two steps (AdamW's state exists in the second)
    cfg = TrainConfig(out="", data=sys.argv[1], batch_size=batch, block_size=16, min_block_size=16, **dims)
    model, tok = build_model(cfg, None)
    par = Parallel("single", 0, 0, 1, torch.device("cpu"))
    model = wrap(model.train(), cfg, par)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95))
    groups = training_groups(cfg.data, tok, 1, 0)
    for step in range(2):
        part = draw_step(groups, cfg, step, tok.pad_token_id, tok.mask_token_id, with_mask=False)
        train_step(model, optimizer, part, cfg, par, step)
    return part.ids.shape[1]

torch.set_num_threads(1)
steps(2, hidden_size=32, layers=1, heads=4, intermediate_size=64)  # the libraries load (the plan leaves them out)
peaks = {}
for batch in (1, 16):
    base = rss("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # resets VmHWM
    length = steps(batch, hidden_size=256, layers=4, heads=4, intermediate_size=1024, max_positions=256)
    peaks[batch] = (rss("VmHWM") - base, length)
print(json.dumps(peaks))
"""


def test_plan_is_within_15_percent_of_the_measured_peak_on_the_cpu(tmp_path, capsys):
    """`train --plan --device cpu` against the peak a child process reaches over its memory with the
    libraries loaded, at batch 1 (weights, gradients and AdamW dominate) and 16 (activations do), for a
    model built from scratch (its mask row counted). The child runs with MALLOC_MMAP_THRESHOLD_ set, so
    that glibc gives freed blocks back and its peak RSS is the peak of live memory (as CUDA's
    max_memory_allocated is); without it glibc keeps them and peak RSS runs higher (docs/training.md)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sbd_bench.cli import main

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    data = tmp_path / "reverse.jsonl"  # 15 letters and their reverse: 32 tokens with BOS and EOS
    data.write_text("".join(json.dumps({"prompt": w, "completion": w[::-1]}) + "\n"
                            for w in ("abcdefghijklmno", "pqrstuvwxyzabcd", "efghijklmnopqrs")))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", PEAK_CHILD, str(data)], env=env, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    compared = []
    for batch, (peak, length) in json.loads(child.stdout.splitlines()[-1]).items():
        capsys.readouterr()
        assert main(["train", "--plan", "--device", "cpu", "--hidden-size", "256", "--layers", "4", "--heads", "4",
                     "--intermediate-size", "1024", "--max-positions", "256", "--batch-size", batch,
                     "--seq-len", str(length)]) == 0
        compared.append((batch, length, json.loads(capsys.readouterr().out.splitlines()[-1])["total"] * 1e9, peak))
    with capsys.disabled():  # the figures docs/training.md quotes (pytest -s)
        for batch, length, planned, peak in compared:
            print(f"\nbatch {batch}, {length} positions: planned {planned / 1e9:.3f} GB, measured {peak / 1e9:.3f} GB "
                  f"({planned / peak:.2f}x)")
    assert all(abs(planned - peak) <= 0.15 * peak for _, _, planned, peak in compared), compared
