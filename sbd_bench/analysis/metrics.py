"""Every figure a summary row holds, defined once, from sample records alone (no torch import).

    >>> rows = summarize(records)            # records: dicts as written to samples.jsonl

Per sample (as the decoding core records it):
  nfe        model forwards after prefill (prefill forwards are ``prefill_forwards``, never in nfe)
  tokens     generated tokens: no prompt, no mask, nothing after the stop (= len(output_ids))
Repeats (``--repeats``) of one (config, task, example) collapse to one sample first: the median of
each timing; the deterministic figures (nfe, tokens, correct) come from the first repeat.
Per (config, task), over its samples without error:
  nfe, tokens         means
  tokens_per_forward  total tokens / total nfe
  acceptance_rate     verified configurations (``params.verify == "on"``): total drafted tokens that NTP
                      confirmed / total drafted tokens; None for the others
  ntp_match_rate      share of examples whose output_ids equal NTP's, paired on (task, id); verified
                      configurations must reach 1.0 (``compare`` fails them otherwise)
  forwards_per_block  mean forwards per block
  speed_factor_nfe    mean over examples of nfe(ntp) / nfe(config), paired on (task, id)
  speed_factor_wall   the same with decode_time_s (decode wall-clock; prefill is timed apart and is
                      the same code path for every solver)
  *_lo, *_hi          95% interval: seeded percentile bootstrap over examples for speed factors,
                      Wilson score interval for accuracy
  accuracy            mean of ``correct`` over samples that have a verdict (None when none has)
  tokens_vs_ntp       its mean output length over NTP's on the same examples (Σ tokens / Σ NTP
                      tokens, paired on (task, id)); 1.0 for NTP, None without NTP records
  tokens_differ_from_ntp  |tokens_vs_ntp - 1| > TOKENS_DIFFER_PERCENT (10%): the NFE speed factor then
                      compares forwards spent on different amounts of text (a configuration that stops
                      early looks faster than it is), so reports mark the row
"""
from __future__ import annotations

import math
from collections import defaultdict
from statistics import mean, median
from typing import Iterable

BASELINE_SOLVER = "ntp"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
TIMING_FIELDS = ("wall_time_s", "prefill_time_s", "decode_time_s")
TOKENS_DIFFER_PERCENT = 10  # difference of mean output length from NTP's that marks a row (integer: exact)


def example_key(rec: dict) -> tuple[str, str]:
    return rec["task"], str(rec["id"])


def sample_key(rec: dict) -> tuple[str, str, str, int]:
    """What identifies one sample in a run: no two records of a finished run share it."""
    return rec["config"], rec["task"], str(rec["id"]), int(rec.get("repeat", 0))


def collapse_repeats(records: Iterable[dict]) -> list[dict]:
    """One record per (config, task, id): timings are medians over repeats, ``repeats`` counts them.
    A sample whose repeats include an error keeps the error."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[sample_key(r)[:3]].append(r)
    out = []
    for recs in groups.values():
        recs = sorted(recs, key=lambda r: r.get("repeat", 0))
        failed = [r for r in recs if r.get("error")]
        merged = dict(failed[0] if failed else recs[0])
        if not failed:
            for name in TIMING_FIELDS:
                values = [r[name] for r in recs if r.get(name) is not None]
                merged[name] = median(values) if values else None
        merged["repeats"] = len(recs)
        out.append(merged)
    return out


def is_verified(rec: dict) -> bool:
    """A record or summary row of a configuration decoded in the core's verify mode."""
    return (rec.get("params") or {}).get("verify") == "on"


def baseline_records(records: list[dict]) -> dict[tuple[str, str], dict]:
    """(task, id) -> the baseline's (NTP's) record of that example, for records without error."""
    return {example_key(r): r for r in records if r["solver"] == BASELINE_SOLVER and not r.get("error")}


def paired_ratios(records: list[dict], field: str, baseline: dict | None = None) -> dict[tuple[str, str], list[float]]:
    """(config, task) -> [baseline[field] / record[field]] per example paired with the baseline.
    ``records`` must already be collapsed over repeats; ``baseline`` is their ``baseline_records``."""
    base = {key: r[field] for key, r in (baseline if baseline is not None else baseline_records(records)).items()}
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in sorted(records, key=example_key):
        b = base.get(example_key(r))
        if r.get("error") or not b or not r.get(field) or r[field] <= 0:
            continue
        out[(r["config"], r["task"])].append(b / r[field])
    return out


def ntp_matches(records: list[dict], baseline: dict | None = None) -> dict[tuple[str, str], list[bool]]:
    """(config, task) -> [output_ids == NTP's output_ids] per example paired with the baseline."""
    base = {key: r.get("output_ids") for key, r in (baseline if baseline is not None else baseline_records(records)).items()}
    out: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in records:
        if not r.get("error") and base.get(example_key(r)) is not None:
            out[(r["config"], r["task"])].append(r.get("output_ids") == base[example_key(r)])
    return out


