"""Every figure a summary row holds, defined once, from sample records alone (no torch import).

    >>> rows = summarize(records)            # records: dicts as written to samples.jsonl

Per sample (as the decoding core records it):
  nfe        model forwards after prefill (prefill forwards are ``prefill_forwards``, never in nfe)
  tokens     generated tokens: no prompt, no mask, nothing after the stop (= len(output_ids))
Repeats (``--repeats``) of one (config, task, example, sample) collapse to one sample first: the median
of each timing; the deterministic figures (nfe, tokens, correct) come from the first repeat.
Samples (``--samples N``: N decodes of each example, ``sample`` 0..N-1 in the records, each with its
``seed``) are paired with NTP's sample of the same index at the configuration's own sampling settings
(temperature, top_p, top_k): the baseline of ``name:...;temperature=0.7`` is ``ntp:temperature=0.7``.
Per (config, task), over its samples without error:
  nfe, tokens         means
  tokens_per_forward  total tokens / total nfe
  acceptance_rate     verified configurations (``params.verify == "on"``) and generate baselines: total
                      drafted tokens that NTP (the model's argmax) confirmed / total drafted tokens; None for
                      the others
  draft_forwards      generate baselines (transformers' generate: prompt lookup, assisted decoding): mean
                      forwards of the draft model per sample, apart from nfe (0 for prompt lookup); None for
                      the others
  vendor_nfe          a family's own schedule (``types.ScheduleBaseline``: Nemotron-Labs-Diffusion's dlm and
                      self-speculation): mean forwards per sample as its vendor's code counts them (nfe counts
                      them as every configuration's); vendor_tokens_per_forward: total tokens / their total
  ntp_match_rate      share of examples whose output_ids equal NTP's, paired on (task, id); verified
                      configurations reach 1.0 with --exact, and without it wherever no near tie of NTP's
                      logits is rounded differently by forwards of different sizes (``ntp_mismatch_warning``)
  forwards_per_block  mean forwards per block
  speed_factor_nfe    mean over examples of nfe(ntp) / nfe(config), paired on (task, id) (the papers'
                      "mean speed-up": each example weighs the same); with N > 1 samples, of sum over
                      samples of nfe(ntp) / the same sum of nfe(config)
  speed_factor_wall   decode wall-clock: total decode_time_s of NTP over the total of the configuration,
                      on the examples both decoded (paired on (task, id), and sample): how much faster the
                      same work got. Prefill is left out: it is timed apart and is the same code path for
                      every solver. Not a mean of per-example ratios, which a few short examples with large
                      ratios inflate
  speed_factor_e2e    end to end: the same ratio of totals with wall_time_s (prefill + decode), what a
                      user waits for; prefill, equal for both, pulls it towards 1
  *_lo, *_hi          95% interval: seeded percentile bootstrap over examples for speed factors (for the
                      wall factors the examples are resampled and the ratio of totals taken again; and for
                      accuracy and pass@k with N > 1 samples), Wilson score interval for accuracy at N = 1
  accuracy            mean of ``correct`` over samples that have a verdict (None when none has); with
                      N > 1 samples, pass@1: the mean over examples of c/n (n samples with a verdict, c
                      of them correct)
  samples             N, the most samples of one example (1 without --samples)
  pass_k, pass_at_k   with N > 1: k (default N) and the mean over examples with n >= k of the unbiased
                      estimator 1 - C(n - c, k) / C(n, k) (Chen et al. 2021); None at N = 1
  tokens_vs_ntp       its mean output length over NTP's on the same examples (Σ tokens / Σ NTP
                      tokens, paired on (task, id)); 1.0 for NTP, None without NTP records
  tokens_differ_from_ntp  |tokens_vs_ntp - 1| > TOKENS_DIFFER_PERCENT (10%): the NFE speed factor then
                      compares forwards spent on different amounts of text (a configuration that stops
                      early looks faster than it is), so reports mark the row
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from fractions import Fraction
from statistics import mean, median
from typing import Iterable

from ..types import SAMPLING_KEYS

BASELINE_SOLVER = "ntp"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
TIMING_FIELDS = ("wall_time_s", "prefill_time_s", "decode_time_s")
TOKENS_DIFFER_PERCENT = 10  # difference of mean output length from NTP's that marks a row (integer: exact)


def example_key(rec: dict) -> tuple[str, str]:
    return rec["task"], str(rec["id"])


def sample_key(rec: dict) -> tuple[str, str, str, int, int]:
    """What identifies one sample in a run: no two records of a finished run share it."""
    return rec["config"], rec["task"], str(rec["id"]), int(rec.get("sample", 0)), int(rec.get("repeat", 0))


def sampling_of(rec: dict) -> tuple:
    """A record's or row's sampling settings (temperature, top_p, top_k as in its params; None: greedy)."""
    params = rec.get("params") or {}
    return tuple(params.get(key) for key in SAMPLING_KEYS)


def pairing_key(rec: dict) -> tuple:
    """What pairs a record with its baseline's: the example, the sample index, the sampling settings."""
    return rec["task"], str(rec["id"]), int(rec.get("sample", 0)), sampling_of(rec)


