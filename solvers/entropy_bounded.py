"""Entropy-bounded sampler (EB-Sampler, Ben-Hamu et al. 2025), the solver of the SBD paper.

Order the masked positions by an error proxy (lowest entropy first, or highest confidence/margin
first) and reveal the longest prefix U of that order with  sum_{i in U} H_i - max_{i in U} H_i <= gamma.
gamma=0 reveals one token per forward; gamma=inf the whole block at once.
"""
from dataclasses import dataclass
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Solver, SolverError

PROXIES = ("entropy", "confidence", "margin")


@dataclass(frozen=True)
class EntropyBounded(Solver):
    name: ClassVar[str] = "entropy_bounded"
    description: ClassVar[str] = "EB-Sampler: longest low-error prefix with sum(H) - max(H) <= gamma"
    gamma: float = 0.35
    proxy: str = "entropy"

    def __post_init__(self):
        if not self.gamma >= 0:  # also rejects NaN
            raise SolverError(f"entropy_bounded: gamma must be >= 0 (got {self.gamma}); gamma=0 reveals one token per forward")
        if self.proxy not in PROXIES:
            raise SolverError(f"entropy_bounded: proxy must be one of {', '.join(PROXIES)} (got {self.proxy!r})")

    def select(self, view: BlockView):
        masked, entropy = view.masked, view.entropy  # (B, k) each
        error = entropy if self.proxy == "entropy" else -view.confidence if self.proxy == "confidence" else -view.margin
        unmasked = ~masked
        order = error.masked_fill(unmasked, float("inf")).argsort(dim=-1, stable=True)  # masked first
        h_sorted = entropy.masked_fill(unmasked, 0.0).gather(-1, order)
        # sum - max is non-decreasing along the order, so counting the prefix that holds is enough
        bound = h_sorted.cumsum(-1) - h_sorted.cummax(-1).values
        n = (bound <= self.gamma).sum(-1, keepdim=True).clamp_min(1)  # (B, 1): a prefix longer than the
        rank = torch.arange(view.k, device=masked.device)  # masked positions reaches unmasked ones, which
        return torch.zeros_like(masked).scatter(-1, order, rank < n) & masked  # the & drops
