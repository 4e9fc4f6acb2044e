"""KLASS: KL-adaptive stability sampling. Reveal every masked position that is both confident and stable,
its predicted distribution having changed little over the last forwards; else the most confident one.

Source: Kim, Hong, Jung, Park and Yun 2025, "KLASS: KL-Guided Fast Inference in Masked Diffusion Models"
(NeurIPS 2025). Rule: at forward t, KL_t(i) = KL(p_t(i) || p_{t-1}(i)); position i is stable when its last
``history`` KL values are all below ``kl``, and ready when stable, masked and p_t(x_i) > tau; reveal every
ready position; when none is ready, reveal the most confident masked one (the paper's fallback reveals its
step schedule's count, one token per step in its runs). The first forward has no previous distribution, so
nothing is stable there. Reads history: the previous forward's logits (view.previous_logits) and, for the
run of stable forwards, a count it keeps in view.state.
Changed for SBD blocks: the history is the block's own (a block's positions do not exist before its first
forward, where LLaDA had predicted them at every step); defaults tau = 0.9, kl = 0.01, history = 1 (the
paper uses history 2 on 64-token blocks, tau 0.6-0.9, kl 0.01-0.015): with history 2 a 16-slot block
reveals one token per forward in its first 2 forwards whatever the model says (the README's sweep).
"""
from dataclasses import dataclass
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Decision, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class KLASS(Solver):
    name: ClassVar[str] = "klass"
    description: ClassVar[str] = "KLASS: reveal confident positions whose KL to the previous forward stayed < kl"
    reads_history: ClassVar[bool] = True
    tau: float = 0.9
    kl: float = 0.01
    history: int = 1

    def __post_init__(self):
        if not 0.0 <= self.tau < 1.0:
            raise SolverError(f"klass: tau must be in [0, 1) (got {self.tau}); the rule needs confidence > tau")
        if not self.kl > 0:
            raise SolverError(f"klass: kl must be > 0 (got {self.kl}); the rule needs KL < kl")
        if self.history < 1:
            raise SolverError(f"klass: history must be >= 1 (got {self.history}); 1 compares the last two forwards")

    def select(self, view: BlockView):
        confidence, masked = view.confidence, view.masked
        if view.previous_logits is None:
            stable_run = torch.zeros_like(confidence)  # (B, k): forwards in a row with KL < kl
        else:
            p, log_p, log_prev = view.log_probs.exp(), view.log_probs, view.previous_log_probs
            kl = (p * (log_p - log_prev)).masked_fill_(p == 0, 0.0).sum(-1)  # (B, k); inf where prev gave 0
            stable_run = (view.state + 1).masked_fill_(~(kl < self.kl), 0.0)
        ready = masked & (stable_run >= self.history) & (confidence > self.tau)
        fallback = reveal_top(confidence, masked, 1) & ~ready.any(-1, keepdim=True)
        return Decision(reveal=ready | fallback, state=stable_run)
