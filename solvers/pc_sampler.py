"""PC-Sampler: position-aware, calibrated confidence; the n best masked positions per forward.

Source: Huang et al. 2025, "PC-Sampler: Position-Aware Calibration of Decoding Bias in Masked Diffusion
Models". Rule: score_i = exp(-lam * i) * min(alpha, -p_i * log f(x_i)), with i the slot's index in the
block, p_i the probability of the predicted token x_i and f a background frequency of tokens (a corpus
count in the paper, which damps frequent, "trivial" tokens); reveal the n highest scores. Paper defaults:
lam = 0.25, alpha = 10, one token per forward. Changed for SBD blocks: i counts from the block's first slot
(the paper's counts from its block's too); f is uniform (1 / V), since a solver sees logits only and SBD's
models come with no corpus counts; with V tokens the calibration is then min(alpha, p_i log V), which
orders as confidence does once alpha >= log V (V = 101 for the shipped model: alpha = 10 never binds), so
this port measures the position-aware half of the method. n (1 in the paper) sets how many per forward:
the n best each forward, the remainder last, where LLaDA's step schedule (``get_num_transfer_tokens``)
spreads a block's m masks over ceil(m / n) steps as evenly as it can, the first m mod steps one more (5
masks at n = 4: LLaDA 3 then 2, this port 4 then 1; the two agree whenever n divides m, as at n = 1, 2, 4,
8 on a block of 16 with no stop inside).
"""
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class PCSampler(Solver):
    name: ClassVar[str] = "pc_sampler"
    description: ClassVar[str] = "PC-Sampler: exp(-lam*i) * min(alpha, -p log f) per slot, the n best per forward"
    lam: float = 0.25
    alpha: float = 10.0
    n: int = 1

    def __post_init__(self):
        if not self.lam >= 0:  # also rejects NaN
            raise SolverError(f"pc_sampler: lam must be >= 0 (got {self.lam}); lam=0 drops the position weight")
        if not self.alpha > 0:
            raise SolverError(f"pc_sampler: alpha must be > 0 (got {self.alpha}); it caps the calibrated confidence")
        if self.n < 1:
            raise SolverError(f"pc_sampler: n must be >= 1 (got {self.n}); n=1 reveals one token per forward")

    def select(self, view: BlockView):
        surprise = math.log(view.logits.shape[-1])  # -log f for the uniform background f = 1/V
        calibrated = (view.confidence * surprise).clamp_max(self.alpha)  # (B, k)
        slot = torch.arange(view.k, dtype=calibrated.dtype, device=calibrated.device)
        return reveal_top(torch.exp(-self.lam * slot) * calibrated, view.masked, self.n)
