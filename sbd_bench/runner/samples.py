"""One sample: the run's settings (``RunConfig``), the decoder they give, and the record of one
decoded (configuration, example, sample, repeat), or of its failure.

    >>> record = measure_sample(lm, task, example, prompt_ids, solver, RunConfig(), repeat=0)
    >>> record["nfe"], record["correct"]

One measurement routine for every solver: the decoder synchronises the device before each clock read
and times prefill apart from decoding; memory is read around each sample.

Sampled configurations (temperature > 0, or ``--samples N`` > 1) decode each example N times; sample s
of an example has the seed ``sample_seed(--seed, task, id, s)``, the same for every configuration
(common random numbers: NTP and a solver draw from the same streams), recorded beside ``sample``. The
seed alone fixes the sample's tokens, whatever the batch it is decoded in, so ``--resume`` decodes a
missing sample exactly as the interrupted run would have. Greedy runs record neither field.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from ..core.decoding import BrokenModelError, Decoder, SolverContractError, check_max_block_forwards
from ..core.families import family_by_name
from ..core.model import LoadedModel
from ..types import Example, Sampling, SamplingError, Solver, Task, UsageError, sampling_problem
from .memory import MemoryMonitor


@dataclass
class RunConfig:
    model: str = "sbd-tiny"
    family: str | None = None  # the model's family (core/families.py); None: detected from its folder
    tasks: list[str] = field(default_factory=lambda: ["suite"])
    solvers: str = "all"
    out: Path = Path("runs/latest")
    block_size: int = 16
    max_new_tokens: int | None = None  # None: each task's own budget
    max_block_forwards: int | None = None  # None: 2 x block_size (core/decoding.py; revoking solvers only need it)
    limit: int | None = None
    seed: int = 0
    plugins: list[str] = field(default_factory=list)
    device: str = "auto"
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    command: str = ""
    repeats: int = 1  # timed decodes of each (example, config); timings are reported as medians
    warmup: int = 1  # unrecorded decodes per configuration before timing
    cost_curve: bool = True  # time 1, k, 1+k, 2k-token forwards for the cost model
    report: bool = True  # write the report (tables, plots) at the end
    threads: int | None = None  # torch CPU threads; 1 gives steadier timings on a busy machine
    chat_template: bool = False  # prompts through the tokenizer's chat template (benchmark tasks)
    thinking: bool | None = None  # the template's enable_thinking; None: its default
    batch_size: int | None = 1  # sequences decoded together (core/decoding.py); records are batch 1's (bit for bit with
    # exact); None: harness.choose_batch_size picks it once the model is loaded
    fast: bool | None = None  # preallocated cache + CUDA graphs; None: on for a model on one CUDA device
    compile: bool | None = None  # torch.compile inside the fast path's graphs; None: on with the graphs
    device_map: str | None = None  # e.g. "auto": spread a model too large for one GPU (accelerate)
    shard: tuple[int, int] | None = None  # (rank, world_size) under torchrun (distributed.py)
    temperature: float = 0.0  # run-wide sampling defaults; a spec's temperature=/top_p=/top_k= override them
    top_p: float = 1.0
    top_k: int = 0
    samples: int = 1  # decodes of each example per configuration (N of pass@k)
    pass_k: int | None = None  # the k of pass@k (None: N)
    exact: bool = False  # every row computed alone (core/exact.py); a different configuration for compare
    trace: int | None = 1  # traces.jsonl: the first N examples of each task (repeat 0, sample 0); None: every sample
    example_ids: dict[str, list[str]] | None = None  # task name -> the ids to decode (tune's splits); None: all

    def __post_init__(self):
        if self.family is not None:
            family_by_name(self.family)  # a typo is refused before anything loads
        if not 0 <= self.seed < 2 ** 64:  # torch's seed range (it raises an overflow error past it)
            raise UsageError(f"--seed must be between 0 and 2**64 - 1 = {2 ** 64 - 1} (got {self.seed})")
        if self.block_size < 1:
            raise UsageError(f"--block-size must be >= 1 (got {self.block_size})")
        if self.example_ids is not None and self.limit is not None:
            raise UsageError("--limit and chosen example ids do not mix: the ids already say which examples run")
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"--limit must be >= 1 (got {self.limit})")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens must be >= 1 (got {self.max_new_tokens})")
        check_max_block_forwards(self.block_size, self.max_block_forwards)
        if self.repeats < 1:
            raise UsageError(f"--repeats must be >= 1 (got {self.repeats})")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"--threads must be >= 1 (got {self.threads})")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0 (got {self.warmup})")
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1 (got {self.batch_size})")
        if self.compile and self.fast is False:
            raise UsageError("--compile compiles the fast path's forward, which --no-fast turns off: drop one of them")
        problem = sampling_problem(self.temperature, self.top_p, self.top_k)
        if problem:
            raise SamplingError(f"--{problem[0].replace('_', '-')} {problem[1]}")
        if self.trace is not None and self.trace < 0:
            raise UsageError(f"--trace must be a count >= 0 or 'all' (got {self.trace}); 0 traces nothing")
        if self.samples < 1:
            raise SamplingError(f"--samples must be >= 1 (got {self.samples}); 1 decodes each example once")
        if self.pass_k is not None and not 1 <= self.pass_k <= self.samples:
            raise SamplingError(f"--pass-k {self.pass_k} needs 1 <= k <= --samples ({self.samples}): pass@k is estimated "
                                f"from at least k samples per example; raise --samples or lower --pass-k")
        if self.exact and self.compile:
            raise UsageError("--exact computes each row with its own kernel calls, which torch.compile would fuse "
                             "again: drop --compile")
        if self.exact and self.attn_implementation != "sdpa":
            raise UsageError(f"--exact brings its own attention (one query at a time): drop --attn "
                             f"{self.attn_implementation}")
        if self.fast and self.device_map is not None:
            raise UsageError("--fast cannot be combined with --device-map: CUDA graphs do not span devices; "
                             "drop --fast (a device-mapped model runs eagerly)")

    @property
    def block_forwards(self) -> int:
        """The forwards a block may take (``--max-block-forwards``, default 2 x the block size)."""
        return self.max_block_forwards or 2 * self.block_size

    @property
    def sampling(self) -> Sampling:
        """The run-wide sampling settings (``--temperature``, ``--top-p``, ``--top-k``)."""
        return Sampling(self.temperature, self.top_p, self.top_k)

    def to_json(self) -> dict:
        """The settings as recorded in provenance; paths made absolute so `--resume` works from anywhere."""
        data = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        data["plugins"] = [str(Path(p).resolve()) for p in self.plugins]
        data["tasks"] = [str(Path(t).resolve()) if Path(t).is_file() else t for t in self.tasks]
        if Path(self.model).is_dir():
            data["model"] = str(Path(self.model).resolve())
        return data

    @classmethod
    def from_json(cls, data: dict) -> "RunConfig":
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in data.items() if k in known}
        values["out"] = Path(values.get("out", "runs/latest"))
        return cls(**values)


# ------------------------------------------------------------------------------ measuring a sample
def use_fast_path(cfg: RunConfig, lm: LoadedModel) -> bool:
    """--fast/--no-fast; by default on for a model on one CUDA device (graphs do not span devices), or
    when --compile asks for the compiled forward."""
    if cfg.fast is None:
        return (lm.device.type == "cuda" or bool(cfg.compile)) and cfg.device_map is None
    return cfg.fast


def make_decoder(lm: LoadedModel, task: Task, cfg: RunConfig, seed: int | None = None) -> Decoder:
    """The decoder of one sample (``seed``: its own, None: the run's --seed) or of a batch of them."""
    budget = cfg.max_new_tokens or task.max_new_tokens
    return Decoder(lm, block_size=cfg.block_size, max_new_tokens=budget, stop_strings=task.stop,
                   seed=cfg.seed if seed is None else seed, fast=use_fast_path(cfg, lm), compile=cfg.compile,
                   max_block_forwards=cfg.block_forwards)


# --------------------------------------------------------------------------------------- samples
class Planned(NamedTuple):
    """One decode the run has planned: a configuration on an example, its sample index and repeat."""

    task: Task
    example: Example
    ids: list[int]
    repeat: int
    solver: Solver
    sample: int = 0
    seed: int | None = None  # None: a greedy run's sample (decoded with --seed, recorded without one)

    @property
    def key(self) -> tuple:
        """The record's ``metrics.sample_key``."""
        return self.solver.label, self.task.name, str(self.example.id), self.sample, self.repeat


def is_sampled(solver: Solver, cfg: RunConfig) -> bool:
    """Whether the configuration's records are samples with seeds: a temperature, or N > 1 decodes."""
    return cfg.samples > 1 or not solver.sampling.greedy


def sample_seed(run_seed: int, task: str, example_id, sample: int) -> int:
    """The seed of sample ``sample`` of one example: a hash of the run's --seed, the task and the example
    id, so it does not depend on --limit, the example's place or the batch (48 bits: exact in JSON
    readers that hold numbers as doubles)."""
    digest = hashlib.sha256(json.dumps([run_seed, task, str(example_id), sample]).encode()).digest()
    return int.from_bytes(digest[:6], "little")


def decode_sample(lm: LoadedModel, task: Task, example: Example, prompt_ids: list[int], solver: Solver,
                  cfg: RunConfig, repeat: int = 0, sample: int = 0, seed: int | None = None) -> dict:
    """Decode one example with one solver configuration and return its sample record (``seed`` None: a
    greedy run's sample, recorded without sample index and seed)."""
    decoder = make_decoder(lm, task, cfg, seed)
    with MemoryMonitor(lm.device) as mem:
        gen = decoder.generate(prompt_ids, solver)
    return sample_record(task, example, prompt_ids, solver, cfg, repeat, gen, mem.result, sample=sample, seed=seed)


def sample_record(task: Task, example: Example, prompt_ids: list[int], solver: Solver, cfg: RunConfig,
                  repeat: int, gen, memory: dict, batch_size: int = 1, sample: int = 0, seed: int | None = None) -> dict:
    """The record of one decoded sample; at batch size B its timings and memory are its batch's,
    the times divided by B (core/decoding.py)."""
    correct, detail = task.verdict(example, gen.output_text)
    return {
        **_identity(task, example, prompt_ids, solver, cfg, repeat, sample, seed),
        "output_ids": gen.output_ids, "output_text": gen.output_text,
        "stop_reason": gen.stop_reason, "tokens": gen.tokens, "nfe": gen.nfe,
        "prefill_forwards": gen.prefill_forwards, "revealed_per_forward": gen.revealed_per_forward,
        "forwards_per_block": gen.forwards_per_block, "drafted_per_block": gen.drafted_per_block,
        "accepted_per_block": gen.accepted_per_block, "replaced_per_block": gen.replaced_per_block,
        **({"remasked_per_block": gen.remasked_per_block, "forced_per_block": gen.forced_per_block,
            "max_block_forwards": cfg.block_forwards} if solver.revokes else {}),
        **({"draft_forwards": gen.draft_forwards} if gen.draft_forwards is not None else {}),  # GENERATE_FIELDS
        **({"vendor_nfe": gen.vendor_nfe} if gen.vendor_nfe is not None else {}),
        "wall_time_s": gen.prefill_time_s + gen.decode_time_s, "prefill_time_s": gen.prefill_time_s,
        "decode_time_s": gen.decode_time_s, "correct": correct,
        "answer": example.answer, "error": None,
        "peak_memory_bytes": memory["peak_memory_bytes"], "peak_memory_source": memory["peak_memory_source"],
        "memory": memory, "score_detail": detail, "batch_size": batch_size,
    }


def trace_sample(lm: LoadedModel, item: Planned, cfg: RunConfig) -> dict:
    """The per-forward trace of a planned sample: decoded again, alone, with the trace on (the timed decode
    stays untraced), keyed like its record (docs/records.md, 'traces.jsonl')."""
    gen = make_decoder(lm, item.task, cfg, item.seed).generate_batch([item.ids], item.solver, trace=True)[0]
    drawn = {} if item.seed is None else {"sample": item.sample}
    return {"task": item.task.name, "id": item.example.id, "config": item.solver.label, "repeat": item.repeat,
            **drawn, "block_size": cfg.block_size, "output_ids": gen.output_ids, **gen.trace}


def failed_sample(task: Task, example: Example, prompt_ids: list[int], solver: Solver, cfg: RunConfig,
                  repeat: int, exc: BaseException, sample: int = 0, seed: int | None = None) -> dict:
    """The record of a sample whose decoding raised: the error instead of figures, with the line of the
    solver's own file it came from (a plugin's error names its file:line); SBD_BENCH_TRACEBACK=1 prints the
    whole traceback on stderr too."""
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    message += _solver_line(exc, solver)
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        traceback.print_exception(exc, file=sys.stderr)
    return {**_identity(task, example, prompt_ids, solver, cfg, repeat, sample, seed),
            "output_ids": [], "output_text": "", "stop_reason": "error", "tokens": 0, "nfe": 0,
            "prefill_forwards": 0, "revealed_per_forward": [], "forwards_per_block": [],
            "drafted_per_block": None, "accepted_per_block": None, "replaced_per_block": None,
            **({"remasked_per_block": None, "forced_per_block": None, "max_block_forwards": cfg.block_forwards}
               if solver.revokes else {}),
            "wall_time_s": None, "prefill_time_s": None, "decode_time_s": None, "correct": None,
            "answer": example.answer, "error": message, "peak_memory_bytes": None, "peak_memory_source": None,
            "memory": None, "score_detail": None}


TRACEBACK_ENV = "SBD_BENCH_TRACEBACK"  # set to 1: a failed sample's whole traceback goes to stderr too


def _solver_line(exc: BaseException, solver: Solver) -> str:
    """' (at FILE:LINE; ...)': the deepest frame of the traceback in the solver's own file (a wrapper's
    solver: ``Verified``, ``Sampled``); '' when the error arose elsewhere (the core names the solver itself)."""
    while hasattr(solver, "solver"):
        solver = solver.solver
    try:
        source = Path(inspect.getfile(type(solver))).resolve()
    except (TypeError, OSError):
        return ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == source]
    if frames:
        return f" (at {frames[-1].filename}:{frames[-1].lineno}; {TRACEBACK_ENV}=1 prints the traceback)"
    if isinstance(exc, SolverContractError):  # the core found the answer wrong: where the answer is made
        try:
            line = inspect.getsourcelines(type(solver).select)[1]
        except (TypeError, OSError):
            return ""
        return f" (its select: {inspect.getfile(type(solver))}:{line})"
    return ""


