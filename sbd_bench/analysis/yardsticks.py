"""The field's yardsticks of accuracy under parallelism, from summary rows (no torch, no core).

    >>> round(aup([(1, 74.02), (9.08, 73.10)], y_max=74.98), 4)   # d3LLM-LLaDA on GSM8K-CoT, published
    635.717

AUP (Accuracy Under Parallelism; d3LLM, hao-ai-lab, ``AUP_leaderboard/aup_utils.py``): over one curve of
(tokens per forward rho, accuracy y in %) points sorted by rho, the points within ``AUP_MARGIN`` points of
the lowest-parallelism one are kept, and

    AUP = rho_1 y_1 + sum_i (rho_i - rho_{i-1}) (y_i W(y_i) + y_{i-1} W(y_{i-1})) / 2,
    W(y) = min(exp(-alpha (1 - y / y_max)), 1),   alpha = AUP_ALPHA = 3,

with y_max the best accuracy of any configuration on that task in the comparison. No normalisation: it
is in tokens-per-forward x %, and exceeds 100 wherever parallelism pays. Two decisions (docs/measurement.md,
"The field's yardsticks"): a point more than 5 below the first is dropped, not refused (d3LLM's blog
filters, its code asserts); and rho is the row's ``tokens_per_forward``, tokens over forwards after the
prefill, which puts NTP at exactly 1 as d3LLM puts an autoregressive model.

A solver family (``family_of``) is one solver's configurations at one verify and sampling setting; its
curve on a task is its configurations' points plus NTP's (1 token per forward, NTP's accuracy): the
leaderboard's curves start at the same model's accuracy at one token per forward.

PB score (ParallelBench, furiosa-ai; ``parallelbench/analysis/pb_score.py``): PBx is the largest mean
tokens per step over the tasks, among one method's configurations whose mean score over the tasks is at
least x (x = 90, 80, 70, 60); None where none reaches x. No interpolation between configurations (the
scorer's rule; its docs describe interpolation).
"""
from __future__ import annotations

import math
from collections import defaultdict

from ..types import PARALLELBENCH_PREFIX, PARALLELBENCH_TASKS
from .metrics import sampling_of

AUP_ALPHA = 3.0
AUP_MARGIN = 5.0  # accuracy points below the lowest-parallelism point's that a point may fall and still count
PB_THRESHOLDS = (90, 80, 70, 60)


def aup_weight(y: float, y_max: float, alpha: float = AUP_ALPHA) -> float:
    """W(y) = min(exp(-alpha (1 - y / y_max)), 1); 1 at or above y_max (so also where every y is 0)."""
    return 1.0 if y >= y_max else min(math.exp(-alpha * (1 - y / y_max)), 1.0)


def aup_curve(points: list[tuple[float, float]], y_max: float, alpha: float = AUP_ALPHA,
              margin: float = AUP_MARGIN) -> tuple[float, list[tuple[float, float]]]:
    """(AUP, the points it kept, sorted) of (tokens per forward > 0, accuracy %) points. Ties of tokens
    per forward keep their given order (a zero-width trapezoid between them)."""
    if not points:
        raise ValueError("AUP needs at least one (tokens per forward, accuracy) point")
    if any(not rho > 0 for rho, _ in points):
        raise ValueError(f"AUP needs tokens per forward > 0 (got {[rho for rho, _ in points]})")
    curve = sorted(points, key=lambda p: p[0])
    floor = curve[0][1] - margin
    kept = [p for p in curve if p[1] >= floor]  # the first point always stays
    area = kept[0][0] * kept[0][1]  # the first rectangle is not weighted
    for (r0, y0), (r1, y1) in zip(kept, kept[1:]):
        area += (r1 - r0) * (y1 * aup_weight(y1, y_max, alpha) + y0 * aup_weight(y0, y_max, alpha)) / 2
    return area, kept


def aup(points: list[tuple[float, float]], y_max: float, alpha: float = AUP_ALPHA, margin: float = AUP_MARGIN) -> float:
    return aup_curve(points, y_max, alpha, margin)[0]


def pb_scores(configs: list[tuple[float, float]], thresholds=PB_THRESHOLDS) -> dict[str, float | None]:
    """PBx from (mean tokens per step, mean score %) per configuration, each mean taken over the same tasks."""
    return {f"PB{x}": max((tps for tps, score in configs if score >= x), default=None) for x in thresholds}


