"""The decoding core: causal prefill, the NTP step, the SBD block step, and one loop per decode mode
(NTP, blocks, verified) for B prompts decoded together; batch 1 is a batch of one (SBD.md §3).

    >>> decoder = Decoder(load_model("sbd-tiny"), block_size=16, max_new_tokens=128)
    >>> gen = decoder.generate(prompt_ids, EntropyBounded(gamma=0.35))
    >>> gens = decoder.generate_batch([prompt_ids, other_ids], EntropyBounded(gamma=0.35))
    >>> gen.output_text, gen.nfe, gen.revealed_per_forward

Layout choice (ours, documented in docs/decoding.md): prefill caches the prompt minus its last token, and
that last token is carried causally in the first forward, exactly as a finished block is. So every
forward after prefill yields generated tokens, NTP spends exactly one forward per token, and the
first block after the prompt costs 1 + k query tokens like any other first forward.

Batches (B rows, P = longest prompt). Prompts are left-padded to P: a row's own columns are the cache's
last ``cache.length - pad`` ones (``_Row.pad``), and a key padding mask hides the rest from it. Rows
move in lockstep, block-synchronously: each forward serves every row, and a row whose block is done
(or that has stopped) idles until the others have finished theirs. ``forward`` charges a row an NFE
only for the forwards in which it had work, which is exactly its forward count at batch 1. Near the
end of the context a row's block may be narrower than the batch's: its missing slots are hidden and
never masked, so the solver sees the block of batch 1. Where no row hides anything (always at batch 1)
no key padding is built. Greedy outputs and per-row NFE equal batch 1's (tests/test_batching.py); a row's
``prefill_time_s`` and ``decode_time_s`` are its 1/B share of its batch's.

Verify mode (``--solver "name:...;verify=on"``, ``types.Verified``): any block solver drafts, and the
core commits only what NTP's argmax, read from the same first forward, confirms; the output is NTP's
(``_decode_verified``, ``verify_drafts``; docs/decoding.md, 'Verified decoding'). Rows accept different numbers of
drafts: afterwards each keeps only its accepted keys/values, moved to end at the shared end again
(``_realign``, ``cache.keep``); its padding grows by what the others kept more.

Sampling (``solver.sampling``, docs/decoding.md, 'Sampling'): above temperature 0 the tokens are drawn
from the processed distribution (core/sampling.py) with numbers from each row's own stream, seeded by
its sample's seed and taken only in the forwards the row works in, so a row's tokens are batch 1's.
Block solvers still choose positions from the untempered logits. Verified sampling judges drafts by the
speculative-sampling rule (``_judge``), up to the first draft revealed before a draft to its left.

Solvers that remember and revoke (``Solver.reads_history``, ``revokes``, ``reads_shadow``; docs/decoding.md,
'Revocation'): the core keeps each block's history (``_BlockMemory``: the previous forward's logits, the
solver's state, the step that revealed each slot, all on the device) and hands it over in the view; a
position masked again is open to the solver as before. ``reads_shadow`` appends the block's shadow to the
forwards from the block's second on (core/masks.py). A block takes at most ``max_block_forwards`` forwards:
at the last one every position still masked is revealed from its logits (``forced_per_block``).

Traces (``generate_batch(..., trace=True)``, docs/records.md, 'traces.jsonl'): one entry per forward a row
works in (what was masked, revealed, masked again, the tokens after it, the proxies at the masked slots, what
was committed, what verify judged); it costs one more device read per forward, and nothing when off.

Every model call goes through ``Decoder.forward``: it is the one place NFE is counted. Tokens are chosen
from logits in ``next_tokens`` (NTP's) and ``_choose`` (a block's), drafts judged in ``verify_drafts``
(greedy) or ``_judge`` (sampled).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from ..types import GREEDY, BlockView, Decision, Generation, Solver, UsageError, generate_baseline, schedule_baseline
from .cache import KVCache, StaticKVCache
from .fastpath import FastPath, keeps_logits
from .hf_generate import generate_with_transformers
from .aligned import decode_aligned
from .schedules import decode_with_schedule
from .masks import Pattern
from .model import LoadedModel, device_clock
from .sampling import (DrawStream, draw, probabilities, speculative_verify, to_device, uniform_rows,
                       verifiable_drafts)


class DecodeError(UsageError):
    """A prompt or setting the core cannot decode; the message says what to change."""


def check_max_block_forwards(block_size: int, max_block_forwards: int | None) -> None:
    """The bound of a block's forwards (None: the default, 2 x block size) leaves a block its k forwards."""
    if max_block_forwards is not None and max_block_forwards < block_size:
        raise DecodeError(f"--max-block-forwards must be at least the block size {block_size} (got {max_block_forwards}): "
                          f"every solver reveals at least one position per forward, so {block_size} forwards finish a "
                          f"block unless it revokes; the bound is for solvers that revoke")


class SolverContractError(RuntimeError):
    """A solver returned a reveal set that breaks the contract in types.Solver.select."""


class BrokenModelError(DecodeError):
    """The model's logits hold NaN or +inf: every solver's choice over them is garbage, none is to blame."""


def check_logits(lm: LoadedModel, logits: torch.Tensor, where: str) -> None:
    """Raise ``BrokenModelError`` when ``logits`` hold NaN or +inf (-inf is a masked token). A device read:
    called once before a run decodes, and where a solver seems to have broken its contract. During a
    decode the same test rides on each forward's one read (``Decoder.finite``)."""
    if bool((logits.isnan() | logits.isposinf()).any()):
        raise broken_model(lm, where)


def broken_model(lm: LoadedModel, where: str) -> BrokenModelError:
    dtype = str(lm.dtype).removeprefix("torch.")
    hint = "" if lm.dtype == torch.float32 else f"--dtype float32 if {dtype} overflows, or "
    return BrokenModelError(f"the model {lm.path} computes NaN or infinite logits ({where}) in {dtype}: it cannot "
                            f"decode; use {hint}weights saved before its training diverged")


class _NonFiniteLogits(Exception):
    """A forward's logits read back as not finite for a row with work; ``generate_batch`` names the model."""


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
    nfe: int = 0  # forwards after prefill (each serves every row of a batch)
    row_nfe: Counter = field(default_factory=Counter)  # batch row -> forwards in which it had work


