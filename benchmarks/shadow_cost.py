"""What the shadow costs per forward: a block forward of k queries against the same forward with the block's
shadow (2k queries: k more mask queries, core/masks.py), timed alternately in one process, the ratio of
medians reported (revoking solvers that read the shadow pay it from a block's second forward on).

    python benchmarks/shadow_cost.py --model sbd-tiny --threads 1
    python benchmarks/shadow_cost.py --random-dims llama-3.1-8b --device cuda --dtype bfloat16   # on a GPU
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def measure(lm, block_size: int, context: int, rounds: int) -> dict:
    import torch

    from sbd_bench.core.decoding import Decoder
    from sbd_bench.core.model import device_clock

    decoder = Decoder(lm, block_size=block_size)
    cache = decoder.new_cache(1, context + 2 * block_size)
    prompt = torch.randint(5, lm.model.config.vocab_size, (1, context), device=lm.device)
    decoder.prefill(prompt, cache)
    block = torch.full((1, block_size), lm.mask_token_id, device=lm.device)
    block[0, ::3] = prompt[0, : len(range(0, block_size, 3))]  # some slots revealed, as when the shadow is read
    none = prompt[:, :0]
    times = {False: [], True: []}
    for _ in range(3):  # warm-up
        for shadow in (False, True):
            decoder.block_step(none, block, context, cache, shadow=shadow)
    for _ in range(rounds):
        for shadow in (False, True):
            start = device_clock(lm.device)
            decoder.block_step(none, block, context, cache, shadow=shadow)
            times[shadow].append(device_clock(lm.device) - start)
    plain, shadowed = median(times[False]) * 1e3, median(times[True]) * 1e3
    return {"block_size": block_size, "context": context, "ms_block": round(plain, 4),
            "ms_block_with_shadow": round(shadowed, 4), "ratio": round(shadowed / plain, 3),
            "device": str(lm.device), "dtype": str(lm.dtype).removeprefix("torch.")}


def main(argv=None) -> None:
    import torch

    from overhead import random_lm
    from sbd_bench.analysis.roofline import PRESETS
    from sbd_bench.core.model import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sbd-tiny")
    parser.add_argument("--random-dims", default=None, choices=sorted(PRESETS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.random_dims:
        lm = random_lm(PRESETS[args.random_dims], device=args.device, dtype=args.dtype)
    else:
        lm = load_model(args.model, device=args.device, dtype=args.dtype)
    print(json.dumps(measure(lm, args.block_size, args.context, args.rounds)))


if __name__ == "__main__":
    main()
