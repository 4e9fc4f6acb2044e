"""The whole core <-> plugin contract: what a solver sees and returns, what a task provides, and the
records a run writes. Read this file first; everything else in sbd_bench is built around it.

A solver is a dataclass whose fields are its parameters (validated in ``__post_init__``) and whose
``select`` turns one forward's view of a block into the set of positions to reveal::

    @dataclass(frozen=True)
    class TopOne(Solver):
        name: ClassVar[str] = "top_one"
        def select(self, view: BlockView) -> torch.Tensor:
            conf = view.confidence.masked_fill(~view.masked, -1.0)          # (B, k)
            return torch.nn.functional.one_hot(conf.argmax(-1), view.k).bool() & view.masked

The core owns the model, the cache, token choice (argmax at temperature 0, a draw from the tempered and
filtered distribution above it: ``Sampling``) and NFE counting; a solver only chooses *where*, never
*what*, and never calls the model.

A solver that remembers or changes its mind asks for it with a class flag and still holds no state:
``reads_history`` hands it what earlier forwards of the block showed (``BlockView.previous_logits``,
``revealed_at``, ``block``, and the ``state`` tensor it returned last time), ``revokes`` lets it return a
``Decision`` that masks revealed positions again, ``reads_shadow`` adds to each forward a masked query per
slot that sees the other slots, the trained signal for judging a revealed token (docs/solvers.md, 'Porting
a paper's sampler').
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # torch is imported where tensors are used, so `report`/`compare` never load it
    import torch

SCHEMA_VERSION = 1


# ----------------------------------------------------------------------------------------- solvers
class cached_property:  # noqa: N801 (functools' name, for what it does)
    """``functools.cached_property`` without its lock (Python 3.11 takes one on every first read, a cost in
    each forward; a view is read by one thread): the value is computed on first use and kept in the
    instance's ``__dict__``, which later reads find first."""

    def __init__(self, compute):
        self.compute, self.name, self.__doc__ = compute, compute.__name__, compute.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


@dataclass(frozen=True, eq=False)
class BlockView:
    """One forward's output over a block of k positions, for B sequences.

    Only ``logits`` and ``masked`` are given; the proxies are computed once, on first use, and shared
    by every solver that reads them. The mask token's logit is already -inf.
    """

    logits: torch.Tensor  # (B, k, V) float32
    masked: torch.Tensor  # (B, k) bool: True where the position is still masked (and can still change the output:
    #                       none after a revealed stop token or past the budget; docs/decoding.md, 'Stops inside a block')
    step: int = 0  # 0 on the block's first forward, 1 on the next, ...
    generator: torch.Generator | None = None  # seeded by the core, for randomised solvers
    # What earlier forwards of this block left; None unless the solver's class sets reads_history, revokes
    # or reads_shadow. The core keeps it, the solver only reads it.
    block: torch.Tensor | None = None  # (B, k) long: the tokens the block holds, the mask token where masked
    revealed_at: torch.Tensor | None = None  # (B, k) long: the step that revealed each position; -1 masked,
    #                                          -2 the core's own (verified mode's first slot: NTP's token)
    previous_logits: torch.Tensor | None = None  # (B, k, V) this block's previous forward (None at step 0)
    state: torch.Tensor | None = None  # (B, k, ...) the Decision.state of the previous forward (None at step 0)
    # reads_shadow only, from step 1 on: at slot i, the logits of a masked query at i that sees every other
    # slot as the block holds it (the view SBD training gives a masked slot): a trained opinion of block[i]
    shadow_logits: torch.Tensor | None = None  # (B, k, V)

    @property
    def k(self) -> int:
        return self.masked.shape[-1]

    @cached_property
    def log_probs(self) -> torch.Tensor:  # (B, k, V)
        return self.logits.log_softmax(dim=-1)

    @cached_property
    def entropy(self) -> torch.Tensor:  # (B, k), nats, untempered
        return _entropy(self.log_probs)

    @cached_property
    def previous_log_probs(self) -> torch.Tensor | None:  # (B, k, V), None at step 0
        return None if self.previous_logits is None else self.previous_logits.log_softmax(dim=-1)

    @property
    def revealed(self) -> torch.Tensor:  # (B, k) bool: what the solver revealed and may revoke
        return self.revealed_at >= 0

    @cached_property
    def shadow_confidence(self) -> torch.Tensor | None:  # (B, k): the shadow's probability of the block's token
        if self.shadow_logits is None:
            return None
        log_p = self.shadow_logits.log_softmax(dim=-1).gather(-1, self.block.clamp_min(0)[..., None])[..., 0]
        return log_p.exp()

    @cached_property
    def _top2(self) -> tuple[torch.Tensor, torch.Tensor]:  # (B, k, 2) each: the two largest log-probs, their ids
        return self.log_probs.topk(2, dim=-1)

    @cached_property
    def _top2_probs(self) -> torch.Tensor:  # (B, k, 2), only for the proxies that read them (tokens does not)
        return self._top2[0].exp()

    @cached_property
    def confidence(self) -> torch.Tensor:  # (B, k): max_v p(v)
        return self._top2_probs[..., 0]

    @cached_property
    def margin(self) -> torch.Tensor:  # (B, k): p(top1) - p(top2)
        probs = self._top2_probs
        return probs[..., 0] - probs[..., 1]

    @cached_property
    def tokens(self) -> torch.Tensor:  # (B, k): the argmax the core will commit
        return self._top2[1][..., 0]


