"""A block forward's solver step: the blocks opened, the slots the solver may reveal, its choice (and
sampling's draws), and the reveal kept on the host after the forward's one device read, contract checked.
Shared by block decoding (decoding.py) and verified decoding (verify.py).

    >>> block = open_blocks(decoder, call, starts)                  # (B, w) all masked
    >>> block, tokens = reveal(decoder, call, logits, block, working, step)

Tokens are chosen from logits in ``next_tokens`` (NTP's) and ``choose`` (a block's). At the block's last
allowed forward (``max_block_forwards``) every slot still masked is revealed from its logits.
"""
from __future__ import annotations

import torch

from ..types import BlockView, Decision
from .checks import check_decision, check_finite, check_reveal
from .history import BlockMemory
from .sampling import draw, probabilities, uniform_rows
from .state import DecodeCall, Row, to_host
from .tracing import add_forward, block_proxies


def open_blocks(decoder, call: DecodeCall, starts: list[int], first: int = -1) -> torch.Tensor:
    """A new block for every row that goes on, at ``starts``: k slots, or what the model's context leaves,
    all masked, (B, widest); ``first``: the first slot's ``reveal_step`` (0: revealed by the first forward)."""
    rows = call.rows
    for r, start in zip(rows, starts):
        r.size = 0 if r.stop_reason or r.final else min(decoder.block_size, decoder.context - start)
        r.reveal_step, r.open = ([first] + [-1] * (r.size - 1))[: r.size], r.size > 0
        r.fixed, r.remasked, r.forced, r.block_start = int(first >= 0 and r.size > 0), 0, 0, len(r.out)
    block = torch.full((len(rows), max(r.size for r in rows)), decoder.lm.mask_token_id, dtype=torch.long,
                       device=decoder.lm.device)
    # (B, w) the slots before the budget (verified: counted as if no draft were accepted, so never too few),
    # and whether slot 0 is the core's (a stop there ends the row at once): ``open_slots``, every forward
    limits = [r.budget - len(r.out) for r in rows]
    in_budget = None if min(limits) >= block.shape[1] else (  # None: every slot is (most blocks)
        torch.arange(block.shape[1], device=block.device) < torch.tensor(limits, device=block.device)[:, None])
    call.scope = (in_budget, first >= 0)
    if call.solver.keeps_history:
        call.memory = BlockMemory.open(block, core_first=first >= 0)
    return block


def open_slots(decoder, call: DecodeCall, block: torch.Tensor) -> torch.Tensor:
    """(B, w) bool: the masked slots the solver may reveal, those that can still change the output: none
    after the block's first revealed stop token, none past the budget (docs/decoding.md, 'Stops inside a
    block'). A block ends once every slot before its stop is revealed, so no forward goes to slots the
    cut drops. A slot is masked while it holds the mask token (never emitted): no copy to the device,
    which would wait for the forward before the solver's work is queued."""
    in_budget, first_is_core = call.scope
    masked = block == decoder.lm.mask_token_id
    if in_budget is not None:
        masked &= in_budget
    if decoder.stop_ids.numel():
        stops = torch.isin(block, decoder.stop_ids)
        if first_is_core and block.shape[1]:  # verified: NTP's token at slot 0 stops the row at this forward
            stops[:, 0] = False
        masked &= stops.cumsum(1) <= stops  # no stop strictly before the slot
    return masked


def working_slots(rows: list[Row], working: list[int], block: torch.Tensor) -> torch.Tensor:
    """(B, w) bool: the slots of the working rows' blocks."""
    working = set(working)
    sizes = torch.tensor([r.size if b in working else 0 for b, r in enumerate(rows)], device=block.device)
    return torch.arange(block.shape[1], device=block.device) < sizes[:, None]


def uniforms(decoder, rows: list[Row], counts: list[int], width: int) -> torch.Tensor:
    """(B, width) numbers on the device: row b's next counts[b] from its stream, zeros after them."""
    u = uniform_rows([r.stream for r in rows], counts, decoder.lm.device)
    return torch.nn.functional.pad(u, (0, width - u.shape[1]))


