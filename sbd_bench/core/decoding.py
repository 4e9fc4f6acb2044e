"""The decoding core: causal prefill, the NTP step, the SBD block step, and one loop per decode mode
(NTP, blocks; verified in verify.py) for B prompts decoded together; batch 1 is a batch of one (SBD.md §3).

    >>> decoder = Decoder(load_model("sbd-tiny"), block_size=16, max_new_tokens=128)
    >>> gen = decoder.generate(prompt_ids, EntropyBounded(gamma=0.35))
    >>> gens = decoder.generate_batch([prompt_ids, other_ids], EntropyBounded(gamma=0.35))
    >>> gen.output_text, gen.nfe, gen.revealed_per_forward

Layout choice (ours, documented in docs/decoding.md): prefill caches the prompt minus its last token, and
that last token is carried causally in the first forward, exactly as a finished block is. So every
forward after prefill yields generated tokens, NTP spends exactly one forward per token, and the
first block after the prompt costs 1 + k query tokens like any other first forward.

Batches (B rows, P = longest prompt). Prompts are left-padded to P: a row's own columns are the cache's
last ``cache.length - pad`` ones (``Row.pad``), and a key padding mask hides the rest from it. Rows
move in lockstep, block-synchronously: each forward serves every row, and a row whose block is done
(or that has stopped) idles until the others have finished theirs. ``forward`` charges a row an NFE
only for the forwards in which it had work, which is exactly its forward count at batch 1. Near the
end of the context a row's block may be narrower than the batch's: its missing slots are hidden and
never masked, so the solver sees the block of batch 1. Where no row hides anything (always at batch 1)
no key padding is built. Greedy outputs and per-row NFE equal batch 1's (tests/test_batching.py); a row's
``prefill_time_s`` and ``decode_time_s`` are its 1/B share of its batch's.

A decode's state is one ``state.DecodeCall`` (its rows, its forwards' log, the blocks' history, the trace
switch, verified sampling's drafts), made by ``generate_batch`` and passed to every step; the ``Decoder``
keeps only its settings. The modes and concerns each have a module of their own:

- verify.py: verified decoding (``--solver "name:...;verify=on"``; docs/decoding.md, 'Verified decoding').
- reveal.py: a block forward's solver step (the slots open, the choice, sampling's draws, the reveal).
- history.py: the blocks' memory for solvers that remember and revoke (docs/decoding.md, 'Revocation');
  ``reads_shadow`` appends the block's shadow to the forwards from the block's second on (core/masks.py).
  A block takes at most ``max_block_forwards`` forwards: at the last one every position still masked is
  revealed from its logits (``forced_per_block``).
- tracing.py: traces (``generate_batch(..., trace=True)``, docs/records.md, 'traces.jsonl').
- checks.py: the errors, the bounds, the finite check, the solver contract.
- stops.py: the stop rule (``StopRule``), shared with hf_generate.py, schedules.py and aligned.py.

Sampling (``solver.sampling``, docs/decoding.md, 'Sampling'): above temperature 0 the tokens are drawn
from the processed distribution (core/sampling.py) with numbers from each row's own stream, seeded by
its sample's seed and taken only in the forwards the row works in, so a row's tokens are batch 1's.
Block solvers still choose positions from the untempered logits.

Every model call goes through ``Decoder.forward``: it is the one place NFE is counted.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from ..types import Generation, Solver, generate_baseline, schedule_baseline
from .cache import KVCache, StaticKVCache
from .checks import (BrokenModelError, DecodeError, NonFiniteLogits, SolverContractError, broken_model,  # noqa: F401
                     check_finite, check_logits, check_max_block_forwards, finite_flag)
from .fastpath import FastPath, keeps_logits
from .hf_generate import generate_with_transformers
from .aligned import decode_aligned
from .schedules import decode_with_schedule
from .masks import Pattern
from .model import LoadedModel, device_clock
from .reveal import next_tokens, open_blocks, reveal
from .sampling import DrawStream
from .state import BLOCK_FIELDS, REVOKE_BLOCK_FIELDS, DecodeCall, ForwardLog, Row, to_host
from .stops import StopRule
from .tracing import add_forward, block_proxies, finish_traces
from .verify import decode_verified


@lru_cache(maxsize=4)
def _positions(first: int, end: int, device) -> torch.Tensor:
    """(1, end - first) first..end-1: a block's forwards after its first share their positions (only read)."""
    return torch.arange(first, end, device=device)[None]