def _entropy(log_probs: torch.Tensor) -> torch.Tensor:
    entropy = -(log_probs.exp() * log_probs.nan_to_num(neginf=0.0)).sum(-1)
    return entropy.clamp_min(0.0)  # rounding can leave -1e-7


@dataclass(frozen=True, eq=False)
class Decision:
    """What ``select`` may return instead of the bare (B, k) reveal tensor."""

    reveal: torch.Tensor  # (B, k) bool: positions to reveal now, as select's plain return
    # (B, k) bool: positions this solver revealed in earlier forwards of the block, masked again now; only a
    # solver with revokes=True may return it, and never one it reveals in the same forward
    remask: torch.Tensor | None = None
    state: torch.Tensor | None = None  # (B, k, ...) any tensor: the block's next forward hands it back (view.state)


class UsageError(ValueError):
    """Bad input from the user. The CLI prints its message as one line and exits non-zero; every
    module's error class for bad input derives from it, and its message names the fix."""


def did_you_mean(name: str, known, what: str) -> str:
    """The one-line message for an unknown name: the closest known one, then all of them."""
    import difflib

    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"unknown {what} '{name}': {hint}available: {', '.join(known)}"


class SolverError(UsageError):
    """A solver parameter is invalid."""


@dataclass(frozen=True)
class Solver:
    """Base class of every solver. Subclasses are frozen dataclasses; their fields are parameters.

    Capability flags are class attributes:
      ``decodes_blocks``  False means true next-token decoding through the causal stream (the NTP
                          baseline); ``select`` is then never called.
      ``deterministic``   False when ``select`` draws from ``view.generator``.
      ``verify``          set by the core's verify mode (``Verified``, ``name:...;verify=on``), never
                          by a solver: the core then commits only drafts that NTP's argmax confirms.
      ``sampling``        how the core picks revealed tokens; set by ``Sampled`` (``name:...;temperature=T``),
                          never by a solver: greedy unless a configuration asks for a temperature.
      ``reads_history``   the view carries ``block``, ``revealed_at``, ``previous_logits`` and ``state``.
      ``revokes``         ``select`` may return ``Decision(remask=...)`` (implies reads_history). A block then
                          takes at most ``max_block_forwards`` forwards (default 2k): at the last one the core
                          reveals every position still masked and counts them in ``forced_per_block``.
      ``reads_shadow``    the view carries ``shadow_logits`` from step 1 on (implies reads_history); each such
                          forward holds 2k block queries instead of k: still one forward, one NFE.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    decodes_blocks: ClassVar[bool] = True
    deterministic: ClassVar[bool] = True
    verify: ClassVar[bool] = False
    reads_history: ClassVar[bool] = False
    revokes: ClassVar[bool] = False
    reads_shadow: ClassVar[bool] = False
    # sampling = GREEDY is set below, once Sampling exists (not annotated: it must not be a dataclass field here)

    def select(self, view: BlockView) -> torch.Tensor | Decision:
        """Return a (B, k) bool tensor: positions to reveal now, or a ``Decision`` holding it. The reveal set
        must be a subset of ``view.masked`` holding at least one position in every row that still has a
        mask. Must not modify ``view``."""
        raise NotImplementedError

    @property
    def keeps_history(self) -> bool:
        """Whether the core hands this solver's views what earlier forwards of the block showed."""
        return self.reads_history or self.revokes or self.reads_shadow

    @property
    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def label(self) -> str:
        """``name:key=value,...``: the configuration's name in records, tables and ``--solver``."""
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.params.items())


