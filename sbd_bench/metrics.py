"""Every figure a summary row holds, defined once, from sample records alone (no torch import).

    >>> rows = summarize(records)            # records: dicts as written to samples.jsonl

Definitions:
  nfe                 mean model forwards after prefill, per sample
  tokens              mean generated tokens per sample (no prompt, no masks, nothing after the stop)
  tokens_per_forward  total tokens / total nfe over the configuration's samples
  speed_factor_nfe    mean over samples of nfe(ntp) / nfe(config), paired on (task, id, repeat)
  speed_factor_wall   mean over samples of wall(ntp) / wall(config), paired likewise
  accuracy            mean of ``correct`` over samples that have a verdict (None when none has)
"""
from __future__ import annotations

import math
from collections import defaultdict
from statistics import mean
from typing import Iterable

BASELINE_SOLVER = "ntp"


def _key(rec: dict) -> tuple:
    return rec["task"], rec["id"], rec.get("repeat", 0)


def paired_ratios(records: list[dict], field: str) -> dict[tuple[str, str], list[float]]:
    """(config, task) -> [baseline[field] / record[field]] over samples paired with the baseline."""
    base = {_key(r): r[field] for r in records if r["solver"] == BASELINE_SOLVER and not r.get("error")}
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        if r.get("error") or _key(r) not in base:
            continue
        value = r[field]
        if value and value > 0:
            out[(r["config"], r["task"])].append(base[_key(r)] / value)
    return out


def summarize(records: Iterable[dict]) -> list[dict]:
    records = list(records)
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["config"], r["task"])].append(r)
    nfe_ratios = paired_ratios(records, "nfe")
    wall_ratios = paired_ratios(records, "wall_time_s")
    rows = []
    for (config, task), recs in groups.items():
        ok = [r for r in recs if not r.get("error")]
        verdicts = [bool(r["correct"]) for r in ok if r.get("correct") is not None]
        total_nfe = sum(r["nfe"] for r in ok)
        rows.append({
            "solver": recs[0]["solver"],
            "params": recs[0]["params"],
            "config": config,
            "task": task,
            "n": len(ok),
            "errors": len(recs) - len(ok),
            "accuracy": mean(verdicts) if verdicts else None,
            "nfe": mean(r["nfe"] for r in ok) if ok else None,
            "tokens": mean(r["tokens"] for r in ok) if ok else None,
            "tokens_per_forward": sum(r["tokens"] for r in ok) / total_nfe if total_nfe else None,
            "speed_factor_nfe": _mean_or_none(nfe_ratios.get((config, task))),
            "speed_factor_wall": _mean_or_none(wall_ratios.get((config, task))),
            "wall_time_s": mean(r["wall_time_s"] for r in ok) if ok else None,
            "peak_memory_bytes": max((r.get("peak_memory_bytes") or 0 for r in ok), default=None) or None,
            "peak_memory_source": next((r.get("peak_memory_source") for r in ok if r.get("peak_memory_source")), None),
        })
    return rows


def _mean_or_none(values: list[float] | None) -> float | None:
    return mean(values) if values else None


def json_safe(value):
    """Replace NaN/Infinity (not valid JSON) by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
