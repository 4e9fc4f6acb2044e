"""Regression check of a run against a baseline run, from record files only (no torch import).

    python -m sbd_bench compare results/baseline runs/ci            # exit 1 on a regression
    python -m sbd_bench compare results/baseline runs/ci --html compare.html   # and both runs on one page

Both runs are cut to the examples they share (a short CI run against a full baseline compares like
with like), then summarised with the same metrics. Per configuration x task it fails when
  nfe, tokens_per_forward  change by more than --nfe-tol / --tpf-tol (relative; default: any change)
  accuracy                 changes by more than --accuracy-tol (absolute fraction; default: any change)
  speed_factor_wall        falls more than --wall-tol below the baseline (relative; default 0.2: timings
                           are noisy, CPUs more so; CI passes a larger one); a ratio of total decode times
  pass_at_k                changes by more than --accuracy-tol, like accuracy (pass@1), with --samples N > 1
  errors                   increase
  ntp_match_rate           is below 1 in a greedy verified configuration or generate baseline (its output
                           must be NTP's) where the baseline's was 1, or at all with --exact; below 1 in both
                           runs without --exact (rounding at near ties, bf16 most) it is a note, not a regression
and when the run has a configuration the baseline lacks (refresh the baseline deliberately, see the
docs/measurement.md). Below the table, every solver family's AUP in both runs (``compare_aup``): a drop
below the baseline's bootstrap interval is reported, not gated (accuracy and tokens per forward are). A row that did not regress improved when a figure moved the better way (accuracy or
pass@k up, NFE down, tokens per forward up, fewer errors: within the tolerances; the wall-clock speed
factor up by more than --wall-tol), else it is unchanged. ``--format markdown`` writes a summary for a CI
job page: the status, then the regressions, the improvements and the unchanged rows, then the notes. Runs with and without --exact are not compared (refused): their timings measure
different kernels. Greedy decoding makes NFE, tokens and accuracy deterministic on one machine; so do sampled
configurations whose samples have the same seeds: NFE, tokens per forward, accuracy and pass@k are gated
only where the two runs hold the same samples (N) with the same seeds (the same --seed), and a note says
where they do not.
Exit status: 0 pass, 1 regression, 2 bad input. The last stdout line is JSON.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from ..types import UsageError
from .metrics import BASELINE_SOLVER, example_key, is_lossless, is_verified, ntp_mismatch_warning, sampling_of, summarize
from .page import COMPARE_TITLE, page_data, page_html
from .records import check_output_file, load_run, starts_with, write_text_atomic
from .traces import TRACES, read_traces
from .yardsticks import family_aups, task_y_max


class CompareError(UsageError):
    """Two runs that cannot be compared; the message says why and what to do."""


EPS = 1e-9  # "any change" still ignores float noise in means of identical integers
# run-wide settings that runs recorded before sampling existed lack: they had these values
SAMPLING_DEFAULTS = {"samples": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 0}


def _rel(base, new) -> float | None:
    if base is None or new is None:
        return None
    if base == 0:
        return 0.0 if new == 0 else float("inf")
    return (new - base) / base


def compare_rows(base_row: dict, run_row: dict, tol: dict, same_draws: bool = True, exact: bool = False) -> list[str]:
    """The reasons this configuration x task regressed (empty when it did not). ``same_draws``: both rows
    hold the same samples with the same seeds, so the figures that depend on the draws compare.
    ``exact``: both runs used --exact, where a verified output that differs from NTP's is a regression."""
    problems = []
    for name, key in (("nfe", "nfe"), ("tokens_per_forward", "tpf")):
        change = _rel(base_row[name], run_row[name])
        if same_draws and change is not None and abs(change) > tol[key] + EPS:
            problems.append(f"{name} {base_row[name]:.3f} -> {run_row[name]:.3f} ({100 * change:+.1f}%)")
    for name, shown in (("accuracy", "accuracy"), ("pass_at_k", f"pass@{run_row.get('pass_k')}")):
        a, b = base_row.get(name), run_row.get(name)
        if same_draws and ((a is None) != (b is None) or (a is not None and abs(b - a) > tol["accuracy"] + EPS)):
            problems.append(f"{shown} {a} -> {b}")
    change = _rel(base_row["speed_factor_wall"], run_row["speed_factor_wall"])
    if change is not None and change < -tol["wall"] - EPS:
        problems.append(f"speed_factor_wall {base_row['speed_factor_wall']:.2f} -> {run_row['speed_factor_wall']:.2f} "
                        f"({100 * change:+.0f}%, tolerance -{100 * tol['wall']:.0f}%)")
    if run_row["errors"] > base_row["errors"]:
        problems.append(f"errors {base_row['errors']} -> {run_row['errors']}")
    if ntp_mismatch(run_row) and (exact or not ntp_mismatch(base_row)):
        problems.append(f"{_lossless_kind(run_row)} output differs from NTP's on {100 * ntp_mismatch(run_row):.1f}% of examples "
                        f"(must be none{'' if exact else ', as in the baseline'})")
    return problems


