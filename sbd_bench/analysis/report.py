"""Tables and plots of a run folder, from its record files only (no torch, no model, no core import).

    python -m sbd_bench report runs/x            # also run at the end of every `run`

Writes into the run folder (atomically, each file complete or absent):
  report.md               provenance, the main table, AUP (and PB scores) per solver family, then three
                          narrow detail tables (accuracy and speed
                          factors with 95% intervals, pass@k with several samples per example; wall-clock against predicted speed factors; the
                          decoding profile; with math tasks, what the other scorer would change),
                          the measured cost curve, failures
  table.csv               the main table: rows = solver configurations, columns = tasks,
                          cells = accuracy (%) / speed factor (NFE) relative to NTP
  rows.csv                one row per configuration x task with every summary figure
  accuracy_vs_speed.png   accuracy against speed factor per task, Pareto front marked, verified
                          configurations (``verify=on``, output = NTP's) as diamonds
  tokens_per_forward.png  distribution of tokens revealed per forward, per task and configuration
  forwards_per_block.png  distribution of forwards per block, per task and configuration
  report.html             one self-contained page: sortable leaderboard, interactive plot, examples and
                          their decoding timelines where traced (page.py)
Every table and plot lists tasks in the run's order and configurations NTP first, then in run order.
A row whose mean output length differs from NTP's by more than 10% (``tokens_differ_from_ntp``,
defined in metrics.py) carries LENGTH_MARK and a footnote: its NFE speed factor counts forwards
spent on a different amount of text.
"""
from __future__ import annotations

import csv
import io
import itertools
import json
import math
from pathlib import Path
from typing import Callable

from ..types import SUMMARY_ROW_FIELDS
from .columns import ACCURACY, PROFILE, WALL, report_columns, report_header
from .formats import (LENGTH_FOOTNOTE, LENGTH_MARK, _interval, _num, _pct, _x, dominates, length_mark, pareto_front,
                      sampled_rows)  # dominates: report.dominates, as before the formats moved out (tests use it)
from .metrics import (BASELINE_SOLVER, is_generate_baseline, no_baseline_note, is_verified, ntp_mismatch_warning, scorer_changes,
                      summarize)
from .records import (SUMMARY, RunFolderError, free_path, is_run_summary, load_run, prepare_output_folder,
                      remove_empty_folders, starts_with, write_atomic, write_text_atomic)
from .page import PAGE, write_page
from .roofline import prediction_columns
from .traces import TRACES, read_traces
from .yardsticks import PB_THRESHOLDS, annotate

PREDICTION_LABELS = {"pred_measured": "predicted (measured curve)"}
SAMPLED_NOTE = ("Sampled run: N samples of each example per configuration (`n` counts samples), each with its seed in "
                "samples.jsonl. Accuracy is pass@1, the mean over examples of c/n; pass@k is the mean over examples "
                "of the unbiased estimator 1 - C(n-c, k)/C(n, k) (Chen et al. 2021); both intervals are bootstrapped "
                "over examples. Speed factors pair each configuration with NTP at its own sampling settings, sample "
                "by sample, and divide the sums over an example's samples.")


# --------------------------------------------------------------------------------- order and marks
def task_order(rows: list[dict]) -> list[str]:
    """Tasks in the order the run met them: the one order of every table and plot."""
    return list(dict.fromkeys(r["task"] for r in rows))


def config_order(rows: list[dict]) -> list[str]:
    """Configurations NTP first (every speed factor is relative to it), then in the run's order."""
    configs = list(dict.fromkeys(r["config"] for r in rows))
    return sorted(configs, key=lambda c: c.split(":")[0] != BASELINE_SOLVER)  # stable: run order otherwise


def ordered(rows: list[dict]) -> list[dict]:
    """Rows task by task, each task's configurations in ``config_order``."""
    tasks, configs = task_order(rows), config_order(rows)
    return sorted(rows, key=lambda r: (tasks.index(r["task"]), configs.index(r["config"])))


