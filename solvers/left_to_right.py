"""Ablation: reveal the leftmost n masked positions each forward, whatever the model's confidence."""
from dataclasses import dataclass
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class LeftToRight(Solver):
    name: ClassVar[str] = "left_to_right"
    description: ClassVar[str] = "ablation: the leftmost n masked positions per forward"
    n: int = 1

    def __post_init__(self):
        if self.n < 1:
            raise SolverError(f"left_to_right: n must be >= 1 (got {self.n})")

    def select(self, view: BlockView):
        leftness = -torch.arange(view.k, dtype=torch.float32, device=view.masked.device).expand(view.masked.shape)
        return reveal_top(leftness, view.masked, self.n)
