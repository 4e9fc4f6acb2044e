"""The solver conformance kit: checks every solver must pass, whoever wrote it.

    >>> from sbd_bench.conformance import check_solver, play_block
    >>> check_solver(MySolver())        # raises AssertionError naming the broken rule
    >>> play_block(MySolver(), [logits_0, logits_1, ...])   # one block forward by forward, as the core runs it

``test_conformance`` in tests/test_solvers.py runs it over every registered solver (built-ins, entry
points, and the folders in the SBD_BENCH_PLUGINS environment variable), so a plugin gets it for free:
``SBD_BENCH_PLUGINS=my_solvers/ python -m pytest tests/test_solvers.py -k conformance``.

``play_block`` hands a solver the view the core would (history, state and shadow included, for the solvers
that ask) over crafted logits, and checks each answer against the contract: the way to pin a ported
rule's boundaries without a model (docs/solvers.md, 'Porting a paper's sampler').
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .types import BlockView, Decision, Solver

MASK = -1  # the mask token's id in the kit's blocks (the core uses the model's; solvers never compare ids)


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


@dataclass
class Forward:
    """One forward of ``play_block``: what the solver was shown and what it answered."""

    view: BlockView
    reveal: torch.Tensor  # (B, k) bool
    remask: torch.Tensor  # (B, k) bool (all False for a solver that does not revoke)


def _answer(decision) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    if isinstance(decision, Decision):
        return decision.reveal, decision.remask, decision.state
    return decision, None, None


def play_block(solver: Solver, logits: list[torch.Tensor], shadows: list[torch.Tensor | None] | None = None,
               masked: torch.Tensor | None = None, max_forwards: int | None = None,
               generator_seed: int = 7) -> list[Forward]:
    """Decode one block as the core does: forward t shows ``logits[t]`` (B, k, V) (the last one again once
    the list runs out), and to a solver that reads the shadow ``shadows[t]`` from forward 1 on. The history
    (block, revealed_at, previous_logits, state) is handed over, the reveals set to the argmax, the remasks
    masked again, until no position is masked or ``max_forwards`` (default 2k) forwards have run. Each answer
    is checked against the contract (AssertionError naming the broken rule); returns the forwards."""
    name, first = solver.label, logits[0]
    batch, k, _ = first.shape
    remaining = torch.ones(batch, k, dtype=torch.bool) if masked is None else masked.clone()
    block = torch.where(remaining, MASK, first.argmax(-1))
    revealed_at = torch.where(remaining, -1, -2)  # positions revealed before the block: the core's own
    previous = state = None
    generator, forwards = torch.Generator().manual_seed(generator_seed), []
    for step in range(max_forwards or 2 * k):
        if not remaining.any():
            break
        now = logits[min(step, len(logits) - 1)]
        shadow = None
        if solver.reads_shadow and step > 0:
            assert shadows, f"{name} reads the shadow: give play_block shadow logits"
            shadow = shadows[min(step, len(shadows) - 1)]
        history = dict(block=block.clone(), revealed_at=revealed_at.clone(), previous_logits=previous,
                       state=state, shadow_logits=shadow) if solver.keeps_history else {}
        view = BlockView(now.clone(), remaining.clone(), step=step, generator=generator, **history)
        reveal, remask, state = _answer(solver.select(view))
        assert isinstance(reveal, torch.Tensor) and reveal.dtype == torch.bool, f"{name}: select must return a bool tensor"
        assert reveal.shape == remaining.shape, f"{name}: select returned shape {tuple(reveal.shape)}, expected {tuple(remaining.shape)}"
        assert not (reveal & ~remaining).any(), f"{name}: revealed a position that was not masked"
        assert (reveal.sum(-1)[remaining.any(-1)] >= 1).all(), f"{name}: revealed nothing in a row that still had masks"
        assert torch.equal(view.logits, now) and torch.equal(view.masked, remaining), f"{name}: modified its inputs"
        if solver.keeps_history:
            assert torch.equal(view.block, block) and torch.equal(view.revealed_at, revealed_at), \
                f"{name}: modified the view's history"
        if remask is None:
            remask = torch.zeros_like(reveal)
        else:
            assert solver.revokes, f"{name}: returned Decision.remask without revokes = True"
            assert remask.dtype == torch.bool and remask.shape == reveal.shape, f"{name}: remask must be a (B, k) bool tensor"
            assert not (remask & ~(revealed_at >= 0)).any(), \
                f"{name}: masked again a position it had not revealed in an earlier forward of this block"
        if state is not None:
            assert state.shape[:2] == reveal.shape, f"{name}: Decision.state must be shaped (B, k, ...)"
        forwards.append(Forward(view, reveal, remask))
        block = torch.where(reveal, now.argmax(-1), block).masked_fill(remask, MASK)
        revealed_at = revealed_at.masked_fill(reveal, step).masked_fill(remask, -1)
        remaining = (remaining & ~reveal) | remask
        previous = now
    return forwards


def contradicted_block(k: int = 8, vocab: int = 50) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A block built to need a revocation, as (logits, shadows) for ``play_block`` (batch 1): at forward 0 the
    first k/2 slots are sure of token i + 1 (p = 0.998) and the rest unsure (uniform); from forward 1 on the
    rest are sure of their tokens, while the block's own logits and the shadow at the first k/2 slots give
    the token revealed there p = 1e-9 and are sure of another: every signal says the early reveals were wrong."""
    half = k // 2
    first = torch.zeros(1, k, vocab)
    later = torch.zeros(1, k, vocab)
    for i in range(k):
        if i < half:
            first[0, i, i + 1] = 10.0
            later[0, i, i + 1], later[0, i, half + i + 1] = -10.0, 10.0
        else:
            later[0, i, i + 1] = 10.0
    for logits in (first, later):
        logits[..., vocab - 1] = float("-inf")  # the mask token
    return [first, later], [later, later]


