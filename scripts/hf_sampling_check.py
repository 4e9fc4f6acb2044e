"""Is sampled decoding through transformers' generate distributed as NTP sampling? The check behind the refusal
of temperature > 0 for the generate baselines (docs/baselines.md#sampling). On the random 'abcd' Llama of
tests/test_sampling_distribution.py (prompt 'abca', temperature 0.7, top-p 0.9), the first two tokens of N
seeded samples, decoded by the core's hf_generate path (the refusal lives in the spec parser, not there),
against their exact joint distribution under NTP sampling: Pearson's chi-square, and for assisted decoding
the share of drafts accepted against sum_x min(p(x), q(x)), what speculative sampling accepts for a first
draft drawn from the draft model's processed distribution q. The core's own NTP sampling is the control.
Minutes of CPU; not part of CI:

    python scripts/hf_sampling_check.py --samples 2000
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from chisquare import goodness_of_fit
    from test_sampling_distribution import PROMPT, SAMPLING, _probs, exact_joint
    from tiny_models import build_tiny_model

    from sbd_bench.core.decoding import Decoder
    from sbd_bench.core.model import load_model
    from sbd_bench.registry import solver_registry
    from sbd_bench.types import Sampled

    root = Path(tempfile.mkdtemp())
    folder = build_tiny_model(root / "abcd", seed=0, alphabet="abcd", sharpen=10.0)
    draft_folder = build_tiny_model(root / "draft", seed=3, alphabet="abcd", sharpen=10.0, hidden=16, layers=1)
    lm = dataclasses.replace(load_model(folder, device="cpu", dtype="float32"), stop_token_ids=())
    draft = dataclasses.replace(load_model(draft_folder, device="cpu", dtype="float32"), stop_token_ids=())
    prompt = lm.tokenizer(PROMPT)["input_ids"]
    joint = exact_joint(lm, prompt).sum(-1)  # (V, V): the first two tokens
    cells = {(a, b): float(joint[a, b]) for a in range(joint.shape[0]) for b in range(joint.shape[1]) if joint[a, b] > 0}
    p0, q0 = joint.sum(-1), _probs(draft, [prompt])[0, -1]
    registry = solver_registry()
    configs = {"ntp (the core's, the control)": registry["ntp"](),
               "hf_prompt_lookup:tokens=3,ngram=1": registry["hf_prompt_lookup"](tokens=3, ngram=1),
               "hf_assisted:tokens=2": registry["hf_assisted"](draft=str(draft_folder), tokens=2)}
    for name, solver in configs.items():
        gens = [Decoder(lm, max_new_tokens=2, seed=seed).generate(prompt, Sampled(solver, SAMPLING))
                for seed in range(args.samples)]
        statistic, df, p = goodness_of_fit(Counter(tuple(g.output_ids) for g in gens), cells)
        line = f"{name}: {args.samples} samples, chi2 {statistic:.1f}, df {df}, p {p:.2g}"
        if gens[0].drafted_per_block is not None:
            first = [(g.drafted_per_block[0], g.accepted_per_block[0]) for g in gens if g.drafted_per_block[0]]
            line += f"; first forward: {len(first)} with drafts, {sum(a for _, a in first)} first drafts accepted"
            if "assisted" in name:
                line += f" (speculative sampling accepts sum min(p, q) = {float(torch.minimum(p0, q0).sum()):.3f} of them)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
