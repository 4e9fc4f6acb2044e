"""Decoding the block-diffusion families whose blocks are aligned (``Family.aligned``: SDAR/TraDo,
Fast-dLLM v2; docs/models.md), with any block solver, through the core's one model call.

    >>> decoder = Decoder(load_model(SDAR_DIR), block_size=4, max_new_tokens=256)
    >>> gen = decoder.generate(prompt_ids, EntropyBounded(gamma=0.35))      # dispatched here by the family

What these families break in the SBD loop (core/decoding.py), and what is done instead, from the family's
fields (core/families.py), so that a new family of this kind is a table entry:
- **Aligned blocks.** Block boundaries lie at multiples of the block size ``B`` from position 0, and every
  block, the prompt's included, attends bidirectionally within itself and to all earlier blocks
  (block-causal). The prompt's full blocks are prefilled in one block-causal forward; its tail (P mod B
  tokens) opens the first block as fixed slots, seen inside the block but never offered to the solver.
- **The commit** of a finished block writes its keys and values as a clean block-bidirectional encoding.
  ``commit="fused"`` (SDAR): the finished block is carried in the next block's first forward, its queries
  seeing the cache and itself, the new block's seeing both: exactly the store forward SDAR's code runs apart
  (keys and values of a query depend only on what it sees), one forward per block fewer.
  ``commit="forward"`` (Fast-dLLM v2): a forward of the finished block alone, kept, whose last logit's
  argmax is the next block's first slot (fixed, a token of the output); where the prompt is a multiple of
  ``B``, the prefill's last logit gives it, and that prefill is then a counted forward (it yields a token).
- **Shifted logits** (``logit_shift``): slot j's distribution is the block query at j − 1's (slot 0 is
  always fixed in such a family: the prompt's tail or the committed seed).
- **Reveal windows** (``sub_block``): only the masked slots of the leftmost sub-block that still has one are
  offered to the solver (Fast-dLLM v2 decodes its 32-slot blocks in sub-blocks of 8, left to right).
Traced as the core traces (``generate_batch(..., trace=True)``). Stops are the core's: a block ends at a forward that commits a stop token with every slot before it
revealed, and no commit forward follows. A block takes at most ``max_block_forwards`` forwards: at the last
one every masked slot is revealed from its logits. Rows are decoded one at a time (their blocks are aligned
to each row's own positions); greedy only. ``vendor_nfe`` counts what the family's own code would run for
the same reveals: SDAR a store forward per committed block, Fast-dLLM v2 its prefill when it yields no token.
"""
from __future__ import annotations

import torch

from ..types import BlockView, Decision, Generation, UsageError
from .cache import KVCache
from .checks import check_decision
from .masks import Pattern
from .model import LoadedModel, device_clock
from .tracing import add_forward, block_proxies


class BlockCausal:
    """The mask of consecutive query groups (``sizes``): each bidirectional within itself, seeing the whole
    cache and every earlier group. Duck-types ``masks.Pattern`` for ``Decoder.forward``."""

    def __init__(self, sizes: list[int]):
        self.sizes = [s for s in sizes if s]

    def mask(self, past: int, dtype: torch.dtype, device) -> torch.Tensor:
        group = torch.repeat_interleave(torch.arange(len(self.sizes), device=device),
                                        torch.tensor(self.sizes, device=device))
        allowed = torch.cat([torch.ones(len(group), past, dtype=torch.bool, device=device),
                             group[:, None] >= group[None, :]], dim=1)
        return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
            ~allowed, torch.finfo(dtype).min)[None, None]


def check_aligned(lm: LoadedModel, block_size: int, solvers) -> None:
    """Refuse, before anything is decoded, what an aligned family cannot run here."""
    family = lm.family
    if not family.aligned:
        return
    trained = lm.info.get("trained_block_size")
    if trained and block_size != trained:
        raise UsageError(f"{lm.path} is a {family.name} checkpoint trained with blocks of {trained}, aligned to "
                         f"multiples of it: pass --block-size {trained}")
    if family.sub_block and block_size % family.sub_block:
        raise UsageError(f"a {family.name} block is decoded in sub-blocks of {family.sub_block}: --block-size must be "
                         f"a multiple of {family.sub_block}")
    for solver in solvers:
        reason = refusal(lm, solver)
        if reason:
            raise UsageError(reason)