# ------------------------------------------------------------------------------------------ tables
def main_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and body of the paper-style table: one row per configuration, one column per task."""
    tasks = task_order(rows)
    cell = {(r["config"], r["task"]): r for r in rows}
    body = []
    for config in config_order(rows):
        line = [config]
        for task in tasks:
            r = cell.get((config, task))
            line.append("" if r is None else f"{_pct(r['accuracy'])} / {_x(r['speed_factor_nfe'])}{length_mark(r)}")
        body.append(line)
    return ["config", *tasks], body


# A detail table is a list of (header, cell of one summary row), built from columns.COLUMNS: a new figure
# is one entry there, not here.
TableColumn = tuple[str, Callable[[dict], str]]


def family_table(rows: list[dict], yardsticks: dict) -> tuple[list[str], list[list[str]]]:
    """One row per solver family (in ``config_order``): its AUP per task with the 95% interval (and how
    many of its points the 5-point margin kept, where it dropped some), the mean over tasks, and with
    ParallelBench tasks its PB scores. The task headers carry the task's y_max."""
    tasks = [t for t in task_order(rows) if any(e["task"] == t for e in yardsticks["aup"])]
    entries = {(e["family"], e["task"]): e for e in yardsticks["aup"]}
    families = list(dict.fromkeys(r["family"] for r in ordered(rows) if r.get("family") is not None))
    y_max = {e["task"]: e["y_max"] for e in yardsticks["aup"]}
    pb = yardsticks.get("pb") or {}
    header = ["family", *(f"{t} AUP (y_max {y_max[t]:.1f})" for t in tasks), "mean AUP"]
    header += [f"PB{x}" for x in PB_THRESHOLDS] if yardsticks.get("pb_tasks") else []
    body = []
    for family in families:
        line = [family]
        for task in tasks:
            e = entries.get((family, task))
            line.append("-" if e is None else _num(e["aup"], 1) + _interval(e["aup_lo"], e["aup_hi"], lambda v: _num(v, 1))
                        + (f" ({e['kept']} of {len(e['points'])} points)" if e["kept"] < len(e["points"]) else ""))
        line.append(_num(yardsticks["mean_aup"].get(family), 1))
        if yardsticks.get("pb_tasks"):
            line += [_num((pb.get(family) or {}).get(f"PB{x}"), 2) for x in PB_THRESHOLDS]
        body.append(line)
    return header, body


def family_lines(rows: list[dict], yardsticks: dict) -> list[str]:
    if not yardsticks.get("aup"):
        return []
    pb_tasks = yardsticks.get("pb_tasks") or []
    text = ["### AUP per solver family", "", "AUP (d3LLM's Accuracy Under Parallelism): the weighted area under a solver "
            "family's accuracy (%) against tokens per forward on a task, its configurations' points joined by NTP's "
            "(1 token per forward), a point more than 5 below the first dropped; y_max, in each header, is the best "
            "accuracy on the task in this run; 95% bootstrap interval over examples; mean over the tasks "
            "(docs/measurement.md, 'The field's yardsticks')."]
    if pb_tasks:
        text[-1] += (f" PBx (ParallelBench): the most mean tokens per forward of the family's configurations whose "
                     f"mean score over the {len(pb_tasks)} of ParallelBench's {yardsticks['pb_tasks_of']} tasks in "
                     f"this run is at least x%.")
    return text + ["", markdown(*family_table(rows, yardsticks)), ""]


def accuracy_speed_columns(sampled: bool = False) -> list[TableColumn]:
    return [(report_header(c, sampled), c.cell) for c in report_columns(ACCURACY, sampled)]


def prediction_table_columns(predictions: dict[str, dict]) -> list[TableColumn]:
    def predicted(name):
        return lambda r: _x(predictions[name].get((r["config"], r["task"])))

    return [(f"{WALL.header} (measured)", lambda r: WALL.text(r.get(WALL.key)))] + [
        (PREDICTION_LABELS.get(name, name.replace("pred_", "predicted ").replace("_", " ")), predicted(name))
        for name in predictions]