# ------------------------------------------------------------------------------- over summary rows
def family_of(row: dict) -> str:
    """A row's solver family: its solver, and its verify and sampling settings where set."""
    params = row.get("params") or {}
    settings = [f"verify={params['verify']}"] if params.get("verify") == "on" else []
    settings += [f"{k}={params[k]}" for k in ("temperature", "top_p", "top_k") if params.get(k) is not None]
    return row["solver"] + (f" ({', '.join(settings)})" if settings else "")


def _points(rows: list[dict]) -> list[tuple[float, float]]:
    return [(r["tokens_per_forward"], 100 * r["accuracy"]) for r in rows
            if r.get("accuracy") is not None and r.get("tokens_per_forward")]


def task_y_max(rows: list[dict]) -> dict[str, float]:
    """Per task, the best accuracy (%) of any row: the y_max of every family's AUP there."""
    best: dict[str, float] = {}
    for r in rows:
        if r.get("accuracy") is not None:
            best[r["task"]] = max(best.get(r["task"], 0.0), 100.0 * r["accuracy"])
    return best


def family_aups(rows: list[dict], records: list[dict] | None = None, y_max: dict[str, float] | None = None,
                baseline_solver: str = "ntp") -> list[dict]:
    """One entry per (family, task) with a verdict: ``aup``, ``y_max``, ``points`` (sorted, the anchor
    included), ``kept`` (how many the margin kept), ``anchor`` (the NTP configuration whose point joins
    the family's, or None without one), and ``aup_lo``/``aup_hi`` (95% bootstrap over examples when
    ``records``, the run's sample records, are given). ``y_max``: per task, instead of the rows' best (a
    comparison of two runs takes the best of both)."""
    best = {**task_y_max(rows), **(y_max or {})}
    by_task: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_task[r["task"]][family_of(r)].append(r)
    out = []
    for task, families in by_task.items():
        anchors = [r for members in families.values() for r in members if r["solver"] == baseline_solver
                   and r.get("accuracy") is not None and r.get("tokens_per_forward")]
        curves = {}
        for family, members in families.items():
            anchor = next((r for r in anchors if sampling_of(r) == sampling_of(members[0])), None)
            if _points(members):  # a point of its own: the anchor alone is NTP's, not this family's
                curves[family] = members if anchor is None or anchor in members else [anchor, *members]
        intervals = _bootstrap(task, curves, records, y_max) if records is not None else {}
        for family, curve in curves.items():
            anchor = curve[0] if curve[0]["solver"] == baseline_solver else None
            value, kept = aup_curve(_points(curve), best[task])
            lo, hi = intervals.get(family, (None, None))
            out.append({"family": family, "solver": curve[-1]["solver"], "task": task, "aup": value,
                        "aup_lo": lo, "aup_hi": hi, "y_max": best[task],
                        "points": [list(p) for p in sorted(_points(curve), key=lambda p: p[0])], "kept": len(kept),
                        "anchor": None if anchor is None else anchor["config"]})
    return out


