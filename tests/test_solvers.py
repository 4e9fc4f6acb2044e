"""Conformance kit over every registered solver, and golden tests of each built-in rule."""
import math
import os

import pytest
import torch

from sbd_bench.conformance import check_solver
from sbd_bench.registry import build_solver, solver_registry
from sbd_bench.types import BlockView, SolverError

PLUGIN_DIRS = [d for d in os.environ.get("SBD_BENCH_PLUGINS", "").split(os.pathsep) if d]
REGISTRY = solver_registry(PLUGIN_DIRS)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_conformance(name):
    check_solver(REGISTRY[name]())


def uniform_rows(sizes: list[int], vocab: int = 8) -> torch.Tensor:
    """(1, k, V) logits; position i uniform over its first sizes[i] tokens: entropy ln(sizes[i])."""
    logits = torch.full((1, len(sizes), vocab), float("-inf"))
    for i, n in enumerate(sizes):
        logits[0, i, :n] = 0.0
    return logits


def select(name, logits, masked=None, **params):
    masked = torch.ones(logits.shape[:2], dtype=torch.bool) if masked is None else masked
    return build_solver(REGISTRY[name], params).select(BlockView(logits, masked))


# entropies ln4, ln2, ln5, ln3 -> sorted ln2, ln3, ln4, ln5; sum - max over prefixes:
# 0, ln2 = 0.693, ln2 + ln3 = 1.792, ln2 + ln3 + ln4 = 3.178
@pytest.mark.parametrize("gamma, expected", [
    (0.0, [0, 1, 0, 0]), (0.5, [0, 1, 0, 0]), (0.7, [0, 1, 0, 1]), (2.0, [1, 1, 0, 1]),
    (3.1, [1, 1, 0, 1]), (3.2, [1, 1, 1, 1]), (math.inf, [1, 1, 1, 1]),
])
def test_entropy_bounded_sum_minus_max_rule(gamma, expected):
    chosen = select("entropy_bounded", uniform_rows([4, 2, 5, 3]), gamma=gamma)
    assert chosen[0].int().tolist() == expected


def test_entropy_bounded_extremes_over_a_whole_block():
    torch.manual_seed(0)
    logits = torch.randn(2, 16, 100)
    remaining, steps = torch.ones(2, 16, dtype=torch.bool), 0
    while remaining.any():  # gamma = 0: exactly one per forward (all entropies here are > 0)
        chosen = select("entropy_bounded", logits, remaining.clone(), gamma=0.0)
        assert chosen.sum(-1).tolist() == [1, 1]
        remaining &= ~chosen
        steps += 1
    assert steps == 16
    assert select("entropy_bounded", logits, gamma=1e9).all()  # huge gamma: the whole block at once


def test_entropy_bounded_proxies_change_the_order():
    # position 0: confident but flat tail (high entropy); position 1: less confident, low entropy
    logits = torch.tensor([[[5.0] + [0.0] * 30, [1.5, 1.4] + [-20.0] * 29]])  # p=0.83 H=1.03 | p=0.52 H=0.69
    by_entropy = select("entropy_bounded", logits, gamma=0.0, proxy="entropy")
    by_conf = select("entropy_bounded", logits, gamma=0.0, proxy="confidence")
    assert by_entropy[0].tolist() == [False, True] and by_conf[0].tolist() == [True, False]


def test_entropy_bounded_skips_revealed_positions():
    masked = torch.tensor([[True, False, True, True]])
    chosen = select("entropy_bounded", uniform_rows([4, 2, 5, 3]), masked, gamma=0.0)
    assert chosen[0].int().tolist() == [0, 0, 0, 1]  # ln3 is the lowest entropy still masked


def confident(confs: list[float], vocab: int = 4) -> torch.Tensor:
    """(1, k, V) logits whose top probability at position i is confs[i]."""
    rows = []
    for c in confs:
        rest = (1 - c) / (vocab - 1)
        rows.append(torch.tensor([c] + [rest] * (vocab - 1)).log())
    return torch.stack(rows)[None]


@pytest.mark.parametrize("confs, tau, expected", [
    ([0.95, 0.5, 0.92, 0.3], 0.9, [1, 0, 1, 0]),   # every position above tau
    ([0.5, 0.6, 0.4, 0.3], 0.9, [0, 1, 0, 0]),     # none above: still the most confident one
    ([0.5, 0.6, 0.6, 0.3], 0.9, [0, 1, 0, 0]),     # a tie goes to the leftmost
    ([0.95, 0.99, 0.97, 0.96], 0.9, [1, 1, 1, 1]),  # all above
    ([0.95, 0.99, 0.97, 0.96], 1.0, [0, 1, 0, 0]),  # tau = 1: only the most confident
])
def test_confidence_threshold(confs, tau, expected):
    assert select("confidence", confident(confs), tau=tau)[0].int().tolist() == expected


def test_confidence_threshold_ignores_revealed_positions():
    masked = torch.tensor([[False, True, True, False]])
    chosen = select("confidence", confident([0.99, 0.5, 0.6, 0.99]), masked, tau=0.9)
    assert chosen[0].int().tolist() == [0, 0, 1, 0]


def test_fixed_k_and_factor():
    logits = confident([0.6, 0.99, 0.3, 0.9])
    assert select("fixed_k", logits, k=2)[0].int().tolist() == [0, 1, 0, 1]
    masked = torch.tensor([[True, False, False, False]])
    assert select("fixed_k", logits, masked, k=3)[0].int().tolist() == [1, 0, 0, 0]
    # sorted 0.99, 0.9, 0.6, 0.3: (n+1)(1-c_n) = 0.02, 0.3, 1.6, 3.5 -> largest n with < 1 is 2
    assert select("factor", logits, f=1.0)[0].int().tolist() == [0, 1, 0, 1]
    assert select("factor", logits, f=0.01)[0].int().tolist() == [0, 1, 0, 0]  # at least one
    assert select("factor", logits, f=4.0)[0].int().tolist() == [1, 1, 1, 1]


def test_ablations():
    logits = confident([0.6, 0.99, 0.3, 0.9])
    masked = torch.tensor([[False, True, True, True]])
    assert select("left_to_right", logits, masked, n=2)[0].int().tolist() == [0, 1, 1, 0]
    gen = torch.Generator().manual_seed(3)
    chosen = build_solver(REGISTRY["random_order"], {"n": 2}).select(BlockView(logits, masked, generator=gen))
    assert chosen.sum() == 2 and not (chosen & ~masked).any()


@pytest.mark.parametrize("name, params, fix", [
    ("entropy_bounded", {"gamma": "-1"}, "gamma must be >= 0"),
    ("entropy_bounded", {"gamma": "nan"}, "gamma must be >= 0"),
    ("entropy_bounded", {"proxy": "vibes"}, "proxy must be one of"),
    ("confidence", {"tau": "0"}, "tau must be in (0, 1]"),
    ("confidence", {"tau": "1.5"}, "tau must be in (0, 1]"),
    ("fixed_k", {"k": "0"}, "k must be >= 1"),
    ("fixed_k", {"k": "two"}, "not a valid int"),
    ("factor", {"f": "-2"}, "f must be > 0"),
    ("fixed_k", {"kk": "2"}, "has no parameter 'kk'"),
])
def test_bad_parameters_name_the_fix(name, params, fix):
    with pytest.raises(SolverError, match=fix.replace("(", r"\(").replace("]", r"\]")):
        build_solver(REGISTRY[name], params)
