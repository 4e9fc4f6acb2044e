"""The per-forward cost curve of this machine: one forward with 1, k, 1+k and 2k query tokens, timed
through the core's own forward. ``run`` records it as ``cost_curve`` in ``summary.json``; the cost
model (analysis/roofline.py) interpolates it to predict wall-clock speed factors.

    >>> measure_cost_curve(lm, block_size=16, context=64)["time_s"]
"""
from __future__ import annotations

import time
from statistics import median

import torch

from ..core.decoding import Decoder
from ..core.model import device_clock
from ..core.masks import Pattern


def measure_cost_curve(lm, block_size: int, context: int, reps: int = 30, warmup: int = 3,
                       budget_s: float = 3.0, fast: bool = False, compile: bool | None = None) -> dict:
    """Time of one forward with 1, k, 1+k and 2k query tokens over a cache of ``context`` random tokens,
    through the core's own forward (sizes interleaved, device synchronised around each): ``time_s``
    holds medians (what predictions use, like the medians of measured decodes), ``min_time_s`` minima
    (the least disturbed figure on a shared machine). Stops early, after at least 5 timed rounds, once
    ``budget_s`` seconds are spent: a big model on a slow machine must not spend minutes here.
    ``fast``/``compile``: through the fast path, as the run decodes (the same graphs: nothing new to compile)."""
    device, k = lm.device, block_size
    limit = lm.max_positions or context + 2 * k + 1
    context = max(1, min(context, limit - 2 * k - 1))
    decoder = Decoder(lm, block_size=k, fast=fast, compile=compile)
    cache = decoder.new_cache(1, context + 2 * k + 1)
    gen = torch.Generator().manual_seed(0)
    vocab = lm.model.config.vocab_size
    decoder.prefill(torch.randint(0, vocab, (1, context), generator=gen).to(device), cache)
    shapes = {1: 1, k: 0, 1 + k: 1, 2 * k: k}  # query tokens -> how many of them are causal
    times: dict[int, list[float]] = {q: [] for q in shapes}
    started = time.perf_counter()
    for rep in range(warmup + reps):
        if rep >= warmup + 5 and time.perf_counter() - started > budget_s:
            break
        for q, n_causal in shapes.items():
            ids = torch.randint(0, vocab, (1, q), generator=gen).to(device)
            positions = torch.arange(context, context + q, device=device)[None]
            start = device_clock(device)  # the logits the core reads: the block's, or the one next token
            decoder.forward(ids, positions, Pattern(n_causal, q - n_causal), cache, keep=max(1, q - n_causal))
            elapsed = device_clock(device) - start
            cache.rollback(q)
            if rep >= warmup:
                times[q].append(elapsed)
    qs = sorted(times)
    return {"block_size": k, "context": context, "reps": len(times[1]), "device": str(device), "fast_path": fast,
            "query_tokens": qs, "time_s": [median(times[q]) for q in qs], "min_time_s": [min(times[q]) for q in qs]}