def _identity(task, example, prompt_ids, solver, cfg, repeat, sample=0, seed=None) -> dict:
    drawn = {} if seed is None else {"sample": sample, "seed": seed}  # greedy records stay as they were
    return {"task": task.name, "id": example.id, "solver": solver.name, "params": solver.params,
            "config": solver.label, "block_size": cfg.block_size, "repeat": repeat, **drawn,
            "prompt_tokens": len(prompt_ids), "prompt_hash": prompt_hash(prompt_ids), "prompt": example.prompt,
            **({"exact": True} if cfg.exact else {})}


def prompt_hash(prompt_ids: list[int]) -> str:
    """Identifies the exact prompt, so that `compare` notices a task whose example ids stayed but whose
    prompts changed (then nothing it compares would mean anything)."""
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:12]


def measure_sample(lm, task, example, ids, solver, cfg, repeat, sample: int = 0, seed: int | None = None) -> dict:
    """decode_sample, with failure isolation: an exception (an OOM included) becomes an error record."""
    try:
        return decode_sample(lm, task, example, ids, solver, cfg, repeat, sample, seed)
    except BrokenModelError:  # NaN or infinite logits: the model's fault, not the sample's; the run stops
        raise  # (its records so far kept), as the check before the first sample stops it
    except Exception as exc:  # KeyboardInterrupt / SystemExit are not Exceptions: they stop the sweep
        if lm.device.type == "cuda":
            torch.cuda.empty_cache()  # give an OOM'd configuration's memory back to the next one
        return failed_sample(task, example, ids, solver, cfg, repeat, exc, sample, seed)
