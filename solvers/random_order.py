"""Ablation: reveal n masked positions chosen uniformly at random (from the core's seeded generator)."""
from dataclasses import dataclass
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class RandomOrder(Solver):
    name: ClassVar[str] = "random_order"
    description: ClassVar[str] = "ablation: n uniformly random masked positions per forward (seeded)"
    deterministic: ClassVar[bool] = False
    n: int = 2

    def __post_init__(self):
        if self.n < 1:
            raise SolverError(f"random_order: n must be >= 1 (got {self.n})")

    def select(self, view: BlockView):
        noise = torch.rand(view.masked.shape, generator=view.generator, device="cpu").to(view.masked.device)
        return reveal_top(noise, view.masked, self.n)
