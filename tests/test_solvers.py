"""Conformance kit over every registered solver, golden tests of each built-in rule, and each rule's
boundary: crafted logits whose entropies and confidences are exact in float32 put a position exactly
on the bound, and flipping any rule's comparison (the mutations below) fails one of these cases."""
import math
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from sbd_bench.conformance import check_solver
from sbd_bench.registry import build_solver, solver_registry
from sbd_bench.types import BlockView, Solver, SolverError

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


# ------------------------------------------------------------------------------ rule boundaries
# A position uniform over its first n tokens has confidence exactly 1/n for n = 1, 2, 4, 8 and entropy
# exactly 0, LN2 and 2 * LN2 in float32 for n = 1, 2, 4 (LN2: float32 ln 2, as BlockView computes it);
# the sums the rules form of these are exact too. So each case below sits exactly on its rule's bound.
LN2 = float(torch.tensor(math.log(2), dtype=torch.float32))
BELOW_LN2 = float(torch.nextafter(torch.tensor(LN2), torch.tensor(0.0)))  # the float32 just below


@dataclass(frozen=True)
class Boundary:
    solver: str
    params: dict
    sizes: list[int]  # position i uniform over sizes[i] tokens
    expected: list[int]  # 1 where the position must be revealed
    masked: list[int] | None = None  # 1 where still masked (default: all)
    seed: int | None = None  # the view's generator seed (randomised solvers)
    why: str = field(default="", compare=False)

    def run(self, cls) -> list[int]:
        masked = torch.tensor([self.masked or [1] * len(self.sizes)], dtype=torch.bool)
        gen = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        view = BlockView(uniform_rows(self.sizes), masked, generator=gen)
        return build_solver(cls, self.params).select(view)[0].int().tolist()


BOUNDARIES = [
    # entropy_bounded: reveal the longest prefix (in proxy order) with sum(H) - max(H) <= gamma
    Boundary("entropy_bounded", {"gamma": 0.0}, [1, 2, 1, 4], [1, 1, 1, 0],
             why="H = 0, ln2, 0, 2ln2: the zeros cost nothing at gamma = 0, and sum - max of {0, 0, ln2} is exactly 0"),
    Boundary("entropy_bounded", {"gamma": LN2}, [2, 2, 4], [1, 1, 0], why="prefix {ln2, ln2}: sum - max = ln2 = gamma"),
    Boundary("entropy_bounded", {"gamma": 2 * LN2}, [2, 2, 4], [1, 1, 1], why="all: 4ln2 - 2ln2 = 2ln2 = gamma"),
    Boundary("entropy_bounded", {"gamma": BELOW_LN2}, [2, 2, 4], [1, 0, 0], why="just below: one"),
    Boundary("entropy_bounded", {"gamma": 0.0, "proxy": "confidence"}, [2, 1, 1], [1, 1, 1],
             why="confidence order 1, 1, 0.5: entropies 0, 0, ln2, sum - max = 0"),
    Boundary("entropy_bounded", {"gamma": 0.0}, [1, 1, 2, 1], [0, 1, 1, 0], masked=[0, 1, 1, 0],
             why="zero entropies of revealed positions are not revealed again"),
    # confidence: reveal every masked position with confidence >= tau, and at least the most confident
    Boundary("confidence", {"tau": 0.5}, [1, 2, 2, 4], [1, 1, 1, 0], why="confidences 1, .5, .5, .25 at tau = .5"),
    Boundary("confidence", {"tau": 0.25}, [1, 2, 2, 4], [1, 1, 1, 1], why="tau = .25: all"),
    Boundary("confidence", {"tau": 1.0}, [2, 1, 1, 2], [0, 1, 1, 0], why="tau = 1: every certain position"),
    Boundary("confidence", {"tau": 1.0}, [4, 2, 2], [0, 1, 0], why="none reaches tau: exactly one, the leftmost best"),
    # factor: largest n with (n + 1)(1 - c_(n)) < f; sorted 1, .5, .5, .25 give 0, 1.5, 2.0, 3.75
    Boundary("factor", {"f": 1.5}, [1, 2, 2, 4], [1, 0, 0, 0], why="n = 2 gives exactly f: not taken"),
    Boundary("factor", {"f": 2.0}, [1, 2, 2, 4], [1, 1, 0, 0], why="n = 3 gives exactly f: not taken"),
    Boundary("factor", {"f": 3.75}, [1, 2, 2, 4], [1, 1, 1, 0], why="n = 4 gives exactly f: not taken"),
    Boundary("factor", {"f": 10.0}, [2, 2, 1, 1], [1, 1, 0, 0], masked=[1, 1, 0, 0],
             why="n never exceeds the masked count (revealed positions count as confidence 0)"),
    Boundary("factor", {"f": 0.01}, [2, 4, 2], [1, 0, 0], why="nothing holds: still one position"),
    # fixed_k: the k most confident masked positions, ties to the leftmost
    Boundary("fixed_k", {"k": 1}, [2, 1, 4, 1], [0, 1, 0, 0], why="k = 1: one; the tie of two certain ones: leftmost"),
    Boundary("fixed_k", {"k": 2}, [2, 1, 4, 1], [0, 1, 0, 1]),
    Boundary("fixed_k", {"k": 3}, [2, 1, 4, 1], [1, 1, 0, 1], masked=[1, 1, 1, 1]),
    Boundary("fixed_k", {"k": 3}, [2, 1, 4, 1], [1, 0, 1, 1], masked=[1, 0, 1, 1], why="k = #masked: all of them"),
    Boundary("fixed_k", {"k": 5}, [2, 1, 4, 1], [1, 0, 1, 0], masked=[1, 0, 1, 0], why="k > #masked: no more"),
    # left_to_right: the leftmost n masked positions, whatever the confidence
    Boundary("left_to_right", {"n": 1}, [4, 4, 1, 1], [0, 1, 0, 0], masked=[0, 1, 1, 1]),
    Boundary("left_to_right", {"n": 2}, [4, 4, 1, 1], [1, 0, 1, 0], masked=[1, 0, 1, 1]),
    Boundary("left_to_right", {"n": 3}, [4, 4, 1, 1], [0, 1, 1, 1], masked=[0, 1, 1, 1], why="n = #masked: all"),
    Boundary("left_to_right", {"n": 9}, [4, 4, 1, 1], [1, 0, 0, 1], masked=[1, 0, 0, 1], why="n > #masked: no more"),
    # random_order: n uniformly random masked positions drawn from the view's generator (golden draws)
    Boundary("random_order", {"n": 1}, [2] * 8, [0, 0, 0, 0, 0, 0, 1, 0], seed=3, why="n = 1: exactly one"),
    Boundary("random_order", {"n": 3}, [2] * 8, [0, 0, 0, 0, 1, 0, 1, 1], seed=3),
    Boundary("random_order", {"n": 3}, [2] * 8, [0, 0, 1, 0, 1, 1, 0, 0], seed=11),
    Boundary("random_order", {"n": 2}, [2] * 4, [1, 0, 1, 0], masked=[1, 0, 1, 0], seed=3, why="n = #masked"),
    Boundary("random_order", {"n": 5}, [2] * 4, [0, 1, 0, 1], masked=[0, 1, 0, 1], seed=3, why="n > #masked"),
]