def improvements(base_row: dict, run_row: dict, tol: dict, same_draws: bool = True) -> list[str]:
    """The figures of a row that moved the better way (read only where ``compare_rows`` found no regression)."""
    better = []
    if same_draws:
        for name, sign in (("nfe", -1), ("tokens_per_forward", 1)):
            change = _rel(base_row[name], run_row[name])
            if change is not None and sign * change > EPS:
                better.append(f"{name} {base_row[name]:.3f} -> {run_row[name]:.3f} ({100 * change:+.1f}%)")
        for name, shown in (("accuracy", "accuracy"), ("pass_at_k", f"pass@{run_row.get('pass_k')}")):
            a, b = base_row.get(name), run_row.get(name)
            if a is not None and b is not None and b - a > EPS:
                better.append(f"{shown} {a} -> {b}")
    change = _rel(base_row["speed_factor_wall"], run_row["speed_factor_wall"])
    if change is not None and change > tol["wall"] + EPS:
        better.append(f"speed_factor_wall {base_row['speed_factor_wall']:.2f} -> {run_row['speed_factor_wall']:.2f} "
                      f"({100 * change:+.0f}%)")
    if run_row["errors"] < base_row["errors"]:
        better.append(f"errors {base_row['errors']} -> {run_row['errors']}")
    return better


def _lossless_kind(row: dict) -> str:
    return "verified" if is_verified(row) else "generate baseline"


def ntp_mismatch(row: dict) -> float:
    """The share of a greedy verified row's (or generate baseline's) examples whose output differs from NTP's
    (0 for other rows; sampled verified output is distributed as NTP's, not equal to it)."""
    match = row.get("ntp_match_rate")
    greedy = not any(sampling_of(row))
    return 1 - match if is_lossless(row) and greedy and match is not None and match < 1 - EPS else 0.0


def compare_aup(base_rows: list[dict], base_records: list[dict], run_rows: list[dict]) -> list[dict]:
    """Per (family, task) of the run: its AUP in both runs with one y_max (the best accuracy on the task in
    either run, so that a change of y_max moves neither); ``dropped`` where the run's falls below the
    baseline's 95% bootstrap interval (beyond the noise of which examples were drawn), ``improvement`` where
    it rises above it. A drop is reported, not a regression of its own: AUP is made of accuracy and tokens
    per forward, which are gated at their tolerances already. Each entry: ``cells`` (``AUP_HEADER``),
    ``status``, ``changes``."""
    best = {t: max(a, task_y_max(run_rows).get(t, 0.0)) for t, a in task_y_max(base_rows).items()}
    best.update({t: v for t, v in task_y_max(run_rows).items() if t not in best})
    base = {(e["family"], e["task"]): e for e in family_aups(base_rows, base_records, best)}
    out = []
    for e in family_aups(run_rows, None, best):
        b = base.get((e["family"], e["task"]))
        if b is None:
            continue  # a family new in the run: its configurations are reported missing from the baseline
        lo, hi = (b["aup_lo"], b["aup_hi"]) if b["aup_lo"] is not None else (b["aup"], b["aup"])
        change = f"AUP {b['aup']:.1f} -> {e['aup']:.1f} (baseline's 95% interval [{lo:.1f}, {hi:.1f}], y_max {e['y_max']:.1f})"
        status = "dropped" if e["aup"] < lo - EPS else "improvement" if e["aup"] > hi + EPS else "unchanged"
        out.append({"cells": [e["family"], e["task"], f"{e['y_max']:.1f}", f"{b['aup']:.1f}", f"[{lo:.1f}, {hi:.1f}]",
                              f"{e['aup']:.1f}", "DROP" if status == "dropped" else "ok"],
                    "status": status, "changes": [change] if status != "unchanged" else []})
    return out


