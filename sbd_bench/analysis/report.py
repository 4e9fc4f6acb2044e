"""Tables and plots of a run folder, from its record files only (no torch, no model, no core import).

    python -m sbd_bench report runs/x            # also run at the end of every `run`

Writes into the run folder (atomically, each file complete or absent):
  report.md               provenance, the main table, details with 95% intervals, predicted speed factors
  table.csv               the main table: rows = solver configurations, columns = tasks,
                          cells = accuracy (%) / speed factor (NFE) relative to NTP
  rows.csv                one row per configuration x task with every summary figure
  accuracy_vs_speed.png   accuracy against speed factor per task, Pareto front marked
  tokens_per_forward.png  distribution of tokens revealed per forward, per configuration
  forwards_per_block.png  distribution of forwards per block, per configuration
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ..types import SUMMARY_ROW_FIELDS
from .metrics import summarize
from .records import load_run, prepare_output_folder, write_text_atomic
from .roofline import prediction_columns

PREDICTION_LABELS = {"pred_measured": "predicted (measured curve)"}


# ------------------------------------------------------------------------------------------ tables
def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _interval(lo, hi, fmt) -> str:
    return "" if lo is None else f" [{fmt(lo)}, {fmt(hi)}]"


def main_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and body of the paper-style table: one row per configuration, one column per task."""
    configs = list(dict.fromkeys(r["config"] for r in rows))
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cell = {(r["config"], r["task"]): r for r in rows}
    body = []
    for config in configs:
        line = [config]
        for task in tasks:
            r = cell.get((config, task))
            line.append("" if r is None else f"{_pct(r['accuracy'])} / {_x(r['speed_factor_nfe'])}")
        body.append(line)
    return ["config", *tasks], body


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


def detail_table(rows: list[dict], predictions: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    header = ["task", "config", "n", "accuracy % [95% CI]", "nfe", "tokens/forward", "forwards/block",
              "speed factor NFE [95% CI]", "speed factor wall [95% CI]",
              *[PREDICTION_LABELS.get(name, name.replace("pred_", "predicted ").replace("_", " ")) for name in predictions],
              "peak memory MiB", "errors"]
    body = []
    for r in sorted(rows, key=lambda r: r["task"]):
        mem = r.get("peak_memory_bytes")
        body.append([
            r["task"], r["config"], str(r["n"]),
            _pct(r["accuracy"]) + _interval(r["accuracy_lo"], r["accuracy_hi"], _pct),
            "-" if r["nfe"] is None else f"{r['nfe']:.1f}",
            "-" if r["tokens_per_forward"] is None else f"{r['tokens_per_forward']:.2f}",
            "-" if r["forwards_per_block"] is None else f"{r['forwards_per_block']:.2f}",
            _x(r["speed_factor_nfe"]) + _interval(r["speed_factor_nfe_lo"], r["speed_factor_nfe_hi"], _x),
            _x(r["speed_factor_wall"]) + _interval(r["speed_factor_wall_lo"], r["speed_factor_wall_hi"], _x),
            *[_x(column.get((r["config"], r["task"]))) for column in predictions.values()],
            "-" if not mem else f"{mem / 2**20:.0f}", str(r["errors"]),
        ])
    return header, body


def provenance_lines(summary: dict) -> list[str]:
    p = summary.get("provenance") or {}
    keys = ("command", "git_commit", "git_dirty", "model_path", "model_hash", "device", "device_name", "gpu_name",
            "driver_version", "cuda", "cpu", "threads", "dtype", "attn_implementation", "torch", "transformers",
            "seed", "started")
    return [f"- {k}: `{p.get(k)}`" for k in keys if p.get(k) is not None]


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
    return lines


# ------------------------------------------------------------------------------------------- plots
def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both speed (x) and accuracy (y), sorted by speed."""
    front, best = [], float("-inf")
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return sorted(front)


def _savefig(fig, path: Path) -> None:
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    os.replace(tmp, path)


def plot_accuracy_vs_speed(rows: list[dict], path: Path):
    """Write the plot; returns its (closed) figure so tests can read the axes."""
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    colors = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(configs)}
    cols = 2 if len(tasks) == 4 else min(3, len(tasks))
    rows_n = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.5 * cols, 4 * rows_n), squeeze=False)
    for ax in axes.flat[len(tasks):]:
        ax.set_visible(False)
    for ax, task in zip(axes.flat, tasks):
        points = [(r["speed_factor_nfe"], r["accuracy"], r["config"], r.get("speed_factor_wall")) for r in rows
                  if r["task"] == task and r["speed_factor_nfe"] is not None and r["accuracy"] is not None]
        for x, y, config, wall in points:
            ax.scatter(x, 100 * y, color=colors[config], s=40, zorder=3)
            if wall is not None:
                ax.scatter(wall, 100 * y, facecolors="none", edgecolors=colors[config], s=40, zorder=3)
        front = pareto_front([(x, y) for x, y, _, _ in points])
        if front:
            ax.plot([x for x, _ in front], [100 * y for _, y in front], "k--", lw=1, marker="o", ms=11, mfc="none",
                    zorder=2)
        if not points:
            ax.text(0.5, 0.5, "no verdicts", transform=ax.transAxes, ha="center")
        right = max([x for x, *_ in points] + [w for *_, w in points if w is not None] + [1.0])
        ax.set_xlim(0, right * 1.15)
        ax.set_ylim(-2, 102)
        ax.set_title(task)
        ax.set_xlabel("speed factor relative to NTP (x)\nfilled: NFE, hollow: wall-clock")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", color=colors[c], label=c) for c in configs]
    handles.append(plt.Line2D([], [], ls="--", marker="o", ms=11, mfc="none", color="k", label="Pareto front (NFE)"))
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=7, frameon=False)
    _savefig(fig, path)
    plt.close(fig)
    return fig


def plot_distribution(records: list[dict], field: str, value_label: str, unit: str, path: Path):
    """One 100% stacked bar per configuration: the share of each value of a per-sample list field
    (pooled over tasks), coloured by the value; the mean is printed at the bar's end."""
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    data: dict[str, list[int]] = {}
    for r in records:
        if not r.get("error"):
            data.setdefault(r["config"], []).extend(r.get(field) or [])
    data = {c: v for c, v in data.items() if v}
    top = max((max(v) for v in data.values()), default=1)
    cmap, norm = plt.get_cmap("viridis"), Normalize(vmin=1, vmax=max(top, 2))
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(data) + 1.4))
    for row, (config, values) in enumerate(data.items()):
        left = 0.0
        for value in sorted(set(values)):
            share = values.count(value) / len(values)
            ax.barh(row, share, left=left, color=cmap(norm(value)), edgecolor="white", linewidth=0.5)
            left += share
        ax.text(1.01, row, f"mean {sum(values) / len(values):.2f}", va="center", fontsize=7)
    ax.set_yticks(range(len(data)), list(data), fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"share of {unit} (all tasks)")
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=value_label, pad=0.12)
    _savefig(fig, path)
    plt.close(fig)
    return fig


