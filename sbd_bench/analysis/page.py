"""report.html: one self-contained page per run, built from its records alone (no torch, no core).

    python -m sbd_bench report runs/x        # writes report.html beside report.md (so does every `run`)

The page opens from disk with no network: the run's figures are embedded as one JSON document, and
the page's script and style (``page_assets/report.js``, ``report.css``, hand-written, no library) are
inlined when it is written. What it shows: the cross-task summary (report.md's main table, a one-line
``headline``), then per task the leaderboard (every figure of ``columns.COLUMNS``, by report.md's names
and in its strings, sortable, 95% intervals), accuracy against the NFE or wall-clock speed factor with the
intervals as whiskers and the Pareto front (``formats.pareto_front``), and the examples: prompt, every sample's
output beside NTP's with the differences marked, the verdicts, and where a trace exists
(``traces.jsonl``, ``traces.py``) the decoding played forward by forward. ``compare --html`` builds the
same document from two runs (``compare.compare_page_data``).

Size: outputs are embedded in full up to ``OUTPUT_BUDGET`` characters, the first examples of every task
first; past it an example shows its verdicts and forward counts only (traced examples are always in
full). The page lists examples ``EXAMPLES_PER_PAGE`` at a time.
"""
from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path

from .metrics import BASELINE_SOLVER, is_verified, no_baseline_note, ntp_mismatch_warning, sampling_of
from .records import write_text_atomic
from ..types import SAMPLING_KEYS
from .columns import Column, shown
from .formats import LENGTH_FOOTNOTE, _pct, _x, length_mark, pareto_front, sampled_rows
from .traces import trace_key, trace_problems

PAGE = "report.html"
OUTPUT_BUDGET = 2_000_000  # characters of output text embedded, past which only traced examples get theirs
EXAMPLES_PER_PAGE = 20
LINKED = ("table.csv", "rows.csv")  # written by `report` before the page, linked from it where present
SETTINGS = ("tasks", "solvers", "block_size", "max_new_tokens", "limit", "seed", "repeats", "samples", "temperature",
            "top_p", "top_k", "batch_size", "exact")
PROVENANCE = ("command", "model_path", "model_hash", "git_commit", "git_dirty", "device", "device_name", "dtype",
              "attn_implementation", "threads", "torch", "transformers", "started")


def columns_of(rows: list[dict]) -> list[Column]:
    """The leaderboard's columns, every one of columns.COLUMNS: pass@k only where some configuration has several
    samples per example."""
    return shown(sampled_rows(rows))


def _config(row: dict, names: list[str], rows: list[dict]) -> dict:
    sampling = {k: v for k, v in zip(SAMPLING_KEYS, sampling_of(row)) if v is not None}
    base = next((r["config"] for r in rows if r["solver"] == BASELINE_SOLVER and sampling_of(r) == sampling_of(row)
                 and r.get("run") == row.get("run")), None)  # run: on a compare page, each run's own NTP
    return {"name": row["config"], "solver": row["solver"], "ntp": row["solver"] == BASELINE_SOLVER,
            "verified": is_verified(row), "sampled": bool(sampling) or (row.get("samples") or 1) > 1,
            "sampling": ", ".join(f"{k}={v}" for k, v in sampling.items()), "samples": row.get("samples") or 1,
            "base": names.index(base) if base in names else None}


def _row(row: dict, tasks: list[str], names: list[str], columns: list[Column]) -> dict:
    """One leaderboard row: per column its value and text, and where the column has a 95% interval its
    bounds (``bounds[key] = [lo, hi]``, what the plot's whiskers are drawn from) and their text."""
    values, texts, intervals, bounds = {}, {}, {}, {}
    for c in columns:
        values[c.key], texts[c.key] = row.get(c.key), c.value_text(row)
        if c.interval_text(row):
            bounds[c.key] = [row[c.interval[0]], row[c.interval[1]]]
            intervals[c.key] = c.interval_text(row)
    return {"task": tasks.index(row["task"]), "config": names.index(row["config"]), "values": values, "texts": texts,
            "intervals": intervals, "bounds": bounds, "length_differs": bool(row.get("tokens_differ_from_ntp"))}


def _matrix(rows: list[dict], tasks: list[str], names: list[str]) -> list[list]:
    """The cross-task summary, report.md's main table: per configuration [index, cell per task], each cell
    "accuracy / NFE speed factor" as report.main_table writes it ("" where the task lacks it)."""
    cell = {(r["config"], r["task"]): r for r in rows}
    return [[i, *["" if (name, task) not in cell else
                  f"{_pct(cell[name, task]['accuracy'])} / {_x(cell[name, task]['speed_factor_nfe'])}"
                  f"{length_mark(cell[name, task])}" for task in tasks]] for i, name in enumerate(names)]


