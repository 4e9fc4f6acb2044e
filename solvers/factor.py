"""Factor rule (Fast-dLLM): with confidences sorted descending c_(1) >= c_(2) >= ..., reveal the
largest n with (n + 1) * (1 - c_(n)) < f, and at least one position."""
from dataclasses import dataclass
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class Factor(Solver):
    name: ClassVar[str] = "factor"
    description: ClassVar[str] = "Fast-dLLM factor rule: largest n with (n+1)(1-c_(n)) < f"
    f: float = 1.0

    def __post_init__(self):
        if not self.f > 0:
            raise SolverError(f"factor: f must be > 0 (got {self.f}); small f reveals about one token per forward")

    def select(self, view: BlockView):
        conf = view.confidence.masked_fill(~view.masked, 0.0)  # (B, k)
        c_sorted = conf.sort(dim=-1, descending=True).values
        n = torch.arange(1, view.k + 1, device=conf.device)
        holds = ((n + 1) * (1 - c_sorted) < self.f) & (n <= view.masked.sum(-1, keepdim=True))
        largest = torch.where(holds, n, 0).amax(-1)  # (B,)
        return reveal_top(view.confidence, view.masked, largest)
