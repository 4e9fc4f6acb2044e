"""The solver conformance kit: checks every solver must pass, whoever wrote it.

    >>> from sbd_bench.conformance import check_solver
    >>> check_solver(MySolver())        # raises AssertionError naming the broken rule

``test_conformance`` in tests/test_solvers.py runs it over every registered solver (built-ins, entry
points, and the folders in the SBD_BENCH_PLUGINS environment variable), so a plugin gets it for free:
``SBD_BENCH_PLUGINS=my_solvers/ python -m pytest tests/test_solvers.py -k conformance``.
"""
from __future__ import annotations

import torch

from .types import BlockView, Solver


def random_views(batch: int = 4, k: int = 8, vocab: int = 50, seed: int = 0, sharpness: float = 3.0):
    """Views with varied logits and masked sets: a full block, a partly revealed one, a single mask,
    and a row with nothing left to reveal."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k, vocab, generator=gen) * sharpness
    logits[..., vocab - 1] = float("-inf")  # the mask token, as the core hands it over
    masked = torch.rand(batch, k, generator=gen) < 0.6
    masked[0] = True
    if batch > 1:
        masked[1] = False
        masked[1, k // 2] = True
    if batch > 2:
        masked[2] = False
    return logits, masked


def check_solver(solver: Solver, k: int = 8, vocab: int = 50, seeds: range = range(3)) -> None:
    if not solver.decodes_blocks:
        return  # the NTP baseline never selects: the core decodes it through the causal stream
    for seed in seeds:
        logits, masked = random_views(k=k, vocab=vocab, seed=seed)
        logits_before, masked_before = logits.clone(), masked.clone()
        view = BlockView(logits, masked, step=0, generator=torch.Generator().manual_seed(7))
        chosen = solver.select(view)
        name = solver.label
        assert isinstance(chosen, torch.Tensor) and chosen.dtype == torch.bool, f"{name}: select must return a bool tensor"
        assert chosen.shape == masked.shape, f"{name}: select returned shape {tuple(chosen.shape)}, expected {tuple(masked.shape)}"
        assert not (chosen & ~masked).any(), f"{name}: revealed a position that was not masked"
        has_mask = masked.any(-1)
        assert (chosen.sum(-1)[has_mask] >= 1).all(), f"{name}: revealed nothing in a row that still had masks"
        assert torch.equal(logits, logits_before) and torch.equal(masked, masked_before), f"{name}: modified its inputs"
        again = solver.select(BlockView(logits, masked, step=0, generator=torch.Generator().manual_seed(7)))
        assert torch.equal(chosen, again), f"{name}: not deterministic for the same inputs and generator seed"
        # a whole block: at most k forwards until every position is revealed
        remaining, gen = masked.clone(), torch.Generator().manual_seed(seed)
        for step in range(k):
            if not remaining.any():
                break
            chosen = solver.select(BlockView(logits, remaining.clone(), step=step, generator=gen))
            assert not (chosen & ~remaining).any(), f"{name}: revealed a position twice"
            remaining &= ~chosen
        assert not remaining.any(), f"{name}: did not finish a block of {k} positions in {k} forwards"
