"""Top-k: reveal the k most confident masked positions each forward (fewer when fewer remain)."""
from dataclasses import dataclass
from typing import ClassVar

from sbd_bench.types import BlockView, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class FixedK(Solver):
    name: ClassVar[str] = "fixed_k"
    description: ClassVar[str] = "reveal the k most confident masked positions per forward"
    k: int = 2

    def __post_init__(self):
        if self.k < 1:
            raise SolverError(f"fixed_k: k must be >= 1 (got {self.k}); k=1 reveals one token per forward")

    def select(self, view: BlockView):
        return reveal_top(view.confidence, view.masked, self.k)
