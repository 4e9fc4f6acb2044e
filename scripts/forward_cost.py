"""What one forward of each model costs on this machine, the models measured in turn in one process (so that
the machine's load hits them alike): the per-forward cost curve of ``run`` (1, k, 1+k and 2k query tokens
over a cache of ``--context`` tokens, through the core's own forward), the least time seen over
``--rounds`` rounds (the least disturbed figure on a shared machine; medians are in the JSON line), and
each model's cost relative to the first. What a draft model's forward costs against its target's
(models/ntp-draft/README.md):

    python scripts/forward_cost.py sbd-tiny ntp-draft --threads 1
"""
from __future__ import annotations

import argparse
import json
from statistics import median

import torch

from sbd_bench.core.model import load_model
from sbd_bench.runner.costcurve import measure_cost_curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="shipped model names or local HF folders; the first is the reference")
    parser.add_argument("--context", type=int, default=40, help="cached tokens before the timed forward (default: 40)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lms = [load_model(name, device="cpu", dtype="float32", require_mask_token=False) for name in args.models]
    times: dict[str, list[list[float]]] = {name: [] for name in args.models}
    least: dict[str, list[list[float]]] = {name: [] for name in args.models}
    for _ in range(args.rounds):
        for name, lm in zip(args.models, lms):
            curve = measure_cost_curve(lm, args.block_size, args.context, reps=20, budget_s=1.0)
            times[name].append(curve["time_s"])
            least[name].append(curve["min_time_s"])
    queries = curve["query_tokens"]
    medians = {name: [median(r[i] for r in rounds) for i in range(len(queries))] for name, rounds in times.items()}
    minima = {name: [min(r[i] for r in rounds) for i in range(len(queries))] for name, rounds in least.items()}
    reference = minima[args.models[0]]
    print(f"{'model':<16} {'parameters':>10} " + " ".join(f"{f'{q} tok (ms)':>12}" for q in queries) + "  vs first (1 tok)")
    for name, lm in zip(args.models, lms):
        parameters = sum(p.numel() for p in lm.model.parameters())
        cells = " ".join(f"{1000 * t:>12.3f}" for t in minima[name])
        print(f"{name:<16} {parameters:>10,} {cells}  {minima[name][0] / reference[0]:.2f}")
    print(json.dumps({"query_tokens": queries, "context": args.context, "threads": args.threads,
                      "min_time_s": minima, "median_time_s": medians}))


if __name__ == "__main__":
    main()