def _bootstrap(task: str, curves: dict[str, list[dict]], records: list[dict], y_max: dict | None) -> dict:
    """Per family, the 95% percentile bootstrap interval of its AUP: the task's examples resampled with
    replacement (the same draw for every configuration: they are paired), each configuration's accuracy
    and tokens per forward taken again, and y_max with them unless fixed."""
    import numpy as np

    from .metrics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, collapse_repeats, example_key

    configs = sorted({r["config"] for curve in curves.values() for r in curve})
    if not configs:  # no family has a point of its own on this task (an NTP-only run, every sample failed)
        return {}
    samples = [r for r in collapse_repeats(r for r in records if r["task"] == task) if not r.get("error")]
    examples = sorted({example_key(r) for r in samples})
    if len(examples) < 2:
        return {}
    index = {key: i for i, key in enumerate(examples)}
    tokens, nfe = np.zeros((len(configs), len(examples))), np.zeros((len(configs), len(examples)))
    correct, verdicts = np.zeros_like(tokens), np.zeros_like(tokens)
    row_of = {c: i for i, c in enumerate(configs)}
    for r in samples:
        if r["config"] in row_of:
            at = (row_of[r["config"]], index[example_key(r)])
            tokens[at] += r["tokens"]
            nfe[at] += r["nfe"]
            if r.get("correct") is not None:
                correct[at] += bool(r["correct"])
                verdicts[at] += 1
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(0, len(examples), size=(BOOTSTRAP_RESAMPLES, len(examples)))
    rate = np.divide(correct, verdicts, out=np.zeros_like(correct), where=verdicts > 0)  # c/n per example
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = 100 * rate[:, picks].sum(-1) / (verdicts[:, picks] > 0).sum(-1)  # (configs, resamples)
        tpf = tokens[:, picks].sum(-1) / nfe[:, picks].sum(-1)
    fixed = (y_max or {}).get(task)
    best = np.full(BOOTSTRAP_RESAMPLES, fixed) if fixed is not None else np.nanmax(accuracy, axis=0)
    out = {}
    for family, curve in curves.items():
        rows = [row_of[r["config"]] for r in curve]
        values = []
        for k in range(BOOTSTRAP_RESAMPLES):
            points = [(tpf[i, k], accuracy[i, k]) for i in rows if tpf[i, k] > 0 and not math.isnan(accuracy[i, k])]
            if points:
                values.append(aup(points, float(best[k])))
        if values:
            lo, hi = np.percentile(values, [2.5, 97.5])
            out[family] = (float(lo), float(hi))
    return out


def mean_aups(entries: list[dict], tasks: list[str]) -> dict[str, float | None]:
    """Per family, the plain mean of its AUP over ``tasks`` (d3LLM's Avg AUP); None where it lacks one."""
    per: dict[str, dict[str, float]] = defaultdict(dict)
    for e in entries:
        per[e["family"]][e["task"]] = e["aup"]
    return {family: (sum(values[t] for t in tasks) / len(tasks) if tasks and all(t in values for t in tasks) else None)
            for family, values in per.items()}


def family_pb_scores(rows: list[dict], tasks: list[str], thresholds=PB_THRESHOLDS) -> dict[str, dict]:
    """Per family, PBx over ``tasks``: each configuration's mean accuracy (%) and mean tokens per forward
    over the tasks (every one with a verdict, else the configuration does not count), then ``pb_scores``."""
    cells: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["task"] in tasks and r.get("accuracy") is not None and r.get("tokens_per_forward"):
            cells[(family_of(r), r["config"])][r["task"]] = r
    configs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (family, _), by_task in cells.items():
        if len(by_task) == len(tasks):
            configs[family].append((sum(r["tokens_per_forward"] for r in by_task.values()) / len(tasks),
                                    sum(100 * r["accuracy"] for r in by_task.values()) / len(tasks)))
    return {family: pb_scores(points, thresholds) for family, points in configs.items()}


def annotate(rows: list[dict], records: list[dict] | None = None) -> dict:
    """Add each row's family and its family's AUP on the row's task (the last five of ``SUMMARY_ROW_FIELDS``;
    None without a verdict), and return the ``yardsticks`` section of summary.json: every (family, task) entry of
    ``family_aups``, each family's mean AUP over the run's tasks, and with ParallelBench tasks in the run,
    each family's PB scores over them (``pb_tasks``: which; ParallelBench has ``PARALLELBENCH_TASKS``)."""
    entries = family_aups(rows, records)
    by_key = {(e["family"], e["task"]): e for e in entries}
    for r in rows:
        e = by_key.get((family_of(r), r["task"]), {})
        r.update(family=family_of(r), aup=e.get("aup"), aup_lo=e.get("aup_lo"), aup_hi=e.get("aup_hi"),
                 aup_y_max=e.get("y_max"))
    tasks = list(dict.fromkeys(r["task"] for r in rows if r.get("accuracy") is not None))
    pb_tasks = [t for t in tasks if t.startswith(PARALLELBENCH_PREFIX)]
    return {"aup_alpha": AUP_ALPHA, "aup_margin": AUP_MARGIN, "aup": entries, "mean_aup": mean_aups(entries, tasks),
            "mean_aup_tasks": tasks, "pb_tasks": pb_tasks, "pb_tasks_of": PARALLELBENCH_TASKS,
            "pb": family_pb_scores(rows, pb_tasks) if pb_tasks else {}}
