"""A model family's own decoding schedules, run as its vendor's code runs them, as baselines beside ours
(``types.ScheduleBaseline``; docs/models.md): Nemotron-Labs-Diffusion's diffusion decoder (``dlm``) and its
self-speculation (``linear_spec``), read from its remote ``NemotronLabsDiffusionModel.generate`` and
``linear_spec_generate`` (docs/models.md names the copies read).

    >>> decoder = Decoder(load_model(NLD_DIR), max_new_tokens=256)
    >>> gen = decoder.generate(prompt_ids, NLDDiffusion(block=8, tau=0.9))   # dispatched here
    >>> gen.nfe, gen.vendor_nfe, gen.forwards_per_block

Both start the same way: one causal forward over the whole prompt, whose last logit's argmax is the first
token, the *seed* of the first block. Then, per block of ``block`` slots starting at the seed:
- ``dlm``: the block is [seed, mask × (block − 1)], read bidirectionally against the cache (written by
  nothing: its keys and values are dropped); each forward reveals every masked slot whose confidence is at
  least ``tau``, and the most confident one always; the block ends when no slot is masked or a stop is
  revealed with nothing masked before it. Then one causal *commit* forward over the whole block writes its
  exact keys and values, and its last logit's argmax is the next block's seed. The vendor counts the commit
  forwards and the denoising forwards, not the prompt's; tokens per forward are at most block / 2.
- ``linear_spec``: the block [seed, mask × (block − 1)] is drafted in one bidirectional forward (every slot
  its argmax), then verified in one causal forward over [seed, drafts]: the drafts equal to the causal
  argmax before them are accepted, up to the first that is not, and the argmax after the last accepted one
  (the bonus) follows; the cache keeps the seed and the accepted drafts, and the bonus is the next seed.
  Every token committed is the causal argmax after its prefix: the output is NTP's. The vendor counts the
  prompt's forward too.

Counted as the core counts (``nfe``: every forward after the prefill, through ``Decoder.forward``, the one
place forwards are counted; the prompt's forward yields the first token, so it is one of them, as in the
generate baselines, and ``prefill_forwards`` is 0) and as the vendor counts (``vendor_nfe``). Differences
from the vendor's code, kept on purpose: the mask token's logit is −inf here as everywhere in the core (the
vendor's confidence is over the full vocabulary, mask included, and a slot whose argmax is the mask stays
masked); decoding ends by the core's stop rule (stop tokens, stop strings, budget: the same for every
configuration), the vendor's at an end-of-sequence token; the last block is cut to the budget (the vendor
asks for a budget that is a multiple of the block); rows are decoded one at a time, as the vendor's
self-speculation requires (its diffusion decoder takes a batch without an attention mask).
"""
from __future__ import annotations

import torch

from ..types import Generation, UsageError, schedule_baseline
from .cache import KVCache
from .masks import Pattern
from .model import LoadedModel, device_clock


def check_schedules(lm: LoadedModel, solvers) -> None:
    """Refuse, before anything is decoded, a schedule this model cannot run."""
    for solver in solvers:
        baseline = schedule_baseline(solver)
        if baseline is None:
            continue
        if lm.exact:
            raise UsageError(f"{solver.label} runs its vendor's schedule, which --exact does not cover (it makes the "
                             f"core's own decoding exact): drop --exact or the {baseline.name} configuration")
        if not lm.family.next_token:
            raise UsageError(f"{solver.label} reads next-token logits from causal forwards, and a {lm.family.name} "
                             f"checkpoint is no next-token model: drop the {baseline.name} configuration")


class _Run:
    """One prompt's decode under a schedule: what is committed, which forward revealed each token."""

    def __init__(self, decoder, prompt_ids: list[int]):
        self.decoder, self.lm = decoder, decoder.lm
        self.budget = min(decoder.max_new_tokens, decoder.context - len(prompt_ids))
        self.cache = KVCache(self.lm.model.config)
        self.start_nfe = decoder.nfe
        self.out: list[int] = []
        self.revealer: list[int] = []  # out[i] was revealed by forward revealer[i] (0: the prompt's)
        self.forwards_per_block: list[int] = []
        self.cut: int | None = None
        self.reason = ""

    @property
    def forwards(self) -> int:
        return self.decoder.nfe - self.start_nfe

    def forward(self, ids: list[int], start: int, bidirectional: bool, keep: int) -> torch.Tensor:
        """One forward of ``ids`` at positions start.. (causal, or all bidirectional): float32 (len, V) of
        the last ``keep`` queries; a bidirectional forward's keys and values are dropped, a causal one's kept."""
        device = self.lm.device
        tensor = torch.tensor([ids], dtype=torch.long, device=device)
        positions = torch.arange(start, start + len(ids), device=device)[None]
        pattern = Pattern(0, len(ids)) if bidirectional else None
        logits = self.decoder.forward(tensor, positions, pattern, self.cache, keep=keep)
        if bidirectional:
            self.cache.rollback(len(ids))
        return logits[0]

    def commit(self, tokens: list[int]) -> None:
        """Append ``tokens``, revealed by the forward just made, and apply the core's stop rule."""
        self.out += tokens
        self.revealer += [self.forwards] * len(tokens)
        self.check_stop(self.out)

    def check_stop(self, ids: list[int]) -> bool:
        cut, reason = self.decoder.stop.stop_at(ids, len(ids), self.budget)
        if cut is not None and self.cut is None:
            self.cut, self.reason = cut, reason
        return cut is not None

    def generation(self, t0: float, t1: float, **fields) -> Generation:
        out = self.out[: self.cut]
        revealed = [0] * self.forwards
        for forward in self.revealer[: len(out)]:
            revealed[forward - 1] += 1
        return Generation(output_ids=out, stop_reason=self.reason, nfe=self.forwards, prefill_forwards=0,
                          revealed_per_forward=revealed, forwards_per_block=self.forwards_per_block,
                          prefill_time_s=0.0, decode_time_s=t1 - t0,
                          output_text=self.decoder.stop.text(out, self.reason), **fields)