def bootstrap_ci(values: list[float], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | tuple[None, None]:
    """Percentile bootstrap interval of the mean; deterministic for a given seed and input order."""
    if not values:
        return None, None
    import numpy as np

    data = np.asarray(values, dtype=float)
    if len(data) == 1:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def wilson_ci(successes: int, n: int, z: float = 1.959964) -> tuple[float, float] | tuple[None, None]:
    """Wilson score interval of a proportion (good at small n and at 0% / 100%)."""
    if n == 0:
        return None, None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if successes == 0 else lo), (1.0 if successes == n else hi)  # exact ends, no rounding


def summarize(records: Iterable[dict]) -> list[dict]:
    samples = collapse_repeats(records)
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in samples:
        groups[(r["config"], r["task"])].append(r)
    baseline = baseline_records(samples)  # one pass, shared by every pairing below
    nfe_ratios = paired_ratios(samples, "nfe", baseline)
    wall_ratios = paired_ratios(samples, "decode_time_s", baseline)
    matches = ntp_matches(samples, baseline)
    ntp_tokens = {key: r["tokens"] for key, r in baseline.items()}
    return [{**_row(config, task, recs, nfe_ratios.get((config, task), []), wall_ratios.get((config, task), []),
                    matches.get((config, task), [])), **_length_against_ntp(recs, ntp_tokens)}
            for (config, task), recs in groups.items()]


def _length_against_ntp(recs: list[dict], ntp_tokens: dict[tuple[str, str], int]) -> dict:
    """Mean output length against NTP's on the examples both finished (see the module docstring)."""
    pairs = [(r["tokens"], ntp_tokens[example_key(r)]) for r in recs
             if not r.get("error") and example_key(r) in ntp_tokens]
    ntp_total = sum(ntp for _, ntp in pairs)
    if not ntp_total:
        return {"tokens_vs_ntp": None, "tokens_differ_from_ntp": None}
    total = sum(tokens for tokens, _ in pairs)
    return {"tokens_vs_ntp": total / ntp_total,
            "tokens_differ_from_ntp": 100 * abs(total - ntp_total) > TOKENS_DIFFER_PERCENT * ntp_total}


def _row(config: str, task: str, recs: list[dict], nfe_ratios: list[float], wall_ratios: list[float],
         matches: list[bool]) -> dict:
    ok = [r for r in recs if not r.get("error")]
    verdicts = [bool(r["correct"]) for r in ok if r.get("correct") is not None]
    total_nfe = sum(r["nfe"] for r in ok)
    drafted = sum(sum(r.get("drafted_per_block") or []) for r in ok)
    accepted = sum(sum(r.get("accepted_per_block") or []) for r in ok)
    blocks = [n for r in ok for n in r.get("forwards_per_block") or []]
    acc_lo, acc_hi = wilson_ci(sum(verdicts), len(verdicts))
    nfe_lo, nfe_hi = bootstrap_ci(nfe_ratios)
    wall_lo, wall_hi = bootstrap_ci(wall_ratios)
    memory = [r.get("peak_memory_bytes") for r in ok if r.get("peak_memory_bytes")]
    nvml = [r["memory"]["nvml_peak_used_bytes"] for r in ok
            if (r.get("memory") or {}).get("nvml_peak_used_bytes")]
    return {
        "solver": recs[0]["solver"], "params": recs[0]["params"], "config": config, "task": task,
        "n": len(ok), "errors": len(recs) - len(ok), "repeats": max(r["repeats"] for r in recs),
        "accuracy": mean(verdicts) if verdicts else None, "accuracy_lo": acc_lo, "accuracy_hi": acc_hi,
        "nfe": _mean(r["nfe"] for r in ok), "tokens": _mean(r["tokens"] for r in ok),
        "tokens_per_forward": sum(r["tokens"] for r in ok) / total_nfe if total_nfe else None,
        "acceptance_rate": accepted / drafted if drafted and is_verified(recs[0]) else None,
        "ntp_match_rate": _mean(matches),
        "forwards_per_block": _mean(blocks),
        "speed_factor_nfe": _mean(nfe_ratios), "speed_factor_nfe_lo": nfe_lo, "speed_factor_nfe_hi": nfe_hi,
        "speed_factor_wall": _mean(wall_ratios), "speed_factor_wall_lo": wall_lo, "speed_factor_wall_hi": wall_hi,
        "wall_time_s": _mean(r["wall_time_s"] for r in ok),
        "prefill_time_s": _mean(r["prefill_time_s"] for r in ok),
        "decode_time_s": _mean(r["decode_time_s"] for r in ok),
        "peak_memory_bytes": max(memory) if memory else None,
        "peak_memory_source": next((r.get("peak_memory_source") for r in ok if r.get("peak_memory_source")), None),
        "peak_memory_nvml_bytes": max(nvml) if nvml else None,
    }


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
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