def test_crafted_rows_are_exact():
    view = BlockView(uniform_rows([1, 2, 4, 8]), torch.ones(1, 4, dtype=torch.bool))
    assert view.entropy[0].tolist()[:3] == [0.0, LN2, 2 * LN2]
    assert view.confidence[0].tolist() == [1.0, 0.5, 0.25, 0.125]


@pytest.mark.parametrize("case", BOUNDARIES, ids=lambda c: f"{c.solver}-{c.params}-{c.sizes}-{c.masked}-{c.seed}")
def test_rule_boundary(case):
    assert case.run(REGISTRY[case.solver]) == case.expected, case.why


# Each built-in rule's comparison flipped or its count moved by one. A mutant is built from the solver's
# source with one edit; some boundary case above must then fail.
MUTATIONS = [
    ("entropy_bounded", "(bound <= self.gamma)", "(bound < self.gamma)"),
    ("entropy_bounded", "keepdim=True).clamp_min(1)", "keepdim=True).clamp_min(2)"),
    ("confidence", "(conf >= self.tau)", "(conf > self.tau)"),
    ("confidence", "reveal_top(conf, view.masked, 1)", "reveal_top(conf, view.masked, 2)"),
    ("factor", "(1 - c_sorted) < self.f)", "(1 - c_sorted) <= self.f)"),
    ("factor", "(n <= view.masked.sum(-1, keepdim=True))", "(n < view.masked.sum(-1, keepdim=True))"),
    ("fixed_k", "view.masked, self.k)", "view.masked, self.k + 1)"),
    ("fixed_k", "view.masked, self.k)", "view.masked, self.k - 1)"),
    ("left_to_right", "leftness = -torch.arange", "leftness = torch.arange"),
    ("left_to_right", "view.masked, self.n)", "view.masked, self.n + 1)"),
    ("random_order", "view.masked, self.n)", "view.masked, self.n + 1)"),
    ("random_order", "generator=view.generator, ", ""),
]
SOLVERS_DIR = Path(__file__).resolve().parent.parent / "solvers"


def mutant(solver: str, old: str, new: str) -> type[Solver]:
    """The solver class built from its source file with ``old`` replaced by ``new`` (once)."""
    source = (SOLVERS_DIR / f"{solver}.py").read_text()
    assert source.count(old) == 1, f"solvers/{solver}.py no longer holds {old!r} once: update MUTATIONS"
    module = types.ModuleType(f"mutant_{solver}")
    sys.modules[module.__name__] = module  # dataclasses look their module up while building the class
    try:
        exec(compile(source.replace(old, new), f"mutant of solvers/{solver}.py", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return next(v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Solver) and v.name == solver)


@pytest.mark.parametrize("solver, old, new", MUTATIONS, ids=lambda v: v if " " not in v else None)
def test_every_rule_mutation_fails_a_boundary_case(solver, old, new):
    cls = mutant(solver, old, new)
    torch.manual_seed(1)  # a mutant that ignores the view's generator draws from the global one
    survived = all(case.run(cls) == case.expected for case in BOUNDARIES if case.solver == solver)
    assert not survived, f"replacing {old!r} by {new!r} in solvers/{solver}.py passes every boundary case"


def test_unmutated_sources_pass_the_boundary_cases():
    for solver in {case.solver for case in BOUNDARIES}:  # the mutants' source path builds working solvers
        cls = mutant(solver, "class ", "class ")
        assert all(case.run(cls) == case.expected for case in BOUNDARIES if case.solver == solver), solver