def next_tokens(decoder, call: DecodeCall, logits: torch.Tensor, working: list[int]) -> torch.Tensor:
    """NTP's token from next-token logits (B, 1, V) -> (B, 1): the argmax at temperature 0, else a draw
    from the processed distribution, one number from each working row's stream."""
    if call.sampling.greedy:
        return logits.argmax(-1)
    working_set = set(working)
    u = uniforms(decoder, call.rows, [int(b in working_set) for b in range(len(call.rows))], 1)
    return draw(probabilities(logits, call.sampling), u[:, :1])


def draw_block(decoder, call: DecodeCall, logits: torch.Tensor, working: list[int], chosen: torch.Tensor,
               step: int) -> torch.Tensor:
    """Sampled tokens for every slot of a block's logits (B, w, V), each working row taking its block's
    size in numbers from its stream (the solver chose positions from the untempered logits; only the
    chosen slots keep their draw). Verified, the distributions of the chosen slots are kept for
    ``verify.judge`` (``call.draft_probs``, anew at a block's first forward)."""
    rows, (batch, width) = call.rows, chosen.shape
    probs = probabilities(logits, call.sampling)  # (B, w, V)
    working_set = set(working)
    u = uniforms(decoder, rows, [rows[b].size if b in working_set else 0 for b in range(batch)], width)
    if call.solver.verify:
        kept = call.draft_probs if step and call.draft_probs is not None else torch.zeros_like(probs)
        call.draft_probs = torch.where(chosen[..., None], probs, kept)
    return draw(probs, u)


def decide(solver, view: BlockView) -> tuple:
    """The solver's answer for one view: (reveal, remask or None, state or None), its shapes checked."""
    decision = solver.select(view)
    picked, dropped, kept = ((decision.reveal, decision.remask, decision.state)
                             if isinstance(decision, Decision) else (decision, None, None))
    check_decision(solver, picked, dropped, kept, view.masked)
    return picked, dropped, kept


def _whole(x: torch.Tensor | None) -> torch.Tensor | None:
    return x


def choose_in_groups(decoder, call: DecodeCall, logits, block, working: list[int], step: int, masked_slots, memory,
                     shadow) -> tuple:
    """``choose``'s solver calls for a batch: (chosen, remask, state, tokens) over the whole (B, w) block."""
    solver, rows, (batch, width) = call.solver, call.rows, block.shape
    sizes = {rows[b].size for b in working}
    if solver.deterministic and len(sizes) == 1 and not decoder.lm.exact:
        groups = [(working, sizes.pop(), None)]
    else:
        groups = [([b], rows[b].size, rows[b].generator) for b in working]
    chosen = tokens = remask = state = None
    for idx, size, generator in groups:
        whole = len(idx) == batch and size == width

        def part(x: torch.Tensor | None) -> torch.Tensor | None:
            return x if x is None or whole else x[idx, :size]

        history = {} if memory is None else memory.view(part, block, shadow)
        view = BlockView(logits=part(logits), masked=part(masked_slots), step=step, generator=generator, **history)
        picked, dropped, kept = decide(solver, view)
        if whole:
            return picked, dropped, kept, view.tokens if call.sampling.greedy else None
        if chosen is None:
            chosen, tokens = torch.zeros(block.shape, dtype=torch.bool, device=block.device), torch.zeros_like(block)
        chosen[idx, :size] = picked
        if dropped is not None:
            remask = torch.zeros_like(chosen) if remask is None else remask
            remask[idx, :size] = dropped
        if kept is not None:
            state = kept.new_zeros(block.shape + kept.shape[2:]) if state is None else state
            state[idx, :size] = kept
        if call.sampling.greedy:
            tokens[idx, :size] = view.tokens
    return chosen, remask, state, tokens