def _confident(logits: torch.Tensor, masked: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The vendor's reveal rule: (tokens, reveal) over (k, V) logits at the ``masked`` (k,) slots: every
    masked slot whose argmax has probability >= ``tau``, and the most confident masked slot always."""
    probs = torch.softmax(logits, dim=-1)
    confidence, tokens = probs.max(dim=-1)
    reveal = masked & (confidence >= tau)
    best = torch.where(masked, confidence, torch.full_like(confidence, -1.0)).argmax()
    reveal[best] = True
    return tokens, reveal


def decode_dlm(decoder, prompt_ids: list[int], block: int, tau: float) -> Generation:
    run, mask = _Run(decoder, prompt_ids), decoder.lm.mask_token_id
    t0 = device_clock(run.lm.device)
    seed = int(run.forward(prompt_ids, 0, bidirectional=False, keep=1)[-1].argmax())
    run.commit([seed])
    counted = 0  # the prompt's forward counts in the first block
    while run.cut is None:
        start = len(prompt_ids) + len(run.out) - 1  # the seed's position
        slots = [seed] + [mask] * (min(block, run.budget - len(run.out) + 1) - 1)
        revealed_at: dict[int, int] = {}  # slot -> the forward that revealed it
        filled: list[int] = []  # the slots after the seed, up to the first still masked
        while len(revealed_at) < len(slots) - 1:
            masked = torch.tensor([i > 0 and i not in revealed_at for i in range(len(slots))], device=run.lm.device)
            tokens, reveal = _confident(run.forward(slots, start, bidirectional=True, keep=len(slots)), masked, tau)
            for i in reveal.nonzero().flatten().tolist():
                slots[i], revealed_at[i] = int(tokens[i]), run.forwards
            first_masked = next((i for i in range(1, len(slots)) if i not in revealed_at), len(slots))
            filled = slots[1:first_masked]
            if run.check_stop(run.out + filled):  # a stop with nothing masked before it ends the block
                break
        run.out += filled
        run.revealer += [revealed_at[i] for i in range(1, 1 + len(filled))]
        # the commit: the whole block causally, its keys and values kept; its last logit seeds the next block
        seed = int(run.forward(slots, start, bidirectional=False, keep=1)[-1].argmax())
        run.forwards_per_block.append(run.forwards - counted)
        counted = run.forwards
        if run.cut is None:
            run.commit([seed])
    t1 = device_clock(run.lm.device)
    return run.generation(t0, t1, vendor_nfe=run.forwards - 1)  # the vendor leaves the prompt's forward out


def decode_linear_spec(decoder, prompt_ids: list[int], block: int) -> Generation:
    run, mask = _Run(decoder, prompt_ids), decoder.lm.mask_token_id
    drafted, accepted_per_block, replaced = [], [], []
    t0 = device_clock(run.lm.device)
    seed = int(run.forward(prompt_ids, 0, bidirectional=False, keep=1)[-1].argmax())
    run.commit([seed])
    counted = 0  # the prompt's forward counts in the first block
    while run.cut is None:
        start = len(prompt_ids) + len(run.out) - 1
        width = min(block, run.budget - len(run.out) + 1)
        drafts: list[int] = []
        if width > 1:  # the draft: every masked slot its argmax, in one bidirectional forward
            logits = run.forward([seed] + [mask] * (width - 1), start, bidirectional=True, keep=width)
            drafts = logits[1:].argmax(-1).tolist()
        # the verify: [seed, drafts] causally; ntp[i] is the argmax after slot i
        ntp = run.forward([seed] + drafts, start, bidirectional=False, keep=width).argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == ntp[accepted]:
            accepted += 1
        run.cache.rollback(width - (accepted + 1))  # keep the seed and the accepted drafts
        drafted.append(len(drafts))
        accepted_per_block.append(accepted)
        replaced.append(int(accepted < len(drafts)))
        run.forwards_per_block.append(run.forwards - counted)
        counted = run.forwards
        seed = ntp[accepted]  # the bonus: committed now, the next block's seed
        run.commit(ntp[: accepted + 1])
    t1 = device_clock(run.lm.device)
    return run.generation(t0, t1, vendor_nfe=run.forwards, drafted_per_block=drafted,
                          accepted_per_block=accepted_per_block, replaced_per_block=replaced)


SCHEDULES = {"dlm": decode_dlm, "linear_spec": decode_linear_spec}


def decode_with_schedule(decoder, prompt_ids: list[int], solver) -> Generation:
    """Decode one prompt with ``solver``'s ``ScheduleBaseline`` (see the module docstring)."""
    baseline = schedule_baseline(solver)
    decoder.check_prompt(prompt_ids)
    return SCHEDULES[baseline.schedule](decoder, prompt_ids, **baseline.schedule_options())
