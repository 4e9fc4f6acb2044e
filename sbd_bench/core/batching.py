"""Batched decoding: B prompts decoded together, each row with its own prompt length, masked set,
progress and stop. Greedy outputs and per-row NFE equal those of ``Decoder.generate`` at batch 1
(tests/test_batching.py); only the wall time is shared.

    >>> gens = BatchDecoder(Decoder(lm, block_size=16, max_new_tokens=128)).generate(prompts, solver)
    >>> [g.output_text for g in gens], [g.nfe for g in gens]

Layout (B rows, P = longest prompt). Prompts are left-padded to P: cache column c of row b holds
that row's position c - pad_b, and a key padding mask hides columns < pad_b from row b. All rows
share the cache columns, so they move in lockstep, block-synchronously: every row's block starts at
column P (at its own position P_b), each forward serves every row, and a row whose block is done
(or that has stopped) idles until the others have finished theirs. A row's NFE counts only the
forwards in which it had work, which is exactly its forward count at batch 1; idle rows cost compute
but no NFE. Near the end of the context a row's block may be shorter than k: its missing slots are
hidden by the key padding mask and never masked, so the solver sees the same block as at batch 1.

Solvers are batched (``select`` takes (B, k)): deterministic ones are called once per forward on the
rows that have work. A solver that draws from ``view.generator`` (``deterministic = False``) is called
row by row, each row with its own generator seeded like batch 1, so its draws match batch 1 too.

Verify mode works the same way, block-synchronously: rows accept different numbers of drafts, so after
each block's first forward every row keeps only its own accepted keys/values, moved to end at the shared
end column again (``_realign``, ``cache.keep``); its left padding grows by what the others kept more.

Timing: a row's ``prefill_time_s`` and ``decode_time_s`` are its 1/B share of its batch's times, so
tokens / wall time over the records is the batch's throughput.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..types import BlockView, Generation, Solver
from .decoding import (Counters, Decoder, SolverContractError, _check_reveal, _check_shape, _clock, _end_block,
                       _new_blocks, check_logits, to_host, verify_drafts)
from .masks import Pattern


@dataclass
class _Row:
    prompt_len: int
    pad: int  # left padding columns
    budget: int
    generator: torch.Generator | None
    out: list[int] = field(default_factory=list)
    revealed: list[int] = field(default_factory=list)
    per_block: list[int] = field(default_factory=list)
    nfe: int = 0
    stop_reason: str = ""  # set once the row has stopped
    size: int = 0  # this block's size (k, or less at the end of the context)
    steps: int = 0  # forwards spent on this block
    reveal_step: torch.Tensor | None = None  # (size,) forward index that revealed each slot

    @property
    def finished(self) -> bool:
        return bool(self.stop_reason)


@dataclass
class _VerifiedRow(_Row):
    """A row in verify mode: what it carries into the next first forward, and its per-block verdicts."""
    pending: list[int] = field(default_factory=list)  # the last committed token, then the drafts to verify
    final: bool = False  # the drafts end at a stop or the budget: verify them and draft no more
    cached: int = 0  # positions in the cache; the row's columns end at the shared end, after its padding
    drafting: bool = False
    blocks: dict = field(default_factory=_new_blocks)

    def __post_init__(self):
        self.per_block = self.blocks["forwards_per_block"]

    def verdicts(self) -> dict:
        return {name: values for name, values in self.blocks.items() if name != "forwards_per_block"}


class BatchDecoder:
    """Runs the primitives of a ``Decoder`` (``forward``, ``ntp_step``, ``block_step``) over B rows."""

    def __init__(self, decoder: Decoder):
        self.d = decoder

    def generate(self, prompts: list[list[int]], solver: Solver) -> list[Generation]:
        d, lm = self.d, self.d.lm
        device, k = lm.device, d.block_size
        if not prompts:
            return []
        for ids in prompts:
            d.check_prompt(ids)
        batch, longest = len(prompts), max(len(p) for p in prompts)
        d.counters = Counters()
        verified = solver.decodes_blocks and solver.verify
        rows = [(_VerifiedRow if verified else _Row)(
                    prompt_len=len(p), pad=longest - len(p), budget=d._budget(len(p)),
                    generator=None if solver.deterministic else torch.Generator().manual_seed(d.seed))
                for p in prompts]
        pad_id = getattr(lm.tokenizer, "pad_token_id", None)
        ids = torch.full((batch, longest), 0 if pad_id is None else pad_id, dtype=torch.long, device=device)
        for b, p in enumerate(prompts):
            ids[b, rows[b].pad:] = torch.tensor(p, dtype=torch.long, device=device)
        pads = torch.tensor([r.pad for r in rows], device=device)
        columns = torch.arange(longest, device=device)
        self.prompt_pad = columns[None] < pads[:, None]  # (B, P) True on left padding
        positions = (columns[None] - pads[:, None]).clamp_min(0)  # (B, P)
        self.committed = 0  # cache columns holding committed tokens (python-side: no device sync)
        cache = d.new_cache(batch, longest + max(r.budget for r in rows) + 2 * k)

        t0 = _clock(device)
        if longest > 1:  # 1. prefill all but the last prompt column, causally, padding hidden
            d.forward(ids[:, :-1], positions[:, :-1], Pattern(longest - 1, 0, self.prompt_pad[:, :-1]), cache,
                      phase="prefill", keep=1)
            self.committed = longest - 1
        t1 = _clock(device)
        try:
            if verified:  # 2. decode
                self._decode_verified(ids, rows, solver, cache)
            elif solver.decodes_blocks:
                self._decode_blocks(ids, rows, solver, cache)
            else:
                self._decode_ntp(ids, rows, cache)
        except SolverContractError:  # NaN logits make any solver look broken: the model is named instead
            check_logits(lm, d.last_logits, f"forward {d.counters.nfe} of {solver.label}")
            raise
        t2 = _clock(device)
        return [Generation(output_ids=r.out, stop_reason=r.stop_reason, nfe=r.nfe,
                           prefill_forwards=int(r.prompt_len > 1), revealed_per_forward=r.revealed,
                           forwards_per_block=r.per_block, prefill_time_s=(t1 - t0) / batch,
                           decode_time_s=(t2 - t1) / batch, output_text=d._text(r.out, r.stop_reason),
                           **(r.verdicts() if verified else {}))
                for r in rows]

    # ------------------------------------------------------------------------------ helpers
    def _key_pad(self, query_pad: torch.Tensor) -> torch.Tensor:
        """(B, committed + Q) True where a row may not look: its prompt padding, ``query_pad``."""
        batch, prompt_cols = self.prompt_pad.shape[0], min(self.committed, self.prompt_pad.shape[1] - 1)
        rest = torch.zeros(batch, self.committed - prompt_cols, dtype=torch.bool, device=query_pad.device)
        return torch.cat([self.prompt_pad[:, :prompt_cols], rest, query_pad], dim=1)

    def _clamp(self, positions: torch.Tensor) -> torch.Tensor:
        """Idle rows run past their end: keep their (unused) positions inside the model's range."""
        top = self.d.lm.max_positions
        return positions if top is None else positions.clamp_max(top - 1)

    # ---------------------------------------------------------------------------------- NTP
    def _decode_ntp(self, ids: torch.Tensor, rows: list[_Row], cache) -> None:
        d, batch = self.d, ids.shape[0]
        token = ids[:, -1:]  # (B, 1)
        position = torch.tensor([[r.prompt_len - 1] for r in rows], device=ids.device)  # (B, 1)
        no_pad = torch.zeros(batch, 1, dtype=torch.bool, device=ids.device)
        while not all(r.finished for r in rows):
            logits = d.ntp_step(token, self._clamp(position), cache, self._key_pad(no_pad))  # (B, V)
            self.committed += 1
            token = logits.argmax(-1, keepdim=True)  # (B, 1)
            picked = token[:, 0].tolist()
            for b, r in enumerate(rows):
                if r.finished:
                    continue
                r.out.append(picked[b])
                r.nfe += 1
                cut, reason = d._stop(r.out, len(r.out), r.budget, first_new=len(r.out) - 1)
                if cut is not None:
                    r.out, r.stop_reason = r.out[:cut], reason
                    r.revealed = [1] * len(r.out)
                    r.per_block = [min(d.block_size, len(r.out) - i) for i in range(0, len(r.out), d.block_size)]
            position = position + 1

    # ------------------------------------------------------------------------------- blocks
    def _decode_blocks(self, ids: torch.Tensor, rows: list[_Row], solver: Solver, cache) -> None:
        d, lm, k, device = self.d, self.d.lm, self.d.block_size, ids.device
        batch = ids.shape[0]
        pending = ids[:, -1:]  # (B, n): the last prompt token, then each finished block
        starts = [r.prompt_len for r in rows]  # positions, kept on the host
        slot = torch.arange(k)
        while not all(r.finished for r in rows):
            for r, start in zip(rows, starts):
                r.size = max(1, d._block_room(start))
                r.steps, r.reveal_step = 0, torch.full((r.size,), -1, dtype=torch.long)
            absent = slot[None] >= torch.tensor([[r.size] for r in rows])  # (B, k): slots past a row's context
            # the host copy of ``masked`` drives the bookkeeping: no device sync per row
            masked_host = ~absent & torch.tensor([[not r.finished] for r in rows])
            absent, masked = absent.to(device), masked_host.to(device)
            block = torch.full((batch, k), lm.mask_token_id, dtype=torch.long, device=device)
            start = self._clamp(torch.tensor(starts, device=device))
            step = 0
            while masked_host.any():
                working = masked_host.any(-1).nonzero()[:, 0].tolist()
                if step == 0:  # the finished block (or last prompt token) is committed in this forward
                    key_pad = self._key_pad(torch.cat([torch.zeros_like(pending, dtype=torch.bool), absent], 1))
                    logits = d.block_step(pending, block, start, cache, key_pad)
                    self.committed += pending.shape[1]
                else:
                    logits = d.block_step(block[:, :0], block, start, cache, self._key_pad(absent))
                chosen, tokens = self._select(solver, logits, masked, rows, working, step)
                block = torch.where(chosen, tokens, block)
                block_list, chosen_list = to_host(block, chosen)  # the forward's one device synchronisation
                _check_reveal(solver, [chosen_list[b] for b in working], masked_host[working].tolist())
                chosen_host, block_host = torch.tensor(chosen_list), torch.tensor(block_list)
                masked_host &= ~chosen_host
                for b in working:
                    self._after_forward(rows[b], b, chosen_host, block_host, masked_host, step)
                masked = masked_host.to(device)
                step += 1
            pending, starts = block, [s + k for s in starts]  # a row whose block was cut short has stopped

    def _select(self, solver: Solver, logits, masked, rows: list[_Row], working: list[int], step: int):
        """One solver decision for every working row: (chosen (B, k) bool, tokens (B, k))."""
        chosen = torch.zeros_like(masked)
        tokens = torch.zeros(masked.shape, dtype=torch.long, device=masked.device)
        sizes = {rows[b].size for b in working}
        if solver.deterministic and len(sizes) == 1:  # one batched call over the rows with work
            size, idx = sizes.pop(), torch.tensor(working, device=masked.device)
            view = BlockView(logits=logits[idx, :size], masked=masked[idx, :size].clone(), step=step)
            picked = solver.select(view)
            _check_shape(solver, picked, view.masked)
            chosen[idx, :size], tokens[idx, :size] = picked, view.tokens
            return chosen, tokens
        for b in working:  # row by row: own generator, own block size
            size = rows[b].size
            view = BlockView(logits=logits[b : b + 1, :size], masked=masked[b : b + 1, :size].clone(), step=step,
                             generator=rows[b].generator)
            picked = solver.select(view)
            _check_shape(solver, picked, view.masked)
            chosen[b, :size], tokens[b, :size] = picked[0], view.tokens[0]
        return chosen, tokens

    def _after_forward(self, r: _Row, b: int, chosen, block, masked, step: int) -> None:
        """The batch-1 loop's bookkeeping for one row after one forward (Decoder._decode_blocks), on the
        host copies of ``chosen``, ``block`` and ``masked`` (B, k)."""
        d = self.d
        r.reveal_step[chosen[b, : r.size]] = step
        r.nfe += 1
        r.steps += 1
        row_masked = masked[b, : r.size]
        filled = int(row_masked.long().argmax()) if row_masked.any() else r.size  # contiguous prefix
        head = r.out + block[b, :filled].tolist()
        cut, reason = d._stop(head, len(r.out) + filled, r.budget, block_done=not row_masked.any(),
                              first_new=len(r.out))
        if cut is None:
            return
        kept = max(0, cut - len(r.out))
        r.out += block[b, :kept].tolist()
        counts = torch.bincount(r.reveal_step[:kept], minlength=r.steps) if kept else torch.zeros(r.steps, dtype=torch.long)
        r.revealed += counts.tolist()
        r.per_block.append(r.steps)
        masked[b] = False  # the row's block is over: it idles until the others finish theirs
        if reason != "block_done":
            r.out, r.stop_reason = r.out[:cut], reason

    # ------------------------------------------------------------------------------ verified
    def _decode_verified(self, ids: torch.Tensor, rows: list[_VerifiedRow], solver: Solver, cache) -> None:
        """Verify mode over B rows: ``Decoder._decode_verified``'s rule, forwards and records, row by row.
        Each first forward carries every row's pending tokens right-aligned (hidden filler before a
        shorter row's). Rows accept different numbers of drafts: afterwards each keeps only its accepted
        keys/values, moved to end at the shared end again (``_realign``), its padding grown instead."""
        d, lm, k, device = self.d, self.d.lm, self.d.block_size, ids.device
        batch, filler = ids.shape[0], lm.mask_token_id
        pads = [r.pad for r in rows]  # columns hidden from each row, left of its own
        for r, last in zip(rows, ids[:, -1].tolist()):
            r.pending, r.cached = [last], r.prompt_len - 1
        while not all(r.finished for r in rows):
            # 1. the first forward: carry, verify, commit; the solver drafts each new block in the same step,
            # as if every draft were accepted (one device read per forward), void for a row that rejects
            carried = [[] if r.finished else r.pending[:-1] if r.final else r.pending for r in rows]
            n = max(map(len, carried))
            starts = [r.cached + len(c) for r, c in zip(rows, carried)]
            for r, s in zip(rows, starts):
                r.size = 0 if r.finished or r.final else d._block_room(s)
            width = k if any(r.size for r in rows) else 0
            tokens = torch.tensor([[filler] * (n - len(c)) + c for c in carried], device=device)
            hidden = torch.tensor([[i < n - len(c) for i in range(n)] + [j >= r.size for j in range(width)]
                                   for c, r in zip(carried, rows)])  # (B, n + width): filler, absent slots
            block = torch.full((batch, width), lm.mask_token_id, dtype=torch.long, device=device)
            ntp_logits, logits = d.carry_step(tokens, block, torch.tensor(starts, device=device), cache,
                                              self._verified_key_pad(pads, hidden))
            ntp = ntp_logits.argmax(-1)  # (B, n); a row's last carried token is at n - 1 (right-aligned)
            masked_host = torch.tensor([[0 < j < r.size for j in range(width)] for r in rows], dtype=torch.bool)
            working = masked_host.any(-1).nonzero()[:, 0].tolist()
            chosen = torch.zeros(batch, width, dtype=torch.bool, device=device)
            if width:
                block[:, 0] = ntp[:, -1]  # NTP's token after the last carried one: the block's first position
            if working:
                chosen, picked = self._select(solver, logits, masked_host.to(device), rows, working, 0)
                block = torch.where(chosen, picked, block)
            ntp_host, block_host, chosen_list = to_host(ntp, block, chosen)  # the forward's one device read
            if working:
                _check_reveal(solver, [chosen_list[b] for b in working], masked_host[working].tolist())
            masked_host &= ~torch.tensor(chosen_list, dtype=torch.bool).reshape(batch, width)
            kept = [0] * batch
            for b, r in enumerate(rows):
                if r.finished:
                    continue
                new, accepted, replaced = verify_drafts(r.pending, ntp_host[b][n - len(carried[b]) :])
                kept[b] = accepted + 1 if replaced else len(carried[b])
                if r.blocks["drafted_per_block"]:  # the previous block's drafts are judged now
                    r.blocks["accepted_per_block"][-1], r.blocks["replaced_per_block"][-1] = accepted, int(replaced)
                first_new = len(r.out)
                r.out += new
                r.revealed.append(len(new))
                r.nfe += 1
                cut, reason = d._stop(r.out, len(r.out), r.budget, first_new=first_new)
                if cut is not None or replaced or r.final:  # no block to draft: it would start elsewhere
                    _end_block(r.blocks, forwards=1, drafted=0)
                    masked_host[b] = False
                    if cut is not None:
                        r.revealed[-1] -= len(r.out) - cut
                        r.out, r.stop_reason = r.out[:cut], reason
                    else:
                        r.pending, r.final = r.out[-1:], False
                    continue
                r.steps, r.drafting = 1, True
            pads = self._realign(cache, rows, pads, carried, kept, n)
            # 2. the drafts go on, a forward of the blocks alone each time; rows whose block is done wait
            starts, step = torch.tensor([r.cached for r in rows], device=device), 0
            while True:
                for b, r in enumerate(rows):
                    if r.drafting:
                        self._end_draft(r, b, block_host, masked_host)
                drafting = [b for b, r in enumerate(rows) if r.drafting]
                if not drafting:
                    break
                absent = torch.tensor([[not r.drafting or j >= r.size for j in range(width)] for r in rows])
                logits = d.block_step(block[:, :0], block, starts, cache, self._verified_key_pad(pads, absent))
                step += 1
                for b in drafting:
                    rows[b].nfe += 1
                    rows[b].steps += 1
                    rows[b].revealed.append(0)  # drafting forwards commit nothing
                chosen, picked = self._select(solver, logits, masked_host.to(device), rows, drafting, step)
                block = torch.where(chosen, picked, block)
                block_host, chosen_list = to_host(block, chosen)  # the forward's one device read
                _check_reveal(solver, [chosen_list[b] for b in drafting], masked_host[drafting].tolist())
                masked_host &= ~torch.tensor(chosen_list, dtype=torch.bool)

    def _end_draft(self, r: _VerifiedRow, b: int, block: list[list[int]], masked: torch.Tensor) -> None:
        """After a drafting forward: end the row's draft at a stop or the budget among its drafts, or
        when its block is full (``Decoder._decode_verified``); host copies of block and masked (B, k)."""
        row_masked = masked[b, : r.size]
        filled = int(row_masked.long().argmax()) if row_masked.any() else r.size  # contiguous prefix
        cut, reason = self.d._stop(r.out + block[b][1:filled], len(r.out) + filled - 1, r.budget,
                                   block_done=not row_masked.any(), first_new=len(r.out))
        if cut is None:
            return
        _end_block(r.blocks, forwards=r.steps, drafted=cut - len(r.out))
        r.pending, r.final, r.drafting = block[b][: 1 + cut - len(r.out)], reason != "block_done", False
        masked[b] = False

    def _verified_key_pad(self, pads: list[int], query_hidden: torch.Tensor) -> torch.Tensor:
        """(B, length + Q) True where a row may not look: its padding columns, ``query_hidden`` (B, Q)."""
        columns = torch.arange(self.committed)[None] < torch.tensor(pads)[:, None]
        return torch.cat([columns, query_hidden], dim=1).to(self.d.lm.device)

    def _realign(self, cache, rows: list[_VerifiedRow], pads: list[int], carried: list[list[int]], kept: list[int],
                 n: int) -> list[int]:
        """After a first forward that appended ``n`` columns (row b's carried tokens at the right end):
        keep row b's first ``kept[b]`` carried tokens and drop the rest, filler included, so that every
        unfinished row's columns end at the new shared end. Returns the new padding per row."""
        before = self.committed
        live = [b for b, r in enumerate(rows) if not r.finished]
        for b in live:
            rows[b].cached += kept[b]
        if not live:
            return pads
        if all(len(carried[b]) == n and kept[b] == kept[live[0]] for b in live):  # all alike: a rollback does
            cache.rollback(n - kept[live[0]])
            self.committed = before + kept[live[0]]
            return [pads[b] if b in live else 0 for b in range(len(rows))]
        width = max(rows[b].cached for b in live)
        columns = torch.arange(width)
        source = columns.clamp_max(before + n - 1)[None].repeat(len(rows), 1)  # finished rows: anything
        for b in live:
            old = rows[b].cached - kept[b]  # positions cached before the forward
            i = columns - (width - rows[b].cached)  # index into the row's own positions
            source[b] = torch.where(i < old, pads[b] + i, before + n - len(carried[b]) + i - old).clamp_min(0)
        cache.keep(source)
        self.committed = width
        return [width - rows[b].cached if b in live else 0 for b in range(len(rows))]