@dataclass(frozen=True)
class Wrapped(Solver):
    """What a configuration that wraps a solver (``Verified``, ``Sampled``) takes from it unchanged: its
    name, its choices and what it asks of the core."""

    solver: Solver

    @property
    def name(self) -> str:
        return self.solver.name

    @property
    def deterministic(self) -> bool:
        return self.solver.deterministic

    @property
    def reads_history(self) -> bool:
        return self.solver.reads_history

    @property
    def revokes(self) -> bool:
        return self.solver.revokes

    @property
    def reads_shadow(self) -> bool:
        return self.solver.reads_shadow

    def select(self, view: BlockView) -> torch.Tensor | Decision:
        return self.solver.select(view)


@dataclass(frozen=True)
class Verified(Wrapped):
    """A block solver decoded in the core's verify mode (``--solver "name:...;verify=on"``): the solver
    drafts each block as usual, and the core commits a drafted token only where it equals NTP's argmax
    after the committed tokens before it, so the output is NTP's, token for token (docs/decoding.md, 'Verified
    decoding'). Any solver gets it, plugins included: it wraps the solver and changes nothing in it.
    Params and label are the solver's plus ``verify=on``."""

    verify: ClassVar[bool] = True

    @property
    def description(self) -> str:
        return self.solver.description + " (verified)"

    @property
    def sampling(self) -> Sampling:
        return self.solver.sampling

    @property
    def params(self) -> dict[str, Any]:
        return {**self.solver.params, "verify": "on"}

    @property
    def label(self) -> str:
        return self.solver.label + ("," if self.solver.params else ":") + "verify=on"


# The smallest temperature above 0 that the core divides logits by. Logits are divided in float32 (largest
# finite value 3.4e38): below 1e-6 a logit of 3.4e32 / T already overflows, and 1e-45 or 1e-300 (0 once
# in float32) turns every logit into inf and the probabilities into NaN. At 1e-6 a logit gap of 1e-4
# already weighs exp(-100): the distribution is the argmax's but for exact ties, so nothing smaller is
# a temperature anyone needs (greedy is temperature 0).
MIN_TEMPERATURE = 1e-6


class SamplingError(UsageError):
    """A temperature, top-p, top-k or sample count the core cannot use; the message names the fix."""


def sampling_problem(temperature, top_p, top_k) -> tuple[str, str] | None:
    """(setting, what is wrong with it and what works) for the first bad sampling setting, else None."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not number(temperature) or not (math.isfinite(temperature) and temperature >= 0):  # also refuses NaN
        return "temperature", f"must be a number >= 0 (got {temperature}); 0 decodes greedily (argmax)"
    if 0 < temperature < MIN_TEMPERATURE:
        return "temperature", (f"must be 0 or at least {MIN_TEMPERATURE:g} (got {temperature}): logits divided by a "
                               f"smaller one overflow (NaN probabilities); give 0 for greedy decoding (argmax), "
                               f"which so small a temperature only approaches")
    if not number(top_p) or not 0 < top_p <= 1:
        return "top_p", f"must be in (0, 1] (got {top_p}); 1 keeps the whole distribution"
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        return "top_k", f"must be an integer >= 0 (got {top_k}); 0 keeps every token"
    return None


@dataclass(frozen=True)
class Sampling:
    """How the core turns a position's logits into its token: the argmax at ``temperature`` 0 (greedy, the
    default), else a draw from what HF ``generate(do_sample=True)`` samples from: logits / temperature,
    then top-k, then top-p (core/sampling.py). Which positions a block solver reveals is still decided on
    the untempered logits (``BlockView``). Greedy ignores top-p and top-k (``effective``)."""

    temperature: float = 0.0
    top_p: float = 1.0  # keep the fewest most probable tokens whose probabilities add up to top_p; 1: all
    top_k: int = 0  # keep the top_k most probable tokens (and any tied with the last); 0: all

    def __post_init__(self):
        t, p, k = self.temperature, self.top_p, self.top_k
        problem = sampling_problem(t, p, k)
        if problem:
            raise SamplingError(" ".join(problem))
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def effective(self) -> Sampling:
        """What decodes: greedy ignores top-p and top-k, so every greedy setting is ``GREEDY``."""
        return GREEDY if self.greedy else self

    @property
    def params(self) -> dict[str, Any]:
        """What a configuration's params and label gain: nothing when greedy, else the settings that act."""
        if self.greedy:
            return {}
        return {"temperature": self.temperature, **({"top_p": self.top_p} if self.top_p < 1 else {}),
                **({"top_k": self.top_k} if self.top_k else {})}


