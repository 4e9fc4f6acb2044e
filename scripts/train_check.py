"""The training check (issue 18): a ~1B-parameter random Llama trained with the SBD objective under
torchrun + FSDP2 on every GPU present, through the project's own training step (sbd_bench.training):
seconds per step, tokens/s, MFU and peak memory per GPU beside ``train --plan``'s prediction.

    torchrun --nproc-per-node $(nvidia-smi -L | wc -l) scripts/train_check.py            # the GPUs present
    torchrun --nproc-per-node 2 scripts/train_check.py --tiny --steps 3                 # CPU smoke run (gloo)

``scripts/gpu_check.py --training`` launches it. Rank 0 prints one JSON line (and writes --out).
MFU counts the model's FLOPs per step, 6 x parameters x tokens (forward and backward, both SBD copies:
2 x seq-len tokens per sequence) plus attention, 12 x layers x hidden x (2 x seq-len)^2 per sequence
(the SBD mask is arbitrary, so attention runs over all pairs), over the step time x the GPUs' dense
bf16 peak (datasheet, analysis/roofline.py).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sbd_bench.analysis.roofline import HARDWARE  # noqa: E402
from sbd_bench.core.model import device_name  # noqa: E402
from sbd_bench.training.config import TrainConfig  # noqa: E402
from sbd_bench.training.parallel import start, wrap  # noqa: E402
from sbd_bench.training.plan import plan  # noqa: E402
from sbd_bench.training.train import draw_step, train_step  # noqa: E402

# Llama-3.2-1B's shape (1.24B parameters with its 128k vocabulary, untied here)
ONE_B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=False)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=512, tie_word_embeddings=False)


def random_pairs(n: int, seq_len: int, prompt: int, vocab: int) -> list:
    """Sequences of random ids: a prompt and a completion ending in id 2 (the EOS of the config)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (n, seq_len), generator=g).tolist()
    return [(row[:prompt], row[prompt:seq_len - 16] + [2]) for row in ids]  # room for the last block's padding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU (gloo): exercise the code")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10; tiny 3)")
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per GPU (default 4; tiny 2)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 2048; tiny 64)")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = TINY if args.tiny else ONE_B
    steps, batch, seq_len = args.steps or (3 if args.tiny else 10), args.batch_size or (2 if args.tiny else 4), \
        args.seq_len or (64 if args.tiny else 2048)
    world = int(os.environ.get("WORLD_SIZE", 1))
    cfg = TrainConfig(out="", steps=steps + 2, batch_size=batch, world_size=world, block_size=16, warmup=1,
                      lr=1e-4, device="cpu" if args.tiny else "cuda", strategy="fsdp" if world > 1 else "single",
                      activation_checkpointing=args.activation_checkpointing)
    par = start(cfg)
    torch.manual_seed(0)
    config = LlamaConfig(**dims, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM._from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    predicted = plan(model, world, par.strategy, batch, seq_len, checkpointing=args.activation_checkpointing,
                     cuda=par.device.type == "cuda")
    n_params = sum(p.numel() for p in model.parameters())
    model = wrap(model.train(), cfg, par)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    groups = [random_pairs(64 * batch * world, seq_len, 64, dims["vocab_size"])]
    cuda = par.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(par.device)
    times = []
    for step in range(steps + 2):  # two untimed steps: allocation, optimizer state, kernels chosen
        batch_ = draw_step(groups, cfg, step, 0, dims["vocab_size"] - 1, with_mask=False)
        if cuda:
            torch.cuda.synchronize(par.device)
        par.barrier()
        t0 = time.perf_counter()
        train_step(model, optimizer, batch_, cfg, par, step)
        if cuda:
            torch.cuda.synchronize(par.device)
        par.barrier()
        if step >= 2:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    peak = torch.cuda.max_memory_allocated(par.device) if cuda else None
    peaks = par.gather(peak if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    tokens = cfg.global_batch_size * 2 * seq_len  # both SBD copies go through the model
    flops = 6 * n_params * tokens + 12 * dims["num_hidden_layers"] * dims["hidden_size"] * (2 * seq_len) ** 2 * cfg.global_batch_size
    name = device_name(par.device)
    hw = next((h for key, h in HARDWARE.items() if key in name), None)
    result = {"model": "random Llama, 1B dims" if not args.tiny else "tiny", "parameters": n_params, "world_size": world,
              "strategy": par.strategy, "device": name, "batch_size_per_gpu": batch, "seq_len": seq_len,
              "activation_checkpointing": args.activation_checkpointing, "steps_timed": steps, "step_s": step_s,
              "tokens_per_s": tokens / step_s, "model_flops_per_step": flops,
              "mfu": flops / (step_s * hw.peak_flops * world) if hw and cuda else None,
              "peak_memory_bytes_per_gpu": max(peaks) if cuda else None,
              "max_rss_bytes_per_rank": None if cuda else max(peaks),
              "plan_total_bytes_per_gpu": predicted.total * 1e9,
              "peak_over_plan": max(peaks) / (predicted.total * 1e9) if cuda else None,
              "plan": {k: getattr(predicted, k) for k in ("weights", "in_flight", "gradients", "optimizer", "activations")}}
    if par.main:
        print(json.dumps(result), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    par.leave()  # together: no rank leaves while rank 0 still writes


if __name__ == "__main__":
    main()