def profile_columns(sampled: bool = False) -> list[TableColumn]:
    return [(report_header(c, sampled), c.cell) for c in report_columns(PROFILE, sampled)]


def column_table(rows: list[dict], columns: list[TableColumn]) -> tuple[list[str], list[list[str]]]:
    """One line per (task, configuration), in the report's order, with the given columns."""
    return (["task", "config", *(name for name, _ in columns)],
            [[r["task"], r["config"], *(cell(r) for _, cell in columns)] for r in ordered(rows)])


def markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    return "\n".join(lines)


def csv_text(header: list[str], body: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(body)
    return buffer.getvalue()


def provenance_lines(summary: dict) -> list[str]:
    p = summary.get("provenance") or {}
    keys = ("command", "git_commit", "git_dirty", "model_path", "model_hash", "device", "device_name", "gpu_name",
            "driver_version", "cuda", "cpu", "threads", "dtype", "attn_implementation", "exact", "torch", "transformers",
            "seed", "sandbox", "math_verify", "started")
    return [f"- {k}: `{p.get(k)}`" for k in keys if p.get(k) is not None]


def scorer_lines(changes: list[dict], rows: list[dict]) -> list[str]:
    """The section on the math scorers (metrics.scorer_changes), in the report's order; none without them."""
    if not changes:
        return []
    tasks, configs = task_order(rows), config_order(rows)

    def place(c):
        return (tasks.index(c["task"]) if c["task"] in tasks else len(tasks),
                configs.index(c["config"]) if c["config"] in configs else len(configs))

    header = ["task", "config", "scorer", "verdicts", "other scorer", "it would pass", "it would fail",
              "no math-verify verdict"]
    body = [[c["task"], c["config"], c["scorer"], str(c["verdicts"]), c["other_scorer"], str(c["other_passes"]),
             str(c["other_fails"]), str(c["no_math_verify_verdict"])] for c in sorted(changes, key=place)]
    return ["### Math scorers", "", "Every math answer is judged by both scorers (docs/benchmarks.md, 'Scoring math "
            "answers'); accuracy counts the task's `scorer`. 'It would pass' / 'it would fail': how many of these "
            "verdicts the other scorer turns. 'No math-verify verdict': math-verify ran out of its time budget or "
            "its worker died (each sample's `score_detail` says which), a failed verdict.", "",
            markdown(header, body), ""]


def cost_curve_lines(summary: dict) -> list[str]:
    curve = summary.get("cost_curve")
    if not curve:
        return []
    times = dict(zip(curve["query_tokens"], curve["time_s"]))
    k = curve["block_size"]
    cells = ", ".join(f"q={q}: {t * 1e3:.3f} ms" for q, t in times.items())
    lines = [f"Measured forward cost on {curve['device']} over a {curve['context']}-token cache "
             f"(medians of {curve['reps']}): {cells}."]
    if 1 in times and k in times and 2 * k in times:
        lines[0] += (f" A {k}-token forward costs {times[k] / times[1]:.2f}x and a {2 * k}-token forward "
                     f"{times[2 * k] / times[1]:.2f}x a 1-token forward here; 'predicted (measured curve)' applies "
                     "these to each sample's forwards per block, so the rest of the gap to the measured wall-clock "
                     "factor is per-forward work outside the model call (solver, bookkeeping) and timing noise.")
    inversions = non_monotone(times)
    if inversions:
        pairs = "; ".join(f"q={b} took {times[b] * 1e3:.3f} ms, less than q={a} ({times[a] * 1e3:.3f} ms)"
                          for a, b in inversions)
        lines += ["", f"The measured curve is not monotone: {pairs}, although a forward over more query tokens "
                  "does no less work. Such inversions come from timing noise (another process taking the core during "
                  "one shape's repetitions; the median removes only part of it) and from the kernels chosen per "
                  "shape (matrix-multiply libraries block and vectorise some sizes better than their neighbours). "
                  "Read the inverted points as equal in cost, not as a property of the model or the solvers."]
    return lines


def non_monotone(times: dict[int, float]) -> list[tuple[int, int]]:
    """(q, q') pairs of neighbouring measured sizes, q < q', where the larger forward took less time."""
    qs = sorted(times)
    return [(a, b) for a, b in zip(qs, qs[1:]) if times[b] < times[a]]


# ------------------------------------------------------------------------------------------- plots
def _savefig(fig, path: Path) -> None:
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))


