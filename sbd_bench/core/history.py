"""The blocks' memory, for solvers that remember and revoke (``Solver.reads_history``, ``revokes``,
``reads_shadow``; docs/decoding.md, 'Revocation'): what earlier forwards of the blocks under way showed,
kept on the device and handed over in each ``BlockView``.

    >>> memory = BlockMemory.open(block, core_first=False)   # reveal.open_blocks, a new block per row
    >>> view = BlockView(logits, masked, step, **memory.view(part, block, shadow))
    >>> memory.record(revealed, remask, logits, state)        # after the solver's choice

A position masked again is open to the solver as before; its step goes back to -1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class BlockMemory:
    """(B, w, V) logits of the last forward, (B, w, ...) the solver's last state, (B, w) the step that
    revealed each slot (-1 masked, -2 the core's); on the device, never read back."""

    revealed_at: torch.Tensor
    logits: torch.Tensor | None = None
    state: torch.Tensor | None = None

    @classmethod
    def open(cls, block: torch.Tensor, core_first: bool) -> BlockMemory:
        """The memory of new blocks (B, w), all masked; ``core_first``: slot 0 is the core's (verified)."""
        revealed_at = torch.full_like(block, -1)
        if core_first and block.shape[1]:
            revealed_at[:, 0] = -2  # the core's slot (a row whose block is empty never reads it)
        return cls(revealed_at)

    def view(self, part: Callable, block: torch.Tensor, shadow: torch.Tensor | None) -> dict:
        """The ``BlockView`` fields of the history, each cut to the rows of a solver call by ``part``; the
        block and revealed_at as copies: the core goes on from its own, whatever a solver writes in its view
        (at batch 1 part() is the tensor itself)."""
        return dict(block=part(block).clone(), revealed_at=part(self.revealed_at).clone(),
                    previous_logits=part(self.logits), state=part(self.state), shadow_logits=part(shadow))

    def record(self, revealed: torch.Tensor, remask: torch.Tensor | None, logits: torch.Tensor,
               state: torch.Tensor | None, step: int) -> None:
        """After a choice at ``step``: the slots revealed (B, w) and masked again, the forward's block logits
        and the solver's state, for the next forward's view."""
        self.revealed_at = self.revealed_at.masked_fill(revealed, step)
        if remask is not None:
            self.revealed_at = self.revealed_at.masked_fill(remask, -1)
        self.logits, self.state = logits, state
