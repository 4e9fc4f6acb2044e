"""Dilated unmasking schedule (DUS): a fixed coarse-to-fine plan that reveals non-adjacent positions
together, log(k) forwards per block whatever the model says.

Source: Luxembourg, Permuter and Nachmani 2025, "Plan for Speed: Dilated Scheduling for Masked Diffusion
Language Models". Rule: over a block of k slots, level 0 holds the slots i with i mod s = 0 for the stride
s = k // base**skip, each later level the slots with i mod (s / base^j) = 0 not in an earlier level, down to
stride 1; a last level smaller than the one before it joins it. Forward t reveals the masked slots of the
earliest level that still has one. At k = 16, base 2: {0, 8}, {4, 12}, {2, 6, 10, 14}, the 8 odd slots: 4
forwards. Changed for SBD blocks: the plan is over the block's slots (a block cut short by the context
gets the plan of its size); a slot that is already revealed (verified mode's first, NTP's own) is skipped,
so a level may take fewer positions. Not ported: the repository's ``generate_scheduled`` remasks low-confidence
tokens by default (``remasking='low_confidence'``, threshold 0.3; an outside audit's reading of it), so its
default decode is the plan plus that remasking, where this port is the plan alone (DUS as the paper states
it). The remasking's exact rule could not be read from the repository's code here, and a port must follow
the code, not a guess (docs/solvers.md, 'Porting a paper's sampler').
"""
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import torch

from sbd_bench.types import BlockView, Solver, SolverError


@lru_cache(maxsize=64)
def dilated_levels(k: int, base: int, skip: int) -> tuple[int, ...]:
    """The level of each of the k slots (the forward, counted from 0, in which the plan reveals it)."""
    level, stride, depth = [-1] * k, k // base ** skip, 0
    while stride >= 1:
        fresh = [i for i in range(k) if i % stride == 0 and level[i] < 0]
        for i in fresh:
            level[i] = depth
        depth += bool(fresh)
        stride //= base
    leftover = [i for i in range(k) if level[i] < 0]  # k not a power of base: the rest in one last level
    for i in leftover:
        level[i] = depth
    depth += bool(leftover)
    sizes = [level.count(d) for d in range(depth)]
    if depth >= 2 and sizes[-1] < sizes[-2]:  # a small last level joins the one before
        level = [min(v, depth - 2) for v in level]
    return tuple(level)


@dataclass(frozen=True)
class Dilated(Solver):
    name: ClassVar[str] = "dilated"
    description: ClassVar[str] = "DUS: a fixed coarse-to-fine plan of non-adjacent slots, log(k) forwards per block"
    base: int = 2
    skip: int = 1

    def __post_init__(self):
        if self.base < 2:
            raise SolverError(f"dilated: base must be >= 2 (got {self.base}); base 2 halves the stride each forward")
        if self.skip < 1:
            raise SolverError(f"dilated: skip must be >= 1 (got {self.skip}); the first stride is k // base**skip")

    def select(self, view: BlockView):
        level = torch.tensor(dilated_levels(view.k, self.base, self.skip), device=view.masked.device)  # (k,)
        pending = level.expand(view.masked.shape).masked_fill(~view.masked, view.k)  # (B, k), k: nothing left
        earliest = pending.amin(-1, keepdim=True)  # (B, 1)
        return view.masked & (level == earliest)