MARKER_AREA = 45  # points^2: a marker about 6.7 points wide
MARKER_GAP = 1.2  # centres of two markers at least this many marker widths apart: none hides another


def _nudges(spacing: float, rings: int = 6) -> list[tuple[float, float]]:
    """Offsets (points) on a hexagonal lattice, nearest first, sideways before up or down."""
    cells = [((i + (j % 2) / 2) * spacing, j * spacing * 3 ** 0.5 / 2)
             for j in range(-rings, rings + 1) for i in range(-rings, rings + 1)]
    return sorted(cells, key=lambda c: (round((c[0] ** 2 + c[1] ** 2) ** 0.5, 6), abs(c[1]), c[0]))


def spread_markers(positions: list[tuple[float, float]], width: float,
                   bounds: tuple[float, float, float, float] = (-math.inf, math.inf, -math.inf, math.inf)
                   ) -> list[tuple[float, float]]:
    """Offsets (points) that keep markers of ``width`` points from covering each other: each marker,
    in the given order, takes the nearest free spot to its true position (``positions`` in points)
    inside ``bounds`` (x_min, x_max, y_min, y_max: the axes' real range, so no accuracy is drawn above
    100% or below 0% and no speed factor below 0; one was drawn at 106%). The first marker of a spot
    stays on it; the others sit beside it, or below it at 100% and above it at 0% when beside is taken."""
    spacing = MARKER_GAP * width
    x_min, x_max, y_min, y_max = bounds

    def inside(x, y):  # with a hair of slack: a marker on 100% exactly is inside
        return x_min - 1e-6 <= x <= x_max + 1e-6 and y_min - 1e-6 <= y <= y_max + 1e-6

    placed: list[tuple[float, float]] = []
    offsets = []
    for x, y in positions:
        free = ((dx, dy) for dx, dy in _nudges(spacing) if inside(x + dx, y + dy)
                and all((x + dx - px) ** 2 + (y + dy - py) ** 2 >= spacing ** 2 - 1e-9 for px, py in placed))
        dx, dy = next(free, (0.0, 0.0))  # no room left near it: on its true spot
        placed.append((x + dx, y + dy))
        offsets.append((dx, dy))
    return offsets


def _speed_points(rows: list[dict], task: str) -> list[dict]:
    """The markers of one panel: every configuration's NFE speed factor (filled), then every wall-clock
    one (hollow), so that the NFE markers (the Pareto front's) keep their true spots first."""
    rows = [r for r in rows if r["task"] == task and r["accuracy"] is not None]
    return [{"config": r["config"], "kind": kind, "x": r[f"speed_factor_{kind}"], "y": 100 * r["accuracy"], "row": r}
            for kind in ("nfe", "wall") for r in rows if r[f"speed_factor_{kind}"] is not None]