def headline(rows: list[dict], tasks: list[str]) -> str:
    """One line of who wins where: per task, the configuration with the largest NFE speed factor among
    those whose accuracy is at least NTP's at the same sampling settings (means over the same examples,
    no interval), or that none is."""
    parts = []
    for task in tasks:
        here = [r for r in rows if r["task"] == task]
        # NTP per sampling settings (and per run on a compare page): what each configuration is held to
        ntp = {(r.get("run"), sampling_of(r)): r for r in here if r["solver"] == BASELINE_SOLVER and r["accuracy"] is not None}
        if not ntp:
            continue
        keep = [r for r in here if r["solver"] != BASELINE_SOLVER and (r.get("run"), sampling_of(r)) in ntp
                and r["accuracy"] is not None and r["speed_factor_nfe"] is not None
                and r["accuracy"] >= ntp[r.get("run"), sampling_of(r)]["accuracy"] - 1e-9]
        if keep:
            best = max(r["speed_factor_nfe"] for r in keep)
            ties = [r["config"] for r in keep if r["speed_factor_nfe"] >= best - 1e-9]
            parts.append(f"{task} {_x(best)} {ties[0]}" + (f" (+{len(ties) - 1} tied)" if len(ties) > 1 else ""))
        else:
            parts.append(f"{task}: none keeps NTP's accuracy")
    if not parts:
        return ""
    return "Fastest (NFE speed factor) at NTP's accuracy or above: " + "; ".join(parts) + "."


def _fronts(rows: list[dict], tasks: list[str]) -> dict[str, dict[str, list[str]]]:
    """Per speed factor (NFE, wall) and task, the configurations on the Pareto front."""
    fronts: dict[str, dict[str, list[str]]] = {}
    for kind in ("nfe", "wall"):
        fronts[kind] = {}
        for task in tasks:
            points = {r["config"]: (r[f"speed_factor_{kind}"], r["accuracy"]) for r in rows
                      if r["task"] == task and r["accuracy"] is not None and r[f"speed_factor_{kind}"] is not None}
            front = set(pareto_front(list(points.values())))
            fronts[kind][task] = [c for c, p in points.items() if p in front]
    return fronts


def _examples(records: list[dict], tasks: list[str], names: list[str], traced: set) -> tuple[dict, int]:
    """Per task, its examples in the run's order: prompt, reference answer, and per configuration the
    list of its samples (one for a greedy run), each [sample, correct, nfe, tokens, output text or None,
    error or None], of the first repeat (repeats time the same decode again: same output, same verdict).
    Output text within ``OUTPUT_BUDGET`` (traced examples always)."""
    examples: dict[tuple, dict] = {}
    column = {name: i for i, name in enumerate(names)}
    for r in records:
        key = (r["task"], str(r["id"]))
        ex = examples.setdefault(key, {"id": str(r["id"]), "prompt": None, "answer": None,
                                       "cells": [None] * len(names), "texts": []})
        ex["prompt"] = ex["prompt"] or r.get("prompt")
        ex["answer"] = ex["answer"] if ex["answer"] is not None else r.get("answer")
        if r.get("repeat", 0) != 0:
            continue
        i = column[r["config"]]
        sample = [int(r.get("sample", 0)), r.get("correct"), r["nfe"], r["tokens"], None, r.get("error")]
        if ex["cells"][i] is None:
            ex["cells"][i] = []
        ex["cells"][i].append(sample)
        ex["texts"].append((sample, r.get("output_text") or ""))
    for ex in examples.values():
        for cell in ex["cells"]:
            if cell:
                cell.sort(key=lambda sample: sample[0])
    by_task = {task: [ex for (t, _), ex in examples.items() if t == task] for task in tasks}
    order = []  # round robin over the tasks: each task's first examples come first
    for rank in range(max(map(len, by_task.values()), default=0)):
        order += [exs[rank] for exs in by_task.values() if rank < len(exs)]
    used, omitted = 0, 0
    for task in tasks:
        for ex in by_task[task]:
            ex["traced"] = (task, ex["id"]) in traced
    for ex in order:
        size = sum(len(text) for _, text in ex["texts"]) + len(ex["prompt"] or "")
        keep = ex["traced"] or used + size <= OUTPUT_BUDGET
        used += size if keep else 0
        omitted += not keep
        for sample, text in ex.pop("texts"):
            sample[4] = text if keep else None
        ex["full"] = keep
        if not keep:
            ex["prompt"] = None
    return by_task, omitted


def _traces(traces: list[dict], records: list[dict], names: list[str]) -> tuple[list[dict], dict[str, str]]:
    """The traces of recorded samples, each with its problems against its record (``trace_problems``), and
    one map of token pieces for all of them."""
    by_key = {(r["config"], r["task"], str(r["id"]), int(r.get("sample", 0)), int(r.get("repeat", 0))): r
              for r in records}
    out, pieces = [], {}
    for trace in traces:
        record = by_key.get(trace_key(trace))
        if record is None or trace["config"] not in names:
            continue  # a trace of a sample the records do not hold: nothing to show it beside
        pieces.update(trace["pieces"])
        out.append({"task": trace["task"], "id": str(trace["id"]), "config": names.index(trace["config"]),
                    "sample": trace.get("sample", 0), "block_size": trace["block_size"],
                    "forwards": trace["forwards"], "problems": trace_problems(trace, record)})
    return out, pieces