GREEDY = Sampling()
SAMPLING_KEYS = ("temperature", "top_p", "top_k")  # core options in every spec, never solver parameters
Solver.sampling = GREEDY


@dataclass(frozen=True)
class Sampled(Wrapped):
    """A configuration decoded at a temperature (``--solver "name:...;temperature=0.8"``, or ``--temperature``
    for the whole run): the solver chooses positions as always, the core draws the revealed tokens from the
    tempered, filtered distribution (``Sampling``); with ``verify=on`` the speculative-sampling rule keeps
    the output distributed as NTP's sampling. Params and label are the solver's plus the sampling settings."""

    sampling: Sampling = GREEDY

    @property
    def description(self) -> str:
        return self.solver.description + f" (sampled at temperature {self.sampling.temperature})"

    @property
    def decodes_blocks(self) -> bool:
        return self.solver.decodes_blocks

    @property
    def verify(self) -> bool:
        return self.solver.verify

    @property
    def params(self) -> dict[str, Any]:
        return {**self.solver.params, **self.sampling.params}

    @property
    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.sampling.params.items())
        if not extra:
            return self.solver.label
        return self.solver.label + ("," if self.solver.params else ":") + extra


def sampled(solver: Solver, sampling: Sampling) -> Solver:
    """``solver`` decoded with ``sampling``: itself when greedy (its label and records stay as they were)."""
    inner = solver.solver if isinstance(solver, Sampled) else solver
    return inner if sampling.greedy else Sampled(inner, sampling.effective)


# ------------------------------------------------- baselines decoded by transformers' own generate
@dataclass(frozen=True)
class GenerateBaseline(Solver):
    """Base class of the baselines the core decodes with transformers' own ``generate`` (prompt lookup,
    assisted decoding with a draft model: core/hf_generate.py, docs/baselines.md) on the same model, prompt,
    stops and budget as every other configuration: the lossless speed-ups a user has without fine-tuning.
    A subclass's fields are its parameters; it says how to call ``generate`` (``generate_options``: its
    keyword arguments, HF's names) and which draft model it needs (``draft_model``: a folder or a shipped
    model name; None: none). The core never calls ``select``, and verify mode does not apply: ``generate``
    keeps the target's own output already."""

    decodes_blocks: ClassVar[bool] = False
    decoded_by: ClassVar[str] = "transformers' generate"  # what the refusals name

    @property
    def draft_model(self) -> str | None:
        return None

    def generate_options(self) -> dict[str, Any]:
        raise NotImplementedError

    def select(self, view: BlockView) -> torch.Tensor:
        raise RuntimeError(f"{self.name} decodes with {self.decoded_by}; the core never asks it to select")


@dataclass(frozen=True)
class ScheduleBaseline(GenerateBaseline):
    """A model family's own decoding schedule, run as its vendor's code runs it (core/schedules.py,
    docs/models.md): Nemotron-Labs-Diffusion's ``dlm`` and self-speculation. Like the generate baselines it
    is decoded outside the core's loops (one row at a time, greedily), named, never in ``all``; its forwards
    go through the core's one model call, so ``nfe`` is counted as every configuration's is, and
    ``vendor_nfe`` as the vendor's code reports it. ``schedule``: which loop of core/schedules.py."""

    schedule: ClassVar[str] = ""
    decoded_by: ClassVar[str] = "its vendor's schedule"

    def generate_options(self) -> dict[str, Any]:
        return {}