def plot_accuracy_vs_speed(rows: list[dict], path: Path):
    """Write the plot; returns its (closed) figure so tests can read the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.transforms import offset_copy

    tasks, configs = task_order(rows), config_order(rows)
    # tab20's dark hues (tab10's colours) for the first 10 configurations, its light ones for the next 10
    colors = {c: plt.get_cmap("tab20")((2 * i + i // 10) % 20) for i, c in enumerate(configs)}
    # verified configurations (output = NTP's) as diamonds, transformers' generate baselines (prompt lookup,
    # assisted decoding; output = NTP's too) as squares; gids "verified" and "generate" let tests find them
    marker = {r["config"]: ("D", "verified") if is_verified(r) else ("s", "generate") if is_generate_baseline(r)
              else ("o", None) for r in rows}
    cols = 2 if len(tasks) == 4 else min(3, len(tasks))
    rows_n = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.8 * cols, 4.2 * rows_n), squeeze=False)
    for ax in axes.flat[len(tasks):]:
        ax.set_visible(False)
    panels = list(zip(axes.flat, tasks))
    for ax, task in panels:
        right = max([p["x"] for p in _speed_points(rows, task)] + [1.0]) * 1.15
        ax.set_xlim(0, right)
        ax.set_ylim(-4, 106)  # room for the markers drawn on 0% and 100%
        ax.set_yticks(range(0, 101, 20))
        ax.set_title(task, fontsize=12)
        ax.set_xlabel("speed factor relative to NTP (x)", fontsize=10)
        ax.set_ylabel("accuracy (%)", fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle("Accuracy against speed factor relative to NTP, per task", fontsize=12)
    fig.tight_layout()  # before placing markers: their nudges are computed in the final axes' points
    for ax, task in panels:
        points = _speed_points(rows, task)
        to_points = ax.transData + fig.dpi_scale_trans.inverted()  # data -> inches
        where = [tuple(72 * v for v in to_points.transform((p["x"], p["y"]))) for p in points]
        # the axes' real range: speed factors from the left edge (0), accuracy 0..100%
        (x_min, y_min), (x_max, y_max) = (72 * to_points.transform((x, y)) for x, y in zip(ax.get_xlim(), (0, 100)))
        nudges = spread_markers(where, width=MARKER_AREA ** 0.5, bounds=(x_min, x_max, y_min, y_max))
        for p, (dx, dy) in zip(points, nudges):
            filled = p["kind"] == "nfe"
            shape, gid = marker[p["config"]]
            ax.scatter(p["x"], p["y"], s=MARKER_AREA, zorder=3, linewidths=1.5, clip_on=False, marker=shape, gid=gid,
                       facecolors=colors[p["config"]] if filled else "none", edgecolors=colors[p["config"]],
                       transform=offset_copy(ax.transData, fig=fig, x=dx, y=dy, units="points"))
        front = pareto_front([(p["x"], p["y"] / 100) for p in points if p["kind"] == "nfe"])
        if front:
            ax.plot([x for x, _ in front], [100 * y for _, y in front], "k--", lw=1, marker="o", ms=13, mfc="none",
                    zorder=2)
        if not points:
            ax.text(0.5, 0.5, "no verdicts", transform=ax.transAxes, ha="center")
    handles = [plt.Line2D([], [], marker=marker[c][0], ls="", color=colors[c], label=c) for c in configs]
    grey = "0.35"
    if any(gid == "verified" for _, gid in marker.values()):
        handles.append(plt.Line2D([], [], marker="D", ls="", color=grey, label="diamond: verified (output = NTP's)"))
    if any(gid == "generate" for _, gid in marker.values()):
        handles.append(plt.Line2D([], [], marker="s", ls="", color=grey,
                                  label="square: transformers' generate\n(prompt lookup, draft model)"))
    handles += [plt.Line2D([], [], marker="o", ls="", color=grey, label="filled: speed factor from NFE"),
                plt.Line2D([], [], marker="o", ls="", mfc="none", mec=grey, label="hollow: speed factor from wall-clock"),
                plt.Line2D([], [], ls="--", marker="o", ms=12, mfc="none", color="k", label="Pareto front (NFE)")]
    handles.append(plt.Line2D([], [], ls="", label="markers that would cover each other\nare set side by side"))
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.93), fontsize=10, frameon=False)
    _savefig(fig, path)
    plt.close(fig)
    return fig


def count_bins(top: int, with_zero: bool) -> list[tuple[int, int, str]]:
    """(low, high, label) bins for whole counts up to ``top``: 0 (when present), 1, 2, 3, 4 on their
    own, then 5-8, 9-16, 17-32, ... so that a 16-position block stays readable."""
    bins = [(0, 0, "0")] if with_zero else []
    bins += [(v, v, str(v)) for v in range(1, min(top, 4) + 1)]
    low = 5
    while low <= top:
        high = 2 * (low - 1)
        bins.append((low, high, f"{low}–{high}"))
        low = high + 1
    return bins


# Paul Tol's "bright" scheme (distinct for colour-blind readers too), then ochre, teal and near-black
BIN_COLORS = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#997700", "#17BECF", "#222222")


def bin_colors(bins: list[tuple[int, int, str]]) -> list[str]:
    """One clearly different colour per bin, the same for a bin in every panel; 0 in light grey.
    (Nine colours cover blocks of up to 128 positions; beyond that they repeat.)"""
    nonzero = itertools.cycle(BIN_COLORS)
    return ["#DDDDDD" if low == 0 else next(nonzero) for low, _, _ in bins]


def plot_distribution(records: list[dict], rows: list[dict], field: str, title: str, unit: str, path: Path):
    """One panel per task; in it one 100% stacked bar per configuration: the share of each value of a
    per-sample list field (``revealed_per_forward``, ``forwards_per_block``), one discrete colour per
    value (or range of values); the mean is printed at the bar's end."""
    import matplotlib.pyplot as plt

    tasks, configs = task_order(rows), config_order(rows)
    data: dict[tuple[str, str], list[int]] = {}
    for r in records:
        if not r.get("error") and r.get(field):
            data.setdefault((r["task"], r["config"]), []).extend(r[field])
    values = [v for vs in data.values() for v in vs]
    bins = count_bins(max(values, default=1), with_zero=0 in values)
    colors = bin_colors(bins)
    heights = [0.32 * sum((task, c) in data for c in configs) + 0.7 for task in tasks]
    fig, axes = plt.subplots(len(tasks), 1, figsize=(9, sum(heights) + 1.0), squeeze=False,
                             gridspec_kw={"height_ratios": heights}, sharex=True)
    for ax, task in zip(axes[:, 0], tasks):
        present = [c for c in configs if (task, c) in data][::-1]  # barh draws bottom-up: NTP on top
        for row, config in enumerate(present):
            counts = data[(task, config)]
            left = 0.0
            for (low, high, _), color in zip(bins, colors):
                share = sum(low <= v <= high for v in counts) / len(counts)
                if share:
                    ax.barh(row, share, left=left, color=color, edgecolor="white", linewidth=0.5)
                    left += share
            ax.text(1.01, row, f"mean {sum(counts) / len(counts):.2f}", va="center", fontsize=8)
        ax.set_yticks(range(len(present)), present, fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_title(task, fontsize=10, loc="left")
        if not present:
            ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center")
    axes[-1, 0].set_xlabel(f"share of {unit}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for color in colors]
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.legend(handles, [label for *_, label in bins], title=title.split(":")[0].lower(), loc="upper left",
               bbox_to_anchor=(1.0, 0.95), fontsize=9, title_fontsize=9, frameon=False)
    _savefig(fig, path)
    plt.close(fig)
    return fig


# ------------------------------------------------------------------------------------------ report
def _table_section(title: str, intro: str, rows: list[dict], columns: list[TableColumn]) -> list[str]:
    header, body = column_table(rows, columns)
    marked = any(LENGTH_MARK in cell for line in body for cell in line)
    return [f"### {title}", "", intro, "", markdown(header, body), ""] + ([LENGTH_FOOTNOTE, ""] if marked else [])


def report_text(run_dir: Path, summary: dict, rows: list[dict], predictions: dict[str, dict],
                warning: str | None = None, scorers: list[dict] | None = None, yardsticks: dict | None = None) -> str:
    """report.md; ``warning``: verified outputs that differ from NTP's (metrics.ntp_mismatch_warning);
    ``scorers``: metrics.scorer_changes of the records; ``yardsticks``: yardsticks.annotate of the rows."""
    header, body = main_table(rows)
    text = [f"{REPORT_TITLE}{run_dir.name}", ""]
    if not summary.get("complete"):
        text += [f"**Incomplete run**: finish it with `python -m sbd_bench run --resume {run_dir}`.", ""]
    text += ["Cells: accuracy (%) / speed factor relative to NTP, from forward counts (NFE), paired per example.", "",
             markdown(header, body), ""]
    if any(r.get("tokens_differ_from_ntp") for r in rows):
        text += [LENGTH_FOOTNOTE, ""]
    sampled = sampled_rows(rows)
    if sampled:
        text += [SAMPLED_NOTE, ""]
    text += family_lines(rows, yardsticks or {})
    text += ["## Details", ""]
    text += _table_section(
        ACCURACY, "95% intervals: Wilson for accuracy, seeded percentile bootstrap over examples "
        "for speed factors (and for accuracy and pass@k with several samples per example). NFE: the mean over "
        "examples of NTP's forwards over the configuration's. Wall, decode: NTP's total decode time over the "
        "configuration's, on the same examples (prefill is timed apart and left out). End-to-end: the same ratio of "
        "totals with prefill included, what a user waits for. '= NTP output': the share of samples whose output ids "
        "equal NTP's (100% for greedy verified configurations, `verify=on`, unless rounding at a near tie moved "
        "them: see the warning below the table; sampled ones are distributed as NTP's instead).",
        rows, accuracy_speed_columns(sampled))
    batch = ((summary.get("provenance") or {}).get("config") or {}).get("batch_size") or 1
    if batch > 1:
        text += [batched_timing_note(batch), ""]
    no_ntp = no_baseline_note(summary, rows)
    if no_ntp:
        text += [no_ntp, ""]
    if warning:
        text += [f"**Warning**: {warning}.", ""]
    if predictions:
        text += _table_section(
            "Wall-clock speed factor, measured and predicted", "Predicted speed factors apply a cost model to each "
            "sample's forwards per block: the forward costs measured on this machine (below), and datasheet figures "
            "for other hardware and model sizes (see `python -m sbd_bench roofline`).",
            rows, prediction_table_columns(predictions))
    text += _table_section(
        PROFILE, "Means per sample. 'tokens vs NTP' is the mean output length over NTP's on the same "
        "examples. Acceptance: verified configurations (`verify=on`) only, the share of drafted tokens NTP's argmax "
        "confirmed.",
        rows, profile_columns(sampled))
    text += scorer_lines(scorers or [], rows)
    text += cost_curve_lines(summary) + [""]
    failures = summary.get("failures") or []
    if failures:
        text += [f"## Failures ({len(failures)})", ""] + [
            f"- {f['config']} on {f['task']}/{f['id']}: {f['error']}" for f in failures[:50]] + [""]
    text += ["## Plots", "", "![accuracy vs speed factor](accuracy_vs_speed.png)", "",
             "![tokens per forward](tokens_per_forward.png)", "", "![forwards per block](forwards_per_block.png)", "",
             f"Interactive: [{PAGE}]({PAGE}) (sortable tables, the plot per task, every example's outputs).", "",
             "## Provenance", "", *provenance_lines(summary), ""]
    return "\n".join(text)


def batched_timing_note(batch: int) -> str:
    """What the wall-clock factors of a run decoded ``batch`` sequences per forward compare."""
    return (f"Decoded {batch} sequences per forward (`--batch-size {batch}`; outputs and NFE are batch 1's): a sample's "
            f"times are its 1/{batch} share of its batch's, so the wall-clock factors compare throughput at batch {batch} "
            f"(every configuration decodes the same batches of examples), not the latency of one sequence; "
            f"`--batch-size 1` times each sample alone.")


REPORT_FILES = ("report.md", "table.csv", "rows.csv", "accuracy_vs_speed.png", "tokens_per_forward.png",
                "forwards_per_block.png", PAGE)  # what _write_report writes
REPORT_TITLE = "# sbd_bench report: "


def check_report_folder(folder: Path, also: tuple[str, ...] = (), flag: str = "--out") -> None:
    """Refuse, before any work, a folder holding files by the report's names (or by the names in
    ``also``) that sbd_bench did not write: the report would replace them. A run folder (its
    summary.json a run's) or a folder holding a report.md of ours may be written again."""
    folder = Path(folder)
    if is_run_summary(folder / SUMMARY) or starts_with(folder / "report.md", REPORT_TITLE):
        return
    taken = [name for name in (*also, *REPORT_FILES) if (folder / name).exists()]
    if taken:
        raise RunFolderError(f"{flag} {folder} holds {', '.join(taken)}, which sbd_bench did not write and would "
                             f"replace: give a new or empty folder, e.g. {flag} {free_path(folder)}")


def write_report(run_dir: Path, out_dir: Path | None = None, loaded: tuple[dict, list[dict]] | None = None) -> Path:
    """Build every table and plot of a run folder; returns the path of report.md. ``loaded`` is the
    folder's ``load_run`` when the caller has read it already."""
    summary, records = loaded or load_run(Path(run_dir))  # first: bad input must not leave folders behind
    return _write_report(Path(run_dir), out_dir, summary, records)[0]


def _write_report(run_dir: Path, out_dir: Path | None, summary: dict, records: list[dict]) -> tuple[Path, list[dict]]:
    """(report.md, the ordered summary rows) of a loaded run folder."""
    import matplotlib

    matplotlib.use("Agg")
    traces = read_traces(run_dir / TRACES)  # before anything is written: a damaged line is refused first
    out_dir = Path(out_dir or run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = ordered(summarize(records, ((summary.get("provenance") or {}).get("config") or {}).get("pass_k")))
    yardsticks = annotate(rows, records)
    predictions = prediction_columns(summary, records)
    warning = ntp_mismatch_warning(records, exact=bool((summary.get("provenance") or {}).get("exact")))
    # report.md first: it marks the folder as a report's (check_report_folder), so a report that a full disk
    # stopped halfway is replaced by the same command run again, not refused as someone else's files
    write_text_atomic(out_dir / "report.md", report_text(run_dir, summary, rows, predictions, warning,
                                                        scorer_changes(records), yardsticks))
    write_text_atomic(out_dir / "table.csv", csv_text(*main_table(rows)))
    long_header = list(SUMMARY_ROW_FIELDS) + list(predictions)
    long_body = [[json.dumps(r.get(f)) if isinstance(r.get(f), dict) else r.get(f) for f in SUMMARY_ROW_FIELDS]
                 + [predictions[name].get((r["config"], r["task"])) for name in predictions] for r in rows]
    write_text_atomic(out_dir / "rows.csv", csv_text(long_header, long_body))
    plot_accuracy_vs_speed(rows, out_dir / "accuracy_vs_speed.png")
    plot_distribution(records, rows, "revealed_per_forward", "Tokens revealed per forward: share of forwards",
                      "forwards", out_dir / "tokens_per_forward.png")
    plot_distribution(records, rows, "forwards_per_block", "Forwards per block: share of blocks", "blocks",
                      out_dir / "forwards_per_block.png")
    write_page(out_dir, run_dir.name, summary, records, rows, traces)
    return out_dir / "report.md", rows


def cmd_report(args) -> int:
    summary, records = load_run(Path(args.run_dir))  # bad records first: nothing is written then
    created = []
    if args.out:
        prepare_output_folder(Path(args.out), keep=False)
        check_report_folder(Path(args.out))
        created = prepare_output_folder(Path(args.out))
    try:
        path, rows = _write_report(Path(args.run_dir), Path(args.out) if args.out else None, summary, records)
    except BaseException:
        remove_empty_folders(created)  # a report that could not be written leaves no empty folder behind
        raise
    print(markdown(*main_table(rows)))
    print(json.dumps({"report": str(path), "complete": bool(summary.get("complete"))}))
    return 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("report", help="tables (Markdown, CSV), plots (PNG) and report.html of a run folder")
    p.add_argument("run_dir", help="a run folder written by `run`")
    p.add_argument("--out", default=None, help="where to write (default: the run folder)")
    p.set_defaults(func=cmd_report)
