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

import os
import platform
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from ..analysis import metrics
from ..analysis.records import (SAMPLES, SUMMARY, RecordWriter, read_records, read_summary, repair_tail,
                                write_json_atomic)
from ..analysis.report import write_report
from ..core.fastpath import FastPath
from ..core.model import MODELS_DIR, LoadedModel, folder_hash, load_model
from ..registry import parse_solver_spec, solver_registry
from ..tasks import load_task
from ..types import SCHEMA_VERSION, Example, Solver, Task, UsageError
from .batches import batched_records, warm_up_batches
from .costcurve import measure_cost_curve
from .memory import nvml_for
from .samples import RunConfig, measure_sample, use_fast_path

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


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(cfg: RunConfig, lm: LoadedModel) -> dict:
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
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_model(),
        "gpu_name": gpu.get("gpu_name"),
        "driver_version": gpu.get("driver_version"),
        "cuda_driver_version": gpu.get("cuda_driver_version"),
        "cuda": torch.version.cuda,
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "dtype": str(lm.dtype).removeprefix("torch."),
        "attn_implementation": lm.attn_implementation,
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


def plan_work(cfg: RunConfig, tasks: list[Task], lm: LoadedModel) -> list[tuple[Task, Example, list[int]]]:
    work = []
    for task in tasks:
        examples = task.examples("test")[: cfg.limit]
        if not examples:
            raise UsageError(f"task '{task.name}' has no examples")
        for example in examples:
            ids = task.encode(example, lm.tokenizer)
            if lm.max_positions is not None and len(ids) >= lm.max_positions:
                raise UsageError(f"task '{task.name}' example {example.id}: prompt of {len(ids)} tokens does not fit "
                                 f"the model's context of {lm.max_positions}; drop it or use a longer-context model")
            work.append((task, example, ids))
    return work


def plan_samples(work, solvers: list[Solver], repeats: int):
    """Every sample of the run in measuring order: examples outer, repeats, configurations inner."""
    return [(task, example, ids, repeat, solver)
            for task, example, ids in work for repeat in range(repeats) for solver in solvers]


def _key(task: Task, example: Example, repeat: int, solver: Solver) -> tuple:
    return solver.label, task.name, str(example.id), repeat


def warm_up(lm, work, solvers, cfg) -> None:
    """Unrecorded decodes, so that first-call costs (allocations, kernel selection) stay out of timings."""
    task, example, ids = work[0]
    for _ in range(cfg.warmup):
        for solver in solvers:
            measure_sample(lm, task, example, ids, solver, cfg, 0)
    if cfg.batch_size > 1 and cfg.warmup:
        warm_up_batches(lm, work, solvers, cfg)


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


def _open_run_folder(cfg: RunConfig, resume: bool) -> tuple[Path, dict | None]:
    out = Path(cfg.out)
    if resume:
        summary = read_summary(out)
        repair_tail(out / SAMPLES)
        return out, summary
    if read_records(out / SAMPLES):
        raise UsageError(f"{out} already holds records: finish it with `python -m sbd_bench run --resume {out}` "
                         f"or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    (out / SAMPLES).unlink(missing_ok=True)
    return out, None


def run(cfg: RunConfig, progress=None, resume: bool = False) -> Path:
    solvers = parse_solver_spec(cfg.solvers, solver_registry(cfg.plugins))
    options = {"chat_template": cfg.chat_template or None, "thinking": cfg.thinking}
    tasks = [load_task(name, **{k: v for k, v in options.items() if v is not None}) for name in cfg.tasks]
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, attn_implementation=cfg.attn_implementation,
                    device_map=cfg.device_map)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    work = plan_work(cfg, tasks, lm)
    if cfg.shard is not None:  # torchrun: this rank's share, examples rank, rank + world, ... (distributed.py
        rank, world = cfg.shard  # has checked that every rank gets one)
        work = work[rank::world]
    out, summary = _open_run_folder(cfg, resume)
    prov = provenance(cfg, lm)
    if summary is None:
        summary = {"schema_version": SCHEMA_VERSION, "complete": False, "provenance": prov, "rows": [],
                   "failures": [], "cost_curve": None}
    else:
        _check_same_model(summary, prov, out)
        summary.setdefault("resumed", []).append({k: prov[k] for k in ("command", "git_commit", "started")})
        summary["complete"] = False
    write_json_atomic(out / SUMMARY, summary)

    planned = plan_samples(work, solvers, cfg.repeats)
    done = {metrics.sample_key(r) for r in read_records(out / SAMPLES)}
    todo = [s for s in planned if _key(s[0], s[1], s[3], s[4]) not in done]
    with _sigterm_as_interrupt():
        if todo:
            warm_up(lm, work, solvers, cfg)
        if cfg.cost_curve and not summary.get("cost_curve"):
            _measure_cost_curve(lm, work, cfg, summary)
        _sweep(lm, todo, cfg, out, summary, len(planned), len(planned) - len(todo), progress)
    if cfg.report:
        write_report(out)
    return out


def _sweep(lm, todo, cfg, out: Path, summary: dict, total: int, done: int, progress) -> None:
    writer = RecordWriter(out / SAMPLES)
    started = time.perf_counter()
    if cfg.batch_size > 1:
        records = batched_records(lm, todo, cfg)
    else:
        records = (measure_sample(lm, task, example, ids, solver, cfg, repeat)
                   for task, example, ids, repeat, solver in todo)
    try:
        for record in records:
            writer.write(record)
            done += 1
            if progress:
                status = f" FAILED: {record['error']}" if record["error"] else ""
                progress(done, total, time.perf_counter() - started,
                         f"{record['task']}/{record['id']} {record['config']}{status}")
    finally:
        writer.close()
        if use_fast_path(cfg, lm):  # which way the forwards ran (compiled CUDA graphs, or why not), and
            path = FastPath.for_model(lm, cfg.compile)  # what compiling and capturing cost (warm-up)
            summary["provenance"].update(fast_path=path.status, fast_path_warmup_s=round(path.warmup_s, 3),
                                         fast_path_graphs=path.captures)
        write_summary(out, summary, total)


def write_summary(out: Path, summary: dict, total: int) -> None:
    records = read_records(out / SAMPLES)
    summary["rows"] = metrics.summarize(records)
    summary["failures"] = [{"config": r["config"], "task": r["task"], "id": r["id"], "repeat": r.get("repeat", 0),
                            "error": r["error"]} for r in records if r.get("error")]
    summary["complete"] = len({metrics.sample_key(r) for r in records}) >= total
    summary["samples"] = {"planned": total, "recorded": len(records)}
    write_json_atomic(out / SUMMARY, summary)


def _check_same_model(summary: dict, prov: dict, out: Path) -> None:
    before = (summary.get("provenance") or {}).get("model_hash")
    if before and prov["model_hash"] and before != prov["model_hash"]:
        raise UsageError(f"{out} was started with another model (hash {before}, now {prov['model_hash']}): "
                         f"resuming would mix models; start a new run folder instead")


def resume(run_dir: Path, progress=None, command: str = "") -> Path:
    """Finish an interrupted run with the configuration it was started with."""
    summary = read_summary(Path(run_dir))
    cfg = RunConfig.from_json((summary.get("provenance") or {}).get("config") or {})
    cfg.out = Path(run_dir)
    cfg.command = command or cfg.command
    return run(cfg, progress=progress, resume=True)