def collapse_repeats(records: Iterable[dict]) -> list[dict]:
    """One record per (config, task, id, sample): timings are medians over repeats, ``repeats`` counts
    them. A sample whose repeats include an error keeps the error."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[sample_key(r)[:4]].append(r)
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


def is_generate_baseline(rec: dict) -> bool:
    """A record or summary row of a baseline decoded by transformers' generate (``types.GenerateBaseline``:
    prompt lookup, assisted decoding): they alone carry ``draft_forwards`` (a row: its mean)."""
    return rec.get("draft_forwards") is not None


def is_lossless(rec: dict) -> bool:
    """A configuration whose greedy output must be NTP's: verified, or a generate baseline (both verify
    drafts against the model's own argmax)."""
    return is_verified(rec) or is_generate_baseline(rec)


def baseline_records(records: list[dict]) -> dict[tuple, dict]:
    """``pairing_key`` -> the baseline's (NTP's) record of that example and sample, for records without error."""
    return {pairing_key(r): r for r in records if r["solver"] == BASELINE_SOLVER and not r.get("error")}


def paired_ratios(records: list[dict], field: str, baseline: dict | None = None) -> dict[tuple[str, str], list[float]]:
    """(config, task) -> [baseline[field] / record[field]] per example paired with the baseline; an example
    with several samples gives the ratio of the sums over its samples that pair.
    ``records`` must already be collapsed over repeats; ``baseline`` is their ``baseline_records``."""
    base = {key: r[field] for key, r in (baseline if baseline is not None else baseline_records(records)).items()}
    sums: dict[tuple, list] = {}
    for r in sorted(records, key=lambda r: (example_key(r), int(r.get("sample", 0)))):
        b = base.get(pairing_key(r))
        if r.get("error") or not b or not r.get(field) or r[field] <= 0:
            continue
        pair = sums.setdefault((r["config"], r["task"], str(r["id"])), [0, 0])
        pair[0] += b
        pair[1] += r[field]
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (config, task, _), (b, value) in sums.items():
        out[(config, task)].append(b / value)
    return out


