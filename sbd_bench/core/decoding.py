"""The decoding core: causal prefill, the NTP step, the SBD block step, and the loop (SBD.md §3).

    >>> decoder = Decoder(load_model("sbd-tiny"), block_size=16, max_new_tokens=128)
    >>> gen = decoder.generate(prompt_ids, EntropyBounded(gamma=0.35))
    >>> gen.output_text, gen.nfe, gen.revealed_per_forward

Layout choice (ours, documented in docs/decoding.md): prefill caches the prompt minus its last token, and
that last token is carried causally in the first forward, exactly as a finished block is. So every
forward after prefill yields generated tokens, NTP spends exactly one forward per token, and the
first block after the prompt costs 1 + k query tokens like any other first forward.

Verify mode (``--solver "name:...;verify=on"``, ``types.Verified``): any block solver drafts, and the
core commits only what NTP's argmax, read from the same first forward, confirms; the output is NTP's
(``_decode_verified``, ``verify_drafts``; docs/decoding.md, 'Verified decoding').

Every model call goes through ``Decoder.forward``: it is the one place NFE is counted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..types import BlockView, Generation, Solver, UsageError
from .cache import KVCache, StaticKVCache
from .fastpath import keeps_logits, static_forward
from .masks import Pattern
from .model import LoadedModel


class DecodeError(UsageError):
    """A prompt or setting the core cannot decode; the message says what to change."""


class SolverContractError(RuntimeError):
    """A solver returned a reveal set that breaks the contract in types.Solver.select."""


class BrokenModelError(DecodeError):
    """The model's logits hold NaN or +inf: every solver's choice over them is garbage, none is to blame."""


def check_logits(lm: LoadedModel, logits: torch.Tensor, where: str) -> None:
    """Raise ``BrokenModelError`` when ``logits`` hold NaN or +inf (-inf is a masked token). A device read:
    called once before a run decodes, and where a solver seems to have broken its contract."""
    if bool((logits.isnan() | logits.isposinf()).any()):
        dtype = str(lm.dtype).removeprefix("torch.")
        hint = "" if lm.dtype == torch.float32 else f"--dtype float32 if {dtype} overflows, or "
        raise BrokenModelError(f"the model {lm.path} computes NaN or infinite logits ({where}) in {dtype}: it cannot "
                               f"decode; use {hint}weights saved before its training diverged")


def check_model_output(lm: LoadedModel, prompt_ids: list[int]) -> None:
    """One causal forward of a prompt, outside any sample, checked by ``check_logits``: a broken model
    is refused before anything is decoded."""
    decoder = Decoder(lm, max_new_tokens=1)
    prompt = torch.tensor([prompt_ids], dtype=torch.long, device=lm.device)
    positions = torch.arange(len(prompt_ids), device=lm.device)[None]
    logits = decoder.forward(prompt, positions, None, KVCache(lm.model.config), phase="prefill", keep=1)
    check_logits(lm, logits, "on the run's first prompt")


@dataclass
class Counters:
    nfe: int = 0
    prefill_forwards: int = 0


class Decoder:
    def __init__(self, lm: LoadedModel, block_size: int = 16, max_new_tokens: int = 256,
                 stop_strings: tuple[str, ...] = (), seed: int = 0, fast: bool = False,
                 compile: bool | None = None):
        if block_size < 1:
            raise DecodeError(f"--block-size must be >= 1 (got {block_size})")
        if max_new_tokens < 1:
            raise DecodeError(f"--max-new-tokens must be >= 1 (got {max_new_tokens})")
        self.lm, self.block_size, self.max_new_tokens = lm, block_size, max_new_tokens
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.seed = seed
        self.counters = Counters()
        # fast: a preallocated cache, and compiled CUDA graphs of the decode forwards on CUDA (fastpath.py);
        # compile: None = with the graphs, True/False = asked for (on CPU too) or not
        self.fast = None
        if fast:
            from .fastpath import FastPath

            self.fast = FastPath.for_model(lm, compile)

    def new_cache(self, batch: int, positions: int):
        """An empty cache for ``batch`` rows that will hold at most ``positions`` columns."""
        if self.fast is not None:
            return self.fast.cache(batch, positions)
        return KVCache(self.lm.model.config)

    # ------------------------------------------------------------------------- the one model call
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, pattern: Pattern | None, cache: KVCache,
                phase: str = "decode", keep: int = 0) -> torch.Tensor:
        """ids, positions (B, Q) -> float32 logits (B, keep, V) of the last ``keep`` queries (0: all Q),
        the only ones the core reads. Appends Q positions to ``cache``; ``pattern`` None: Q causal queries."""
        if phase == "prefill":
            self.counters.prefill_forwards += 1
        else:
            self.counters.nfe += 1
        if isinstance(cache, StaticKVCache):  # the mask is built from the pattern, inside the graph on CUDA
            if self.fast is not None and phase != "prefill":
                logits = self.fast.forward(ids, positions, pattern, cache, keep)
            else:
                logits = static_forward(self.lm, cache, ids, positions, pattern, keep)
        else:
            mask = None if pattern is None else pattern.mask(cache.length, self.lm.dtype, ids.device)
            kept = {"logits_to_keep": keep} if keeps_logits(self.lm.model) else {}
            logits = self.lm.model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache.hf,
                                   use_cache=True, **kept).logits
            logits = (logits if kept or not keep else logits[:, -keep:]).float()
        cache.advance(ids.shape[1])
        self.last_logits = logits  # a reference only: read when a solver seems to break its contract
        if self.lm.mask_token_id >= 0:
            logits[..., self.lm.mask_token_id] = float("-inf")  # the mask token is never emitted
        return logits

    # ------------------------------------------------------------------------------- the steps
    def prefill(self, prompt: torch.Tensor, cache: KVCache) -> None:
        """Cache the prompt (1, P), causally. Its logits are not needed (see the module docstring)."""
        if prompt.shape[1]:
            positions = torch.arange(prompt.shape[1], device=prompt.device)[None]
            self.forward(prompt, positions, None, cache, phase="prefill", keep=1)

    def ntp_step(self, token: torch.Tensor, position: int | torch.Tensor, cache: KVCache,
                 key_pad: torch.Tensor | None = None) -> torch.Tensor:
        """Feed one committed token (B, 1) causally; keep its KV; return next-token logits (B, V).
        ``position``: an int, or (B, 1) per row; ``key_pad``: see ``attention_mask``."""
        positions = torch.full_like(token, position) if isinstance(position, int) else position
        pattern = None if key_pad is None else Pattern(1, 0, key_pad)  # None: it sees the whole cache
        return self.forward(token, positions, pattern, cache, keep=1)[:, -1]

    def block_step(self, pending: torch.Tensor, block: torch.Tensor, start: int | torch.Tensor, cache: KVCache,
                   key_pad: torch.Tensor | None = None) -> torch.Tensor:
        """One SBD forward: ``pending`` (B, n) committed tokens at start-n..start-1, causal (their KV is
        kept: it is exact), then ``block`` (B, k) at start..start+k-1, bidirectional (its KV depends on
        the masks and is dropped). Returns the block's logits (B, k, V); logit i predicts token i.
        ``start``: an int, or (B,) per row; ``key_pad``: see ``attention_mask``."""
        return self._carry(pending, block, start, cache, key_pad, keep=block.shape[1])

    def carry_step(self, pending: torch.Tensor, block: torch.Tensor, start: int | torch.Tensor, cache: KVCache,
                   key_pad: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``block_step`` that also returns the logits of the carried tokens: ((B, n, V), (B, k, V)).
        Carried logit i is NTP's next-token prediction after pending[:, i]; verified decoding reads it."""
        n = pending.shape[1]
        logits = self._carry(pending, block, start, cache, key_pad, keep=n + block.shape[1])
        return logits[:, :n], logits[:, n:]

    def _carry(self, pending, block, start, cache, key_pad, keep: int) -> torch.Tensor:
        """The forward of ``block_step``, returning the logits of its last ``keep`` queries."""
        n, k = pending.shape[1], block.shape[1]
        ids = torch.cat([pending, block], dim=1)
        offsets = torch.arange(-n, k, device=block.device)
        if isinstance(start, int):
            positions = (start + offsets)[None].expand(ids.shape[0], -1)
        else:
            positions = start.to(block.device)[:, None] + offsets  # (B, n + k)
        if self.lm.max_positions is not None:  # only idle slots of a batched row can pass the end
            positions = positions.clamp_max(self.lm.max_positions - 1)
        positions = positions.clamp_min(0)  # only hidden filler slots of a batched row fall before 0
        logits = self.forward(ids, positions, Pattern(n, k, key_pad), cache, keep=keep)
        cache.rollback(k)
        return logits

    # -------------------------------------------------------------------------------- the loop
    def generate(self, prompt_ids: list[int], solver: Solver) -> Generation:
        device = self.lm.device
        self.check_prompt(prompt_ids)
        self.counters = Counters()
        cache = self.new_cache(1, len(prompt_ids) + self._budget(len(prompt_ids)) + 2 * self.block_size)
        prompt = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        t0 = _clock(device)
        self.prefill(prompt[:, :-1], cache)  # 1. prefill all but the last prompt token
        t1 = _clock(device)
        try:
            if solver.decodes_blocks and solver.verify:  # 2. decode
                state = self._decode_verified(prompt, solver, cache)
            elif solver.decodes_blocks:
                state = self._decode_blocks(prompt, solver, cache)
            else:
                state = self._decode_ntp(prompt, cache)
        except SolverContractError:  # NaN logits make any solver look broken: the model is named instead
            check_logits(self.lm, self.last_logits, f"forward {self.counters.nfe} of {solver.label}")
            raise
        t2 = _clock(device)
        output_ids, stop_reason, revealed, per_block, *verdicts = state
        return Generation(
            output_ids=output_ids, stop_reason=stop_reason, nfe=self.counters.nfe,
            prefill_forwards=self.counters.prefill_forwards, revealed_per_forward=revealed,
            forwards_per_block=per_block, prefill_time_s=t1 - t0, decode_time_s=t2 - t1,
            output_text=self._text(output_ids, stop_reason), **(verdicts[0] if verdicts else {}),
        )

    def _decode_ntp(self, prompt: torch.Tensor, cache: KVCache):
        out: list[int] = []
        token, position, budget = prompt[:, -1:], prompt.shape[1] - 1, self._budget(prompt.shape[1])
        while True:
            logits = self.ntp_step(token, position, cache)  # (1, V)
            token = logits.argmax(-1, keepdim=True)  # (1, 1)
            out.append(int(token))
            position += 1
            cut, reason = self._stop(out, len(out), budget, first_new=len(out) - 1)
            if cut is not None:
                out = out[:cut]
                k = self.block_size  # NTP spends one forward per token: group them by block for reports
                per_block = [min(k, len(out) - i) for i in range(0, len(out), k)]
                return out, reason, [1] * len(out), per_block

    def _decode_blocks(self, prompt: torch.Tensor, solver: Solver, cache: KVCache):
        lm, device = self.lm, self.lm.device
        generator = torch.Generator().manual_seed(self.seed)
        out: list[int] = []
        revealed: list[int] = []
        per_block: list[int] = []
        pending, start, budget = prompt[:, -1:], prompt.shape[1], self._budget(prompt.shape[1])
        while True:
            size = self._block_room(start)
            block = torch.full((1, size), lm.mask_token_id, dtype=torch.long, device=device)
            masked = torch.ones(1, size, dtype=torch.bool, device=device)
            reveal_step = [-1] * size  # the forward that revealed each slot; -1: still masked (host side)
            step, cut, reason = 0, None, ""
            while cut is None:
                if step == 0:  # first forward: the finished block (or last prompt token) is committed now
                    logits = self.block_step(pending, block, start, cache)
                else:
                    logits = self.block_step(block[:, :0], block, start, cache)
                chosen, block = _choose(solver, logits, masked, block, step, generator)
                masked &= ~chosen
                tokens, picked = to_host(block, chosen)  # the forward's one device synchronisation
                _check_reveal(solver, picked, [[s < 0 for s in reveal_step]])
                reveal_step = [step if c else s for s, c in zip(reveal_step, picked[0])]
                step += 1
                filled = next((i for i, s in enumerate(reveal_step) if s < 0), size)  # contiguous prefix
                cut, reason = self._stop(out + tokens[0][:filled], len(out) + filled, budget,
                                         block_done=min(reveal_step) >= 0, first_new=len(out))
            kept = max(0, cut - len(out))
            out += tokens[0][:kept]
            revealed += [reveal_step[:kept].count(s) for s in range(step)]
            per_block.append(step)
            if reason != "block_done":
                return out[:cut], reason, revealed, per_block
            pending, start = block, start + size

    def _decode_verified(self, prompt: torch.Tensor, solver: Solver, cache: KVCache):
        """Verified block decoding (docs/decoding.md, 'Verified decoding'). Each block's first forward carries the
        last committed token and the previous block's drafts causally: a draft is committed only where
        it equals NTP's argmax after the tokens before it (``verify_drafts``); the first that differs is
        replaced by NTP's token, the rest are dropped and their keys/values rolled back. NTP's token
        after the last carried one is exact: it is the block's first position. Stops and the budget see
        committed tokens only, so the output is NTP's, token for token."""
        lm, device = self.lm, self.lm.device
        generator = torch.Generator().manual_seed(self.seed)
        out: list[int] = []
        revealed: list[int] = []  # tokens committed by each forward
        blocks = _new_blocks()
        pending, final, budget = prompt[0, -1:].tolist(), False, self._budget(prompt.shape[1])
        while True:
            # 1. carry pending (its last draft too, unless final: drafting ended at a stop or the budget).
            # The solver drafts the new block in the same step, as if every draft were accepted, so that the
            # forward's results come to the host in one read; that draft is void if NTP rejects one.
            carried = pending[:-1] if final else pending
            n, start = len(carried), prompt.shape[1] - 1 + len(out) + len(carried)  # pending[0] at P - 1 + len(out)
            size = 0 if final else self._block_room(start)
            block = torch.full((1, size), lm.mask_token_id, dtype=torch.long, device=device)
            ntp_logits, logits = self.carry_step(torch.tensor([carried], device=device), block, start, cache)
            ntp = ntp_logits.argmax(-1)  # (1, n)
            still, chosen = [False] + [True] * (size - 1), torch.zeros(1, size, dtype=torch.bool, device=device)
            if size:
                block[:, 0] = ntp[:, -1]  # NTP's token after the last carried one: the block's first position
            if size > 1:
                chosen, block = _choose(solver, logits, torch.tensor([still], device=device), block, 0, generator)
            (ntp_host,), (tokens,), (picked,) = to_host(ntp, block, chosen)  # the forward's one device read
            if size > 1:
                _check_reveal(solver, [picked], [still])
            new, accepted, replaced = verify_drafts(pending, ntp_host)
            cache.rollback(n - 1 - accepted if replaced else 0)  # keys/values of rejected drafts
            if blocks["drafted_per_block"]:  # the previous block's drafts are judged now
                blocks["accepted_per_block"][-1], blocks["replaced_per_block"][-1] = accepted, int(replaced)
            first_new = len(out)
            out += new
            revealed.append(len(new))
            cut, reason = self._stop(out, len(out), budget, first_new=first_new)
            if cut is not None or replaced or final:  # no block to draft: it would start elsewhere
                _end_block(blocks, forwards=1, drafted=0)
                if cut is not None:
                    revealed[-1] -= len(out) - cut
                    return out[:cut], reason, revealed, blocks.pop("forwards_per_block"), blocks
                pending, final = out[-1:], False
                continue
            # 2. the draft goes on, a forward of the block alone each time, until the block is full or a stop
            # or the budget among the drafts ends it (drafting, not generation)
            still, step = [m and not c for m, c in zip(still, picked)], 0
            while True:
                filled = next((i for i, m in enumerate(still) if m), size)  # contiguous prefix
                cut, reason = self._stop(out + tokens[1:filled], len(out) + filled - 1, budget,
                                         block_done=not any(still), first_new=len(out))
                if cut is not None:
                    break
                logits = self.block_step(block[:, :0], block, start, cache)
                revealed.append(0)  # drafting forwards commit nothing
                step += 1
                chosen, block = _choose(solver, logits, torch.tensor([still], device=device), block, step, generator)
                block_host, chosen_host = to_host(block, chosen)  # the forward's one device read
                _check_reveal(solver, chosen_host, [still])
                tokens, still = block_host[0], [m and not c for m, c in zip(still, chosen_host[0])]
            _end_block(blocks, forwards=step + 1, drafted=cut - len(out))
            pending, final = tokens[: 1 + cut - len(out)], reason != "block_done"

    # ----------------------------------------------------------------------------- bookkeeping
    def check_prompt(self, prompt_ids: list[int]) -> None:
        """Refuse a prompt the core cannot decode: an empty one, or one that fills the model's context."""
        if not prompt_ids:
            raise DecodeError("empty prompt: the core needs at least one prompt token")
        top = self.lm.max_positions
        if top is not None and len(prompt_ids) >= top:
            raise DecodeError(f"prompt of {len(prompt_ids)} tokens does not fit the model's context of "
                              f"{top}: shorten it or use a model with a longer context")

    def _block_room(self, start: int) -> int:
        """Positions of a block starting at ``start``: k, or what the model's context leaves."""
        k, limit = self.block_size, self.lm.max_positions
        return k if limit is None else min(k, limit - start)

    def _budget(self, prompt_len: int) -> int:
        budget = self.max_new_tokens
        if self.lm.max_positions is not None:
            budget = min(budget, self.lm.max_positions - prompt_len)
        return budget

    def _stop(self, ids: list[int], n_filled: int, budget: int, block_done: bool = False, first_new: int = 0):
        """Where generation ends, given ``ids`` = everything generated whose predecessors are all
        revealed. Returns (cut, reason): keep ids[:cut]; (None, '') to go on."""
        cut, reason = None, ""
        stops = self.lm.stop_token_ids
        for i in range(first_new, min(len(ids), budget)):
            if ids[i] in stops:
                cut, reason = i + 1, "stop_token"
                break
        if self.stop_strings:
            head = ids[: cut if cut is not None else budget]
            # a stop string ending before first_new was seen already: decode only a tail window
            # wide enough for any stop string ending anew, even at one byte-level token per UTF-8 byte
            window = 4 * max(len(s) for s in self.stop_strings) + 8
            tail = self.lm.tokenizer.decode(head[max(0, first_new - window):], skip_special_tokens=True)
            if any(s in tail for s in self.stop_strings):
                cut, reason = self._stop_string_cut(head), "stop_string"
        if cut is not None:
            return cut, reason
        if n_filled >= budget:
            reason = "max_new_tokens" if budget == self.max_new_tokens else "context"
            return budget, reason
        if block_done:
            return n_filled, "block_done"
        return None, ""

    def _stop_string_cut(self, ids: list[int]) -> int:
        """The fewest tokens whose text already holds a stop string."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            text = self.lm.tokenizer.decode(ids[:mid], skip_special_tokens=True)
            if any(s in text for s in self.stop_strings):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _text(self, ids: list[int], reason: str) -> str:
        text = self.lm.tokenizer.decode(ids, skip_special_tokens=True)
        if reason == "stop_string":  # the stop string itself is not part of the answer
            cut = min((text.find(s) for s in self.stop_strings if s in text), default=len(text))
            text = text[:cut]
        return text


def verify_drafts(pending: list[int], ntp: list[int]) -> tuple[list[int], int, bool]:
    """The verify rule (greedy). ``pending``: the last committed token, then the drafts; ``ntp[i]``: NTP's
    argmax after pending[i], for every pending token (then NTP's token after the last draft starts the
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


def _choose(solver: Solver, logits: torch.Tensor, masked: torch.Tensor, block: torch.Tensor, step: int,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One solver decision over ``block`` (B, k), shape checked: (chosen (B, k) bool, the block with their
    argmax set). Both block loops call it; verify mode's chosen tokens are drafts."""
    view = BlockView(logits=logits, masked=masked.clone(), step=step, generator=generator)
    chosen = solver.select(view)
    _check_shape(solver, chosen, masked)
    return chosen, torch.where(chosen, view.tokens, block)


VERIFIED_BLOCK_FIELDS = ("forwards_per_block", "drafted_per_block", "accepted_per_block", "replaced_per_block")


def _new_blocks() -> dict[str, list[int]]:
    """The per-block records of one verified generation (``Generation``), empty."""
    return {name: [] for name in VERIFIED_BLOCK_FIELDS}


def _end_block(blocks: dict[str, list[int]], forwards: int, drafted: int) -> None:
    """Close a block of verified decoding; its drafts are judged at the next block's first forward."""
    for name, value in zip(VERIFIED_BLOCK_FIELDS, (forwards, drafted, 0, 0)):
        blocks[name].append(value)


def to_host(*tensors: torch.Tensor) -> list[list[list]]:
    """(B, w) tensors (the carried tokens' NTP argmax, the block, the solver's choice) as lists of rows,
    bool tensors as bools, in one device-to-host copy: the only synchronisation of a block forward; the
    bookkeeping after it runs on the host."""
    rows, parts, at = torch.cat([t.long() for t in tensors], dim=-1).tolist(), [], 0
    for t in tensors:
        part = [row[at : at + t.shape[-1]] for row in rows]
        parts.append([[bool(v) for v in row] for row in part] if t.dtype == torch.bool else part)
        at += t.shape[-1]
    return parts


def _check_shape(solver: Solver, chosen: torch.Tensor, masked: torch.Tensor) -> None:
    if chosen.dtype != torch.bool or chosen.shape != masked.shape:
        raise SolverContractError(f"solver '{solver.name}' returned {chosen.dtype} {tuple(chosen.shape)}; "
                                  f"select must return a bool tensor shaped like view.masked {tuple(masked.shape)}")


def _check_reveal(solver: Solver, chosen: list[list[bool]], masked: list[list[bool]]) -> None:
    """The reveal contract on host copies (rows of ``chosen`` and of the ``masked`` it was chosen from)."""
    for row_chosen, row_masked in zip(chosen, masked):
        if any(c and not m for c, m in zip(row_chosen, row_masked)):
            raise SolverContractError(f"solver '{solver.name}' revealed a position that was already revealed")
        if any(row_masked) and not any(row_chosen):
            raise SolverContractError(f"solver '{solver.name}' revealed nothing in a forward; reveal at least one position")


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