def page_data(run_name: str, summary: dict, records: list[dict], rows: list[dict], traces: list[dict],
              links: tuple[str, ...] = ()) -> dict:
    """Everything the page shows, as one JSON-able document. ``rows``: the report's ordered summary rows;
    ``links``: files beside the page that it links to (table.csv, rows.csv)."""
    provenance = summary.get("provenance") or {}
    settings = provenance.get("config") or {}
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    names = list(dict.fromkeys(r["config"] for r in rows))
    first = {}
    for r in rows:
        first.setdefault(r["config"], r)
    sampled = sampled_rows(rows)
    columns = columns_of(rows)
    shown_traces, pieces = _traces(traces, records, names)
    examples, omitted = _examples(records, tasks, names, {(t["task"], t["id"]) for t in shown_traces})
    return {
        "run": run_name, "complete": bool(summary.get("complete")), "resume_command": summary.get("resume_command"),
        "provenance": [[k, provenance[k]] for k in PROVENANCE if provenance.get(k) is not None],
        "settings": [[k, settings[k]] for k in SETTINGS if settings.get(k) is not None],
        "failures": len(summary.get("failures") or []),
        "warning": ntp_mismatch_warning(records, exact=bool(provenance.get("exact"))),
        "note": no_baseline_note(summary, rows),
        "length_note": LENGTH_FOOTNOTE,
        "tasks": tasks,
        "configs": [_config(first[name], names, rows) for name in names],
        "columns": [{"key": c.key, "label": c.name(sampled), "title": c.title, "marked": c.marked} for c in columns],
        "rows": [_row(r, tasks, names, columns) for r in rows],
        "fronts": _fronts(rows, tasks),
        "matrix": _matrix(rows, tasks, names), "headline": headline(rows, tasks), "links": list(links),
        "examples": examples, "omitted": omitted, "output_budget": OUTPUT_BUDGET,
        "per_page": EXAMPLES_PER_PAGE,
        "traces": shown_traces, "pieces": pieces,
    }


def _asset(name: str) -> str:
    return (resources.files(__package__) / "page_assets" / name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """Text that cannot end the <script> element it sits in: '</' becomes '<\\/' (the same string in
    JSON and in JavaScript)."""
    return text.replace("</", "<\\/")


COMPARE_TITLE = "<title>sbd_bench compare: "  # how `compare --html` knows a page it wrote before


def page_html(data: dict) -> str:
    title = html.escape(f"sbd_bench {'compare' if data.get('compare') else 'report'}: {data['run']}")
    payload = _script_safe(json.dumps(data, allow_nan=False, separators=(",", ":"), ensure_ascii=False))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        # no request may leave the file: everything below is inline, and the policy refuses the rest
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        'style-src \'unsafe-inline\'; script-src \'unsafe-inline\'; img-src data:">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{title}</title>",
        f"<style>\n{_asset('report.css')}</style>", "</head>", "<body>",
        f'<header><h1>{title}</h1><div id="banner"></div><details id="provenance"></details></header>',
        '<section id="summary"><h2>Summary: accuracy % / NFE speed factor, every task</h2><p id="headline"></p>'
        '<div class="scroll"><table id="matrix"></table></div><p id="summary-links" class="hint"></p></section>',
        '<nav id="tasks" role="tablist" aria-label="task"></nav>',
        '<main id="task-panel" role="tabpanel">',
        '<section id="leaderboard"><h2>Leaderboard</h2><p class="hint">Click a header to sort; 95% intervals in '
        'brackets. <span class="badge ntp">NTP</span> the baseline every speed factor is relative to, '
        '<span class="badge verified">verified</span> output = NTP\'s (<code>verify=on</code>), '
        '<span class="badge sampled">sampled</span> decoded at a temperature or several samples per example.</p>'
        '<div class="scroll"><table id="board"></table></div><p id="board-note" class="hint"></p></section>',
        '<section id="plot"><h2>Accuracy against speed factor</h2><div class="switch" role="group" '
        'aria-label="speed factor"><button type="button" data-speed="nfe">NFE</button><button type="button" '
        'data-speed="wall">wall-clock (decode)</button></div><div id="plot-area"></div>'
        '<div id="tooltip" role="tooltip" hidden></div></section>',
        '<section id="examples"><h2>Examples</h2><div id="example-controls"></div><div id="example-list"></div>'
        '</section>',
        "</main>",
        "<noscript>This page draws its tables with JavaScript; report.md beside it holds the same tables.</noscript>",
        f'<script type="application/json" id="report-data">{payload}</script>',
        f"<script>\n{_script_safe(_asset('report.js'))}</script>",
        "</body>", "</html>", ""])


def write_page(out_dir: Path, run_name: str, summary: dict, records: list[dict], rows: list[dict],
               traces: list[dict]) -> Path:
    """Write report.html into ``out_dir`` (atomically), linking the CSV tables already beside it; returns its path."""
    path = Path(out_dir) / PAGE
    links = tuple(name for name in LINKED if (Path(out_dir) / name).is_file())
    write_text_atomic(path, page_html(page_data(run_name, summary, records, rows, traces, links)))
    return path