def compare_runs(baseline_dir: Path, run_dir: Path, tol: dict) -> tuple[list[dict], list[str], list[str], list[dict]]:
    """(rows, regressions, notes, families) for a run against a baseline; each row: ``cells`` (a line of
    the table, ``HEADER``), ``status`` (regression, improvement or unchanged) and ``changes`` (why);
    ``families``: ``compare_aup``'s entries (a drop is among ``notes``)."""
    base_summary, base_records = load_run(baseline_dir)
    run_summary, run_records = load_run(run_dir)
    shared = {example_key(r) for r in base_records} & {example_key(r) for r in run_records}
    if not shared:
        raise CompareError(f"{run_dir} and {baseline_dir} share no example (task, id): compare runs of the same tasks")
    changed = _changed_prompts(base_records, run_records, shared)
    if changed:
        raise CompareError(f"{len(changed)} shared example(s) have different prompts in {baseline_dir} and {run_dir} "
                           f"(first: {'/'.join(changed[0])}): the task changed, so nothing compares; refresh the "
                           f"baseline deliberately (docs/measurement.md)")
    pass_k = _pass_k(base_summary, run_summary)
    base_rows = {(r["config"], r["task"]): r for r in summarize((r for r in base_records if example_key(r) in shared),
                                                                pass_k)}
    run_rows = {(r["config"], r["task"]): r for r in summarize((r for r in run_records if example_key(r) in shared),
                                                               pass_k)}
    base_draws, run_draws = _draws(base_records, shared), _draws(run_records, shared)
    exact = _same_exact_setting(baseline_dir, base_summary, run_dir, run_summary)
    notes = _setting_notes(base_summary, run_summary)
    notes += [f"{d} is incomplete: only its finished samples are compared" for d, summary in
              ((baseline_dir, base_summary), (run_dir, run_summary)) if not summary.get("complete")]
    body, regressions = [], []
    for key, row in run_rows.items():
        base = base_rows.get(key)
        if base is None:
            regressions.append(f"{key[0]} on {key[1]}: missing from the baseline {baseline_dir}; refresh the "
                               f"baseline deliberately (docs/measurement.md) or drop it from the run")
            body.append({"cells": [key[0], key[1], "-", _f(row["nfe"]), "-", _f(row["accuracy"]), "-",
                                   _f(row["tokens_per_forward"]), "-", _f(row["speed_factor_wall"]), "MISSING IN BASELINE"],
                         "status": "regression", "changes": ["missing from the baseline"]})
            continue
        same_draws = _same_draws(base, row, base_draws.get(key, {}), run_draws.get(key, {}))
        if not same_draws:
            notes.append(f"{key[0]} on {key[1]}: the runs hold different samples or seeds (--samples, --seed), so its "
                         f"NFE, tokens per forward, accuracy and pass@k are not compared")
        problems = compare_rows(base, row, tol, same_draws, exact)
        regressions += [f"{key[0]} on {key[1]}: {p}" for p in problems]
        if not problems and ntp_mismatch(row):
            notes.append(f"{key[0]} on {key[1]}: {_lossless_kind(row)} output differs from NTP's on {100 * ntp_mismatch(row):.1f}% "
                         f"of examples (baseline {100 * ntp_mismatch(base):.1f}%): rounding at near ties"
                         + ("; --exact removes it" if is_verified(row) else ""))
        better = [] if problems else improvements(base, row, tol, same_draws)
        body.append({"cells": [key[0], key[1], _f(base["nfe"]), _f(row["nfe"]), _f(base["accuracy"]), _f(row["accuracy"]),
                               _f(base["tokens_per_forward"]), _f(row["tokens_per_forward"]),
                               _f(base["speed_factor_wall"]), _f(row["speed_factor_wall"]), "FAIL" if problems else "ok"],
                     "status": "regression" if problems else "improvement" if better else "unchanged",
                     "changes": problems or better})
    for key in sorted({(r["config"], r["task"]) for r in base_records} - run_rows.keys()):
        notes.append(f"{key[0]} on {key[1]} is in the baseline but not in this run (not compared)")
    families = compare_aup(list(base_rows.values()), [r for r in base_records if example_key(r) in shared],
                           list(run_rows.values()))
    notes += [f"{f['cells'][0]} on {f['cells'][1]}: {f['changes'][0]}, beyond noise" for f in families
              if f["status"] == "dropped"]
    return body, regressions, notes, families