def paired_times(records: list[dict], field: str, baseline: dict | None = None
                 ) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(config, task) -> [(baseline's field, the record's)] per example paired with the baseline, both
    timed; an example with several samples gives the sums over its samples that pair. ``records``
    collapsed over repeats; ``baseline`` their ``baseline_records``."""
    base = {key: r.get(field) for key, r in (baseline if baseline is not None else baseline_records(records)).items()}
    sums: dict[tuple, list[float]] = {}
    for r in sorted(records, key=lambda r: (example_key(r), int(r.get("sample", 0)))):
        b = base.get(pairing_key(r))
        if r.get("error") or b is None or r.get(field) is None:
            continue
        pair = sums.setdefault((r["config"], r["task"], str(r["id"])), [0.0, 0.0])
        pair[0] += b
        pair[1] += r[field]
    out: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for (config, task, _), (b, value) in sums.items():
        out[(config, task)].append((b, value))
    return out


def ratio_of_totals(pairs: list[tuple[float, float]]) -> float | None:
    """Σ baseline / Σ configuration over (baseline, configuration) pairs; None without positive time."""
    total = sum(run for _, run in pairs)
    return sum(base for base, _ in pairs) / total if pairs and total > 0 else None


def ntp_matches(records: list[dict], baseline: dict | None = None) -> dict[tuple[str, str], list[bool]]:
    """(config, task) -> [output_ids == NTP's output_ids] per sample paired with the baseline."""
    base = {key: r.get("output_ids") for key, r in (baseline if baseline is not None else baseline_records(records)).items()}
    out: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in records:
        if not r.get("error") and base.get(pairing_key(r)) is not None:
            out[(r["config"], r["task"])].append(r.get("output_ids") == base[pairing_key(r)])
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c are correct (Chen et al. 2021):
    1 - C(n - c, k) / C(n, k), in exact integer arithmetic, then rounded once."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def per_example_verdicts(recs: list[dict]) -> list[tuple[int, int]]:
    """(n, c) per example, in example order: samples without error that have a verdict, and the correct ones."""
    counts: dict[tuple[str, str], list[int]] = {}
    for r in sorted(recs, key=example_key):
        if not r.get("error") and r.get("correct") is not None:
            pair = counts.setdefault(example_key(r), [0, 0])
            pair[0] += 1
            pair[1] += bool(r["correct"])
    return [(n, c) for n, c in counts.values()]


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


def bootstrap_ratio_ci(pairs: list[tuple[float, float]], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | tuple[None, None]:
    """Percentile bootstrap interval of ``ratio_of_totals``: examples (pairs) resampled with
    replacement, the ratio of the resampled totals each time; deterministic for a seed and input order."""
    if ratio_of_totals(pairs) is None:
        return None, None
    import numpy as np

    data = np.asarray(pairs, dtype=float)  # (n, 2)
    if len(data) == 1:
        return float(data[0, 0] / data[0, 1]), float(data[0, 0] / data[0, 1])
    picks = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    base, run = data[picks, 0].sum(axis=1), data[picks, 1].sum(axis=1)
    ratios = base[run > 0] / run[run > 0]
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
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


def summarize(records: Iterable[dict], pass_k: int | None = None) -> list[dict]:
    """One row per (config, task); ``pass_k``: the k of pass@k where a configuration has N > 1 samples
    per example (default N; a k above a configuration's N gives it no pass@k)."""
    samples = collapse_repeats(records)
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in samples:
        groups[(r["config"], r["task"])].append(r)
    baseline = baseline_records(samples)  # one pass, shared by every pairing below
    nfe_ratios = paired_ratios(samples, "nfe", baseline)
    decode_times = paired_times(samples, "decode_time_s", baseline)
    wall_times = paired_times(samples, "wall_time_s", baseline)
    matches = ntp_matches(samples, baseline)
    ntp_tokens = {key: r["tokens"] for key, r in baseline.items()}
    return [{**_row(config, task, recs, nfe_ratios.get((config, task), []), matches.get((config, task), [])),
             **_wall_factors("speed_factor_wall", decode_times.get((config, task), [])),
             **_wall_factors("speed_factor_e2e", wall_times.get((config, task), [])),
             **_length_against_ntp(recs, ntp_tokens), **_pass_rates(recs, pass_k)}
            for (config, task), recs in groups.items()]


def _wall_factors(name: str, pairs: list[tuple[float, float]]) -> dict:
    lo, hi = bootstrap_ratio_ci(pairs)
    return {name: ratio_of_totals(pairs), f"{name}_lo": lo, f"{name}_hi": hi}


def _pass_rates(recs: list[dict], pass_k: int | None) -> dict:
    """With N > 1 samples per example: pass@1 as accuracy (mean over examples of c/n, bootstrap interval
    over examples, which are independent where samples of one example are not) and pass@k."""
    samples = max(Counter(example_key(r) for r in recs).values())
    row = {"samples": samples, "pass_k": None, "pass_at_k": None, "pass_at_k_lo": None, "pass_at_k_hi": None}
    verdicts = per_example_verdicts(recs)
    if samples == 1 or not verdicts:
        return row
    rates = [c / n for n, c in verdicts]
    row["accuracy"] = mean(rates)
    row["accuracy_lo"], row["accuracy_hi"] = bootstrap_ci(rates)
    k = pass_k or samples
    estimates = [pass_at_k(n, c, k) for n, c in verdicts if n >= k]
    lo, hi = bootstrap_ci(estimates)
    return {**row, "pass_k": k, "pass_at_k": _mean(estimates), "pass_at_k_lo": lo, "pass_at_k_hi": hi}


def ntp_mismatch_warning(records: Iterable[dict], exact: bool) -> str | None:
    """One line when greedy outputs that must be NTP's differ from it (verified configurations, generate
    baselines; None when none does): how many, why, and what removes it. ``records``: a run's sample
    records; ``exact``: whether it used --exact."""
    samples = collapse_repeats(records)
    greedy = [r for r in samples if not any(sampling_of(r))]  # sampled: distributed as NTP's, not equal to it
    matches, parts = ntp_matches(samples), []
    for kind in ("verified", "generate"):
        configs = {r["config"] for r in greedy if (is_verified(r) if kind == "verified" else is_generate_baseline(r))}
        found = {key: m for key, m in matches.items() if key[0] in configs}
        differ = sum(m.count(False) for m in found.values())
        if not differ:
            continue
        rows = sum(1 for m in found.values() if not all(m))
        what = (f"{differ} of {sum(map(len, found.values()))} "
                f"{'verified samples' if kind == 'verified' else 'samples of generate baselines'} "
                f"({rows} configuration x task row(s)) differ from ntp's output")
        if kind == "generate":
            parts.append(f"{what}: transformers' generate verifies drafts in forwards of several tokens, whose "
                         f"rounding can flip a near tie of the model's logits (bf16 most; --exact does not cover "
                         f"generate), --dtype float32 makes it rare")
        elif exact:
            parts.append(f"{what} although --exact was on: a bug of exact mode; please report it with this run folder")
        else:
            parts.append(f"{what}: near ties of NTP's logits round differently in forwards of different sizes (bf16 "
                         f"most); --exact removes it (verified = ntp bit for bit), --dtype float32 makes it rare")
    return "; ".join(parts) or None


def scorer_changes(records: Iterable[dict]) -> list[dict]:
    """Per (task, config, scorer) of the samples judged by two scorers (math tasks: ``score_detail`` names
    ``scorer``, ``other_scorer`` and ``other_correct``): ``verdicts``, how many of them the other scorer
    would turn to a pass (``other_passes``) or to a fail (``other_fails``), and how many got no verdict
    from math-verify (``no_math_verify_verdict``: it timed out, or its worker died). Repeats count once."""
    rows: dict[tuple, dict] = {}
    for r in collapse_repeats(records):
        detail = r.get("score_detail")
        if r.get("error") or not isinstance(detail, dict) or "other_correct" not in detail:
            continue
        key = (r["task"], r["config"], detail["scorer"])
        row = rows.setdefault(key, {"task": key[0], "config": key[1], "scorer": key[2],
                                    "other_scorer": detail["other_scorer"], "verdicts": 0, "other_passes": 0,
                                    "other_fails": 0, "no_math_verify_verdict": 0})
        row["verdicts"] += 1
        row["other_passes"] += bool(detail["other_correct"] and not r["correct"])
        row["other_fails"] += bool(r["correct"] and not detail["other_correct"])
        row["no_math_verify_verdict"] += "error" in (detail.get("math_verify") or {})
    return list(rows.values())


def _length_against_ntp(recs: list[dict], ntp_tokens: dict[tuple, int]) -> dict:
    """Mean output length against NTP's on the examples both finished (see the module docstring)."""
    pairs = [(r["tokens"], ntp_tokens[pairing_key(r)]) for r in recs
             if not r.get("error") and pairing_key(r) in ntp_tokens]
    ntp_total = sum(ntp for _, ntp in pairs)
    if not ntp_total:
        return {"tokens_vs_ntp": None, "tokens_differ_from_ntp": None}
    total = sum(tokens for tokens, _ in pairs)
    return {"tokens_vs_ntp": total / ntp_total,
            "tokens_differ_from_ntp": 100 * abs(total - ntp_total) > TOKENS_DIFFER_PERCENT * ntp_total}


def _row(config: str, task: str, recs: list[dict], nfe_ratios: list[float], matches: list[bool]) -> dict:
    ok = [r for r in recs if not r.get("error")]
    verdicts = [bool(r["correct"]) for r in ok if r.get("correct") is not None]
    total_nfe = sum(r["nfe"] for r in ok)
    drafted = sum(sum(r.get("drafted_per_block") or []) for r in ok)
    accepted = sum(sum(r.get("accepted_per_block") or []) for r in ok)
    blocks = [n for r in ok for n in r.get("forwards_per_block") or []]
    acc_lo, acc_hi = wilson_ci(sum(verdicts), len(verdicts))
    nfe_lo, nfe_hi = bootstrap_ci(nfe_ratios)
    memory = [r.get("peak_memory_bytes") for r in ok if r.get("peak_memory_bytes")]
    nvml = [r["memory"]["nvml_peak_used_bytes"] for r in ok
            if (r.get("memory") or {}).get("nvml_peak_used_bytes")]
    return {
        "solver": recs[0]["solver"], "params": recs[0]["params"], "config": config, "task": task,
        "n": len(ok), "errors": len(recs) - len(ok), "repeats": max(r["repeats"] for r in recs),
        "accuracy": mean(verdicts) if verdicts else None, "accuracy_lo": acc_lo, "accuracy_hi": acc_hi,
        "nfe": _mean(r["nfe"] for r in ok), "tokens": _mean(r["tokens"] for r in ok),
        "tokens_per_forward": sum(r["tokens"] for r in ok) / total_nfe if total_nfe else None,
        "acceptance_rate": accepted / drafted if drafted and any(map(is_lossless, ok)) else None,
        "ntp_match_rate": _mean(matches),
        "forwards_per_block": _mean(blocks),
        "speed_factor_nfe": _mean(nfe_ratios), "speed_factor_nfe_lo": nfe_lo, "speed_factor_nfe_hi": nfe_hi,
        "wall_time_s": _mean(r["wall_time_s"] for r in ok),
        "prefill_time_s": _mean(r["prefill_time_s"] for r in ok),
        "decode_time_s": _mean(r["decode_time_s"] for r in ok),
        "draft_forwards": _mean(r.get("draft_forwards") for r in ok),
        # a family's own schedule (types.ScheduleBaseline): the forwards as its vendor counts them
        "vendor_nfe": _mean(r.get("vendor_nfe") for r in ok),
        "vendor_tokens_per_forward": (sum(r["tokens"] for r in ok) / vendor_total
                                      if (vendor_total := sum(r.get("vendor_nfe") or 0 for r in ok)) else None),
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


def no_baseline_note(summary: dict, rows: list[dict]) -> str | None:
    """What the speed factors are relative to in a run without the NTP baseline (a block-diffusion family
    has no NTP path: docs/models.md), else None."""
    if not rows or any(r["solver"] == BASELINE_SOLVER for r in rows):
        return None
    family = (((summary.get("provenance") or {}).get("model_info")) or {}).get("family")
    why = f"a {family} checkpoint has no NTP path" if family else "the run decoded no ntp configuration"
    return (f"No NTP baseline ({why}): the speed factors relative to NTP are blank. Tokens per forward compares "
            f"the configurations, against 1.00 for a decoder that commits one token per forward (NTP's figure).")