# ------------------------------------------------------------------------------------------ report
def write_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Build every table and plot of a run folder; returns the path of report.md."""
    import matplotlib

    matplotlib.use("Agg")
    run_dir = Path(run_dir)
    summary, records = load_run(run_dir)  # first: bad input must not leave folders behind
    out_dir = Path(out_dir or run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize(records)
    predictions = prediction_columns(summary, records)
    header, body = main_table(rows)
    write_text_atomic(out_dir / "table.csv", csv_text(header, body))
    long_header = list(SUMMARY_ROW_FIELDS) + list(predictions)
    long_body = [[json.dumps(r.get(f)) if isinstance(r.get(f), dict) else r.get(f) for f in SUMMARY_ROW_FIELDS]
                 + [predictions[name].get((r["config"], r["task"])) for name in predictions] for r in rows]
    write_text_atomic(out_dir / "rows.csv", csv_text(long_header, long_body))
    plot_accuracy_vs_speed(rows, out_dir / "accuracy_vs_speed.png")
    plot_distribution(records, "revealed_per_forward", "tokens revealed per forward", "forwards",
                      out_dir / "tokens_per_forward.png")
    plot_distribution(records, "forwards_per_block", "forwards per block", "blocks", out_dir / "forwards_per_block.png")
    d_header, d_body = detail_table(rows, predictions)
    failures = summary.get("failures") or []
    text = [f"# sbd_bench report: {run_dir.name}", ""]
    if not summary.get("complete"):
        text += [f"**Incomplete run**: finish it with `python -m sbd_bench run --resume {run_dir}`.", ""]
    text += ["Cells: accuracy (%) / speed factor relative to NTP, from forward counts (NFE), paired per example.", "",
             markdown(header, body), "", "## Details", "",
             "95% intervals: Wilson for accuracy, seeded percentile bootstrap over examples for speed factors. "
             "Wall-clock speed factors use decode time (prefill is timed apart); predicted ones apply a cost "
             "model to each sample's forwards per block (see `python -m sbd_bench roofline`).", "",
             markdown(d_header, d_body), ""]
    text += cost_curve_lines(summary) + [""]
    if failures:
        text += [f"## Failures ({len(failures)})", ""] + [
            f"- {f['config']} on {f['task']}/{f['id']}: {f['error']}" for f in failures[:50]] + [""]
    text += ["## Plots", "", "![accuracy vs speed factor](accuracy_vs_speed.png)", "",
             "![tokens per forward](tokens_per_forward.png)", "", "![forwards per block](forwards_per_block.png)", "",
             "## Provenance", "", *provenance_lines(summary), ""]
    write_text_atomic(out_dir / "report.md", "\n".join(text))
    return out_dir / "report.md"


def cmd_report(args) -> int:
    summary, records = load_run(Path(args.run_dir))  # bad records first: nothing is written then
    if args.out:
        prepare_output_folder(Path(args.out), keep=False)
    path = write_report(Path(args.run_dir), Path(args.out) if args.out else None)
    print(markdown(*main_table(summarize(records))))
    print(json.dumps({"report": str(path), "complete": bool(summary.get("complete"))}))
    return 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("report", help="tables (Markdown, CSV) and plots (PNG) of a run folder")
    p.add_argument("run_dir", help="a run folder written by `run`")
    p.add_argument("--out", default=None, help="where to write (default: the run folder)")
    p.set_defaults(func=cmd_report)