def compare_page_data(baseline_dir: Path, run_dir: Path) -> dict:
    """report.html's document for two runs side by side (``compare --html``): both cut to the examples
    they share, each summarised alone (speed factors against its own NTP), every configuration named
    ``CONFIG [RUN]`` with the baseline's row above the run's, the examples showing both runs' outputs."""
    base_summary, base_records = load_run(baseline_dir)
    run_summary, run_records = load_run(run_dir)
    shared = {example_key(r) for r in base_records} & {example_key(r) for r in run_records}
    if not shared:
        raise CompareError(f"{run_dir} and {baseline_dir} share no example (task, id): compare runs of the same tasks")
    labels = (Path(baseline_dir).name, Path(run_dir).name)
    if labels[0] == labels[1]:
        labels = (f"baseline {labels[0]}", f"run {labels[1]}")
    pass_k = _pass_k(base_summary, run_summary)
    rows, records, traces, warnings = [], [], [], []
    for label, folder, summary, found in ((labels[0], baseline_dir, base_summary, base_records),
                                          (labels[1], run_dir, run_summary, run_records)):
        named = [{**r, "config": f"{r['config']} [{label}]"} for r in found if example_key(r) in shared]
        rows += [{**row, "run": label} for row in summarize(named, pass_k)]
        records += named
        traces += [{**t, "config": f"{t['config']} [{label}]"} for t in read_traces(Path(folder) / TRACES)
                   if (t["task"], str(t["id"])) in shared]
        warning = ntp_mismatch_warning(named, exact=bool((summary.get("provenance") or {}).get("exact")))
        warnings += [f"{label}: {warning}"] if warning else []
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    configs = list(dict.fromkeys(r["config"].rsplit(" [", 1)[0] for r in rows))
    configs.sort(key=lambda c: c.split(":")[0] != BASELINE_SOLVER)  # NTP first, then the runs' order
    rows.sort(key=lambda r: (tasks.index(r["task"]), configs.index(r["config"].rsplit(" [", 1)[0]),
                             labels.index(r["run"])))
    data = page_data(f"{labels[1]} against {labels[0]}", run_summary, records, rows, traces)
    data.update(compare=list(labels), warning="; ".join(warnings) or None,
                complete=bool(base_summary.get("complete")) and bool(run_summary.get("complete")))
    return data


def _draws(records: list[dict], shared: set) -> dict[tuple[str, str], dict]:
    """(config, task) -> {(id, sample): seed} over the shared examples (greedy records: sample 0, no seed)."""
    out: dict[tuple[str, str], dict] = {}
    for r in records:
        if example_key(r) in shared:
            out.setdefault((r["config"], r["task"]), {})[(str(r["id"]), int(r.get("sample", 0)))] = r.get("seed")
    return out


def _same_draws(base_row: dict, run_row: dict, base: dict, run: dict) -> bool:
    """Both rows hold N samples per example, and every sample both runs decoded has the same seed."""
    return base_row.get("samples") == run_row.get("samples") and all(base[k] == run[k] for k in base.keys() & run.keys())


def _pass_k(base: dict, run: dict) -> int | None:
    """The k of pass@k both runs are summarised with: the run's --pass-k, else the baseline's, else N."""
    for summary in (run, base):
        k = ((summary.get("provenance") or {}).get("config") or {}).get("pass_k")
        if k:
            return k
    return None


def _same_exact_setting(baseline_dir: Path, base: dict, run_dir: Path, run: dict) -> bool:
    """Whether both runs used --exact; refused when only one did."""
    settings = [bool((s.get("provenance") or {}).get("exact")) for s in (base, run)]
    if settings[0] != settings[1]:
        said = {True: "with --exact", False: "without --exact"}
        raise CompareError(f"{baseline_dir} was decoded {said[settings[0]]} and {run_dir} {said[settings[1]]}: exact "
                           f"and plain runs are different configurations (exact mode's kernels are slower); compare "
                           f"runs of the same setting")
    return settings[0]


