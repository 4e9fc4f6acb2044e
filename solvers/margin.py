"""Margin threshold: Fast-dLLM's confidence-threshold rule scored by the margin p(top1) - p(top2) instead
of the confidence: reveal every masked position whose margin is at least tau, and always the largest-margin one.

Source: Wu et al. 2025, "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and
Parallel Decoding" (the threshold rule, there on confidence); margin as the score, as in Kim et al. 2025 (top-k
margin). Rule: reveal {i masked : m_i >= tau} and argmax_i m_i (the leftmost on a tie). Changed for SBD
blocks: nothing; the threshold applies within the block. Default tau = 0.9 (ours), the value of the
confidence rule's default: a margin of 0.9 needs a top probability of at least 0.9 (docs/solvers.md has the
threshold sweep on the shipped model). dInfer (inclusionAI/dInfer, every commit to fce4e32) has no margin
decoder; its confidence threshold rule reveals c_i >= min(tau, max_j c_j - 1e-5), so below tau every slot
within 1e-5 of the best is revealed with it, where this rule (and ``confidence``) reveals the best one
alone: the two differ on near-ties only.
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
