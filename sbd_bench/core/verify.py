"""Verified decoding (``--solver "name:...;verify=on"``, ``types.Verified``; docs/decoding.md, 'Verified
decoding'), kept apart as vLLM keeps its rejection sampler: any block solver drafts, and the core commits
only what NTP, read from the same first forward, confirms; the output is NTP's.

    >>> verify_drafts(pending=[7, 1, 2, 3], ntp=[1, 2, 9, 4])    # ([1, 2, 9], 2, True): draft 3 replaced by 9
    >>> decode_verified(decoder, call, last_prompt_tokens, cache) # the loop (Decoder.generate_batch)

Greedy, a draft is committed where it equals NTP's argmax after the tokens before it (``verify_drafts``);
sampled, drafts are judged by the speculative-sampling rule (``judge``, ``sampled_verdict``), up to the first
draft revealed before a draft to its left (``judgeable``). Rows accept different numbers of drafts:
afterwards each keeps only its accepted keys/values, moved to end at the shared end again (``realign``,
``cache.keep``); its padding grows by what the others kept more.
"""
from __future__ import annotations

import torch

from ..types import Solver
from .reveal import next_tokens, open_blocks, reveal, uniforms
from .sampling import probabilities, speculative_verify, to_device, verifiable_drafts
from .state import DecodeCall, Row
from .tracing import add_verdict


def verify_drafts(pending: list[int], ntp: list[int]) -> tuple[list[int], int, bool]:
    """The verify rule (greedy). ``pending``: the last committed token, then the drafts; ``ntp[i]``: NTP's
    token after pending[i], for every pending token (then NTP's token after the last draft starts the
    next block) or all but the last (a final check: nothing follows). Returns (tokens committed now,
    drafts accepted, whether a draft was replaced): the longest prefix of the drafts that agrees with
    NTP, then NTP's token, which replaces the first draft that differs or follows the last one."""
    drafts = pending[1:]
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == ntp[accepted]:
        accepted += 1
    if accepted < len(drafts):
        return drafts[:accepted] + [ntp[accepted]], accepted, True
    return drafts + ntp[len(drafts):], accepted, False


def sampled_verdict(pending: list[int], accepted: int, token: int, final: bool) -> tuple[list[int], int, bool]:
    """``verify_drafts`` for verified sampling, from ``judge``'s (accepted, token): the accepted drafts, then
    the token drawn after them, which replaces the next draft (rejected, or one the rule may not judge) or
    follows the last one (none after a final check). Returns (tokens committed now, accepted, replaced)."""
    drafts = pending[1:]
    if accepted < len(drafts):
        return drafts[:accepted] + [token], accepted, True
    return drafts + ([] if final else [token]), accepted, False


def judgeable(solver: Solver, r: Row) -> int:
    """How many of the row's drafts verified sampling may judge (``verifiable_drafts``). A revoking solver
    kept every draft it revealed before the block's last forward by a choice that saw it (not masking it
    again), so such a draft is no longer distributed as the q it was drawn from: only the leading drafts
    revealed in the block's last forward are judged (docs/decoding.md, 'Revocation')."""
    steps = r.reveal_step[1 : len(r.pending)]
    if solver.revokes:
        last = max(r.reveal_step, default=0)  # every forward reveals: the block's last forward
        return next((i for i, s in enumerate(steps) if s != last), len(steps))
    return verifiable_drafts(steps)