def _changed_prompts(base_records, run_records, shared) -> list[tuple[str, str]]:
    """Shared (task, id) keys whose prompt differs (records without ``prompt_hash`` are not checked)."""
    hashes: dict[tuple[str, str], set[str]] = {}
    for r in [*base_records, *run_records]:
        if r.get("prompt_hash") and example_key(r) in shared:
            hashes.setdefault(example_key(r), set()).add(r["prompt_hash"])
    return sorted(k for k, seen in hashes.items() if len(seen) > 1)


def _setting_notes(base: dict, run: dict) -> list[str]:
    notes = []
    bp, rp = base.get("provenance") or {}, run.get("provenance") or {}
    for key in ("model_hash", "device_name", "dtype", "torch", "transformers"):
        if bp.get(key) != rp.get(key):
            notes.append(f"{key} differs: baseline {bp.get(key)!r}, run {rp.get(key)!r}")
    bc, rc = bp.get("config") or {}, rp.get("config") or {}
    for key in ("block_size", "max_new_tokens", "seed", *SAMPLING_DEFAULTS):
        before, now = (bc.get(key, SAMPLING_DEFAULTS.get(key)), rc.get(key, SAMPLING_DEFAULTS.get(key)))
        if before != now:
            notes.append(f"setting {key} differs: baseline {before!r}, run {now!r}")
    return notes


def _f(value) -> str:
    return "-" if value is None else f"{value:.3f}"


HEADER = ["config", "task", "nfe base", "nfe run", "acc base", "acc run", "tok/fwd base", "tok/fwd run",
          "wall x base", "wall x run", "status"]
AUP_HEADER = ["family", "task", "y_max", "AUP base", "base 95% CI", "AUP run", "status"]
TABLE_START = "| " + " | ".join(HEADER[:2]) + " |"  # how compare knows an --out file it wrote before
SUMMARY_TITLE = "## sbd_bench compare: "  # the same, for --format markdown


