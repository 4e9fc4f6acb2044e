"""What one decode holds while it runs: its rows (``Row``: one prompt each), what its forwards did
(``ForwardLog``) and the per-call state of the modes (``DecodeCall``), handed to every step; the long-lived
``Decoder`` keeps only its settings, so a decode's state lives and ends with its call.

    >>> call = DecodeCall(solver, rows)            # Decoder.generate_batch makes one per call
    >>> decoder.block_step(..., log=call.forwards)  # each forward counted into it (Decoder.forward)
    >>> tokens, finite = to_host(token, call.forwards.finite)   # the forward's one device read
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from ..types import Solver
from .sampling import DrawStream
from .stops import StopRule

BLOCK_FIELDS = ("forwards_per_block", "drafted_per_block", "accepted_per_block", "replaced_per_block",
                "remasked_per_block", "forced_per_block")
REVOKE_BLOCK_FIELDS = BLOCK_FIELDS[4:]


@dataclass
class ForwardLog:
    """One decode's forwards after prefill, as ``Decoder.forward`` counts them: ``nfe`` all of them (each
    serves every row of a batch), ``row_nfe`` per batch row those in which it had work; and what the latest
    one showed: its logits (a reference, read when a solver seems to break its contract) and (B, 1) whether
    they were finite (``checks.finite_flag``, read back with the forward's tokens)."""

    nfe: int = 0
    row_nfe: Counter = field(default_factory=Counter)
    last_logits: torch.Tensor | None = None
    finite: torch.Tensor | None = None


@dataclass
class Row:
    """One prompt of a batch: its columns, what it has committed, its block under way, its records."""

    prompt_len: int
    budget: int
    pad: int  # cache columns left of the row's own (prompt padding, grown when verified rows realign)
    generator: torch.Generator | None  # a randomised solver's, seeded as at batch 1
    stream: DrawStream | None = None  # sampling: the numbers of this row's draws (greedy: None)
    out: list[int] = field(default_factory=list)
    revealed: list[int] = field(default_factory=list)  # tokens committed by each forward
    blocks: dict = field(default_factory=lambda: {name: [] for name in BLOCK_FIELDS})
    stop_reason: str = ""  # set once the row has stopped
    size: int = 0  # the block under way: its slots, the forward that revealed each (-1: masked)
    reveal_step: list[int] = field(default_factory=list)
    fixed: int = 0  # the block's leading slots the core set (verified: NTP's token), never the solver's
    remasked: int = 0  # the block's positions masked again
    forced: int = 0  # the block's positions the core revealed at the bound
    block_start: int = 0  # the output index of the block's first slot (traces)
    trace: list[dict] | None = None  # one entry per forward the row works in, when traced
    open: bool = False  # whether the block goes on (the row has work in the next block forward)
    pending: list[int] = field(default_factory=list)  # verified: last committed token, then the drafts
    final: bool = False  # verified: the drafts end at a stop or the budget: verify them, draft no more

    def stop(self, cut: int, reason: str) -> None:
        self.out, self.stop_reason, self.open = self.out[:cut], reason, False

    def end_block(self, forwards: int, drafted: int = 0) -> None:
        """Close the block; verified drafts are judged at the next block's first forward."""
        for name, value in zip(BLOCK_FIELDS, (forwards, drafted, 0, 0, self.remasked, self.forced)):
            self.blocks[name].append(value)
        self.open = False

    def block_stop(self, rule: StopRule, tokens: list[int], committed: int) -> tuple[int | None, str]:
        """``rule.stop_at`` over the row's output and its block's revealed prefix (host ``tokens``), the
        block's first ``committed`` slots being in the output already (verified: NTP's token)."""
        filled = next((i for i, s in enumerate(self.reveal_step) if s < 0), self.size)  # contiguous prefix
        return rule.stop_at(self.out + tokens[committed:filled], len(self.out) + filled - committed, self.budget,
                            block_done=filled == self.size, first_new=len(self.out))


@dataclass
class DecodeCall:
    """The state of one ``generate_batch`` call, passed to its steps: the solver and its rows, the forwards'
    log, the blocks' history (``history.BlockMemory``, for solvers that keep one), whether each row records a
    trace, verified sampling's draft distributions and the blocks' scope (``reveal.open_blocks``)."""

    solver: Solver
    rows: list[Row]
    tracing: bool = False
    forwards: ForwardLog = field(default_factory=ForwardLog)
    memory: object = None  # history.BlockMemory of the blocks under way, when the solver keeps history
    draft_probs: torch.Tensor | None = None  # verified sampling: (B, w, V) what each draft was drawn from
    scope: tuple[torch.Tensor | None, bool] | None = None  # (B, w) slots before the budget (None: all), whether
    #                                                        slot 0 is the core's

    @property
    def sampling(self):
        return self.solver.sampling


def to_host(*tensors: torch.Tensor) -> list[list[list]]:
    """(B, w) tensors (the carried tokens' NTP argmax, the block, the solver's choice, the forward's
    finite flag) as lists of rows, bool tensors as bools, in one device-to-host copy: the only
    synchronisation of a forward; the bookkeeping after it runs on the host."""
    rows, parts, at = torch.cat(tensors, dim=-1).long().tolist(), [], 0  # cat promotes bool to long
    for t in tensors:
        part = [row[at : at + t.shape[-1]] for row in rows]
        parts.append([[bool(v) for v in row] for row in part] if t.dtype == torch.bool else part)
        at += t.shape[-1]
    return parts
