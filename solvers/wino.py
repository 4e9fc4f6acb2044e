"""WINO: wide in, narrow out. Draft wide with a low confidence threshold; mask again the drafted tokens
that the block, seen without them, no longer supports.

Source: Hong et al. 2025, "Wide-In, Narrow-Out: Revokable Decoding for Efficient and Effective DLLMs"
(arXiv 2507.18578; ICLR 2026). Rule, per forward: reveal every masked position with confidence > tau_in (at most
cap = min(max(floor(0.7 * #masked), 5), 20), the most confident; at least the most confident one). When
more than one is revealed, judge each position revealed in an earlier forward by the shadow's probability
of its token (a masked query at its slot that sees the rest of the block) and mask it again below tau_out;
when that would drop as many as the previous forward revealed (or more), drop only that many less one,
the least supported first. Revokes and reads the shadow (the core's, core/masks.py); keeps the previous
forward's count in view.state.
Changed for SBD blocks: WINO's shadow copy of the block sees the whole block but the own slot and every
other shadow slot (all masks, at duplicated positions); ours sees the block but the own slot, and itself:
exactly the view SBD training gives a masked slot, so the judgement is in distribution. Its cap (tuned for
LLaDA's 128-token blocks) is kept; at k = 16 it is 5 to 11. In verified mode the block's first slot holds
NTP's token, set by the core (``view.revealed`` is False there): it is never judged nor masked again, where
the official code judges every decoded slot (NTP's token is exact, and the core may not drop it). Defaults:
the paper's tau_in = 0.6, tau_out = 0.9.
"""
from dataclasses import dataclass
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Decision, Solver, SolverError, reveal_top


@dataclass(frozen=True)
class WINO(Solver):
    name: ClassVar[str] = "wino"
    description: ClassVar[str] = "WINO: reveal confidence > tau_in, mask again drafts the shadow gives < tau_out"
    revokes: ClassVar[bool] = True
    reads_shadow: ClassVar[bool] = True
    tau_in: float = 0.6
    tau_out: float = 0.9

    def __post_init__(self):
        for key, value in (("tau_in", self.tau_in), ("tau_out", self.tau_out)):
            if not 0.0 <= value <= 1.0:
                raise SolverError(f"wino: {key} must be in [0, 1] (got {value})")

    def select(self, view: BlockView):
        masked, conf = view.masked, view.confidence  # (B, k)
        cap = (masked.sum(-1) * 7 // 10).clamp(5, 20)  # (B,)
        wide = masked & (conf > self.tau_in)
        reveal = reveal_top(conf.masked_fill(~wide, -1.0), wide, cap) | reveal_top(conf, masked, 1)
        accepted = reveal.sum(-1)  # (B,)
        last = view.state[:, 0] if view.state is not None else torch.full_like(accepted, 1 << 30)
        remask = torch.zeros_like(masked)
        if view.shadow_logits is not None:
            support = view.shadow_confidence.masked_fill(~view.revealed, 2.0)  # (B, k), 2: not judged
            weak = view.revealed & (support < self.tau_out) & (accepted > 1)[:, None]
            most = torch.where(weak.sum(-1) >= last, last - 1, weak.sum(-1))  # (B,)
            remask = reveal_top(-support, weak, most) & weak & (most > 0)[:, None]
        state = accepted[:, None].expand(masked.shape)  # (B, k): this forward's count, for the next one
        return Decision(reveal=reveal, remask=remask, state=state)
