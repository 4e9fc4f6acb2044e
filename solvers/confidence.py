"""Confidence threshold (Fast-dLLM): reveal every masked position whose top probability is at least
tau, and always the most confident one so that each forward makes progress."""
from dataclasses import dataclass
from typing import ClassVar

from sbd_bench.types import BlockView, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class ConfidenceThreshold(Solver):
    name: ClassVar[str] = "confidence"
    description: ClassVar[str] = "reveal positions with confidence >= tau, at least the most confident"
    tau: float = 0.9

    def __post_init__(self):
        if not 0.0 < self.tau <= 1.0:
            raise SolverError(f"confidence: tau must be in (0, 1] (got {self.tau}); tau=1 reveals ~one token per forward")

    def select(self, view: BlockView):
        conf = view.confidence  # (B, k)
        return (view.masked & (conf >= self.tau)) | reveal_top(conf, view.masked, 1)
