"""Runs solver configurations x tasks x examples on one model and writes the records as it goes.

    >>> run(RunConfig(model="sbd-tiny", tasks=["arith"], solvers="all", out=Path("runs/x")))

Examples are the outer loop and solver configurations the inner one, so the NTP baseline and every
solver decode the same example back to back: machine drift hits all alike, and speed factors pair.
Each finished sample is appended to ``samples.jsonl`` and flushed at once; ``summary.json`` is
written atomically at the end.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import metrics
from .decoding import Decoder
from .model import LoadedModel, folder_hash, load_model
from .registry import parse_solver_spec, solver_registry
from .tasks import load_task
from .types import SCHEMA_VERSION, Example, Solver, Task, UsageError


@dataclass
class RunConfig:
    model: str = "sbd-tiny"
    tasks: list[str] = field(default_factory=lambda: ["suite"])
    solvers: str = "all"
    out: Path = Path("runs/latest")
    block_size: int = 16
    max_new_tokens: int | None = None  # None: each task's own budget
    limit: int | None = None
    seed: int = 0
    plugins: list[str] = field(default_factory=list)
    device: str = "auto"
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    command: str = ""
    chat_template: bool = False  # prompts through the tokenizer's chat template (benchmark tasks)
    thinking: bool | None = None  # the template's enable_thinking; None: its default

    def __post_init__(self):
        if self.block_size < 1:
            raise UsageError(f"--block-size must be >= 1 (got {self.block_size})")
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"--limit must be >= 1 (got {self.limit})")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens must be >= 1 (got {self.max_new_tokens})")


def write_json_atomic(path: Path, payload) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(metrics.json_safe(payload), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def provenance(cfg: RunConfig, lm: LoadedModel) -> dict:
    import transformers

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True,
                                  timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    dev = lm.device
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain")),
        "command": cfg.command or " ".join(sys.argv),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "model_path": lm.path,
        "model_hash": folder_hash(Path(lm.path)) if Path(lm.path).is_dir() else None,
        "model_info": lm.info,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine(),
        "dtype": str(lm.dtype).removeprefix("torch."),
        "attn_implementation": lm.attn_implementation,
        "seed": cfg.seed,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
    }


class RecordWriter:
    """Appends one JSON line per finished sample and flushes it, so an interruption loses nothing."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.handle.write(json.dumps(metrics.json_safe(record), allow_nan=False) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    # ru_maxrss is in KiB on Linux: the process's peak resident memory so far, not per configuration
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss (process peak RSS)"


def decode_sample(lm: LoadedModel, task: Task, example: Example, prompt_ids: list[int], solver: Solver,
                  cfg: RunConfig, repeat: int = 0) -> dict:
    """Decode one example with one solver configuration and return its sample record."""
    budget = cfg.max_new_tokens or task.max_new_tokens
    decoder = Decoder(lm, block_size=cfg.block_size, max_new_tokens=budget, stop_strings=task.stop, seed=cfg.seed)
    if lm.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(lm.device)
    gen = decoder.generate(prompt_ids, solver)
    peak, source = _peak_memory(lm.device)
    correct, detail = task.verdict(example, gen.output_text)
    return {
        "task": task.name, "id": example.id, "solver": solver.name, "params": solver.params,
        "config": solver.label, "block_size": cfg.block_size, "repeat": repeat,
        "prompt_tokens": len(prompt_ids), "output_ids": gen.output_ids, "output_text": gen.output_text,
        "stop_reason": gen.stop_reason, "tokens": gen.tokens, "nfe": gen.nfe,
        "prefill_forwards": gen.prefill_forwards, "revealed_per_forward": gen.revealed_per_forward,
        "forwards_per_block": gen.forwards_per_block,
        "wall_time_s": gen.prefill_time_s + gen.decode_time_s, "prefill_time_s": gen.prefill_time_s,
        "decode_time_s": gen.decode_time_s, "correct": correct,
        "answer": example.answer, "error": None, "peak_memory_bytes": peak, "peak_memory_source": source,
        "score_detail": detail,
    }


def run(cfg: RunConfig, progress=None) -> Path:
    registry = solver_registry(cfg.plugins)
    solvers = parse_solver_spec(cfg.solvers, registry)
    options = {"chat_template": cfg.chat_template or None, "thinking": cfg.thinking}
    tasks = [load_task(name, **{k: v for k, v in options.items() if v is not None}) for name in cfg.tasks]
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, attn_implementation=cfg.attn_implementation)
    torch.manual_seed(cfg.seed)
    work: list[tuple[Task, Example, list[int]]] = []
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

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    samples_path = out / "samples.jsonl"
    samples_path.unlink(missing_ok=True)
    prov = provenance(cfg, lm)
    summary = {"schema_version": SCHEMA_VERSION, "complete": False, "provenance": prov, "rows": []}
    write_json_atomic(out / "summary.json", summary)

    # warm-up: one decode per configuration, not recorded, so first-call costs stay out of the timings
    task0, example0, ids0 = work[0]
    for solver in solvers:
        decode_sample(lm, task0, example0, ids0, solver, cfg)

    writer = RecordWriter(samples_path)
    total, done, started = len(work) * len(solvers), 0, time.perf_counter()
    try:
        for task, example, ids in work:
            for solver in solvers:
                writer.write(decode_sample(lm, task, example, ids, solver, cfg))
                done += 1
                if progress:
                    progress(done, total, time.perf_counter() - started, f"{task.name}/{example.id} {solver.label}")
    finally:
        writer.close()
        records = read_records(samples_path)
        summary["rows"] = metrics.summarize(records)
        summary["complete"] = done == total
        write_json_atomic(out / "summary.json", summary)
    return out