def judge(decoder, call: DecodeCall, ntp_logits: torch.Tensor, carried: list[list[int]],
          judged: list[int]) -> torch.Tensor:
    """Verified sampling's rule over the rows (``speculative_verify``): row b's drafts, ``pending[1:]``,
    against NTP's processed distributions read at its carried tokens (right-aligned in ``ntp_logits``
    (B, n, V)) and the distributions they were drawn from (``call.draft_probs``), its first ``judged[b]``
    judged. Returns (B, 2): drafts accepted, then the token drawn after them. Each live row takes
    len(drafts) + 1 numbers from its stream."""
    rows, (batch, n, vocab) = call.rows, ntp_logits.shape
    drafts = [r.pending[1:] if c else [] for r, c in zip(rows, carried)]
    most, device = max(map(len, drafts)), ntp_logits.device
    if n == 0:  # nothing carried (no row left to judge)
        return torch.zeros(batch, 2, dtype=torch.long, device=device)
    # NTP after carried token j predicts draft j; after the last draft, the token that follows (a final
    # check carries no token after its last draft: the clamped column is drawn from, never used)
    at = to_device([[min(n - len(c) + j, n - 1) for j in range(most + 1)] for c in carried], device)
    p = probabilities(ntp_logits.gather(1, at[..., None].expand(-1, -1, vocab)), call.sampling)  # (B, most + 1, V)
    q = call.draft_probs[:, 1 : 1 + most] if most else p[:, :0]  # slot 0 was NTP's own
    live = [not r.stop_reason for r in rows]
    accept_u = uniforms(decoder, rows, [len(d) if ok else 0 for d, ok in zip(drafts, live)], most)
    draw_u = uniforms(decoder, rows, [int(ok) for ok in live], 1)[:, 0]
    ids = to_device([d + [0] * (most - len(d)) for d in drafts], device)
    accepted, token = speculative_verify(p, q, ids, to_device(judged, device), accept_u, draw_u)
    return torch.stack([accepted, token], dim=-1)


def commit_verdict(decoder, r: Row, verdict: tuple[list[int], int, bool], carried: int, forward: int = 0) -> int:
    """After a block's first forward, one row: its drafts' ``verdict`` (``verify_drafts`` or
    ``sampled_verdict``), the tokens committed, a stop; the block ends here when a draft was replaced,
    the drafts were final or the row stopped (a block to draft would start elsewhere). Returns how many
    carried keys/values stay."""
    new, accepted, replaced = verdict
    if r.blocks["drafted_per_block"]:  # the previous block's drafts are judged now
        r.blocks["accepted_per_block"][-1], r.blocks["replaced_per_block"][-1] = accepted, int(replaced)
    first_new = len(r.out)
    r.out += new
    r.revealed.append(len(new))
    r.block_start = len(r.out) - 1  # the new block's first slot: NTP's token after the carried ones
    if r.trace is not None:
        add_verdict(r, forward, len(new), accepted, replaced)
    cut, reason = decoder.stop.stop_at(r.out, len(r.out), r.budget, first_new=first_new)
    if cut is not None or replaced or r.final:
        r.end_block(forwards=1)
        if cut is not None:
            r.revealed[-1] -= len(r.out) - cut
            r.stop(cut, reason)
        else:
            r.pending, r.final = r.out[-1:], False
    return accepted + 1 if replaced else carried


def realign(cache, rows: list[Row], carried: list[list[int]], kept: list[int], n: int) -> None:
    """After a first forward that appended ``n`` columns (row b's carried tokens at the right end):
    keep row b's first ``kept[b]`` carried tokens and drop the rest, filler included, so that every
    live row's columns end at the new shared end; its padding grows by what the others kept more."""
    live = [b for b, r in enumerate(rows) if not r.stop_reason]
    if not live:
        return
    if all(len(carried[b]) == n and kept[b] == kept[live[0]] for b in live):  # all alike: a rollback does
        cache.rollback(n - kept[live[0]])
        return
    before = cache.length - n
    own = {b: before - rows[b].pad for b in live}  # a row's positions cached before the forward
    width = max(own[b] + kept[b] for b in live)
    columns = torch.arange(width)
    source = columns.clamp_max(before + n - 1)[None].repeat(len(rows), 1)  # finished rows: anything
    for b in live:
        i = columns - (width - own[b] - kept[b])  # index into the row's own positions
        source[b] = torch.where(i < own[b], rows[b].pad + i, before + n - len(carried[b]) + i - own[b]).clamp_min(0)
        rows[b].pad = width - own[b] - kept[b]
    cache.keep(source)