BLOCK_FIELDS = ("forwards_per_block", "drafted_per_block", "accepted_per_block", "replaced_per_block",
                "remasked_per_block", "forced_per_block")
REVOKE_BLOCK_FIELDS = BLOCK_FIELDS[4:]


@dataclass
class _BlockMemory:
    """What earlier forwards of the blocks under way showed, for solvers that keep history (on the device,
    never read back): (B, w, V) logits of the last forward, (B, w, ...) the solver's last state, (B, w) the
    step that revealed each slot (-1 masked, -2 the core's)."""

    revealed_at: torch.Tensor
    logits: torch.Tensor | None = None
    state: torch.Tensor | None = None


@dataclass
class _Row:
    """One prompt of a batch: its columns, what it has committed, its block under way, its records."""

    prompt_len: int
    budget: int
    pad: int  # cache columns left of the row's own (prompt padding, grown when verified rows realign)
    generator: torch.Generator | None  # a randomised solver's, seeded as at batch 1
    stream: DrawStream | None = None  # sampling: the numbers of this row's draws (greedy: None)
    out: list[int] = field(default_factory=list)
    revealed: list[int] = field(default_factory=list)  # tokens committed by each forward
    blocks: dict = field(default_factory=lambda: {name: [] for name in BLOCK_FIELDS})
    stop_reason: str = ""  # set once the row has stopped
    size: int = 0  # the block under way: its slots, the forward that revealed each (-1: masked)
    reveal_step: list[int] = field(default_factory=list)
    fixed: int = 0  # the block's leading slots the core set (verified: NTP's token), never the solver's
    remasked: int = 0  # the block's positions masked again
    forced: int = 0  # the block's positions the core revealed at the bound
    block_start: int = 0  # the output index of the block's first slot (traces)
    trace: list[dict] | None = None  # one entry per forward the row works in, when traced
    open: bool = False  # whether the block goes on (the row has work in the next block forward)
    pending: list[int] = field(default_factory=list)  # verified: last committed token, then the drafts
    final: bool = False  # verified: the drafts end at a stop or the budget: verify them, draft no more

    def stop(self, cut: int, reason: str) -> None:
        self.out, self.stop_reason, self.open = self.out[:cut], reason, False

    def end_block(self, forwards: int, drafted: int = 0) -> None:
        """Close the block; verified drafts are judged at the next block's first forward."""
        for name, value in zip(BLOCK_FIELDS, (forwards, drafted, 0, 0, self.remasked, self.forced)):
            self.blocks[name].append(value)
        self.open = False


