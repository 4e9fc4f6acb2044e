"""Micro-benchmarks: one solver decision per forward (the BlockView proxies included, as each forward
computes them afresh) for blocks of 16 and 32 and vocabularies of 32k and 128k entries. A solver that keeps
a history (klass, wino) is timed at a block's second forward, the one that reads it (the previous forward,
its own state and, for wino, the shadow), as conformance.play_block hands it over.

    tox -e bench            # or: python -m pytest benchmarks -n 0 --benchmark-enable
"""
import pytest
import torch

import dataclasses

from sbd_bench.conformance import _answer, play_block
from sbd_bench.registry import solver_registry
from sbd_bench.types import BlockView

REGISTRY = solver_registry()
BLOCK_SOLVERS = sorted(name for name, cls in REGISTRY.items() if cls.decodes_blocks)


@pytest.mark.parametrize("vocab", [32_000, 128_000], ids=["V32k", "V128k"])
@pytest.mark.parametrize("k", [16, 32], ids=["k16", "k32"])
@pytest.mark.parametrize("name", BLOCK_SOLVERS)
def test_solver_decision(benchmark, name, k, vocab):
    solver = REGISTRY[name]()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, k, vocab, generator=gen) * 4  # (1, k, V): peaked enough for varied entropies
    masked = torch.rand(1, k, generator=gen) < 0.75
    masked[0, 0] = True

    view = BlockView(logits=logits, masked=masked.clone(), generator=torch.Generator().manual_seed(0))
    if solver.keeps_history:  # the second forward of a block whose first showed these logits, the next others
        following = torch.randn(1, k, vocab, generator=gen) * 4
        view = play_block(solver, [logits, following], [following], masked=masked, max_forwards=2)[1].view
    masked = view.masked

    def fresh_view():  # a new view each round: its proxies are computed afresh, as in a forward
        return (dataclasses.replace(view, masked=view.masked.clone()),), {}

    chosen = _answer(benchmark.pedantic(solver.select, setup=fresh_view, rounds=30, iterations=1, warmup_rounds=2))[0]
    assert chosen.shape == masked.shape and chosen[masked].any() and not chosen[~masked].any()
