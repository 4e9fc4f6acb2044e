"""The ported samplers (klass, wino, pc_sampler, dilated, margin), each rule pinned at its boundaries with
crafted logits, as the core would show them (``play_block`` for the rules that read earlier forwards or the
shadow), and every comparison of each rule flipped once (MUTATIONS): some case below must then fail."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

from sbd_bench.conformance import play_block
from sbd_bench.registry import build_solver, solver_registry
from sbd_bench.types import BlockView
from test_solvers import mutant, uniform_rows

REGISTRY = solver_registry()


def weighted_rows(weights: list[tuple[int, ...]], vocab: int = 8) -> torch.Tensor:
    """(1, k, V) logits; position i gives token j probability weights[i][j] / sum(weights[i])."""
    logits = torch.full((1, len(weights), vocab), float("-inf"))
    for i, w in enumerate(weights):
        logits[0, i, : len(w)] = torch.tensor([math.log(x) for x in w])
    return logits


@dataclass(frozen=True)
class Case:
    solver: str
    params: dict
    logits: list  # per forward: (1, k, V) logits, the last one repeated
    expected: list[list[int]]  # per forward: 1 where revealed (and -1 where masked again)
    masked: list[int] | None = None
    shadows: list | None = None
    why: str = field(default="", compare=False)

    def run(self, cls) -> list[list[int]]:
        solver = build_solver(cls, self.params)
        masked = None if self.masked is None else torch.tensor([self.masked], dtype=torch.bool)
        forwards = play_block(solver, self.logits, self.shadows, masked=masked, max_forwards=len(self.expected))
        return [(f.reveal.int() - f.remask.int())[0].tolist() for f in forwards]


MARGINS = weighted_rows([(1,), (5, 3), (1, 1), (2, 1, 1)])  # margins 1, 0.25, 0, 0.25 (exact in float32)
CONF = uniform_rows([2, 1, 4, 8])  # confidences 0.5, 1, 0.25, 0.125 (exact)


def klass_kl(before: torch.Tensor, after: torch.Tensor) -> float:
    """KL(after || before) at slot 0, computed as KLASS does (same operations, so the same float)."""
    lp, lq = after.log_softmax(-1), before.log_softmax(-1)
    p = lp.exp()
    return float(torch.where(p > 0, p * (lp - lq), 0.0).sum(-1)[0, 0])


SHIFTED = weighted_rows([(3, 1), (1,), (1,), (1,)])  # slot 0 moves from uniform-2 to 3:1; the others certain
STEADY = weighted_rows([(1, 1), (1,), (1,), (1,)])
KL_SHIFT = klass_kl(STEADY, SHIFTED)
ABOVE_KL_SHIFT = float(torch.nextafter(torch.tensor(KL_SHIFT), torch.tensor(1.0)))  # the next float32 up


def wino_shadow(support: list[tuple[int, ...]]) -> list[torch.Tensor]:
    return [weighted_rows(support)]


CASES = [
    # margin: reveal every masked slot with margin >= tau, and always the largest margin
    Case("margin", {"tau": 0.25}, [MARGINS], [[1, 1, 0, 1]], why="margins 1, .25, 0, .25 at tau = .25: equal counts"),
    Case("margin", {"tau": 1.0}, [MARGINS], [[1, 0, 0, 0]], why="tau = 1: the certain slot only"),
    Case("margin", {"tau": 1.0}, [MARGINS], [[0, 1, 0, 0]], masked=[0, 1, 1, 1],
         why="none reaches tau: exactly the largest margin, the leftmost of a tie"),
    # dilated: forward t reveals the masked slots of the earliest level of the plan that still has one
    Case("dilated", {}, [uniform_rows([2] * 16)],
         [[1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
          [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0], [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]],
         why="k = 16, base 2: strides 8, 4, 2, 1: four forwards"),
    Case("dilated", {"base": 4}, [uniform_rows([2] * 16)],
         [[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0], [0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1]],
         why="base 4: strides 4, 1"),
    Case("dilated", {"skip": 2}, [uniform_rows([2] * 16)],
         [[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0],
          [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]], why="skip 2: the first stride is 16 // 4"),
    Case("dilated", {}, [uniform_rows([2] * 5)], [[1, 1, 1, 1, 1]],
         why="k = 5: levels {0, 2, 4}, {1, 3}; the smaller last joins the one before: one forward"),
    Case("dilated", {}, [uniform_rows([2] * 6)], [[1, 0, 0, 1, 0, 0], [0, 1, 1, 0, 1, 1]],
         why="k = 6: levels {0, 3}, {1, 2, 4, 5}; a larger last level stays"),
    Case("dilated", {}, [uniform_rows([2] * 4)], [[1, 0, 1, 0], [0, 1, 0, 1]],
         why="k = 4: levels {0, 2}, {1, 3}; a last level as large as the one before stays"),
    Case("dilated", {}, [uniform_rows([2] * 8)], [[0, 0, 0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 1, 0]],
         masked=[0, 1, 1, 1, 1, 1, 1, 1], why="slot 0 revealed already (verified mode): level 0 is {4}"),
    # pc_sampler: the n best of exp(-lam * i) * min(alpha, p_i log V); V = 8 here (log V = 2.08)
    Case("pc_sampler", {"lam": 0.0}, [CONF], [[0, 1, 0, 0]], why="lam = 0: the most confident"),
    Case("pc_sampler", {"lam": 1.0}, [CONF], [[1, 0, 0, 0]], why="e^-1 * 1 < 0.5: the position weight wins"),
    Case("pc_sampler", {"lam": 0.5}, [CONF], [[0, 1, 0, 0]], why="e^-0.5 * 1 > 0.5: the confidence wins"),
    Case("pc_sampler", {"lam": 0.0, "alpha": 1.0}, [CONF], [[1, 0, 0, 0]],
         why="alpha = 1 caps 1.04 and 2.08 alike: a tie, the leftmost"),
    Case("pc_sampler", {"lam": 0.0, "n": 2}, [CONF], [[1, 1, 0, 0]], why="n = 2: the two best"),
    # klass: reveal every masked slot whose last `history` KLs to the previous forward are < kl and whose
    # confidence is > tau; else the most confident one. No history on the first forward.
    Case("klass", {"tau": 0.4}, [CONF], [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]],
         why="forward 0: no history, the most confident; then KL 0: slot 0 (0.5 > 0.4) ready; then the fallback"),
    Case("klass", {"tau": 0.5}, [uniform_rows([2, 1, 2, 8])], [[0, 1, 0, 0], [1, 0, 0, 0]],
         why="confidences 0.5 are not > tau = 0.5: none ready, the fallback reveals one"),
    Case("klass", {"tau": 0.1, "history": 2}, [CONF], [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 1]],
         why="history 2: ready only at the third forward (two KLs of 0)"),
    Case("klass", {"tau": 0.1, "kl": KL_SHIFT}, [STEADY, SHIFTED], [[0, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 0]],
         why="slot 0's KL equals kl: not stable (strict); slots 2, 3 (KL 0) are"),
    Case("klass", {"tau": 0.1, "kl": ABOVE_KL_SHIFT}, [STEADY, SHIFTED], [[0, 1, 0, 0], [1, 0, 1, 1]],
         why="kl just above slot 0's KL: stable"),
    # wino: reveal confidence > tau_in (at most the cap, at least the best); when more than one is revealed,
    # mask again earlier reveals whose shadow probability is < tau_out, fewer than the previous forward revealed
    Case("wino", {"tau_in": 0.4, "tau_out": 0.75}, [CONF, uniform_rows([1, 1, 1, 1])], [[1, 1, 0, 0], [-1, 0, 1, 1]],
         shadows=wino_shadow([(1, 1), (1,), (1,), (1,)]),
         why="slot 0's token has shadow 0.5 < 0.75, two revealed: it goes; slot 1 (shadow 1) stays"),
    Case("wino", {"tau_in": 0.4, "tau_out": 0.5}, [CONF, uniform_rows([1, 1, 1, 1])], [[1, 1, 0, 0], [0, 0, 1, 1]],
         shadows=wino_shadow([(1, 1), (1,), (1,), (1,)]), why="shadow 0.5 is not < tau_out = 0.5: kept"),
    Case("wino", {"tau_in": 0.5, "tau_out": 0.75}, [CONF], [[0, 1, 0, 0]], why="0.5 is not > tau_in = 0.5"),
    Case("wino", {"tau_in": 0.4, "tau_out": 0.75}, [CONF, uniform_rows([1, 1, 8, 1])], [[1, 1, 0, 0], [0, 0, 0, 1]],
         shadows=wino_shadow([(1, 1), (1,), (1,), (1,)]), why="one revealed: nothing is masked again"),
    Case("wino", {"tau_in": 0.4, "tau_out": 0.75}, [CONF, uniform_rows([1, 1, 1, 1])], [[1, 1, 0, 0], [0, -1, 1, 1]],
         shadows=wino_shadow([(1, 1), (1, 1, 1), (1,), (1,)]),
         why="both weak (0.5, 0.33), as many as the previous forward revealed: 2 - 1 go, the least supported"),
    Case("wino", {"tau_in": 0.2, "tau_out": 0.75}, [uniform_rows([2, 2, 2, 8])], [[1, 1, 1, 0]],
         why="three above tau_in in a block of 4: the cap is max(floor(0.7 * 4), 5) = 5, all three"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.solver}-{c.params}-{c.why[:30]}")
def test_ported_rule_boundary(case):
    assert case.run(REGISTRY[case.solver]) == case.expected, case.why


def test_crafted_rows_are_exact():
    view = BlockView(MARGINS, torch.ones(1, 4, dtype=torch.bool))
    assert view.margin[0].tolist() == [1.0, 0.25, 0.0, 0.25]
    assert 0 < KL_SHIFT < 1


MUTATIONS = [
    ("margin", "(margin >= self.tau)", "(margin > self.tau)"),
    ("margin", "reveal_top(margin, view.masked, 1)", "reveal_top(margin, view.masked, 2)"),
    ("dilated", "sizes[-1] < sizes[-2]", "sizes[-1] <= sizes[-2]"),
    ("dilated", "k // base ** skip", "k // base ** (skip + 1)"),
    ("dilated", "stride //= base", "stride //= 2"),
    ("dilated", "if depth >= 2 and", "if False and"),
    ("pc_sampler", "torch.exp(-self.lam * slot)", "torch.exp(self.lam * slot)"),
    ("pc_sampler", ".clamp_max(self.alpha)", ".clamp_max(self.alpha * 2)"),
    ("pc_sampler", "view.masked, self.n)", "view.masked, self.n + 1)"),
    ("klass", "(confidence > self.tau)", "(confidence >= self.tau)"),
    ("klass", "kl < self.kl", "kl <= self.kl"),
    ("klass", "(stable_run >= self.history)", "(stable_run > self.history)"),
    ("klass", "view.state + 1", "view.state"),
    ("klass", "reveal_top(confidence, masked, 1)", "reveal_top(confidence, masked, 2)"),
    ("wino", "(conf > self.tau_in)", "(conf >= self.tau_in)"),
    ("wino", "(support < self.tau_out)", "(support <= self.tau_out)"),
    ("wino", "(accepted > 1)", "(accepted >= 1)"),
    ("wino", "last - 1", "last"),
    ("wino", ".clamp(5, 20)", ".clamp(1, 20)"),
]


@pytest.mark.parametrize("solver, old, new", MUTATIONS, ids=lambda v: v if " " not in v else None)
def test_every_ported_rule_mutation_fails_a_case(solver, old, new):
    cls = mutant(solver, old, new)
    survived = all(case.run(cls) == case.expected for case in CASES if case.solver == solver)
    assert not survived, f"replacing {old!r} by {new!r} in solvers/{solver}.py passes every case"


def test_unmutated_ported_sources_pass_their_cases():
    for solver in {case.solver for case in CASES}:
        cls = mutant(solver, "class ", "class ")
        assert all(case.run(cls) == case.expected for case in CASES if case.solver == solver), solver