def choose(decoder, call: DecodeCall, logits: torch.Tensor, block: torch.Tensor, working: list[int], step: int,
           forced: bool = False):
    """One solver decision over the working rows: (the solver's picks (B, w) bool, its remask (B, w) bool
    or None, the block with the chosen slots set to their argmax, or sampled, to their draws: ``draw_block``,
    and masked again where remasked). One batched call when they share a block size and the solver draws
    nothing; else row by row, each row with its own generator, so that its draws match batch 1's; row by
    row in exact mode too, so that each row's call is batch 1's (core/exact.py). ``forced``: every masked
    slot is chosen, the remask dropped."""
    solver, rows, (batch, width) = call.solver, call.rows, block.shape
    shadow = None
    if logits.shape[1] > width:  # (B, w, V) the block's shadow follows it
        logits, shadow = logits[:, :width], logits[:, width:]
    memory = call.memory if solver.keeps_history else None
    masked_slots = open_slots(decoder, call, block)
    if batch == 1 and rows[0].size == width:  # batch 1: one call, the view is the block itself
        history = {} if memory is None else memory.view(_whole, block, shadow)
        view = BlockView(logits=logits, masked=masked_slots, step=step, generator=rows[0].generator, **history)
        chosen, remask, state = decide(solver, view)
        tokens = view.tokens if call.sampling.greedy else None
    else:
        chosen, remask, state, tokens = choose_in_groups(decoder, call, logits, block, working, step, masked_slots,
                                                         memory, shadow)
    revealed = chosen
    if forced:  # every masked slot of the working rows (an idle row's masked slots are filler)
        revealed, remask = (chosen | (block == decoder.lm.mask_token_id)) & working_slots(rows, working, block), None
    if not call.sampling.greedy:
        tokens = draw_block(decoder, call, logits, working, revealed, step)
    block = torch.where(revealed, tokens, block)
    if remask is not None:  # what the solver may drop is checked on the host (reveal)
        block = block.masked_fill(remask, decoder.lm.mask_token_id)
    if memory is not None:
        memory.record(revealed, remask, logits, state, step)
    return chosen, remask, block


def reveal(decoder, call: DecodeCall, logits: torch.Tensor, block: torch.Tensor, working: list[int], step: int,
           *also: torch.Tensor):
    """The solver's choice for the rows with work, set in ``block``; the forward's one device read (of
    ``also``, the block and the choice); the choice kept in each row's ``reveal_step`` (contract checked).
    ``logits`` (B, w, V), or (B, 2w, V) with the block's shadow after it. At the block's last allowed
    forward (``max_block_forwards``) every slot still masked is revealed and the solver's remask ignored.
    Returns (the block, host rows of each of ``also``, host rows of the block)."""
    rows, finite = call.rows, call.forwards.finite
    if not working:
        *host, ok = to_host(*also, block, finite)
        check_finite(rows, ok)
        return block, *host
    forced = step + 1 >= decoder.max_block_forwards
    picked, remask, block = choose(decoder, call, logits, block, working, step, forced)
    host = to_host(*also, block, picked, *([remask] if remask is not None else []), finite)
    check_finite(rows, host.pop())
    dropped = host.pop() if remask is not None else None
    picked = host.pop()
    proxies = block_proxies(logits[:, : block.shape[1]]) if call.tracing else None
    for b in working:
        r, row_picked = rows[b], picked[b]
        if proxies is not None:
            masked = [i for i, s in enumerate(r.reveal_step) if s == -1]
            revealed = masked if forced else [i for i, c in enumerate(row_picked) if c]
            revoked = [] if forced or dropped is None else [i for i, d in enumerate(dropped[b]) if d]
            add_forward(r, call.forwards.row_nfe[b], "verify" if also else "block", r.block_start, masked,
                        ([0] if also and r.fixed else []) + revealed, revoked, host[-1][b][: r.size], proxies[b],
                        decoder.lm.mask_token_id)
        row_dropped = None if forced or dropped is None else dropped[b]
        check_reveal(call.solver.name, row_picked, row_dropped, r.reveal_step, r.fixed)
        if forced:
            r.forced += r.reveal_step.count(-1) - sum(row_picked)
            r.reveal_step = [step if s == -1 else s for s in r.reveal_step]
            continue
        r.remasked += sum(row_dropped or ())
        r.reveal_step = [step if c else -1 if d else s
                         for s, c, d in zip(r.reveal_step, row_picked, row_dropped or [False] * len(row_picked))]
    return block, *host