def refusal(lm: LoadedModel, solver) -> str | None:
    """Why ``solver`` cannot decode this model's family (None: it can)."""
    family = lm.family
    if family.next_token and not family.aligned:
        return None
    if not solver.decodes_blocks:
        return (f"{solver.label} decodes token by token through causal forwards, and a {family.name} checkpoint is "
                f"no next-token model (its blocks attend bidirectionally): drop it; speed factors relative to NTP are "
                f"then blank, tokens per forward compare the configurations (docs/models.md)")
    if solver.verify:
        return (f"{solver.label}: verified decoding checks drafts against next-token predictions, which a "
                f"{family.name} checkpoint does not make: drop verify=on")
    if not family.aligned:
        return None
    if not solver.sampling.greedy:
        return (f"{solver.label}: sampling is not decoded for {family.name} checkpoints yet: drop "
                f"--temperature/--top-p/--top-k (greedy decoding)")
    if solver.reads_shadow and family.logit_shift:
        return (f"{solver.label} reads a shadow query per slot, which a family with shifted logits ({family.name}: "
                f"slot i is read at query i - 1) does not have: choose another solver")
    return None


class _Row:
    """One prompt's aligned decode: the cache, what is committed, which forward revealed each token."""

    def __init__(self, decoder, prompt_ids: list[int], solver, seed: int, trace: bool = False):
        self.decoder, self.lm, self.solver = decoder, decoder.lm, solver
        self.family, self.width = decoder.lm.family, decoder.block_size
        self.prompt = prompt_ids
        self.budget = min(decoder.max_new_tokens, decoder.context - len(prompt_ids))
        self.cache = KVCache(self.lm.model.config)
        self.start_nfe = decoder.nfe
        self.generator = None if solver.deterministic else torch.Generator().manual_seed(seed)
        self.out: list[int] = []
        self.revealer: list[int] = []  # out[i] was revealed by forward revealer[i] (1: the first)
        self.forwards_per_block: list[int] = []
        self.cut: int | None = None
        self.reason = ""
        self.carries = 0  # blocks committed inside the next block's first forward (fused)
        self.remasked: list[int] = []  # per block, revoking solvers: positions masked again, revealed at the bound
        self.forced: list[int] = []
        self.trace: list[dict] | None = [] if trace else None  # one entry per forward (docs/records.md, 'Traces')

    @property
    def forwards(self) -> int:
        return self.decoder.nfe - self.start_nfe

    def forward(self, ids: list[int], start: int, pattern, keep: int, phase: str = "decode") -> torch.Tensor:
        device = self.lm.device
        positions = torch.arange(start, start + len(ids), device=device)[None]
        if isinstance(pattern, Pattern) and pattern.shadow:  # the shadow sits at the block's positions
            positions = torch.cat([positions, positions[:, -pattern.n_block:]], dim=1)
            ids = ids + [self.lm.mask_token_id] * pattern.n_block
        tensor = torch.tensor([ids], dtype=torch.long, device=device)
        return self.decoder.forward(tensor, positions, pattern, self.cache, phase=phase, keep=keep)[0]

    def stop_at(self, ids: list[int]) -> bool:
        cut, reason = self.decoder.stop.stop_at(ids, len(ids), self.budget, first_new=len(self.out))
        if cut is not None:
            self.cut, self.reason = cut, reason
        return cut is not None

    def commit(self, tokens: list[int], revealers: list[int]) -> None:
        """``tokens`` join the output, added by the forward just made (its trace entry says so)."""
        self.out += tokens
        self.revealer += revealers
        if self.trace:
            self.trace[-1]["added"] = self.trace[-1].get("added", 0) + len(tokens)

    def trace_token(self, token: int, proxies: list) -> None:
        """The trace of a forward that yields one token from its last logit (the prefill's or a commit's)."""
        if self.trace is not None:
            add_forward(self, self.forwards, "ntp", len(self.out), [0], [0], [], [token], [proxies], -1)

    def finish_trace(self, out: list[int]) -> dict | None:
        if self.trace is None:
            return None
        at = 0
        for entry in self.trace:
            added = entry.pop("added", 0)
            entry["committed"], at = out[at: at + added], at + added
        ids = sorted({t for entry in self.trace for t in entry["tokens"] if t >= 0})
        return {"pieces": {str(i): self.lm.tokenizer.decode([i]) for i in ids}, "forwards": self.trace}


