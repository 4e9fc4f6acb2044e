"""Margin threshold (the margin variant of Fast-dLLM's confidence threshold, as dInfer offers it): reveal
every masked position whose margin p(top1) - p(top2) is at least tau, and always the largest-margin one.

Source: Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding" (threshold rule, there on confidence); margin as the proxy, as in Kim et al. 2025 (top-k
margin) and dInfer's threshold decoders. Rule: reveal {i masked : m_i >= tau} and argmax_i m_i. Changed for
SBD blocks: nothing; the threshold applies within the block. Default tau = 0.9 (ours), the value of the
confidence rule's default: a margin of 0.9 needs a top probability of at least 0.9 (docs/solvers.md has the
threshold sweep on the shipped model).
"""
from dataclasses import dataclass
from typing import ClassVar

from sbd_bench.types import BlockView, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class MarginThreshold(Solver):
    name: ClassVar[str] = "margin"
    description: ClassVar[str] = "reveal positions with margin p1 - p2 >= tau, at least the largest margin"
    tau: float = 0.9

    def __post_init__(self):
        if not 0.0 < self.tau <= 1.0:
            raise SolverError(f"margin: tau must be in (0, 1] (got {self.tau}); tau=1 reveals only certain positions "
                              f"beyond the one largest margin")

    def select(self, view: BlockView):
        margin = view.margin  # (B, k)
        return (view.masked & (margin >= self.tau)) | reveal_top(margin, view.masked, 1)