class Decoder:
    def __init__(self, lm: LoadedModel, block_size: int = 16, max_new_tokens: int = 256,
                 stop_strings: tuple[str, ...] = (), seed: int = 0, fast: bool = False,
                 compile: bool | None = None, max_block_forwards: int | None = None):
        if block_size < 1:
            raise DecodeError(f"--block-size must be >= 1 (got {block_size})")
        if max_new_tokens < 1:
            raise DecodeError(f"--max-new-tokens must be >= 1 (got {max_new_tokens})")
        check_max_block_forwards(block_size, max_block_forwards)
        max_block_forwards = 2 * block_size if max_block_forwards is None else max_block_forwards
        self.lm, self.block_size, self.max_new_tokens = lm, block_size, max_new_tokens
        self.max_block_forwards = max_block_forwards
        self.context = lm.max_positions or 1 << 62  # positions the model takes (none given: no limit)
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.seed = seed
        self.counters = Counters()
        # fast: a preallocated cache, and compiled CUDA graphs of the decode forwards on CUDA (fastpath.py);
        # compile: None = with the graphs, True/False = asked for (on CPU too) or not
        self.fast = FastPath.for_model(lm, compile) if fast else None
        self._mask_index = torch.tensor([lm.mask_token_id], device=lm.device)
        self._stop_ids = torch.tensor(lm.stop_token_ids, dtype=torch.long, device=lm.device)
        self._scope: tuple[torch.Tensor, bool] | None = None  # the blocks under way's (``_open_blocks``)
        self._keeps_logits = keeps_logits(lm.model)
        self.sampling = GREEDY  # the decode under way's (generate_batch sets it)
        self._draft_probs: torch.Tensor | None = None  # verified sampling: (B, w, V) what each draft was drawn from
        self._memory: _BlockMemory | None = None  # the blocks' history, for solvers that keep one
        self._tracing = False  # the decode under way records a trace per row

    def new_cache(self, batch: int, positions: int):
        """An empty cache for ``batch`` rows that will hold at most ``positions`` columns."""
        if self.fast is not None:
            return self.fast.cache(batch, positions)
        return KVCache(self.lm.model.config)

    # ------------------------------------------------------------------------- the one model call
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, pattern: Pattern | None, cache: KVCache,
                phase: str = "decode", keep: int = 0, rows: list[int] | None = None) -> torch.Tensor:
        """ids, positions (B, Q) -> float32 logits (B, keep, V) of the last ``keep`` queries (0: all Q),
        the only ones the core reads. Appends Q positions to ``cache``; ``pattern`` None: Q causal queries.
        ``rows``: the batch rows with work, each charged one NFE (None: all)."""
        if phase != "prefill":  # a prompt's one prefill forward is recorded apart (prefill_forwards)
            self.counters.nfe += 1
            for b in range(ids.shape[0]) if rows is None else rows:
                self.counters.row_nfe[b] += 1
        if isinstance(cache, StaticKVCache):  # the mask is built from the pattern, inside the graph on CUDA
            path = self.fast or FastPath.for_model(self.lm)
            logits = path.forward(ids, positions, pattern, cache, keep, eager=self.fast is None or phase == "prefill")
        else:
            mask = None if pattern is None else pattern.mask(cache.length, self.lm.dtype, ids.device)
            kept = {"logits_to_keep": keep} if self._keeps_logits else {}
            logits = self.lm.model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache.hf,
                                   use_cache=True, **kept).logits
            logits = (logits if kept or not keep else logits[:, -keep:]).float()
        cache.advance(ids.shape[1])
        self.last_logits = logits  # a reference only: read when a solver seems to break its contract
        if self.lm.mask_token_id >= 0:  # the mask token is never emitted
            logits.index_fill_(-1, self._mask_index, float("-inf"))
        # (B, 1) whether each row's logits are free of NaN and +inf: read back with the tokens chosen from them
        # (``to_host``), so a model that breaks mid-run (bf16 overflow on a long context) stops the decode at
        # that forward, for one reduction on the device and no read of its own
        self.finite = (logits.amax(dim=(1, 2)) <= torch.finfo(logits.dtype).max)[:, None]
        return logits

    # ------------------------------------------------------------------------------- the steps
    def prefill(self, prompt: torch.Tensor, cache: KVCache, pads: list[int] | None = None) -> None:
        """Cache the prompts (B, P), causally, row b's first ``pads[b]`` columns (left padding) hidden.
        Their logits are not needed (see the module docstring)."""
        if prompt.shape[1]:
            positions, pattern = torch.arange(prompt.shape[1], device=prompt.device)[None], None
            if pads and any(pads):
                pad = torch.tensor(pads, device=prompt.device)[:, None]
                pattern = Pattern(prompt.shape[1], 0, positions < pad)
                positions = (positions - pad).clamp_min(0)
            self.forward(prompt, positions.expand(prompt.shape[0], -1), pattern, cache, phase="prefill", keep=1)

    def ntp_step(self, token: torch.Tensor, position: int | torch.Tensor, cache: KVCache,
                 key_pad: torch.Tensor | None = None, rows: list[int] | None = None) -> torch.Tensor:
        """Feed one committed token (B, 1) causally; keep its KV; return next-token logits (B, 1, V).
        ``position``: an int, or (B,) per row; ``key_pad``: see ``attention_mask``."""
        if isinstance(position, int):
            positions = torch.full_like(token, position)
        else:  # (B,): rows of a batch that have stopped run past their end, kept inside the model's range
            positions = position[:, None].clamp_max(self.context - 1)
        pattern = None if key_pad is None else Pattern(1, 0, key_pad)  # None: it sees the whole cache
        return self.forward(token, positions, pattern, cache, keep=1, rows=rows)

    def block_step(self, pending: torch.Tensor, block: torch.Tensor, start: int | torch.Tensor, cache: KVCache,
                   key_pad: torch.Tensor | None = None, rows: list[int] | None = None, shadow: bool = False
                   ) -> torch.Tensor:
        """One SBD forward: ``pending`` (B, n) committed tokens at start-n..start-1, causal (their KV is
        kept: it is exact), then ``block`` (B, k) at start..start+k-1, bidirectional (its KV depends on
        the masks and is dropped). Returns the block's logits (B, k, V); logit i predicts token i.
        ``start``: an int, or (B,) per row; ``key_pad``: see ``attention_mask``. With ``shadow`` the block's
        shadow follows it in the same forward (core/masks.py) and its logits follow: (B, 2k, V)."""
        k = block.shape[1]
        return self._carry(pending, block, start, cache, key_pad, 2 * k if shadow else k, rows, shadow)

    def carry_step(self, pending: torch.Tensor, block: torch.Tensor, start: int | torch.Tensor, cache: KVCache,
                   key_pad: torch.Tensor | None = None, rows: list[int] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """``block_step`` that also returns the logits of the carried tokens: ((B, n, V), (B, k, V)).
        Carried logit i is NTP's next-token prediction after pending[:, i]; verified decoding reads it."""
        n = pending.shape[1]
        logits = self._carry(pending, block, start, cache, key_pad, n + block.shape[1], rows)
        return logits[:, :n], logits[:, n:]

    def _carry(self, pending, block, start, cache, key_pad, keep: int, rows, shadow: bool = False) -> torch.Tensor:
        """The forward of ``block_step``, returning the logits of its last ``keep`` queries."""
        n, k = pending.shape[1], block.shape[1]
        ids = torch.cat([pending, block] + ([torch.full_like(block, self.lm.mask_token_id)] if shadow else []), dim=1)
        if isinstance(start, int):  # every row alike (batch 1): the positions are real ones
            positions = torch.arange(start - n, start + k, device=block.device)[None].expand(ids.shape[0], -1)
        else:  # (B, n + k): idle slots of a batched row can pass the end, hidden filler slots fall before 0
            positions = start.to(block.device)[:, None] + torch.arange(-n, k, device=block.device)
            positions = positions.clamp(0, self.context - 1)
        if shadow:  # the shadow sits at the block's positions; it hides what the block hides
            positions = torch.cat([positions, positions[:, n:]], dim=1)
            key_pad = None if key_pad is None else torch.cat([key_pad, key_pad[:, -k:]], dim=1)
        logits = self.forward(ids, positions, Pattern(n, k, key_pad, shadow), cache, keep=keep, rows=rows)
        cache.rollback(k * (2 if shadow else 1))
        return logits

    def next_tokens(self, logits: torch.Tensor, rows: list[_Row], working: list[int]) -> torch.Tensor:
        """NTP's token from next-token logits (B, 1, V) -> (B, 1): the argmax at temperature 0, else a draw
        from the processed distribution, one number from each working row's stream."""
        if self.sampling.greedy:
            return logits.argmax(-1)
        working_set = set(working)
        u = self._uniforms(rows, [int(b in working_set) for b in range(len(rows))], 1)
        return draw(probabilities(logits, self.sampling), u[:, :1])

    def _uniforms(self, rows: list[_Row], counts: list[int], width: int) -> torch.Tensor:
        """(B, width) numbers on the device: row b's next counts[b] from its stream, zeros after them."""
        u = uniform_rows([r.stream for r in rows], counts, self.lm.device)
        return torch.nn.functional.pad(u, (0, width - u.shape[1]))

    # ------------------------------------------------------------------------------- the loops
    def generate(self, prompt_ids: list[int], solver: Solver) -> Generation:
        """Decode one prompt: a batch of one."""
        return self.generate_batch([prompt_ids], solver)[0]

    def generate_batch(self, prompts: list[list[int]], solver: Solver,
                       seeds: list[int] | None = None, trace: bool = False) -> list[Generation]:
        """Decode ``prompts`` together (see the module docstring); one ``Generation`` per prompt. ``seeds``:
        each prompt's (a randomised solver's generator, sampling's stream); None: the decoder's seed for all.
        A row's output depends on its prompt and seed only, not on the other rows. ``trace``: each
        ``Generation.trace`` holds its forwards (the module docstring)."""
        if not prompts:
            return []
        for ids in prompts:
            self.check_prompt(ids)
        seeds = [self.seed] * len(prompts) if seeds is None else list(seeds)
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        if self.lm.family.aligned:  # blocks at multiples of the block size, one row at a time (aligned.py)
            return [decode_aligned(self, ids, solver, seed) for ids, seed in zip(prompts, seeds)]
        if schedule_baseline(solver) is not None:  # a family's own schedule, one row at a time (schedules.py)
            return [decode_with_schedule(self, ids, solver) for ids in prompts]
        if generate_baseline(solver) is not None:  # transformers' own generate, one row at a time (hf_generate.py)
            return [generate_with_transformers(self, ids, solver, seed) for ids, seed in zip(prompts, seeds)]
        device, longest, k = self.lm.device, max(map(len, prompts)), self.block_size
        self.counters, self.sampling, self._draft_probs, self._memory = Counters(), solver.sampling, None, None
        self._keeps_history = solver.keeps_history
        rows = [_Row(len(p), min(self.max_new_tokens, self.context - len(p)), longest - len(p),
                     None if solver.deterministic else torch.Generator().manual_seed(seed),
                     None if self.sampling.greedy else DrawStream(seed)) for p, seed in zip(prompts, seeds)]
        self._tracing = trace
        if trace:
            for r in rows:
                r.trace = []
        pad_id = getattr(self.lm.tokenizer, "pad_token_id", None) or 0
        ids = torch.tensor([[pad_id] * r.pad + p for r, p in zip(rows, prompts)], dtype=torch.long, device=device)
        cache = self.new_cache(len(rows), longest + max(r.budget for r in rows) + 2 * k)
        t0 = device_clock(device)
        self.prefill(ids[:, :-1], cache, [r.pad for r in rows])  # 1. prefill all but the last prompt token
        t1 = device_clock(device)
        try:
            if solver.decodes_blocks and solver.verify:  # 2. decode
                self._decode_verified(rows, ids[:, -1].tolist(), solver, cache)
            elif solver.decodes_blocks:
                self._decode_blocks(rows, ids[:, -1:], solver, cache)
            else:
                self._decode_ntp(rows, ids[:, -1:], cache)
        except SolverContractError:  # NaN logits make any solver look broken: the model is named instead
            check_logits(self.lm, self.last_logits, f"forward {self.counters.nfe} of {solver.label}")
            raise
        except _NonFiniteLogits:
            raise broken_model(self.lm, f"forward {self.counters.nfe} of {solver.label}") from None
        t2 = device_clock(device)
        batch = len(rows)
        if trace:
            self._finish_traces(rows)
        return [Generation(
            output_ids=r.out, stop_reason=r.stop_reason, nfe=self.counters.row_nfe[b],
            prefill_forwards=int(r.prompt_len > 1), revealed_per_forward=r.revealed,
            forwards_per_block=r.blocks["forwards_per_block"], prefill_time_s=(t1 - t0) / batch,
            decode_time_s=(t2 - t1) / batch, output_text=self._text(r.out, r.stop_reason),
            **({name: r.blocks[name] for name in BLOCK_FIELDS[1:4]} if solver.verify else {}),
            **({name: r.blocks[name] for name in REVOKE_BLOCK_FIELDS} if solver.revokes else {}),
            trace=r.trace,
        ) for b, r in enumerate(rows)]

    def _decode_ntp(self, rows: list[_Row], token: torch.Tensor, cache: KVCache) -> None:
        """One forward per token, every row that has not stopped; ``token`` (B, 1): the last prompt token."""
        position, working = self._per_row([r.prompt_len - 1 for r in rows]), list(range(len(rows)))
        while working:
            logits = self.ntp_step(token, position, cache, self._key_pad(rows, cache, 1), working)  # (B, 1, V)
            token, position = self.next_tokens(logits, rows, working), position + 1  # (B, 1)
            picked, finite = to_host(token, self.finite)  # the forward's one device read
            self._check_finite(rows, finite)
            proxies = self._proxies(logits) if self._tracing else None
            for b in working:
                r = rows[b]
                r.out.append(picked[b][0])
                if proxies is not None:
                    self._trace(r, b, "ntp", len(r.out) - 1, [0], [0], [], [picked[b][0]], proxies[b])
                    r.trace[-1]["added"] = 1
                cut, reason = self._stop(r.out, len(r.out), r.budget, first_new=len(r.out) - 1)
                if cut is not None:
                    r.stop(cut, reason)
                    r.revealed = [1] * len(r.out)  # NTP spends one forward per token: grouped by block
                    r.blocks["forwards_per_block"] = [min(self.block_size, len(r.out) - i)
                                                      for i in range(0, len(r.out), self.block_size)]
                    working = [b for b in working if not rows[b].stop_reason]  # the loop runs on the old list

    def _decode_blocks(self, rows: list[_Row], pending: torch.Tensor, solver: Solver, cache: KVCache) -> None:
        """Block decoding; ``pending`` (B, n): the last prompt token, then each finished block, committed in
        the next block's first forward."""
        while any(not r.stop_reason for r in rows):
            starts = [cache.length - r.pad + pending.shape[1] for r in rows]
            block = self._open_blocks(rows, starts)
            start, carried, step = self._per_row(starts), pending, 0
            while working := [b for b, r in enumerate(rows) if r.open]:
                key_pad = self._key_pad(rows, cache, carried.shape[1], block.shape[1])
                logits = self.block_step(carried, block, start, cache, key_pad, working, solver.reads_shadow and step > 0)
                block, tokens = self._reveal(solver, logits, block, rows, working, step)
                carried, step = pending[:, :0], step + 1
                for b in working:
                    r = rows[b]
                    cut, reason = self._block_stop(r, tokens[b], committed=0)
                    if cut is None:
                        continue
                    kept = max(0, cut - len(r.out))  # the block's tokens are committed at its end
                    r.out += tokens[b][:kept]
                    if r.trace is not None:
                        r.trace[-1]["added"] = kept
                    r.revealed += [r.reveal_step[:kept].count(s) for s in range(step)]
                    r.end_block(forwards=step)
                    if reason != "block_done":
                        r.stop(cut, reason)
            pending = block

    def _decode_verified(self, rows: list[_Row], last: list[int], solver: Solver, cache: KVCache) -> None:
        """Verified block decoding (docs/decoding.md, 'Verified decoding'). Each block's first forward carries the
        last committed token and the previous block's drafts causally, right-aligned over the rows: a draft
        is committed only where it equals NTP's token after the tokens before it (``_verify``). NTP's token
        after the last carried one is exact: it is the block's first position; the solver drafts the rest
        in the same step, as if every draft were accepted (one device read per forward), void for a row
        that rejects. Stops and the budget see committed tokens only, so the output is NTP's; sampled, it
        is distributed as NTP sampling's (``_judge``)."""
        device, filler = self.lm.device, self.lm.mask_token_id
        for r, token in zip(rows, last):
            r.pending = [token]
        while live := [b for b, r in enumerate(rows) if not r.stop_reason]:
            # 1. carry pending (its last draft too, unless final: drafting ended at a stop or the budget)
            carried = [[] if r.stop_reason else r.pending[:-1] if r.final else r.pending for r in rows]
            n = max(map(len, carried))
            if not self.sampling.greedy:  # how many drafts the rule may judge, from their reveal steps
                judged = [self._judgeable(solver, r) for r in rows]
            starts = [cache.length - r.pad + len(c) for r, c in zip(rows, carried)]
            block = self._open_blocks(rows, starts, first=0)  # the first slot is NTP's, set below
            tokens = torch.tensor([[filler] * (n - len(c)) + c for c in carried], device=device)
            key_pad = self._key_pad(rows, cache, n, block.shape[1], carried)
            ntp_logits, logits = self.carry_step(tokens, block, self._per_row(starts), cache, key_pad, live)
            if self.sampling.greedy:
                ntp = self.next_tokens(ntp_logits, rows, live)  # (B, n); a row's last carried token is at n - 1
                first = ntp[:, -1]
            else:  # (B, 2): the drafts the rule accepts, then the token drawn after them
                ntp, self._draft_probs = self._judge(ntp_logits, rows, carried, judged), None
                first = ntp[:, 1]
            if block.shape[1]:
                block[:, 0] = first  # NTP's token after the last carried one: the block's first position
            # a row with one token left to commit has nothing to draft (``_open_slots``)
            working = [b for b in live if rows[b].size > 1 and rows[b].budget - len(rows[b].out) > 1]
            block, ntp_host, drafts = self._reveal(solver, logits, block, rows, working, 0, ntp)
            kept = [0] * len(rows)  # carried keys/values that stay
            for b in live:
                r, c = rows[b], len(carried[b])
                verdict = (verify_drafts(r.pending, ntp_host[b][n - c:]) if self.sampling.greedy
                           else sampled_verdict(r.pending, *ntp_host[b], r.final))
                kept[b] = self._verify(r, verdict, c, self.counters.row_nfe[b])
            self._realign(cache, rows, carried, kept, n)
            # 2. the draft goes on, a forward of the blocks alone each time, until a row's block is full or a
            # stop or the budget among its drafts ends it (drafting, not generation)
            step = 0
            while True:
                for r, row_drafts in zip(rows, drafts):
                    cut, reason = self._block_stop(r, row_drafts, committed=1) if r.open else (None, "")
                    if cut is not None:
                        r.end_block(forwards=step + 1, drafted=cut - len(r.out))
                        r.pending, r.final = row_drafts[: 1 + cut - len(r.out)], reason != "block_done"
                if not (drafting := [b for b, r in enumerate(rows) if r.open]):
                    break
                start = self._per_row([cache.length - r.pad for r in rows])
                logits = self.block_step(block[:, :0], block, start, cache,
                                         self._key_pad(rows, cache, 0, block.shape[1]), drafting, solver.reads_shadow)
                step += 1
                for b in drafting:
                    rows[b].revealed.append(0)  # drafting forwards commit nothing
                block, drafts = self._reveal(solver, logits, block, rows, drafting, step)

    # ------------------------------------------------------------------ the loops' shared parts
    def _open_blocks(self, rows: list[_Row], starts: list[int], first: int = -1) -> torch.Tensor:
        """A new block for every row that goes on, at ``starts``: k slots, or what the model's context
        leaves, all masked, (B, widest); ``first``: the first slot's ``reveal_step`` (0: revealed by the
        first forward)."""
        for r, start in zip(rows, starts):
            r.size = 0 if r.stop_reason or r.final else min(self.block_size, self.context - start)
            r.reveal_step, r.open = ([first] + [-1] * (r.size - 1))[: r.size], r.size > 0
            r.fixed, r.remasked, r.forced, r.block_start = int(first >= 0 and r.size > 0), 0, 0, len(r.out)
        block = torch.full((len(rows), max(r.size for r in rows)), self.lm.mask_token_id, dtype=torch.long,
                           device=self.lm.device)
        # (B,) slots before the budget (verified: counted as if no draft were accepted, so never too few), and
        # whether slot 0 is the core's (a stop there ends the row at once): ``_open_slots``
        self._scope = (torch.tensor([r.budget - len(r.out) for r in rows], device=block.device), first >= 0)
        if self._keeps_history:
            revealed_at = torch.full_like(block, -1)
            if first >= 0 and block.shape[1]:
                revealed_at[:, 0] = -2  # the core's slot (a row whose block is empty never reads it)
            self._memory = _BlockMemory(revealed_at)
        return block

    def _per_row(self, values: list[int]) -> int | torch.Tensor:
        """Positions: one int when every row has the same (always at batch 1), else (B,) on the device."""
        return values[0] if values.count(values[0]) == len(values) else torch.tensor(values, device=self.lm.device)

    def _key_pad(self, rows: list[_Row], cache, n: int, width: int = 0, carried: list[list[int]] | None = None):
        """(B, cache.length + n + width) True where a row may not look: its padding columns, the filler
        slots before its ``carried`` tokens (right-aligned in n), its block's slots past its size. None
        where no row hides anything (batch 1)."""
        if len(rows) == 1:
            return None  # a lone row hides nothing
        fill = [n - len(c) for c in carried] if carried else [0] * len(rows)
        if not (any(r.pad for r in rows) or any(fill) or width and any(r.size < width for r in rows)):
            return None
        length, device = cache.length, self.lm.device
        bounds = torch.tensor([[r.pad, length + f, length + n + (r.size if width else 0)] for r, f in zip(rows, fill)],
                              device=device)
        columns = torch.arange(length + n + width, device=device)
        filler = (columns >= length) & (columns < bounds[:, 1:2])
        return (columns < bounds[:, :1]) | filler | (columns >= bounds[:, 2:])

    def _reveal(self, solver: Solver, logits: torch.Tensor, block: torch.Tensor, rows: list[_Row],
                working: list[int], step: int, *also: torch.Tensor):
        """The solver's choice for the rows with work, set in ``block``; the forward's one device read (of
        ``also``, the block and the choice); the choice kept in each row's ``reveal_step`` (contract checked).
        ``logits`` (B, w, V), or (B, 2w, V) with the block's shadow after it. At the block's last allowed
        forward (``max_block_forwards``) every slot still masked is revealed and the solver's remask ignored.
        Returns (the block, host rows of each of ``also``, host rows of the block)."""
        if not working:
            *host, finite = to_host(*also, block, self.finite)
            self._check_finite(rows, finite)
            return block, *host
        forced = step + 1 >= self.max_block_forwards
        picked, remask, block = self._choose(solver, logits, block, rows, working, step, forced)
        host = to_host(*also, block, picked, *([remask] if remask is not None else []), self.finite)
        self._check_finite(rows, host.pop())
        dropped = host.pop() if remask is not None else None
        picked = host.pop()
        name = solver.name
        proxies = self._proxies(logits[:, : block.shape[1]]) if self._tracing else None
        for b in working:
            r, row_picked = rows[b], picked[b]
            if proxies is not None:
                masked = [i for i, s in enumerate(r.reveal_step) if s == -1]
                revealed = masked if forced else [i for i, c in enumerate(row_picked) if c]
                revoked = [] if forced or dropped is None else [i for i, d in enumerate(dropped[b]) if d]
                self._trace(r, b, "verify" if also else "block", r.block_start, masked,
                            ([0] if also and r.fixed else []) + revealed, revoked, host[-1][b][: r.size], proxies[b])
            if any(c and s != -1 for c, s in zip(row_picked, r.reveal_step)):
                raise SolverContractError(f"solver '{name}' revealed a position that was already revealed")
            if not any(row_picked):
                raise SolverContractError(f"solver '{name}' revealed nothing in a forward; reveal at least one position")
            if forced:
                r.forced += r.reveal_step.count(-1) - sum(row_picked)
                r.reveal_step = [step if s == -1 else s for s in r.reveal_step]
                continue
            row_dropped = dropped[b] if dropped is not None else ()
            if any(d and (s < 0 or i < r.fixed or c) for i, (d, s, c) in enumerate(zip(row_dropped, r.reveal_step,
                                                                                          row_picked))):
                raise SolverContractError(f"solver '{name}' masked again a position it had not revealed in an earlier "
                                          f"forward of this block; remask only positions where view.revealed")
            r.remasked += sum(row_dropped)
            r.reveal_step = [step if c else -1 if d else s
                             for s, c, d in zip(r.reveal_step, row_picked, row_dropped or [False] * len(row_picked))]
        return block, *host

    def _check_finite(self, rows: list[_Row], finite: list[list[bool]]) -> None:
        """Stop at a forward whose logits were NaN or +inf for a row still decoding (``forward``'s flag)."""
        if not all(ok[0] or r.stop_reason for r, ok in zip(rows, finite)):
            raise _NonFiniteLogits

    def _choose(self, solver: Solver, logits: torch.Tensor, block: torch.Tensor, rows: list[_Row],
                working: list[int], step: int, forced: bool = False):
        """One solver decision over the working rows: (the solver's picks (B, w) bool, its remask (B, w) bool
        or None, the block with the chosen slots set to their argmax, or sampled, to their draws: ``_draw_block``,
        and masked again where remasked). One batched call when they share a block size and the solver draws
        nothing; else row by row, each row with its own generator, so that its draws match batch 1's; row by
        row in exact mode too, so that each row's call is batch 1's (core/exact.py). ``forced``: every masked
        slot is chosen, the remask dropped."""
        batch, width = block.shape
        shadow = None
        if logits.shape[1] > width:  # (B, w, V) the block's shadow follows it
            logits, shadow = logits[:, :width], logits[:, width:]
        sizes = {rows[b].size for b in working}
        if solver.deterministic and len(sizes) == 1 and not self.lm.exact:
            groups = [(working, sizes.pop(), None)]
        else:
            groups = [([b], rows[b].size, rows[b].generator) for b in working]
        memory = self._memory if solver.keeps_history else None
        chosen = tokens = remask = state = None
        open_slots = self._open_slots(block)
        for idx, size, generator in groups:
            whole = len(idx) == batch and size == width  # batch 1: the view is the block itself

            def part(x: torch.Tensor | None) -> torch.Tensor | None:
                return x if x is None or whole else x[idx, :size]

            masked = part(open_slots)
            # the block and revealed_at as copies: the core goes on from its own, whatever a solver writes in
            # its view (at batch 1 part() is the tensor itself)
            history = {} if memory is None else dict(
                block=part(block).clone(), revealed_at=part(memory.revealed_at).clone(),
                previous_logits=part(memory.logits),
                state=part(memory.state), shadow_logits=part(shadow))
            view = BlockView(logits=part(logits), masked=masked, step=step, generator=generator, **history)
            decision = solver.select(view)
            picked, dropped, kept = ((decision.reveal, decision.remask, decision.state)
                                     if isinstance(decision, Decision) else (decision, None, None))
            self._check_decision(solver, picked, dropped, kept, masked)
            if whole:
                chosen, remask, state = picked, dropped, kept
                tokens = view.tokens if self.sampling.greedy else None
                break
            if chosen is None:
                chosen, tokens = torch.zeros(block.shape, dtype=torch.bool, device=block.device), torch.zeros_like(block)
            chosen[idx, :size] = picked
            if dropped is not None:
                remask = torch.zeros_like(chosen) if remask is None else remask
                remask[idx, :size] = dropped
            if kept is not None:
                state = kept.new_zeros(block.shape + kept.shape[2:]) if state is None else state
                state[idx, :size] = kept
            if self.sampling.greedy:
                tokens[idx, :size] = view.tokens
        revealed = chosen
        if forced:  # every masked slot of the working rows (an idle row's masked slots are filler)
            revealed, remask = (chosen | (block == self.lm.mask_token_id)) & self._working_slots(rows, working, block), None
        if not self.sampling.greedy:
            tokens = self._draw_block(logits, rows, working, revealed, solver.verify, step)
        block = torch.where(revealed, tokens, block)
        if remask is not None:  # what the solver may drop is checked on the host (_reveal)
            block = block.masked_fill(remask, self.lm.mask_token_id)
        if memory is not None:
            memory.revealed_at = memory.revealed_at.masked_fill(revealed, step)
            if remask is not None:
                memory.revealed_at = memory.revealed_at.masked_fill(remask, -1)
            memory.logits, memory.state = logits, state
        return chosen, remask, block

    def _open_slots(self, block: torch.Tensor) -> torch.Tensor:
        """(B, w) bool: the masked slots the solver may reveal, those that can still change the output: none
        after the block's first revealed stop token, none past the budget (docs/decoding.md, 'Stops inside a
        block'). A block ends once every slot before its stop is revealed, so no forward goes to slots the
        cut drops. A slot is masked while it holds the mask token (never emitted): no copy to the device,
        which would wait for the forward before the solver's work is queued."""
        limits, first_is_core = self._scope
        slot = torch.arange(block.shape[1], device=block.device)
        masked = (block == self.lm.mask_token_id) & (slot < limits[:, None])
        if self._stop_ids.numel():
            stops = torch.isin(block, self._stop_ids)
            if first_is_core and block.shape[1]:  # verified: NTP's token at slot 0 stops the row at this forward
                stops[:, 0] = False
            masked &= stops.cumsum(1) <= stops  # no stop strictly before the slot
        return masked

    # ---------------------------------------------------------------------------------- traces
    @staticmethod
    def _proxies(logits: torch.Tensor) -> list:
        """(B, w, 2) entropy and confidence of each slot's untempered distribution, as solvers see them, on the
        host: a trace's one extra device read per forward."""
        view = BlockView(logits, torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device))
        return torch.stack([view.entropy, view.confidence], dim=-1).tolist()

    def _trace(self, r: _Row, b: int, kind: str, start: int, masked: list[int], revealed: list[int],
               revoked: list[int], tokens: list[int], proxies: list) -> None:
        """One forward of row ``b``: the slots masked when it ran, those it revealed and masked again, the
        block's tokens after it, the proxies (entropy, confidence) at the masked slots."""
        mask, at = self.lm.mask_token_id, set(masked)
        r.trace.append({
            "n": self.counters.row_nfe[b], "kind": kind, "start": start, "size": len(tokens), "masked": masked,
            "revealed": revealed, "revoked": revoked, "tokens": [-1 if t == mask else t for t in tokens],
            "entropy": [round(e, 4) if i in at else None for i, (e, _) in enumerate(proxies[: len(tokens)])],
            "confidence": [round(c, 4) if i in at else None for i, (_, c) in enumerate(proxies[: len(tokens)])],
        })

    def _finish_traces(self, rows: list[_Row]) -> None:
        """The tokens each forward added to the output (``committed``: an NTP forward its token, a block's last
        forward the block's tokens, a verify forward the accepted drafts and NTP's token; joined in order they
        are the output, a stop's cut included), and the text of every token id in the trace."""
        for r in rows:
            at = 0
            for entry in r.trace:
                added = entry.pop("added", 0)
                entry["committed"], at = r.out[at : at + added], at + added
        ids = {t for r in rows for entry in r.trace for t in entry["tokens"] if t >= 0}
        pieces = {str(i): self.lm.tokenizer.decode([i]) for i in sorted(ids)}
        for r in rows:
            r.trace = {"pieces": {str(i): pieces[str(i)] for i in sorted({t for e in r.trace for t in e["tokens"]
                                                                          if t >= 0})},
                       "forwards": r.trace}

    def _working_slots(self, rows: list[_Row], working: list[int], block: torch.Tensor) -> torch.Tensor:
        """(B, w) bool: the slots of the working rows' blocks."""
        working = set(working)
        sizes = torch.tensor([r.size if b in working else 0 for b, r in enumerate(rows)], device=block.device)
        return torch.arange(block.shape[1], device=block.device) < sizes[:, None]

    @staticmethod
    def _check_decision(solver: Solver, picked, dropped, kept, masked: torch.Tensor) -> None:
        """The shapes and types of a solver's answer (what it may reveal or drop is checked in ``_reveal``)."""
        if picked is None:
            raise SolverContractError(f"solver '{solver.name}': select returned None; it must return a bool tensor "
                                      f"shaped like view.masked {tuple(masked.shape)} (or a Decision holding one): "
                                      f"is a return statement missing?")
        for what, value in (("select", picked), ("Decision.remask", dropped)):
            if value is not None and (not isinstance(value, torch.Tensor) or value.dtype != torch.bool
                                      or value.shape != masked.shape):
                got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
                raise SolverContractError(f"solver '{solver.name}': {what} returned {got}; it must be a bool tensor "
                                          f"shaped like view.masked {tuple(masked.shape)}")
        if dropped is not None and not solver.revokes:
            raise SolverContractError(f"solver '{solver.name}' returned Decision.remask without revokes = True: a "
                                      f"solver that masks positions again says so with the class flag")
        if kept is not None and (not isinstance(kept, torch.Tensor) or kept.shape[:2] != masked.shape):
            raise SolverContractError(f"solver '{solver.name}': Decision.state must be a tensor shaped (B, k, ...) "
                                      f"like view.masked {tuple(masked.shape)} first")

    def _draw_block(self, logits: torch.Tensor, rows: list[_Row], working: list[int], chosen: torch.Tensor,
                    verify: bool, step: int) -> torch.Tensor:
        """Sampled tokens for every slot of a block's logits (B, w, V), each working row taking its block's
        size in numbers from its stream (the solver chose positions from the untempered logits; only the
        chosen slots keep their draw). Verified, the distributions of the chosen slots are kept for
        ``_judge`` (``_draft_probs``, anew at a block's first forward)."""
        batch, width = chosen.shape
        probs = probabilities(logits, self.sampling)  # (B, w, V)
        working_set = set(working)
        u = self._uniforms(rows, [rows[b].size if b in working_set else 0 for b in range(batch)], width)
        if verify:
            kept = self._draft_probs if step and self._draft_probs is not None else torch.zeros_like(probs)
            self._draft_probs = torch.where(chosen[..., None], probs, kept)
        return draw(probs, u)

    def _block_stop(self, r: _Row, tokens: list[int], committed: int):
        """``_stop`` over the row's output and its block's revealed prefix (host ``tokens``), the block's
        first ``committed`` slots being in the output already (verified: NTP's token)."""
        filled = next((i for i, s in enumerate(r.reveal_step) if s < 0), r.size)  # contiguous prefix
        return self._stop(r.out + tokens[committed:filled], len(r.out) + filled - committed, r.budget,
                          block_done=filled == r.size, first_new=len(r.out))

    @staticmethod
    def _judgeable(solver: Solver, r: _Row) -> int:
        """How many of the row's drafts verified sampling may judge (``verifiable_drafts``). A revoking solver
        kept every draft it revealed before the block's last forward by a choice that saw it (not masking it
        again), so such a draft is no longer distributed as the q it was drawn from: only the leading drafts
        revealed in the block's last forward are judged (docs/decoding.md, 'Revocation')."""
        steps = r.reveal_step[1 : len(r.pending)]
        if solver.revokes:
            last = max(r.reveal_step, default=0)  # every forward reveals: the block's last forward
            return next((i for i, s in enumerate(steps) if s != last), len(steps))
        return verifiable_drafts(steps)

    def _verify(self, r: _Row, verdict: tuple[list[int], int, bool], carried: int, forward: int = 0) -> int:
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
            if not r.trace or r.trace[-1]["n"] != forward:  # a forward that opened no block for the row to draft
                r.trace.append({"n": forward, "kind": "verify", "start": r.block_start, "size": 0, "masked": [],
                                "revealed": [], "revoked": [], "tokens": [], "entropy": [], "confidence": []})
            r.trace[-1].update(start=r.block_start, added=len(new), drafted=len(r.pending) - 1, accepted=accepted,
                               rejected_slot=accepted + 1 if replaced and accepted < len(r.pending) - 1 else None)
        cut, reason = self._stop(r.out, len(r.out), r.budget, first_new=first_new)
        if cut is not None or replaced or r.final:
            r.end_block(forwards=1)
            if cut is not None:
                r.revealed[-1] -= len(r.out) - cut
                r.stop(cut, reason)
            else:
                r.pending, r.final = r.out[-1:], False
        return accepted + 1 if replaced else carried

    def _judge(self, ntp_logits: torch.Tensor, rows: list[_Row], carried: list[list[int]],
               judged: list[int]) -> torch.Tensor:
        """Verified sampling's rule over the rows (``speculative_verify``): row b's drafts, ``pending[1:]``,
        against NTP's processed distributions read at its carried tokens (right-aligned in ``ntp_logits``
        (B, n, V)) and the distributions they were drawn from (``_draft_probs``), its first ``judged[b]``
        judged. Returns (B, 2): drafts accepted, then the token drawn after them. Each live row takes
        len(drafts) + 1 numbers from its stream."""
        batch, n, vocab = ntp_logits.shape
        drafts = [r.pending[1:] if c else [] for r, c in zip(rows, carried)]
        most, device = max(map(len, drafts)), ntp_logits.device
        if n == 0:  # nothing carried (no row left to judge)
            return torch.zeros(batch, 2, dtype=torch.long, device=device)
        # NTP after carried token j predicts draft j; after the last draft, the token that follows (a final
        # check carries no token after its last draft: the clamped column is drawn from, never used)
        at = to_device([[min(n - len(c) + j, n - 1) for j in range(most + 1)] for c in carried], device)
        p = probabilities(ntp_logits.gather(1, at[..., None].expand(-1, -1, vocab)), self.sampling)  # (B, most + 1, V)
        q = self._draft_probs[:, 1 : 1 + most] if most else p[:, :0]  # slot 0 was NTP's own
        live = [not r.stop_reason for r in rows]
        accept_u = self._uniforms(rows, [len(d) if ok else 0 for d, ok in zip(drafts, live)], most)
        draw_u = self._uniforms(rows, [int(ok) for ok in live], 1)[:, 0]
        ids = to_device([d + [0] * (most - len(d)) for d in drafts], device)
        accepted, token = speculative_verify(p, q, ids, to_device(judged, device), accept_u, draw_u)
        return torch.stack([accepted, token], dim=-1)

    def _realign(self, cache, rows: list[_Row], carried: list[list[int]], kept: list[int], n: int) -> None:
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

    # ----------------------------------------------------------------------------- bookkeeping
    def check_prompt(self, prompt_ids: list[int]) -> None:
        """Refuse a prompt the core cannot decode: an empty one, or one that fills the model's context."""
        if not prompt_ids:
            raise DecodeError("empty prompt: the core needs at least one prompt token")
        if len(prompt_ids) >= self.context:
            raise DecodeError(f"prompt of {len(prompt_ids)} tokens does not fit the model's context of "
                              f"{self.context}: shorten it or use a model with a longer context")

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
    """``verify_drafts`` for verified sampling, from ``_judge``'s (accepted, token): the accepted drafts, then
    the token drawn after them, which replaces the next draft (rejected, or one the rule may not judge) or
    follows the last one (none after a final check). Returns (tokens committed now, accepted, replaced)."""
    drafts = pending[1:]
    if accepted < len(drafts):
        return drafts[:accepted] + [token], accepted, True
    return drafts + ([] if final else [token]), accepted, False


def to_host(*tensors: torch.Tensor) -> list[list[list]]:
    """(B, w) tensors (the carried tokens' NTP argmax, the block, the solver's choice, the forward's
    finite flag) as lists of rows, bool tensors as bools, in one device-to-host copy: the only
    synchronisation of a forward; the bookkeeping after it runs on the host."""
    rows, parts, at = torch.cat([t.long() for t in tensors], dim=-1).tolist(), [], 0
    for t in tensors:
        part = [row[at : at + t.shape[-1]] for row in rows]
        parts.append([[bool(v) for v in row] for row in part] if t.dtype == torch.bool else part)
        at += t.shape[-1]
    return parts