def check_solver(solver: Solver, k: int = 8, vocab: int = 50, seeds: range = range(3)) -> None:
    if not solver.decodes_blocks:
        return  # the NTP baseline never selects: the core decodes it through the causal stream
    name = solver.label
    for seed in seeds:
        logits, masked = random_views(k=k, vocab=vocab, seed=seed)
        # one forward twice on the same view: the same answer (a randomised solver: the same generator seed)
        first = play_block(solver, [logits], masked=masked, max_forwards=1)[0]
        again = play_block(solver, [logits], masked=masked, max_forwards=1)[0]
        assert torch.equal(first.reveal, again.reveal), f"{name}: not deterministic for the same inputs and generator seed"
        # whole blocks whose logits change from forward to forward (a history to read), with a shadow:
        # every block ends within the core's bound (2k) without the core forcing it
        gen = torch.Generator().manual_seed(100 + seed)
        changing = [logits + torch.randn(logits.shape, generator=gen) * 0.5 * step for step in range(2 * k)]
        shadows = [torch.randn(logits.shape, generator=gen) * 3.0 for _ in range(2 * k)]
        for start in (masked, torch.ones_like(masked)):
            forwards = play_block(solver, changing, shadows, masked=start)
            left = start.clone()
            for f in forwards:
                left = (left & ~f.reveal) | f.remask
            assert not left.any(), f"{name}: did not finish a block of {k} positions within 2k = {2 * k} forwards"
            if not solver.revokes:
                assert len(forwards) <= k, f"{name}: took more than k = {k} forwards for a block of {k}"
    if solver.revokes:  # a solver that says it revokes must, where every signal says a reveal was wrong
        logits, shadows = contradicted_block(k, vocab)
        forwards = play_block(solver, logits, shadows)
        assert any(f.remask.any() for f in forwards), (
            f"{name}: revokes = True, yet it masked nothing again in a block built to need it (contradicted_block: "
            f"tokens revealed at forward 0 that every later forward, the shadow included, gives p = 1e-9); a solver "
            f"that never revokes leaves revokes False")
