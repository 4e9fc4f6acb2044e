"""Shared helpers of the measurement tests: a tiny random Llama with the char tokenizer, a JSONL
task, and crafted sample records (plain dicts, no torch) for the report/compare/metrics tests."""
from __future__ import annotations

import json
from pathlib import Path

from tiny_models import build_tiny_model

from sbd_bench.types import SCHEMA_VERSION


def make_tiny_model(path: Path, seed: int = 0) -> Path:
    """A random 2-layer Llama (GQA) saved as a local HF folder with a mask token."""
    return build_tiny_model(path, seed=seed)


def make_task_file(path: Path, n: int = 4) -> Path:
    rows = [{"id": str(i), "prompt": f"{i}+{i + 1}=", "answer": str(2 * i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def crafted_record(config: str, task: str, id: str, nfe: int, tokens: int, correct, decode_time_s: float,
                   block_size: int = 4, repeat: int = 0, error: str | None = None) -> dict:
    """A consistent sample record: NTP reveals one token per forward; a block solver fills blocks of
    ``block_size`` evenly over its ``nfe`` forwards."""
    solver = config.split(":")[0]
    if solver == "ntp":
        revealed = [1] * tokens
        per_block = [min(block_size, tokens - i) for i in range(0, tokens, block_size)]
    else:
        revealed = [tokens // nfe + (1 if i < tokens % nfe else 0) for i in range(nfe)]
        blocks = -(-tokens // block_size)
        per_block = [nfe // blocks + (1 if i < nfe % blocks else 0) for i in range(blocks)]
    return {"task": task, "id": id, "solver": solver, "params": {}, "config": config, "block_size": block_size,
            "repeat": repeat, "prompt_tokens": 5, "output_ids": list(range(tokens)), "output_text": "x" * tokens,
            "stop_reason": "stop_token", "tokens": tokens, "nfe": nfe, "prefill_forwards": 1,
            "revealed_per_forward": revealed, "forwards_per_block": per_block,
            "wall_time_s": decode_time_s + 0.001, "prefill_time_s": 0.001, "decode_time_s": decode_time_s,
            "correct": correct, "answer": "a", "error": error, "peak_memory_bytes": 1 << 20,
            "peak_memory_source": "sampled RSS (process resident memory)", "memory": None}


def crafted_run(path: Path, records: list[dict], complete: bool = True, cost_curve: dict | None = None,
                exact: bool = False) -> Path:
    """A run folder as `run` writes it, from crafted records (``exact``: decoded with --exact)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"schema_version": SCHEMA_VERSION, "complete": complete, "rows": [], "failures": [],
               "provenance": {"command": "crafted", "model_hash": "abc", "config": {"block_size": 4, "exact": exact},
                              "exact": exact,
                              "model_config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                               "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64,
                                               "vocab_size": 100}},
               "cost_curve": cost_curve}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def standard_records(tasks=("arith", "copy"), n: int = 5) -> list[dict]:
    """NTP and two block configurations on ``n`` examples of each task; fixed_k is faster and worse."""
    records = []
    for task in tasks:
        for i in range(n):
            tokens = 8 + i
            records.append(crafted_record("ntp", task, str(i), nfe=tokens, tokens=tokens, correct=True,
                                          decode_time_s=0.01 * tokens))
            records.append(crafted_record("entropy_bounded:gamma=0.35,proxy=entropy", task, str(i), nfe=tokens // 2,
                                          tokens=tokens, correct=True, decode_time_s=0.012 * tokens / 2))
            records.append(crafted_record("fixed_k:k=4", task, str(i), nfe=-(-tokens // 4), tokens=tokens,
                                          correct=i % 2 == 0, decode_time_s=0.015 * tokens / 4))
    return records