def decode_aligned(decoder, prompt_ids: list[int], solver, seed: int, trace: bool = False) -> Generation:
    """Decode one prompt of an aligned family (see the module docstring); ``trace``: one trace entry per
    forward, as the core's (a block's forwards "block", a forward that yields one token from its last logit,
    the prefill's or a commit's, "ntp")."""
    decoder.check_prompt(prompt_ids)
    row = _Row(decoder, prompt_ids, solver, seed, trace)
    family, width, mask = row.family, row.width, row.lm.mask_token_id
    t0 = device_clock(row.lm.device)
    full = len(prompt_ids) // width * width  # the prompt's full blocks
    fixed, counted, prefill = prompt_ids[full:], 0, 0
    if full:  # 1. the prompt's full blocks, block-causally; their last logit may be the first token
        yields = family.commit == "forward" and full == len(prompt_ids)
        logits = row.forward(prompt_ids[:full], 0, BlockCausal([width] * (full // width)), keep=1,
                             phase="decode" if yields else "prefill")
        prefill = int(not yields)
        if yields:
            fixed = [int(logits[-1].argmax())]
            row.trace_token(fixed[0], _proxies(row, logits[-1:])[0])
            row.commit(fixed, [row.forwards])
            row.stop_at(row.out)
    start, carried = full, []
    while row.cut is None:  # 2. the blocks
        size = min(width, len(prompt_ids) + row.budget - start)
        slots = fixed + [mask] * (size - len(fixed))
        first_output = len(fixed)  # the prompt's tail, or the seed committed already: not this block's output
        step, revealed_at, memory = 0, [-2] * len(fixed) + [-1] * (size - len(fixed)), {}
        base = row.forwards  # forwards before the block's first: a slot revealed at step s, by forward base + s + 1
        memory["trace_at"] = (len(row.out), first_output)  # where the block's output slots start, in output and slots
        while row.cut is None and mask in slots:
            shadow = solver.reads_shadow and step > 0 and not carried
            if carried:
                pattern, row.carries = BlockCausal([len(carried), size]), row.carries + 1
            else:
                pattern = Pattern(0, size, None, shadow)
            logits = row.forward(carried + slots, start - len(carried), pattern, keep=size * (2 if shadow else 1))
            row.cache.rollback(size * (2 if shadow else 1))  # the block's keys and values depend on its masks
            carried = []
            shadow_logits = logits[size:] if shadow else None
            logits = logits[:size]
            if family.logit_shift:  # slot j is read at query j - 1
                logits = torch.cat([logits[:1], logits[:-1]])
            step = _reveal(row, solver, logits, shadow_logits, slots, revealed_at, memory, step)
            filled = slots[first_output:]
            filled = filled[: filled.index(mask)] if mask in filled else filled
            if row.stop_at(row.out + filled):  # a stop with every slot before it revealed ends the block
                row.commit(filled[: row.cut - len(row.out)],
                           [base + revealed_at[first_output + i] + 1 for i in range(row.cut - len(row.out))])
        row.remasked.append(memory.get("remasked", 0))
        row.forced.append(memory.get("forced", 0))
        if row.cut is not None:
            row.forwards_per_block.append(row.forwards - counted)
            break
        new = slots[first_output:]
        row.commit(new, [base + revealed_at[first_output + i] + 1 for i in range(len(new))])
        start += size
        if row.stop_at(row.out):
            row.forwards_per_block.append(row.forwards - counted)
            break
        if family.commit == "forward":  # 3. the commit: the block alone, kept; its last logit is the next token
            last = row.forward(slots, start - size, BlockCausal([size]), keep=1)[-1:]
            seed_token = int(last[0].argmax())
            row.trace_token(seed_token, _proxies(row, last)[0])
            row.forwards_per_block.append(row.forwards - counted)
            counted = row.forwards
            row.commit([seed_token], [row.forwards])
            fixed = [seed_token]
            row.stop_at(row.out)
        else:  # carried in the next block's first forward
            row.forwards_per_block.append(row.forwards - counted)
            counted = row.forwards
            fixed, carried = [], slots
    t1 = device_clock(row.lm.device)
    out = row.out[: row.cut]
    revealed = [0] * row.forwards
    for forward in row.revealer[: len(out)]:
        revealed[forward - 1] += 1
    vendor = row.forwards + (row.carries if family.commit == "fused" else prefill)
    return Generation(output_ids=out, stop_reason=row.reason, nfe=row.forwards, prefill_forwards=prefill,
                      revealed_per_forward=revealed, forwards_per_block=row.forwards_per_block,
                      prefill_time_s=0.0, decode_time_s=t1 - t0, output_text=decoder.stop.text(out, row.reason),
                      vendor_nfe=vendor, trace=row.finish_trace(out),
                      **({"remasked_per_block": row.remasked, "forced_per_block": row.forced} if solver.revokes else {}))


def _window(family, slots: list[int], revealed_at: list[int]) -> range:
    """The slots offered to the solver: the block's, or its leftmost sub-block that has a masked slot."""
    if not family.sub_block:
        return range(len(slots))
    first = next(i for i, s in enumerate(revealed_at) if s == -1)
    lo = first // family.sub_block * family.sub_block
    return range(lo, min(lo + family.sub_block, len(slots)))


def _reveal(row: _Row, solver, logits, shadow_logits, slots, revealed_at, memory, step) -> int:
    """One solver decision on the window, set in ``slots`` and ``revealed_at``; returns the next step."""
    mask, family = row.lm.mask_token_id, row.family
    window = _window(family, slots, revealed_at)
    lo, hi = window.start, window.stop
    device = row.lm.device
    masked = torch.tensor([[revealed_at[i] == -1 for i in window]], device=device)
    history = {}
    if solver.keeps_history:
        history = dict(block=torch.tensor([slots[lo:hi]], device=device),
                       revealed_at=torch.tensor([revealed_at[lo:hi]], device=device),
                       previous_logits=memory.get("logits"), state=memory.get("state"),
                       shadow_logits=None if shadow_logits is None else shadow_logits[None, lo:hi])
        if memory.get("window") != (lo, hi):  # a new window: nothing earlier was seen through it
            history.update(previous_logits=None, state=None)
    view = BlockView(logits=logits[None, lo:hi], masked=masked, step=step, generator=row.generator, **history)
    forced = step + 1 >= row.decoder.max_block_forwards
    decision = solver.select(view)
    picked, dropped, kept = ((decision.reveal, decision.remask, decision.state) if isinstance(decision, Decision)
                             else (decision, None, None))
    check_decision(solver, picked, dropped, kept, masked)
    tokens = view.tokens[0].tolist()
    picked = picked[0].tolist()
    dropped = dropped[0].tolist() if dropped is not None and not forced else [False] * len(picked)
    was_masked = masked[0].tolist()
    if any(p and not m for p, m in zip(picked, was_masked)):
        raise UsageError(f"solver '{solver.name}' revealed a position that was already revealed")
    if not any(picked):
        raise UsageError(f"solver '{solver.name}' revealed nothing in a forward; reveal at least one position")
    if any(d and (revealed_at[lo + i] < 0 or p) for i, (d, p) in enumerate(zip(dropped, picked))):
        raise UsageError(f"solver '{solver.name}' masked again a position it had not revealed in an earlier forward "
                         f"of this block; remask only positions where view.revealed")
    before = [i for i, s in enumerate(revealed_at) if s == -1]  # the block's masked slots when the forward ran
    if forced:  # the bound: every masked slot of the block from this forward's logits
        every = logits.argmax(-1).tolist()
        picked_all = [i for i, s in enumerate(revealed_at) if s == -1]
        memory["forced"] = memory.get("forced", 0) + len(picked_all) - sum(picked)
        for i in picked_all:
            slots[i], revealed_at[i] = every[i], step
        revealed = picked_all
    else:
        revealed = [lo + i for i, p in enumerate(picked) if p]
        for i in revealed:
            slots[i], revealed_at[i] = tokens[i - lo], step
        for i, d in enumerate(dropped):
            if d:
                slots[lo + i], revealed_at[lo + i] = mask, -1
        memory["remasked"] = memory.get("remasked", 0) + sum(dropped)
    if solver.keeps_history:
        memory.update(logits=logits[None, lo:hi], state=kept, window=(lo, hi))
    if row.trace is not None:  # in the coordinates of the block's output slots
        at, first = memory["trace_at"]
        add_forward(row, row.forwards, "block", at, [i - first for i in before if i >= first],
                    [i - first for i in revealed if i >= first],
                    [lo + i - first for i, d in enumerate(dropped) if d and not forced and lo + i >= first],
                    slots[first:], _proxies(row, logits)[first:], mask)
    return step + 1


def _proxies(row: _Row, logits: torch.Tensor) -> list:
    """(w, 2) entropy and confidence per slot of (w, V) logits, for a trace."""
    return block_proxies(logits[None])[0]
