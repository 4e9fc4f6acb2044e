"""Micro-benchmarks: one solver decision per forward (the BlockView proxies included, as each forward
computes them afresh) for blocks of 16 and 32 and vocabularies of 32k and 128k entries.

    tox -e bench            # or: python -m pytest benchmarks -n 0 --benchmark-enable
"""
import pytest
import torch

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

    def fresh_view():
        view = BlockView(logits=logits, masked=masked.clone(), generator=torch.Generator().manual_seed(0))
        return (view,), {}

    chosen = benchmark.pedantic(solver.select, setup=fresh_view, rounds=30, iterations=1, warmup_rounds=2)
    assert chosen.shape == masked.shape and chosen[masked].any() and not chosen[~masked].any()
