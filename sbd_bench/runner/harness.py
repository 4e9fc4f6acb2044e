"""Runs solver configurations x tasks x examples on one model and writes the records as it goes.

    >>> run(RunConfig(model="sbd-tiny", tasks=["arith"], solvers="all", out=Path("runs/x")))
    >>> resume(Path("runs/x"))          # after an interruption: finishes only what is missing

One measurement routine for every solver (``measure_sample``): the decoder synchronises the device
before each clock read and times prefill apart from decoding; memory is read around each sample.
Examples are the outer loop, repeats the middle one and solver configurations the inner one, so the
NTP baseline and every solver decode the same example back to back in the same process: drift hits
all alike, and speed factors pair. Unrecorded warm-up decodes come first.

Nothing is lost: each finished sample is appended to ``samples.jsonl`` and flushed at once;
``summary.json`` is written atomically, first marked incomplete; a configuration that fails on an
example is recorded with its error and the sweep goes on; SIGTERM is handled like Ctrl-C.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

from ..analysis import metrics, yardsticks
from ..analysis.records import (SAMPLES, SUMMARY, RecordWriter, RunFolderError, RunFolderLock,
                                prepare_output_folder, read_records, read_summary, remove_empty_folders, repair_tail,
                                write_json_atomic)
from ..analysis.report import check_report_folder, write_report
from ..analysis.traces import TRACES
from ..core.decoding import check_model_output
from ..core.fastpath import FastPath
from ..core.hf_generate import check_baselines
from ..core.aligned import check_aligned
from ..core.aligned import refusal as aligned_refusal
from ..core.schedules import check_schedules
from ..core.model import MODELS_DIR, LoadedModel, cpu_model, device_name, folder_hash, load_model
from ..registry import parse_solver_spec, solver_registry
from ..tasks import load_task, task_options, task_registry
from ..tasks.code_tasks import CodeTask
from ..tasks.math_tasks import MathTask
from ..tasks.math_verifier import describe as describe_math_verify
from ..sandbox import isolation
from ..types import SCHEMA_VERSION, Example, Solver, Task, UsageError, generate_baseline
from .batches import batched_records, warm_up_batches
from .costcurve import measure_cost_curve
from .memory import nvml_for
from .samples import (Planned, RunConfig, is_sampled, measure_sample, prompt_hash, sample_seed, trace_sample,
                      use_fast_path)

MODEL_CONFIG_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings")


def shipped_relative(path: str) -> str:
    """A shipped model as 'models/NAME' (records stay the same on every machine); others as given."""
    resolved = Path(path).resolve()
    if resolved.parent == MODELS_DIR.resolve():
        return f"models/{resolved.name}"
    return path


# ------------------------------------------------------------------------------------- provenance
def _git(*args) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(cfg: RunConfig, lm: LoadedModel, threads_chosen: str | None = None) -> dict:
    """Everything needed to know what produced the numbers, and to reproduce them."""
    import transformers

    dev = lm.device
    gpu = {}
    if dev.type == "cuda":
        gpu = nvml_for(dev.index if dev.index is not None else torch.cuda.current_device()).versions()
    model_config = lm.model.config.to_dict()
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain")),
        "command": cfg.command or " ".join(sys.argv),
        "config": cfg.to_json(),
        "model_path": shipped_relative(lm.path),
        "model_hash": folder_hash(Path(lm.path)) if Path(lm.path).is_dir() else None,
        "model_info": lm.info,
        "model_config": {k: model_config.get(k) for k in MODEL_CONFIG_KEYS},
        "device": str(dev),
        "device_name": device_name(dev),
        "gpu_name": gpu.get("gpu_name"),
        "driver_version": gpu.get("driver_version"),
        "cuda_driver_version": gpu.get("cuda_driver_version"),
        "cuda": torch.version.cuda,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "threads_chosen": threads_chosen,  # why that many: --threads, or the rule of choose_threads
        "dtype": str(lm.dtype).removeprefix("torch."),
        "attn_implementation": lm.attn_implementation,
        "exact": lm.exact,
        "seed": cfg.seed,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# --------------------------------------------------------------------------------------- the run
@contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a killed job, a CI timeout) unwinds like Ctrl-C, so the summary is written."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
        previous = signal.signal(signal.SIGTERM, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
    else:
        yield


def run_examples(cfg: RunConfig, task: Task) -> list[Example]:
    """The examples of ``task`` the run decodes: its test split up to --limit, or the ids chosen in
    ``cfg.example_ids`` (tune's calibration and held-out parts), in the split's order."""
    examples = task.examples("test")
    if cfg.example_ids is None:
        return examples[: cfg.limit]
    wanted = {str(i) for i in cfg.example_ids.get(task.name, [])}
    chosen = [e for e in examples if str(e.id) in wanted]
    if len(chosen) < len(wanted):
        missing = sorted(wanted - {str(e.id) for e in chosen})
        raise UsageError(f"task '{task.name}' has no example with id {', '.join(missing[:3])}"
                         f"{' ...' if len(missing) > 3 else ''}: its examples changed since the ids were chosen; "
                         f"choose them again (a new tune)")
    return chosen


def plan_work(cfg: RunConfig, tasks: list[Task], lm: LoadedModel) -> list[tuple[Task, Example, list[int]]]:
    work = []
    for task in tasks:
        examples = run_examples(cfg, task)
        if not examples:
            raise UsageError(f"task '{task.name}' has no examples")
        for example in examples:
            ids = task.encode(example, lm.tokenizer)
            if lm.max_positions is not None and len(ids) >= lm.max_positions:
                raise UsageError(f"task '{task.name}' example {example.id}: prompt of {len(ids)} tokens does not fit "
                                 f"the model's context of {lm.max_positions}; drop it or use a longer-context model")
            work.append((task, example, ids))
    return work


# The most samples one run plans. Every record is read back into memory whole by `report`, `compare`
# and `--resume`: about 1.2 KB of JSON on disk and 5 KB as Python objects each (results/baseline's 4,320
# records: `wc -c` of its samples.jsonl, and tracemalloc around `read_records` of it), so a million are
# about 1.2 GB on disk and 5 GB of memory, and a day of decoding even at 0.1 s a sample. Larger studies
# are several runs (tasks or configurations split between them), which `compare` and `report` read
# one by one.
MAX_PLANNED_SAMPLES = 1_000_000


def check_plan_size(cfg: RunConfig, tasks: list[Task], solvers: list[Solver]) -> None:
    """Refuse, before the model loads, a run that plans more samples than one run folder can hold."""
    examples = sum(len(run_examples(cfg, task)) for task in tasks)
    planned = examples * len(solvers) * cfg.samples * cfg.repeats
    if planned <= MAX_PLANNED_SAMPLES:
        return
    flags = [f"--{name} {value}" for name, value in (("samples", cfg.samples), ("repeats", cfg.repeats)) if value > 1]
    lower = " or ".join(flag.split()[0] for flag in flags) or "--limit"
    raise UsageError(f"{' with '.join(flags) or 'this run'} plans {planned:,} samples ({examples:,} examples x "
                     f"{len(solvers)} configuration(s) x {cfg.samples:,} sample(s) x {cfg.repeats:,} repeat(s)), more "
                     f"than the {MAX_PLANNED_SAMPLES:,} one run folder holds (report, compare and --resume read every "
                     f"record into memory): lower {lower}, or split the tasks or configurations over several runs")


def unknown_characters(work, tokenizer) -> dict | None:
    """The prompt characters the tokenizer cannot encode, which it turns into its unknown token
    (``unk_token``) without a word: how many tokens, in how many prompts, and each character's count.
    None when there are none (byte-level tokenizers never have any)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    hit = [(example, ids) for _, example, ids in work if unk is not None and unk in ids]
    if not hit:
        return None
    probe: dict[str, bool] = {}
    characters: Counter[str] = Counter()
    for example, _ in hit:
        for char in example.prompt:
            if char not in probe:
                probe[char] = unk in tokenizer.encode(char, add_special_tokens=False)
            if probe[char]:
                characters[char] += 1
    return {"unk_token": tokenizer.unk_token, "tokens": sum(ids.count(unk) for _, ids in hit), "prompts": len(hit),
            "of_prompts": len(work), "characters": dict(characters.most_common())}


def plan_samples(work, solvers: list[Solver], cfg: RunConfig) -> list[Planned]:
    """Every sample of the run in measuring order: examples outer, then samples, repeats, configurations
    inner (every configuration decodes sample s of an example with the same seed, back to back)."""
    planned = []
    for task, example, ids in work:
        for sample in range(cfg.samples):
            seed = sample_seed(cfg.seed, task.name, example.id, sample)
            planned += [Planned(task, example, ids, repeat, solver, sample, seed if is_sampled(solver, cfg) else None)
                        for repeat in range(cfg.repeats) for solver in solvers]
    return planned


def warm_up(lm, work, solvers, cfg) -> None:
    """Unrecorded decodes, so that first-call costs (allocations, kernel selection) stay out of timings."""
    if cfg.batch_size > 1:  # only batches are timed: warm those
        if cfg.warmup:
            warm_up_batches(lm, work, solvers, cfg)
        return
    task, example, ids = work[0]
    for _ in range(cfg.warmup):
        for solver in solvers:
            measure_sample(lm, task, example, ids, solver, cfg, 0)


def cost_curve_context(work, cfg: RunConfig) -> int:
    budget = cfg.max_new_tokens or max(task.max_new_tokens for task, _, _ in work)
    return int(sum(len(ids) for _, _, ids in work) / len(work) + budget // 2)


def _measure_cost_curve(lm, work, cfg: RunConfig, summary: dict) -> None:
    """The per-forward cost curve for the cost model; a failure here is recorded, never fatal."""
    try:
        summary["cost_curve"] = measure_cost_curve(lm, cfg.block_size, cost_curve_context(work, cfg),
                                                   fast=use_fast_path(cfg, lm), compile=cfg.compile)
    except Exception as exc:
        summary["cost_curve"], summary["cost_curve_error"] = None, f"{type(exc).__name__}: {exc}"


def _open_run_folder(out: Path, resume: bool) -> tuple[dict | None, list[dict]]:
    """(summary, records) already in the folder, every line checked; nothing is written here, so a
    refusal (damaged records, a folder that belongs to another run) leaves the folder as it was."""
    if resume:
        return read_summary(out), read_records(out / SAMPLES)
    check_report_folder(out, also=(SUMMARY,))  # a summary or report of the user's is never replaced
    records = read_records(out / SAMPLES)
    if records and (out / SUMMARY).exists():
        raise UsageError(f"{out} already holds records: finish it with `python -m sbd_bench run --resume {out}` "
                         f"or choose another --out")
    return None, records  # records without a summary: a run killed before it wrote one, continued here


def _check_kept_records(records: list[dict], planned, out: Path, exact: bool) -> None:
    """Records found in a folder without summary.json must be samples of this command's run: same
    (configuration, task, example, sample, repeat), the same prompt, the same seed, and decoded with --exact if this one is."""
    seeds = {item.key: item.seed for item in planned}
    hashes = {item.key: prompt_hash(item.ids) for item in planned}
    for number, record in enumerate(records, start=1):
        key = metrics.sample_key(record)
        if key not in hashes or record.get("prompt_hash") not in (None, hashes[key]) or record.get("seed") != seeds[key]:
            raise UsageError(f"{out / SAMPLES}:{number} ({record['config']} on {record['task']}/{record['id']}) is not a "
                             f"sample of this command's run: continue the folder with the command that started it, "
                             f"or choose another --out")
        if bool(record.get("exact")) != exact:
            made, now = ("with", "without") if record.get("exact") else ("without", "with")
            raise UsageError(f"{out / SAMPLES}:{number} was decoded {made} --exact and this command runs {now} it: "
                             f"exact and plain records do not mix in one run; give the same --exact setting, or "
                             f"choose another --out")


def load_tasks(cfg: RunConfig) -> list[Task]:
    """The run's tasks, with --chat-template / --thinking passed to each; a task that takes no chat
    template (a synthetic task) is refused naming the flag, not the task option."""
    flags = {"chat_template": ("--chat-template", cfg.chat_template or None),
             "thinking": (f"--thinking {'on' if cfg.thinking else 'off'}", cfg.thinking)}
    options = {key: value for key, (_, value) in flags.items() if value is not None}
    for key in options:
        refused = [name for name in cfg.tasks if key not in task_options(name)]
        if refused:
            takers = [name for name in task_registry() if key in task_options(name)]
            raise UsageError(f"{flags[key][0]} applies to the benchmark tasks ({', '.join(takers)}) and JSONL "
                             f"files, not to {', '.join(f'{name} (synthetic)' for name in refused)}: drop {flags[key][0]}"
                             + (f", or run {', '.join(refused)} in another run without it"
                                if len(refused) < len(cfg.tasks) else ""))
    return [load_task(name, **options) for name in cfg.tasks]


# ----------------------------------------------------------------------------------------- threads
SMALL_MODEL_PARAMETERS = 100_000_000  # below this, one forward's matrix products are too small to share


def choose_threads(requested: int | None, lm: LoadedModel) -> tuple[int, str]:
    """(torch CPU threads, why). ``--threads`` wins. A model on a GPU keeps torch's default. On a CPU, a
    small model gets one thread: its matrix products take microseconds, so several threads spend more
    time waiting for each other than computing, and when another process holds a core they wait for the
    preempted one (10-20x slower, ../shared/STACK.md). A larger model gets the cores left free by the
    machine's load (1-minute load average), at least one."""
    if requested:
        return requested, f"--threads {requested}"
    if lm.device.type != "cpu":
        return torch.get_num_threads(), f"torch's default (the model is on {lm.device.type})"
    parameters = sum(p.numel() for p in lm.model.parameters())
    if parameters < SMALL_MODEL_PARAMETERS:
        return 1, (f"auto: 1 for a model of {parameters / 1e6:.2f}M parameters (< {SMALL_MODEL_PARAMETERS / 1e6:.0f}M: "
                   f"threads would wait on each other); set --threads to override")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    free = max(1, min(cores, torch.get_num_threads(), round(cores - load)))
    return free, f"auto: {free} of {cores} cores (load average {load:.1f}); set --threads to override"


# The batch of a small model in float32 on the CPU when --batch-size is not given. There greedy outputs, NFE
# and per-block counts are batch 1's (tests/test_batching.py; `scripts/same_records.py --ignore batch_size` of
# the main job at batch 1 and 16: 2240 records, 0 differences) and per-call costs dominate a forward, so
# decoding 16 examples per forward spends less than half the CPU time of batch 1 (docs/performance.md:
# 8, 16 and 40 took 51, 47 and 52 s of CPU for the main job's decodes, batch 1 about 100 s).
AUTO_BATCH_SIZE = 16


def choose_batch_size(requested: int | None, lm: LoadedModel) -> tuple[int, str]:
    """(sequences decoded together, why). ``--batch-size`` wins. Otherwise batches only where outputs do not
    depend on the batch and batching saves time: a model under 100M parameters in float32 on the CPU, not
    --exact (each row alone: no gain) nor spread by --device-map; elsewhere 1 (bf16 rounding can flip a near
    tie between batch sizes, and a GPU's batch-1 latency is what its wall-clock factors should say)."""
    if requested is not None:
        return requested, f"--batch-size {requested}"
    parameters = sum(p.numel() for p in lm.model.parameters())
    if lm.device.type != "cpu" or lm.dtype != torch.float32 or lm.exact or parameters >= SMALL_MODEL_PARAMETERS:
        return 1, "auto: 1 (batches only a model under 100M parameters in float32 on the CPU, not --exact)"
    return AUTO_BATCH_SIZE, (f"auto: {AUTO_BATCH_SIZE} for a float32 model of {parameters / 1e6:.2f}M parameters on the "
                             f"CPU (outputs and NFE are batch 1's there); set --batch-size to override")


# --------------------------------------------------------------------------------------- the run
class Progress:
    """What a run says while it goes. This one says nothing; the CLI's draws a progress bar."""

    def message(self, text: str) -> None:
        """A line for the user (a failure, what was chosen)."""

    def start(self, total: int, done: int) -> None:
        """The sweep begins: ``done`` of ``total`` samples are already recorded."""

    def update(self, record: dict) -> None:
        """One more sample recorded (``record["error"]`` is set when it failed)."""

    def close(self) -> None:
        """The sweep ended, finished or not."""


def run(cfg: RunConfig, progress: Progress | None = None, resume: bool = False) -> Path:
    """Decode every planned sample into the run folder ``cfg.out``, holding its lock throughout; with
    ``resume``, only those the folder has no record of yet. Bad input is refused before the model loads
    where it can be, and a refusal never changes the folder."""
    progress = progress or Progress()
    solvers = parse_solver_spec(cfg.solvers, solver_registry(cfg.plugins), cfg.sampling)
    tasks = load_tasks(cfg)
    out = Path(cfg.out)
    if resume and not out.is_dir():
        raise RunFolderError(f"run folder {out} does not exist: give the --out folder of an interrupted run")
    check_plan_size(cfg, tasks, solvers)
    created = [] if resume else prepare_output_folder(out)  # a bad --out costs no model load
    threads_before = torch.get_num_threads()
    try:
        with RunFolderLock(out, cfg.command or " ".join(sys.argv)), _sigterm_as_interrupt():
            summary, kept = _open_run_folder(out, resume)
            return _run_locked(cfg, solvers, tasks, out, summary, kept, progress)
    finally:
        torch.set_num_threads(threads_before)  # a library call leaves the process as it found it
        remove_empty_folders(created)  # a run refused or interrupted before its first write leaves nothing


def applicable_solvers(lm: LoadedModel, solvers: list[Solver], spec: str, progress) -> list[Solver]:
    """What a model can decode of ``solvers``: all of them, but for a family with no NTP path or with
    aligned blocks (core/families.py), where the ntp baseline and what 'all' adds that the family cannot
    decode (verified decoding; a shadow on shifted logits) are left out, with a line saying so; a
    configuration named in --solver that it cannot decode is refused (``check_aligned``)."""
    if lm.family.next_token and not lm.family.aligned:
        return solvers
    from_all = any(part.strip() == "all" for part in str(spec).split("+"))
    implied = {s.label for s in parse_solver_spec("all", solver_registry())} if from_all else set()
    dropped = [s for s in solvers if (s.name == "ntp" or s.label in implied) and aligned_refusal(lm, s)]
    kept = [s for s in solvers if s not in dropped]
    if not kept:
        raise UsageError(f"a {lm.family.name} checkpoint has no NTP path, and nothing but ntp was asked for: give "
                         f"block solvers with --solver (docs/models.md)")
    if dropped:
        progress.message(f"note: a {lm.family.name} checkpoint cannot decode {', '.join(s.label for s in dropped)} "
                         f"(no NTP path{', shifted logits' if lm.family.logit_shift else ''}): left out; tokens per "
                         f"forward compare the configurations (speed factors need NTP)")
    return kept


def _run_locked(cfg, solvers, tasks, out: Path, summary: dict | None, kept: list[dict], progress) -> Path:
    lm = load_model(cfg.model, family=cfg.family, device=cfg.device, dtype=cfg.dtype,
                    attn_implementation=cfg.attn_implementation,
                    device_map=cfg.device_map, exact=cfg.exact)
    threads, threads_chosen = choose_threads(cfg.threads, lm)
    torch.set_num_threads(threads)
    batch_size, batch_size_chosen = choose_batch_size(cfg.batch_size, lm)
    cfg = dataclasses.replace(cfg, batch_size=batch_size)  # recorded (provenance.config) as the number used
    torch.manual_seed(cfg.seed)
    work = plan_work(cfg, tasks, lm)
    traced = traced_examples(work, cfg.trace)  # before sharding: the first examples of each task, on every rank
    if cfg.shard is not None:  # torchrun: this rank's share, examples rank, rank + world, ... (distributed.py
        rank, world = cfg.shard  # has checked that every rank gets one)
        work = work[rank::world]
    check_model_output(lm, work[0][2])  # a model that computes NaN is refused before anything is decoded
    solvers = applicable_solvers(lm, solvers, cfg.solvers, progress)
    check_aligned(lm, cfg.block_size, solvers)  # aligned families: their block size, block solvers only
    check_baselines(lm, solvers)  # transformers' generate baselines: their draft models load and fit the model
    check_schedules(lm, solvers)  # a family's own schedules: a next-token model, no --exact
    planned = plan_samples(work, solvers, cfg)
    prov = {**provenance(cfg, lm, threads_chosen), "batch_size_chosen": batch_size_chosen}
    unknown = unknown_characters(work, lm.tokenizer)
    if unknown:  # recorded, and said once per run (below): the model reads those prompts with holes in them
        prov["unknown_characters"] = unknown
    if any(isinstance(task, CodeTask) for task in tasks):  # how the generated code was isolated when judged
        prov["sandbox"] = isolation().describe()
    math_tasks = [task for task in tasks if isinstance(task, MathTask)]
    if math_tasks:  # what judged the math answers (each record names its scorer)
        prov["math_verify"] = describe_math_verify(max(task.budget_s for task in math_tasks))
    resumption = {**{k: prov[k] for k in ("command", "git_commit", "started", "threads", "threads_chosen")},
                  "records_kept": len(kept)}
    if summary is None:
        if kept:
            _check_kept_records(kept, planned, out, cfg.exact)
            prov["resumed"] = [{**resumption, "without_summary": True}]
        summary = {"schema_version": SCHEMA_VERSION, "complete": False, "provenance": prov, "rows": [],
                   "failures": [], "cost_curve": None, "resume_command": resume_command(out)}
    else:
        _check_same_model(summary, prov, out)
        earlier = summary.pop("resumed", [])  # folders written before resumptions moved into provenance
        summary["provenance"] = summary.get("provenance") or {}
        summary["provenance"]["resumed"] = [*summary["provenance"].get("resumed", earlier), resumption]
        summary["complete"], summary["resume_command"] = False, resume_command(out)
    # every check is behind us: from here on the folder changes
    if kept:
        repair_tail(out / SAMPLES)
    else:
        (out / SAMPLES).unlink(missing_ok=True)
    write_json_atomic(out / SUMMARY, summary)

    done = {metrics.sample_key(r) for r in kept}
    todo = [item for item in planned if item.key not in done]
    try:
        if unknown:
            progress.message(_unknown_warning(unknown, shipped_relative(lm.path)))
        progress.message(f"{shipped_relative(lm.path)} on {lm.device}, {threads} thread(s) ({threads_chosen}); "
                         f"{len(todo)} of {len(planned)} samples to decode into {out}")
        for line in sampling_notes(cfg, solvers):
            progress.message(line)
        if todo:
            warm_up(lm, work, solvers, cfg)
        if cfg.cost_curve and not summary.get("cost_curve"):
            _measure_cost_curve(lm, work, cfg, summary)
        _sweep(lm, todo, cfg, out, summary, len(planned), len(planned) - len(todo), progress, traced)
    except BrokenPipeError:  # the reader of the progress went away (`run ... 2>&1 | head`): stopped after the
        if cfg.report and read_records(out / SAMPLES):  # sample in hand; the report is written as for a
            write_report(out)  # finished run, and it and the summary say how to resume
        raise
    if cfg.report:
        write_report(out)
    return out


def _unknown_warning(unknown: dict, model: str) -> str:
    shown = ", ".join(f"{char!r} x{count}" for char, count in list(unknown["characters"].items())[:8])
    return (f"warning: {unknown['tokens']} prompt token(s) in {unknown['prompts']} of {unknown['of_prompts']} prompts "
            f"are {unknown['unk_token']}: the tokenizer of {model} cannot encode {shown or 'some of their characters'}; "
            f"the model reads {unknown['unk_token']} in their place (use a model whose tokenizer covers them, or "
            f"prompts without them)")


def traced_examples(work, count: int | None) -> set[tuple[str, str]] | None:
    """(task, example id) of the examples whose samples are traced: the first ``count`` of each task; None:
    every one."""
    if count is None:
        return None
    seen: Counter = Counter()
    chosen = set()
    for task, example, _ in work:
        if seen[task.name] < count:
            chosen.add((task.name, str(example.id)))
        seen[task.name] += 1
    return chosen


def _sweep(lm, todo, cfg, out: Path, summary: dict, total: int, done: int, progress: Progress,
           traced: set | None = None) -> None:
    writer, tracer = RecordWriter(out / SAMPLES), None
    items = {item.key: item for item in todo}
    if cfg.batch_size > 1:
        records = batched_records(lm, todo, cfg)
    else:
        records = (measure_sample(lm, item.task, item.example, item.ids, item.solver, cfg, item.repeat, item.sample,
                                  item.seed) for item in todo)
    progress.start(total, done)
    try:
        for record in records:
            item = items[metrics.sample_key(record)]
            if not record["error"] and item.repeat == 0 and item.sample == 0 and generate_baseline(item.solver) is None \
                    and (traced is None or (item.task.name, str(item.example.id)) in traced):  # generate: no forwards to see
                tracer = tracer or RecordWriter(out / TRACES)
                tracer.write(trace_sample(lm, item, cfg))  # before the record: a resumed run traces it again
            writer.write(record)
            progress.update(record)
    finally:
        writer.close()
        if tracer is not None:
            tracer.close()
        progress.close()
        if use_fast_path(cfg, lm):  # which way the forwards ran (compiled CUDA graphs, or why not), and
            path = FastPath.for_model(lm, cfg.compile)  # what compiling and capturing cost (warm-up)
            summary["provenance"].update(fast_path=path.status, fast_path_warmup_s=round(path.warmup_s, 3),
                                         fast_path_graphs=path.captures)
        write_summary(out, summary, total)


def sampling_notes(cfg: RunConfig, solvers: list[Solver]) -> list[str]:
    """Settings that do nothing, said once (not refused: a sweep may mix greedy and sampled configurations)."""
    notes = []
    if cfg.temperature == 0 and (cfg.top_p < 1 or cfg.top_k) and all(s.sampling.greedy for s in solvers):
        notes.append("note: --top-p and --top-k act only at a temperature > 0; every configuration here is greedy")
    greedy = [s.label for s in solvers if s.sampling.greedy and s.deterministic]
    if cfg.samples > 1 and greedy:
        notes.append(f"note: --samples {cfg.samples} decodes each example {cfg.samples} times, and greedy "
                     f"configurations ({', '.join(greedy)}) give the same output every time")
    return notes


def write_summary(out: Path, summary: dict, total: int) -> None:
    records = read_records(out / SAMPLES)
    config = (summary.get("provenance") or {}).get("config") or {}
    summary["rows"] = metrics.summarize(records, config.get("pass_k"))
    summary["yardsticks"] = yardsticks.annotate(summary["rows"], records)
    summary["failures"] = [{"config": r["config"], "task": r["task"], "id": r["id"], "repeat": r.get("repeat", 0),
                            **({"sample": r["sample"]} if "sample" in r else {}), "error": r["error"]}
                           for r in records if r.get("error")]
    summary["complete"] = len({metrics.sample_key(r) for r in records}) >= total
    summary["samples"] = {"planned": total, "recorded": len(records)}
    summary["resume_command"] = None if summary["complete"] else resume_command(out)
    write_json_atomic(out / SUMMARY, summary)


def resume_command(out: Path) -> str:
    """The command that finishes the run in ``out``, as the user types it."""
    return f"python -m sbd_bench run --resume {shlex.quote(str(out))}"


def _check_same_model(summary: dict, prov: dict, out: Path) -> None:
    before = (summary.get("provenance") or {}).get("model_hash")
    if before and prov["model_hash"] and before != prov["model_hash"]:
        raise UsageError(f"{out} was started with another model (hash {before}, now {prov['model_hash']}): "
                         f"resuming would mix models; start a new run folder instead")


def resume(run_dir: Path, progress: Progress | None = None, command: str = "") -> Path:
    """Finish an interrupted run with the configuration it was started with."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        holder = run_dir.parent
        raise RunFolderError(f"--resume {run_dir} is a file: give the run folder "
                             + (f"that holds it: --resume {holder}" if (holder / SUMMARY).is_file() else
                                "(the --out folder of an interrupted run)"))
    if not run_dir.is_dir():
        raise RunFolderError(f"run folder {run_dir} does not exist: give the --out folder of an interrupted run")
    summary = read_summary(run_dir)
    config = (summary.get("provenance") or {}).get("config")
    if not isinstance(config, dict):
        raise RunFolderError(f"{Path(run_dir) / SUMMARY} records no settings (provenance.config): continue the run "
                             f"with the command that started it and `--out {run_dir}`")
    if summary.get("complete"):  # nothing to decode: the folder stays as it is, and no model loads
        report = run_dir / "report.md"
        (progress or Progress()).message(
            f"{run_dir} is complete ({(summary.get('samples') or {}).get('recorded', 'all')} samples recorded): nothing "
            f"to resume; " + (f"its report is {report}" if report.is_file() else
                              f"write its report with `python -m sbd_bench report {run_dir}`"))
        return run_dir
    cfg = RunConfig.from_json(config)
    cfg.out = Path(run_dir)
    cfg.command = command or cfg.command
    return run(cfg, progress=progress, resume=True)