def decode_verified(decoder, call: DecodeCall, last: list[int], cache) -> None:
    """Verified block decoding. Each block's first forward carries the last committed token and the previous
    block's drafts causally, right-aligned over the rows: a draft is committed only where it equals NTP's
    token after the tokens before it (``commit_verdict``). NTP's token after the last carried one is exact:
    it is the block's first position; the solver drafts the rest in the same step, as if every draft were
    accepted (one device read per forward), void for a row that rejects. Stops and the budget see committed
    tokens only, so the output is NTP's; sampled, it is distributed as NTP sampling's (``judge``)."""
    rows, solver, greedy = call.rows, call.solver, call.sampling.greedy
    device, filler = decoder.lm.device, decoder.lm.mask_token_id
    for r, token in zip(rows, last):
        r.pending = [token]
    while live := [b for b, r in enumerate(rows) if not r.stop_reason]:
        # 1. carry pending (its last draft too, unless final: drafting ended at a stop or the budget)
        carried = [[] if r.stop_reason else r.pending[:-1] if r.final else r.pending for r in rows]
        n = max(map(len, carried))
        if not greedy:  # how many drafts the rule may judge, from their reveal steps
            judged = [judgeable(solver, r) for r in rows]
        starts = [cache.length - r.pad + len(c) for r, c in zip(rows, carried)]
        block = open_blocks(decoder, call, starts, first=0)  # the first slot is NTP's, set below
        tokens = torch.tensor([[filler] * (n - len(c)) + c for c in carried], device=device)
        key_pad = decoder.key_pad(rows, cache, n, block.shape[1], carried)
        ntp_logits, logits = decoder.carry_step(tokens, block, decoder.per_row(starts), cache, key_pad, live,
                                                call.forwards)
        if greedy:
            ntp = next_tokens(decoder, call, ntp_logits, live)  # (B, n); a row's last carried token is at n - 1
            first = ntp[:, -1]
        else:  # (B, 2): the drafts the rule accepts, then the token drawn after them
            ntp, call.draft_probs = judge(decoder, call, ntp_logits, carried, judged), None
            first = ntp[:, 1]
        if block.shape[1]:
            block[:, 0] = first  # NTP's token after the last carried one: the block's first position
        # a row with one token left to commit has nothing to draft (``reveal.open_slots``)
        working = [b for b in live if rows[b].size > 1 and rows[b].budget - len(rows[b].out) > 1]
        block, ntp_host, drafts = reveal(decoder, call, logits, block, working, 0, ntp)
        kept = [0] * len(rows)  # carried keys/values that stay
        for b in live:
            r, c = rows[b], len(carried[b])
            verdict = (verify_drafts(r.pending, ntp_host[b][n - c:]) if greedy
                       else sampled_verdict(r.pending, *ntp_host[b], r.final))
            kept[b] = commit_verdict(decoder, r, verdict, c, call.forwards.row_nfe[b])
        realign(cache, rows, carried, kept, n)
        # 2. the draft goes on, a forward of the blocks alone each time, until a row's block is full or a
        # stop or the budget among its drafts ends it (drafting, not generation)
        step = 0
        while True:
            for r, row_drafts in zip(rows, drafts):
                cut, reason = r.block_stop(decoder.stop, row_drafts, committed=1) if r.open else (None, "")
                if cut is not None:
                    r.end_block(forwards=step + 1, drafted=cut - len(r.out))
                    r.pending, r.final = row_drafts[: 1 + cut - len(r.out)], reason != "block_done"
            if not (drafting := [b for b, r in enumerate(rows) if r.open]):
                break
            start = decoder.per_row([cache.length - r.pad for r in rows])
            logits = decoder.block_step(block[:, :0], block, start, cache, decoder.key_pad(rows, cache, 0, block.shape[1]),
                                        drafting, solver.reads_shadow, call.forwards)
            step += 1
            for b in drafting:
                rows[b].revealed.append(0)  # drafting forwards commit nothing
            block, drafts = reveal(decoder, call, logits, block, drafting, step)