def schedule_baseline(solver: Solver) -> ScheduleBaseline | None:
    """The ``ScheduleBaseline`` a configuration decodes with, else None."""
    inner = solver.solver if isinstance(solver, Sampled) else solver
    return inner if isinstance(inner, ScheduleBaseline) else None


def generate_baseline(solver: Solver) -> GenerateBaseline | None:
    """The ``GenerateBaseline`` a configuration decodes with (a sampled one unwrapped), else None."""
    inner = solver.solver if isinstance(solver, Sampled) else solver
    return inner if isinstance(inner, GenerateBaseline) else None


def reveal_top(score: torch.Tensor, masked: torch.Tensor, n: torch.Tensor | int) -> torch.Tensor:
    """The ``n`` highest-``score`` masked positions of each row, as a (B, k) bool tensor.

    ``score`` (B, k); ``n`` an int or a (B,) tensor, clipped to [1, #masked] per row. Ties go to the
    leftmost position, so the choice is deterministic.
    """
    import torch

    if isinstance(n, int) and n <= 1:  # the top one: argmax keeps the first of ties, as the stable sort does
        best = score.masked_fill(~masked, float("-inf")).argmax(dim=-1, keepdim=True)  # (B, 1)
        return (_slots(masked.shape[-1], masked.device) == best) & masked  # a row with nothing masked: nothing
    if isinstance(n, int):  # the first n of the order: past the masked ones it reaches unmasked, which the & drops
        order = score.masked_fill(~masked, float("-inf")).argsort(dim=-1, descending=True, stable=True)
        return torch.zeros_like(masked).scatter(-1, order[:, :n], True) & masked
    n_masked = masked.sum(-1)  # (B,)
    n = torch.as_tensor(n, device=masked.device).expand_as(n_masked)
    n = torch.minimum(n.clamp_min(1), n_masked)
    order = score.masked_fill(~masked, float("-inf")).argsort(dim=-1, descending=True, stable=True)
    rank = torch.arange(masked.shape[-1], device=masked.device).expand_as(order)
    return torch.zeros_like(masked).scatter(-1, order, rank < n.unsqueeze(-1)) & masked


@lru_cache(maxsize=16)
def _slots(k: int, device) -> torch.Tensor:
    """(k,) 0..k-1, one per block width and device, which ``reveal_top`` compares with its argmax in each
    forward (only read, never written)."""
    import torch

    return torch.arange(k, device=device)


# ------------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class Example:
    id: str
    prompt: str
    answer: str | None = None  # reference answer when one is known
    meta: dict[str, Any] = field(default_factory=dict)