def check_model_output(lm: LoadedModel, prompt_ids: list[int]) -> None:
    """One causal forward of a prompt, outside any sample, checked by ``check_logits``: a broken model
    is refused before anything is decoded."""
    decoder = Decoder(lm, max_new_tokens=1)
    prompt = torch.tensor([prompt_ids], dtype=torch.long, device=lm.device)
    positions = torch.arange(len(prompt_ids), device=lm.device)[None]
    logits = decoder.forward(prompt, positions, None, KVCache(lm.model.config), phase="prefill", keep=1)
    check_logits(lm, logits, "on the run's first prompt")


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
        self.stop = StopRule(lm.tokenizer, lm.stop_token_ids, stop_strings, max_new_tokens)  # the stop rule
        self.seed = seed
        self.nfe = 0  # forwards after prefill over the decoder's life, each serving every row of a batch
        # fast: a preallocated cache, and compiled CUDA graphs of the decode forwards on CUDA (fastpath.py);
        # compile: None = with the graphs, True/False = asked for (on CPU too) or not
        self.fast = FastPath.for_model(lm, compile) if fast else None
        self._mask_index = torch.tensor([lm.mask_token_id], device=lm.device)
        self.stop_ids = torch.tensor(lm.stop_token_ids, dtype=torch.long, device=lm.device)
        self._keeps_logits = keeps_logits(lm.model)

    def new_cache(self, batch: int, positions: int):
        """An empty cache for ``batch`` rows that will hold at most ``positions`` columns."""
        if self.fast is not None:
            return self.fast.cache(batch, positions)
        return KVCache(self.lm.model.config)

    # ------------------------------------------------------------------------- the one model call
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, pattern: Pattern | None, cache: KVCache,
                phase: str = "decode", keep: int = 0, rows: list[int] | None = None,
                log: ForwardLog | None = None) -> torch.Tensor:
        """ids, positions (B, Q) -> float32 logits (B, keep, V) of the last ``keep`` queries (0: all Q),
        the only ones the core reads. Appends Q positions to ``cache``; ``pattern`` None: Q causal queries.
        ``rows``: the batch rows with work, each charged one NFE in the decode's ``log`` (None: all), which
        keeps the logits and their finite flag too. Runs in inference mode (a decode is in it throughout:
        ``generate_batch``; a step called on its own enters it here)."""
        if not torch.is_inference_mode_enabled():
            with torch.inference_mode():
                return self.forward(ids, positions, pattern, cache, phase, keep, rows, log)
        if phase != "prefill":  # a prompt's one prefill forward is recorded apart (prefill_forwards)
            self.nfe += 1
            if log is not None:
                log.nfe += 1
                for b in range(ids.shape[0]) if rows is None else rows:
                    log.row_nfe[b] += 1
        if isinstance(cache, StaticKVCache):  # the mask is built from the pattern, inside the graph on CUDA
            path = self.fast or FastPath.for_model(self.lm)
            logits = path.forward(ids, positions, pattern, cache, keep, eager=self.fast is None or phase == "prefill")
        else:
            mask = None if pattern is None else pattern.mask(cache.length, self.lm.dtype, ids.device)
            kept = {"logits_to_keep": keep} if self._keeps_logits else {}
            logits = self.lm.model(input_ids=ids, position_ids=positions, attention_mask=mask, cache=cache.hf,
                                   use_cache=True, **kept).logits
            logits = logits if kept or not keep else logits[:, -keep:]
            logits = logits if logits.dtype == torch.float32 else logits.float()
        cache.advance(ids.shape[1])
        if self.lm.mask_token_id >= 0:  # the mask token is never emitted
            logits.index_fill_(-1, self._mask_index, float("-inf"))
        if log is not None:  # read back with the tokens chosen from them (``to_host``): no read of its own
            log.last_logits, log.finite = logits, finite_flag(logits)
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
                 key_pad: torch.Tensor | None = None, rows: list[int] | None = None,
                 log: ForwardLog | None = None) -> torch.Tensor:
        """Feed one committed token (B, 1) causally; keep its KV; return next-token logits (B, 1, V).
        ``position``: an int, or (B,) per row; ``key_pad``: see ``key_pad``; ``rows``, ``log``: see ``forward``."""
        if isinstance(position, int):
            positions = torch.full_like(token, position)
        else:  # (B,): rows of a batch that have stopped run past their end, kept inside the model's range
            positions = position[:, None].clamp_max(self.context - 1)
        pattern = None if key_pad is None else Pattern(1, 0, key_pad)  # None: it sees the whole cache
        return self.forward(token, positions, pattern, cache, keep=1, rows=rows, log=log)

    def block_step(self, pending: torch.Tensor, block: torch.Tensor, start: int | torch.Tensor, cache: KVCache,
                   key_pad: torch.Tensor | None = None, rows: list[int] | None = None, shadow: bool = False,
                   log: ForwardLog | None = None) -> torch.Tensor:
        """One SBD forward: ``pending`` (B, n) committed tokens at start-n..start-1, causal (their KV is
        kept: it is exact), then ``block`` (B, k) at start..start+k-1, bidirectional (its KV depends on
        the masks and is dropped). Returns the block's logits (B, k, V); logit i predicts token i.
        ``start``: an int, or (B,) per row; ``key_pad``: see ``key_pad``. With ``shadow`` the block's
        shadow follows it in the same forward (core/masks.py) and its logits follow: (B, 2k, V)."""
        k = block.shape[1]
        return self._carry(pending, block, start, cache, key_pad, 2 * k if shadow else k, rows, shadow, log)

    def carry_step(self, pending: torch.Tensor, block: torch.Tensor, start: int | torch.Tensor, cache: KVCache,
                   key_pad: torch.Tensor | None = None, rows: list[int] | None = None,
                   log: ForwardLog | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``block_step`` that also returns the logits of the carried tokens: ((B, n, V), (B, k, V)).
        Carried logit i is NTP's next-token prediction after pending[:, i]; verified decoding reads it."""
        n = pending.shape[1]
        logits = self._carry(pending, block, start, cache, key_pad, n + block.shape[1], rows, log=log)
        return logits[:, :n], logits[:, n:]

    def _carry(self, pending, block, start, cache, key_pad, keep: int, rows, shadow: bool = False,
               log: ForwardLog | None = None) -> torch.Tensor:
        """The forward of ``block_step``, returning the logits of its last ``keep`` queries."""
        n, k = pending.shape[1], block.shape[1]
        if n or shadow:
            ids = torch.cat([pending, block] + ([torch.full_like(block, self.lm.mask_token_id)] if shadow else []), dim=1)
        else:  # the block alone (the model only reads it)
            ids = block
        if not n:  # nothing of this forward is kept: the reference cache need not store it (KVCache.read_only)
            cache.read_only()
        if isinstance(start, int):  # every row alike (batch 1): the positions are real ones
            positions = _positions(start - n, start + k, block.device).expand(ids.shape[0], -1)
        else:  # (B, n + k): idle slots of a batched row can pass the end, hidden filler slots fall before 0
            positions = start.to(block.device)[:, None] + torch.arange(-n, k, device=block.device)
            positions = positions.clamp(0, self.context - 1)
        if shadow:  # the shadow sits at the block's positions; it hides what the block hides
            positions = torch.cat([positions, positions[:, n:]], dim=1)
            key_pad = None if key_pad is None else torch.cat([key_pad, key_pad[:, -k:]], dim=1)
        logits = self.forward(ids, positions, Pattern(n, k, key_pad, shadow), cache, keep=keep, rows=rows, log=log)
        cache.rollback(k * (2 if shadow else 1))
        return logits

    # ------------------------------------------------------------------------------- the loops
    def generate(self, prompt_ids: list[int], solver: Solver) -> Generation:
        """Decode one prompt: a batch of one."""
        return self.generate_batch([prompt_ids], solver)[0]

    def generate_batch(self, prompts: list[list[int]], solver: Solver,
                       seeds: list[int] | None = None, trace: bool = False) -> list[Generation]:
        """Decode ``prompts`` together (see the module docstring); one ``Generation`` per prompt. ``seeds``:
        each prompt's (a randomised solver's generator, sampling's stream); None: the decoder's seed for all.
        A row's output depends on its prompt and seed only, not on the other rows. ``trace``: each
        ``Generation.trace`` holds its forwards (tracing.py)."""
        if not prompts:
            return []
        for ids in prompts:
            self.check_prompt(ids)
        seeds = [self.seed] * len(prompts) if seeds is None else list(seeds)
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        # inference mode for the whole decode, solvers included: each of a forward's small ops skips autograd's
        # bookkeeping, and the forwards enter no mode of their own (nothing made in it outlives the call but
        # host lists and the caches, which only the core writes, in this mode)
        with torch.inference_mode():
            return self._generate_batch(prompts, solver, seeds, trace)

    def _generate_batch(self, prompts: list[list[int]], solver: Solver, seeds: list[int],
                        trace: bool) -> list[Generation]:
        if self.lm.family.aligned:  # blocks at multiples of the block size, one row at a time (aligned.py)
            return [decode_aligned(self, ids, solver, seed, trace) for ids, seed in zip(prompts, seeds)]
        if schedule_baseline(solver) is not None:  # a family's own schedule, one row at a time (schedules.py)
            return [decode_with_schedule(self, ids, solver) for ids in prompts]
        if generate_baseline(solver) is not None:  # transformers' own generate, one row at a time (hf_generate.py)
            return [generate_with_transformers(self, ids, solver, seed) for ids, seed in zip(prompts, seeds)]
        device, longest, k = self.lm.device, max(map(len, prompts)), self.block_size
        rows = [Row(len(p), min(self.max_new_tokens, self.context - len(p)), longest - len(p),
                    None if solver.deterministic else torch.Generator().manual_seed(seed),
                    None if solver.sampling.greedy else DrawStream(seed), trace=[] if trace else None)
                for p, seed in zip(prompts, seeds)]
        call = DecodeCall(solver, rows, tracing=trace)
        pad_id = getattr(self.lm.tokenizer, "pad_token_id", None) or 0
        ids = torch.tensor([[pad_id] * r.pad + p for r, p in zip(rows, prompts)], dtype=torch.long, device=device)
        cache = self.new_cache(len(rows), longest + max(r.budget for r in rows) + 2 * k)
        t0 = device_clock(device)
        self.prefill(ids[:, :-1], cache, [r.pad for r in rows])  # 1. prefill all but the last prompt token
        t1 = device_clock(device)
        try:
            if solver.decodes_blocks and solver.verify:  # 2. decode
                decode_verified(self, call, ids[:, -1].tolist(), cache)
            elif solver.decodes_blocks:
                self._decode_blocks(call, ids[:, -1:], cache)
            else:
                self._decode_ntp(call, ids[:, -1:], cache)
        except SolverContractError:  # NaN logits make any solver look broken: the model is named instead
            check_logits(self.lm, call.forwards.last_logits, f"forward {call.forwards.nfe} of {solver.label}")
            raise
        except NonFiniteLogits:
            raise broken_model(self.lm, f"forward {call.forwards.nfe} of {solver.label}") from None
        t2 = device_clock(device)
        batch = len(rows)
        if trace:
            finish_traces(rows, self.lm.tokenizer)
        return [Generation(
            output_ids=r.out, stop_reason=r.stop_reason, nfe=call.forwards.row_nfe[b],
            prefill_forwards=int(r.prompt_len > 1), revealed_per_forward=r.revealed,
            forwards_per_block=r.blocks["forwards_per_block"], prefill_time_s=(t1 - t0) / batch,
            decode_time_s=(t2 - t1) / batch, output_text=self.stop.text(r.out, r.stop_reason),
            **({name: r.blocks[name] for name in BLOCK_FIELDS[1:4]} if solver.verify else {}),
            **({name: r.blocks[name] for name in REVOKE_BLOCK_FIELDS} if solver.revokes else {}),
            trace=r.trace,
        ) for b, r in enumerate(rows)]

    def _decode_ntp(self, call: DecodeCall, token: torch.Tensor, cache: KVCache) -> None:
        """One forward per token, every row that has not stopped; ``token`` (B, 1): the last prompt token."""
        rows, log = call.rows, call.forwards
        position, working = self.per_row([r.prompt_len - 1 for r in rows]), list(range(len(rows)))
        while working:
            logits = self.ntp_step(token, position, cache, self.key_pad(rows, cache, 1), working, log)  # (B, 1, V)
            token, position = next_tokens(self, call, logits, working), position + 1  # (B, 1)
            picked, finite = to_host(token, log.finite)  # the forward's one device read
            check_finite(rows, finite)
            proxies = block_proxies(logits) if call.tracing else None
            for b in working:
                r = rows[b]
                r.out.append(picked[b][0])
                if proxies is not None:
                    add_forward(r, log.row_nfe[b], "ntp", len(r.out) - 1, [0], [0], [], [picked[b][0]], proxies[b],
                                self.lm.mask_token_id)
                    r.trace[-1]["added"] = 1
                cut, reason = self.stop.stop_at(r.out, len(r.out), r.budget, first_new=len(r.out) - 1)
                if cut is not None:
                    r.stop(cut, reason)
                    r.revealed = [1] * len(r.out)  # NTP spends one forward per token: grouped by block
                    r.blocks["forwards_per_block"] = [min(self.block_size, len(r.out) - i)
                                                      for i in range(0, len(r.out), self.block_size)]
                    working = [b for b in working if not rows[b].stop_reason]  # the loop runs on the old list

    def _decode_blocks(self, call: DecodeCall, pending: torch.Tensor, cache: KVCache) -> None:
        """Block decoding; ``pending`` (B, n): the last prompt token, then each finished block, committed in
        the next block's first forward."""
        rows, solver = call.rows, call.solver
        while any(not r.stop_reason for r in rows):
            starts = [cache.length - r.pad + pending.shape[1] for r in rows]
            block = open_blocks(self, call, starts)
            start, carried, step = self.per_row(starts), pending, 0
            while working := [b for b, r in enumerate(rows) if r.open]:  # one block forward:
                key_pad = self.key_pad(rows, cache, carried.shape[1], block.shape[1])
                shadow = solver.reads_shadow and step > 0
                logits = self.block_step(carried, block, start, cache, key_pad, working, shadow, call.forwards)
                block, tokens = reveal(self, call, logits, block, working, step)  # the solver's choice
                carried, step = pending[:, :0], step + 1
                for b in working:  # commit a finished block, stop
                    r = rows[b]
                    cut, reason = r.block_stop(self.stop, tokens[b], committed=0)
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

    # ------------------------------------------------------------------ the loops' shared parts
    def per_row(self, values: list[int]) -> int | torch.Tensor:
        """Positions: one int when every row has the same (always at batch 1), else (B,) on the device."""
        return values[0] if values.count(values[0]) == len(values) else torch.tensor(values, device=self.lm.device)

    def key_pad(self, rows: list[Row], cache, n: int, width: int = 0, carried: list[list[int]] | None = None):
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

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """Refuse a prompt the core cannot decode: an empty one, or one that fills the model's context."""
        if not prompt_ids:
            raise DecodeError("empty prompt: the core needs at least one prompt token")
        if len(prompt_ids) >= self.context:
            raise DecodeError(f"prompt of {len(prompt_ids)} tokens does not fit the model's context of "
                              f"{self.context}: shorten it or use a model with a longer context")