def table(rows: list[dict], with_changes: bool = False, header: list[str] = HEADER) -> str:
    header = header[:-1] + ["what changed"] if with_changes else header
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = row["cells"][:-1] + ["; ".join(row["changes"])] if with_changes else row["cells"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def aup_table(families: list[dict], with_changes: bool = False) -> str:
    return table(families, with_changes, AUP_HEADER)


AUP_NOTE = ("AUP per solver family, both runs with one y_max per task (the best accuracy in either); DROP: the run's "
            "AUP is below the baseline's 95% bootstrap interval over examples, beyond noise (reported, and gated only "
            "through accuracy and tokens per forward; docs/measurement.md).")


def summary_markdown(rows: list[dict], regressions: list[str], notes: list[str], baseline: Path, run: Path,
                     tol: dict, families: list[dict] | None = None) -> str:
    """The comparison as a CI job summary: status, regressions, improvements, unchanged rows (folded), the
    AUP of every family, notes."""
    families = families or []
    groups = {status: [r for r in rows if r["status"] == status] for status in ("regression", "improvement", "unchanged")}
    dropped = [f for f in families if f["status"] == "dropped"]
    status = f"FAIL, {len(groups['regression'])} row(s) regressed" if regressions else "pass"
    lines = [f"{SUMMARY_TITLE}{status}", "",
             f"`{run}` against the baseline `{baseline}`: {len(rows)} configuration x task row(s) compared; tolerances: "
             f"NFE {100 * tol['nfe']:g}%, tokens per forward {100 * tol['tpf']:g}%, accuracy {tol['accuracy']:g}, "
             f"wall-clock speed factor -{100 * tol['wall']:g}%.", ""]
    for status, title in (("regression", "Regressions"), ("improvement", "Improvements")):
        lines += [f"### {title} ({len(groups[status])})", ""]
        lines += [table(groups[status], with_changes=True), ""] if groups[status] else ["None.", ""]
    lines += [f"### Unchanged ({len(groups['unchanged'])})", ""]
    if groups["unchanged"]:
        lines += [f"<details><summary>{len(groups['unchanged'])} row(s)</summary>", "", table(groups["unchanged"]), "",
                  "</details>", ""]
    else:
        lines += ["None.", ""]
    if families:
        lines += [f"### AUP per solver family ({len(dropped)} dropped)", "", AUP_NOTE, "",
                  aup_table(families, with_changes=True), ""]
    findings = [r for r in regressions if not any(r.startswith(f"{row['cells'][0]} on {row['cells'][1]}: ")
                                                  for row in groups["regression"])]
    if notes or findings:
        lines += ["### Notes", "", *(f"- {line}" for line in findings + notes), ""]
    return "\n".join(lines)


def cmd_compare(args) -> int:
    tol = {"nfe": args.nfe_tol, "tpf": args.tpf_tol, "accuracy": args.accuracy_tol, "wall": args.wall_tol}
    for name, value in tol.items():
        if not (math.isfinite(value) and value >= 0):  # nan compares false with everything: it would turn a check off
            raise UsageError(f"--{name}-tol must be a number >= 0 (got {value}); 0 means any change fails")
    if tol["accuracy"] > 1:  # an absolute change of a fraction: 5 would accept every change
        raise UsageError(f"--accuracy-tol is an absolute change of accuracy, from 0 to 1 (got {tol['accuracy']}): "
                         f"for {tol['accuracy']:g} points write --accuracy-tol {tol['accuracy'] / 100:g}")
    if args.out:  # a comparison written before may be replaced; a run's records or any other file may not
        check_output_file(Path(args.out), "compare.md", lambda path: starts_with(path, TABLE_START)
                          or starts_with(path, SUMMARY_TITLE), "compare")
    if args.html:  # the same for the page: one `compare --html` wrote, or a new file
        check_output_file(Path(args.html), "compare.html", _is_compare_page, "compare", flag="--html")
    rows, regressions, notes, families = compare_runs(Path(args.baseline), Path(args.run), tol)
    if args.html:
        text = page_html(compare_page_data(Path(args.baseline), Path(args.run)))
        Path(args.html).parent.mkdir(parents=True, exist_ok=True)  # the check above probed it and left nothing
        write_text_atomic(Path(args.html), text)
    if args.format == "markdown":
        text = summary_markdown(rows, regressions, notes, Path(args.baseline), Path(args.run), tol, families)
        written = text
    else:
        text = table(rows) + (f"\n\n{AUP_NOTE}\n\n{aup_table(families)}" if families else "")
        written = text + "\n" + "".join(f"\n- {r}" for r in regressions + notes)
    if args.out:  # before stdout, whose reader may be gone (`compare ... --out F | head -1`)
        write_text_atomic(Path(args.out), written.rstrip("\n") + "\n")
    print(text)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    for line in regressions:
        print(f"REGRESSION: {line}", file=sys.stderr)
    status = "fail" if regressions else "pass"
    print(json.dumps({"status": status, "regressions": len(regressions), "compared": len(rows),
                      "aup_compared": len(families), "aup_dropped": sum(f["status"] == "dropped" for f in families),
                      **({"page": str(args.html)} if args.html else {})}))
    return 1 if regressions else 0


def _is_compare_page(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return COMPARE_TITLE.encode() in handle.read(4096)
    except OSError:
        return False


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare a run with a baseline run; exit 1 on a regression")
    p.add_argument("baseline", help="baseline run folder (e.g. results/baseline)")
    p.add_argument("run", help="run folder to check")
    p.add_argument("--nfe-tol", type=float, default=0.0, help="allowed relative change of mean NFE (default 0)")
    p.add_argument("--tpf-tol", type=float, default=0.0, help="allowed relative change of tokens per forward (default 0)")
    p.add_argument("--accuracy-tol", type=float, default=0.0, help="allowed absolute change of accuracy, 0..1 (default 0)")
    p.add_argument("--wall-tol", type=float, default=0.2,
                   help="allowed relative drop of the wall-clock speed factor (default 0.2; CI uses 0.5)")
    p.add_argument("--out", default=None, help="also write the table and findings to this Markdown file")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="also write a page like report.html with both runs side by side (each configuration as "
                        "CONFIG [RUN], both runs' outputs per example), e.g. --html compare.html")
    p.add_argument("--format", choices=("table", "markdown"), default="table",
                   help="table: one Markdown table in the run's order (default); markdown: a summary for a CI job page "
                        "(status, regressions, improvements, unchanged rows, notes), e.g. >> $GITHUB_STEP_SUMMARY")
    p.set_defaults(func=cmd_compare)