class Task:
    """A named set of examples with a verifier. Subclasses set ``name`` and implement ``examples``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    suite: ClassVar[bool] = False  # True for the built-in synthetic tasks that ``--task suite`` runs
    pack: ClassVar[str | None] = None  # the name that runs it with its pack's others ('parallelbench:root=DIR')
    stop: tuple[str, ...] = ()  # stop strings that end generation (stop tokens come from the model)
    max_new_tokens: int = 256  # a sensible default budget for this task

    def examples(self, split: str = "test") -> list[Example]:
        raise NotImplementedError

    def encode(self, example: Example, tokenizer) -> list[int]:
        """Prompt token ids. Override for chat templates."""
        return tokenizer(example.prompt, add_special_tokens=True)["input_ids"]

    def score(self, example: Example, output: str) -> bool | None:
        """True/False when the output can be judged, None when there is no reference."""
        if example.answer is None:
            return None
        return output.strip() == example.answer.strip()

    def verdict(self, example: Example, output: str) -> tuple[bool | None, dict | None]:
        """``score`` plus an optional detail for the sample record's ``score_detail`` (the extracted
        answer, per-test outcomes of generated code). Override when there is more to say."""
        return self.score(example, output), None


# ----------------------------------------------------------------------------------------- records
@dataclass
class Generation:
    """What the decoding core returns for one prompt."""

    output_ids: list[int]  # generated ids up to and including the stop token; no masks, no prompt
    stop_reason: str  # "stop_token" | "stop_string" | "max_new_tokens" | "context"
    nfe: int  # model forwards after prefill
    prefill_forwards: int
    revealed_per_forward: list[int]  # tokens committed by each forward (after stop truncation)
    forwards_per_block: list[int]  # NTP: one entry per token
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0
    output_text: str = ""
    # verify mode only (None otherwise), one entry per block as in forwards_per_block: the block's drafted
    # tokens (its first, NTP's own, is not a draft), how many of them NTP confirmed, 1 if one was replaced
    drafted_per_block: list[int] | None = None
    accepted_per_block: list[int] | None = None
    replaced_per_block: list[int] | None = None
    # revoking solvers only (None otherwise), per block: positions masked again, positions the core revealed
    # at the max_block_forwards bound
    remasked_per_block: list[int] | None = None
    forced_per_block: list[int] | None = None
    draft_forwards: int | None = None  # GenerateBaseline only: forwards of its draft model (0: it drafts without one)
    vendor_nfe: int | None = None  # ScheduleBaseline only: the forwards its vendor's code reports (docs/models.md)
    # generate_batch(trace=True) only: {"pieces": {id: text}, "forwards": [one dict per forward]} (docs/records.md)
    trace: dict | None = None

    @cached_property
    def tokens(self) -> int:
        return len(self.output_ids)


# One line of samples.jsonl. Field names are stable: scripts and CI read them.
SAMPLE_FIELDS = (
    "task", "id", "solver", "params", "config", "block_size", "repeat",
    "prompt_tokens", "output_ids", "output_text", "stop_reason", "tokens", "nfe",
    "prefill_forwards", "revealed_per_forward", "forwards_per_block",
    "drafted_per_block", "accepted_per_block", "replaced_per_block",
    "wall_time_s", "prefill_time_s", "decode_time_s", "correct", "answer", "error",
    "peak_memory_bytes", "peak_memory_source", "memory", "prompt_hash", "score_detail", "batch_size",
    "prompt",  # the example's prompt text as the task gives it (before any chat template): the report shows it
)

# Fields that follow "repeat" in the records of sampled configurations only (temperature > 0, or --samples N
# > 1): the sample's index 0..N-1 and its seed. A greedy run's records are what they were before sampling.
SAMPLED_FIELDS = ("sample", "seed")

# Fields that follow "replaced_per_block" in the records of configurations whose solver revokes (Solver.revokes):
# per block, the positions masked again and those the core revealed at the bound; the bound itself.
REVOKE_FIELDS = ("remasked_per_block", "forced_per_block", "max_block_forwards")

# Records decoded with --exact (core/exact.py) add "exact": true; a plain run's records are what they were.

# Fields that follow "replaced_per_block" in the records of GenerateBaseline configurations only (transformers'
# generate): the draft model's forwards, apart from the target's (nfe); 0 where the draft needs no model.
# ScheduleBaseline configurations (a family's own schedule) carry "vendor_nfe" instead: the vendor's count.
GENERATE_FIELDS = ("draft_forwards", "vendor_nfe")

# One row of summary.json "rows" (per solver configuration x task).
SUMMARY_ROW_FIELDS = (
    "solver", "params", "config", "task", "n", "errors", "repeats", "accuracy", "accuracy_lo", "accuracy_hi",
    "samples", "pass_k", "pass_at_k", "pass_at_k_lo", "pass_at_k_hi",
    "nfe", "tokens", "tokens_per_forward", "acceptance_rate", "ntp_match_rate", "forwards_per_block", "tokens_vs_ntp",
    "tokens_differ_from_ntp",
    "speed_factor_nfe", "speed_factor_nfe_lo", "speed_factor_nfe_hi",
    "speed_factor_wall", "speed_factor_wall_lo", "speed_factor_wall_hi",
    "speed_factor_e2e", "speed_factor_e2e_lo", "speed_factor_e2e_hi", "draft_forwards",
    "vendor_nfe", "vendor_tokens_per_forward",
    "wall_time_s", "prefill_time_s", "decode_time_s",
    "peak_memory_bytes", "peak_memory_source", "peak_memory_nvml_bytes",
    "family", "aup", "aup_lo", "aup_hi", "aup_y_max",  # the row's solver family and its AUP on the task
)

# ParallelBench's tasks (tasks/parallelbench.py) are named "parallelbench/<group>/<task>"; the PB score is
# over those of a run, out of ParallelBench's 17.
PARALLELBENCH_PREFIX = "parallelbench/"
PARALLELBENCH_TASKS = 17
