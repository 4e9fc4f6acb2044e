"""`tune`'s reading side: from the records of a tune folder, which settings of each solver are certified
(Learn then Test, ``ltt.py``), the pick per task and solver, the held-out check, and the files
``tune.json``, ``tune.md`` and ``tune.png``. Records only: no torch, no model.

    >>> state = read_tune(Path("runs/tune"))               # tune.json
    >>> [(r["task"], r["pick"]) for r in state["results"]]
    >>> expand_tuned("@runs/tune")                         # the picks as a --solver spec for `run`

A tune folder holds (the runner writes the runs, this module the rest):
  tune.json          settings, the split (example ids per part and task), the solver families, and per
                     task x family the tested order, each setting's calibration losses and p-value, the
                     certified count, the pick and its held-out figures
  calibration/       a run folder: NTP and every setting on each task's ordering + calibration examples
  held_out/TASK/     a run folder per task with a pick: NTP and that task's picks on its held-out examples
  tune.md            the picks, then every setting's calibration figures
  tune.png           calibration risk and speed against the swept parameter, per task and solver

The loss of an example is 1 when NTP's output is right and the setting's is wrong (a failed decode of
the setting is wrong; a failed or unjudged NTP decode counts as right: the loss is never understated).
Its mean, the risk, bounds the accuracy loss against NTP: acc(NTP) - acc(setting) = P(NTP right,
setting wrong) - P(NTP wrong, setting right) <= risk.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from pathlib import Path
from statistics import mean

from ..types import UsageError
from .ltt import binomial_p_value, certified_prefix, choose
from .metrics import BASELINE_SOLVER, collapse_repeats, pairing_key, summarize, wilson_ci
from .records import write_atomic, write_json_atomic, write_text_atomic
from .report import markdown

TUNE_FILE, TABLE_FILE, PLOT_FILE = "tune.json", "tune.md", "tune.png"
CALIBRATION, HELD_OUT = "calibration", "held_out"
PARTS = ("order", "calibration", "held_out")  # the split of each task's examples, in this order
TUNE_SCHEMA_VERSION = 1


class TuneFolderError(UsageError):
    """A tune folder that cannot be read or used; the message says what to do."""


# ------------------------------------------------------------------------------------------- the split
def split_examples(ids: list[str], task: str, seed: int, sizes: dict[str, int]) -> dict[str, list[str]]:
    """The ids of each part (``PARTS``), ``sizes[part]`` of them: the examples ranked by a hash of
    (seed, task, id), the first ``sizes["order"]`` ordering, the next calibrating, the next held out.
    Depends on the ids only (not on their order in the task, nor on the model), so it is the same on
    every machine; within a part, ids keep the task's order."""
    def rank(example_id: str) -> bytes:
        return hashlib.sha256(json.dumps(["tune-split", seed, task, str(example_id)]).encode()).digest()

    ranked = sorted(map(str, ids), key=rank)
    where, parts = 0, {}
    for part in PARTS:
        chosen = set(ranked[where: where + sizes[part]])
        parts[part] = [str(i) for i in ids if str(i) in chosen]
        where += sizes[part]
    return parts


def config_spec(name: str, params: dict) -> str:
    """The ``--solver`` spec of one configuration (``name:key=value;...``), which parses back to it: a
    label (``name:key=value,...``) does not, its commas being a sweep in a spec."""
    if not params:
        return name
    return name + ":" + ";".join(f"{key}={value}" for key, value in params.items())


# ------------------------------------------------------------------------------------------- losses
def example_losses(records: list[dict], task: str, ids: list[str]) -> dict[str, dict[str, int]]:
    """config -> {example id: loss} over ``ids`` of ``task``, each record paired with NTP's of the same
    example and sampling settings (see the module docstring for the loss)."""
    wanted = set(map(str, ids))
    samples = [r for r in collapse_repeats(records) if r["task"] == task and str(r["id"]) in wanted]
    ntp = {pairing_key(r): r for r in samples if r["solver"] == BASELINE_SOLVER}
    losses: dict[str, dict[str, int]] = defaultdict(dict)
    for r in samples:
        if r["solver"] == BASELINE_SOLVER:
            continue
        base = ntp.get(pairing_key(r))
        ntp_right = base is None or base.get("correct") is not False
        right = not r.get("error") and r.get("correct") is True
        losses[r["config"]][str(r["id"])] = int(ntp_right and not right)
    return losses


def count_losses(losses: dict[str, int], ids: list[str]) -> int:
    """Losses over ``ids``; an example without a record counts as lost (never understated)."""
    return sum(losses.get(str(i), 1) for i in ids)


def _rows(records: list[dict], task: str, ids: list[str]) -> dict[str, dict]:
    wanted = set(map(str, ids))
    return {r["config"]: r for r in summarize([r for r in records if r["task"] == task and str(r["id"]) in wanted])}


def _mean_nfe(records: list[dict], task: str, ids: list[str]) -> dict[str, float]:
    wanted, nfe = set(map(str, ids)), defaultdict(list)
    for r in collapse_repeats(records):
        if r["task"] == task and str(r["id"]) in wanted and not r.get("error"):
            nfe[r["config"]].append(r["nfe"])
    return {config: mean(values) for config, values in nfe.items()}


# --------------------------------------------------------------------------------------- certifying
def certify(state: dict, records: list[dict]) -> list[dict]:
    """Per task x family: the tested order, each setting's calibration figures and p-value, the
    certified prefix and the pick (the certified setting with the fewest mean forwards). ``records``:
    the calibration run's."""
    eps, delta = state["max_loss"], state["delta"]
    results = []
    for task in state["tasks"]:
        split = state["splits"][task]
        calibration = split["calibration"]
        losses = example_losses(records, task, calibration)
        rows = _rows(records, task, calibration)
        order_nfe = _mean_nfe(records, task, split["order"])
        for family in state["families"]:
            configs = family["configs"]
            tested = configs
            if split["order"]:  # most forwards first; a tie keeps the spec's order (sorted is stable)
                tested = sorted(configs, key=lambda c: -order_nfe.get(c, -math.inf))
            settings = []
            for config in tested:
                k, n = count_losses(losses.get(config, {}), calibration), len(calibration)
                row = rows.get(config, {})
                settings.append({"config": config, "value": family["values"][configs.index(config)],
                                 "order_nfe": order_nfe.get(config), "n": n, "losses": k, "risk": k / n,
                                 "p_value": binomial_p_value(k, n, eps), "nfe": row.get("nfe"),
                                 "speed_factor_nfe": row.get("speed_factor_nfe"), "accuracy": row.get("accuracy")})
            p = [s["p_value"] for s in settings]
            count = certified_prefix(p, delta)
            chosen = choose(p, [math.inf if s["nfe"] is None else s["nfe"] for s in settings], delta)
            for i, s in enumerate(settings):
                s["certified"] = i < count
            pick = settings[chosen] if chosen >= 0 else None
            first = settings[0]
            results.append({
                "task": task, "family": family["family"], "solver": family["solver"], "swept": family["swept"],
                "ordered_by": (f"mean NFE on {len(split['order'])} ordering examples, most first" if split["order"]
                               else "the order given in --solver"),
                "settings": settings, "certified": count,
                "pick": pick["config"] if pick else None,
                "pick_spec": family["specs"][configs.index(pick["config"])] if pick else None,
                "pick_value": pick["value"] if pick else None,
                "p_value": pick["p_value"] if pick else None,
                "not_certified": None if pick else (
                    f"no setting certified: the first tested, {family['swept']}={first['value']}, lost "
                    f"{first['losses']} of {first['n']} calibration examples (p = {first['p_value']:.3g} > "
                    f"delta = {delta})"),
                "held_out": None})
    return results


def ntp_accuracy(records: list[dict], task: str, ids: list[str]) -> float | None:
    row = next((r for r in _rows(records, task, ids).values() if r["solver"] == BASELINE_SOLVER), None)
    return row["accuracy"] if row else None


def add_held_out(state: dict, held_out: dict[str, list[dict]]) -> None:
    """Fill each pick's ``held_out`` figures from its task's held-out records (``held_out``: task ->
    records): the loss count and rate with a 95% Wilson interval, accuracy beside NTP's, speed factors."""
    for result in state["results"]:
        records = held_out.get(result["task"])
        if not result["pick"] or records is None:
            continue
        ids = state["splits"][result["task"]]["held_out"]
        losses = example_losses(records, result["task"], ids).get(result["pick"], {})
        k, n = count_losses(losses, ids), len(ids)
        lo, hi = wilson_ci(k, n)
        rows = _rows(records, result["task"], ids)
        row = rows.get(result["pick"], {})
        result["held_out"] = {
            "n": n, "losses": k, "risk": k / n, "risk_lo": lo, "risk_hi": hi,
            "within_max_loss": k / n <= state["max_loss"],
            "accuracy": row.get("accuracy"), "ntp_accuracy": ntp_accuracy(records, result["task"], ids),
            "nfe": row.get("nfe"),
            **{key: row.get(key) for key in ("speed_factor_nfe", "speed_factor_nfe_lo", "speed_factor_nfe_hi",
                                             "speed_factor_wall", "speed_factor_wall_lo", "speed_factor_wall_hi")}}


# -------------------------------------------------------------------------------------- the folder
def read_tune(folder: Path) -> dict:
    """tune.json of a tune folder, checked enough to use; one clear error otherwise."""
    folder = Path(folder)
    path = folder / TUNE_FILE
    if not path.is_file():
        raise TuneFolderError(f"{folder} holds no {TUNE_FILE}: it is not a tune folder (make one with "
                              f"`python -m sbd_bench tune --out {folder} ...`)")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TuneFolderError(f"{path} is not valid JSON: the tune folder is damaged; run the tune again "
                              f"into a new folder") from None
    if not isinstance(state, dict) or state.get("schema_version") != TUNE_SCHEMA_VERSION:
        raise TuneFolderError(f"{path} is not a tune file of schema version {TUNE_SCHEMA_VERSION}: run the tune "
                              f"again with this sbd_bench")
    return state


PROVENANCE_KEYS = ("git_commit", "git_dirty", "model_path", "model_hash", "device", "device_name", "cpu", "dtype",
                   "threads", "exact", "python", "torch", "transformers", "started")


def calibration_provenance(folder: Path) -> dict:
    """What decoded the calibration run (its summary's provenance, the figures that identify it), so that
    tune.json alone says which model and code its certificate is about."""
    from .records import read_summary

    provenance = read_summary(Path(folder) / CALIBRATION).get("provenance") or {}
    return {key: provenance.get(key) for key in PROVENANCE_KEYS}


def expand_tuned(spec: str) -> str:
    """``spec`` with each ``@TUNE_DIR`` part (``+``-separated) replaced by the settings that tune picked
    there (every task's picks), and each ``@TUNE_DIR:TASK`` by that task's."""
    parts = []
    for part in spec.split("+"):
        if not part.strip().startswith("@"):
            parts.append(part)
            continue
        target = part.strip()[1:]
        folder, task = Path(target), None
        if not (folder / TUNE_FILE).is_file() and ":" in target:
            head, _, task = target.rpartition(":")
            folder = Path(head)
        state = read_tune(folder)
        results = state.get("results") or []
        if not results:
            raise TuneFolderError(f"{folder} has no picks yet (its calibration did not finish): finish it with "
                                  f"`python -m sbd_bench tune --resume {folder}`")
        if task is not None and task not in state["tasks"]:
            raise TuneFolderError(f"{folder} tuned no task '{task}' (its tasks: {', '.join(state['tasks'])})")
        picks = [r["pick_spec"] for r in results if r["pick_spec"] and task in (None, r["task"])]
        if not picks:
            raise TuneFolderError(f"{folder} certified no setting{f' on {task}' if task else ''}: there is nothing "
                                  f"to run (see {folder / TABLE_FILE})")
        parts += list(dict.fromkeys(picks))
    return "+".join(parts)


def write_tune(folder: Path, state: dict, plot: bool = True) -> None:
    """tune.json, and once there are results, tune.md and (with ``plot``) tune.png, each written atomically."""
    folder = Path(folder)
    write_json_atomic(folder / TUNE_FILE, state)
    if state.get("results"):
        write_text_atomic(folder / TABLE_FILE, table_text(state, _calibration_yardsticks(folder)))
        if plot:
            plot_tune(state, folder / PLOT_FILE)


# ------------------------------------------------------------------------------------------- tables
def _pct(value, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def held_out_cell(held: dict | None) -> str:
    if not held:
        return "-"
    return (f"{held['losses']}/{held['n']} = {_pct(held['risk'])}% [{_pct(held['risk_lo'])}, "
            f"{_pct(held['risk_hi'])}]")


def picks_table(state: dict) -> tuple[list[str], list[list[str]]]:
    """One row per task x solver: the pick, its certificate, the held-out check and its speed factors."""
    header = ["task", "solver", "setting", "certified", "calibration loss", "held-out loss % [95%]",
              "accuracy % (NTP)", "speed NFE", "speed wall"]
    body = []
    for r in state["results"]:
        held = r["held_out"] or {}
        if not r["pick"]:
            body.append([r["task"], r["family"], "none certified", f"0 of {len(r['settings'])}", "-", "-", "-", "-",
                         "-"])
            continue
        pick = next(s for s in r["settings"] if s["config"] == r["pick"])
        accuracy = (f"{_pct(held.get('accuracy'))} ({_pct(held.get('ntp_accuracy'))})" if held else "-")
        body.append([r["task"], r["family"], f"{r['swept']}={r['pick_value']}",
                     f"{r['certified']} of {len(r['settings'])}, p = {r['p_value']:.3g}",
                     f"{pick['losses']}/{pick['n']}", held_out_cell(r["held_out"]), accuracy,
                     _x(held.get("speed_factor_nfe")), _x(held.get("speed_factor_wall"))])
    return header, body


def side_by_side(state: dict) -> tuple[list[str], list[list[str]]]:
    """Each solver at its pick, one column per task: the setting, its held-out loss and NFE speed factor
    (the comparison at matched accuracy loss that defaults cannot give)."""
    tasks = state["tasks"]
    cell = {(r["family"], r["task"]): r for r in state["results"]}
    body = []
    for family in dict.fromkeys(r["family"] for r in state["results"]):
        line = [family]
        for task in tasks:
            r = cell[(family, task)]
            held = r["held_out"] or {}
            line.append("none certified" if not r["pick"] else
                        f"{r['swept']}={r['pick_value']}: {_pct(held.get('risk'))}% / {_x(held.get('speed_factor_nfe'))}")
        body.append(line)
    return ["solver", *tasks], body


def setting_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    header = [f"{result['swept']} (tested top down)", "order NFE", "NFE", "speed NFE", "accuracy %",
              "losses / n", "p-value", "certified"]
    body = []
    for i, s in enumerate(result["settings"]):  # testing stops at the first failure: the rest are not tested
        mark = "yes" if s["certified"] else "no" if i == result["certified"] else "not tested"
        if s["config"] == result["pick"]:
            mark += " (pick)"
        body.append([s["value"], "-" if s["order_nfe"] is None else f"{s['order_nfe']:.2f}",
                     "-" if s["nfe"] is None else f"{s['nfe']:.2f}", _x(s["speed_factor_nfe"]), _pct(s["accuracy"]),
                     f"{s['losses']}/{s['n']}", f"{s['p_value']:.3g}", mark])
    return header, body


def _calibration_yardsticks(folder: Path) -> dict | None:
    """The calibration run's AUP per solver family (its summary.json ``yardsticks``): each solver's whole
    grid on the ordering and calibration examples is one curve. None before it is summarised."""
    try:
        return json.loads((folder / CALIBRATION / "summary.json").read_text(encoding="utf-8")).get("yardsticks")
    except (OSError, ValueError):
        return None


def aup_lines(yardsticks: dict | None) -> list[str]:
    """tune.md's section on each solver's grid as one AUP curve per task (analysis/yardsticks.py)."""
    entries = (yardsticks or {}).get("aup") or []
    if not entries:
        return []
    body = [[e["task"], e["family"], f"{e['aup']:.1f}" + ("" if e["aup_lo"] is None else
                                                         f" [{e['aup_lo']:.1f}, {e['aup_hi']:.1f}]"),
             f"{e['y_max']:.1f}", f"{e['kept']} of {len(e['points'])}"] for e in entries]
    return ["## AUP of each solver's grid", "",
            "d3LLM's AUP with every setting of a solver (and NTP's point) as one curve of accuracy against tokens per "
            "forward, on the calibration run's examples; 95% bootstrap interval; y_max the best accuracy there "
            "(docs/measurement.md, 'The field's yardsticks').", "",
            markdown(["task", "solver family", "AUP [95% CI]", "y_max", "points kept"], body), ""]


def table_text(state: dict, yardsticks: dict | None = None) -> str:
    settings, sizes = state["settings"], state["sizes"]
    lines = ["# Tune: each solver at its fastest setting whose accuracy loss against NTP is certified", "",
             f"Command: `{settings.get('command') or '?'}`", "",
             f"Certified: the risk (the share of examples NTP gets right and the setting gets wrong, which bounds "
             f"the accuracy loss) is at most {state['max_loss']} (`--max-loss`) for every certified setting at once, "
             f"with probability at least 1 - {state['delta']} (`--delta`) over the draw of the calibration examples "
             f"(Learn then Test: exact binomial p-values, fixed-sequence testing; docs/measurement.md, 'Choosing a "
             f"threshold'). Per task and solver; a different task or model needs its own calibration.", "",
             f"Examples per task: {sizes['order']} to order the settings, {sizes['calibration']} to calibrate, "
             f"{sizes['held_out']} held out (drawn by a hash of the example id, split seed {state['split_seed']}).",
             "", "Decoded by: " + ", ".join(f"{key} {value}" for key, value in (state.get("provenance") or {}).items()
                                            if value is not None),
             "", "## Side by side", "",
             "Each solver at its pick; cells: setting: held-out loss (%) / speed factor from NFE on the held-out "
             "examples.", "", markdown(*side_by_side(state)), "",
             "## Picks", "",
             "Held-out loss: the same loss on the held-out examples, with a 95% Wilson interval; accuracy on them "
             "beside NTP's; speed factors against NTP on them (forwards, and decode wall-clock).", "",
             markdown(*picks_table(state)), ""]
    if not all(r["pick"] for r in state["results"]):
        lines += ["Not certified:", ""]
        lines += [f"- {r['task']}, {r['family']}: {r['not_certified']}" for r in state["results"] if not r["pick"]]
        lines.append("")
    lines += aup_lines(yardsticks)
    lines += ["## Every setting on the calibration examples", ""]
    for r in state["results"]:
        lines += [f"### {r['task']}: {r['family']}", "",
                  f"Tested in {'' if r['ordered_by'].startswith('the order') else 'the order of '}{r['ordered_by']}; "
                  f"certified: the first {r['certified']}; testing stops at the first that fails (those after it: "
                  f"not tested, their p-values shown for reference only).", "",
                  markdown(*setting_rows(r)), ""]
    return "\n".join(lines)


def stderr_lines(state: dict) -> list[str]:
    """The picks table as aligned text for the terminal."""
    header, body = picks_table(state)
    keep = [0, 1, 2, 3, 5, 7, 8]
    rows = [[row[i] for i in keep] for row in [header, *body]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(keep))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


# -------------------------------------------------------------------------------------------- plot
def plot_tune(state: dict, path: Path):
    """One panel per solver (rows) and task (columns): each setting's calibration risk (left axis,
    symmetric-log so that ε and the settings near it stay readable beside a risk of 80%) and NFE speed
    factor (right axis), in the tested order; ε dashed, the certified settings shaded, the pick starred.
    Returns the (closed) figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = state["tasks"]
    families = [f["family"] for f in state["families"]]
    eps = state["max_loss"]
    fig, axes = plt.subplots(len(families), len(tasks), figsize=(3.9 * len(tasks), 3.0 * len(families)),
                             squeeze=False)
    by_key = {(r["task"], r["family"]): r for r in state["results"]}
    for (row, family), (col, task) in ((f, t) for f in enumerate(families) for t in enumerate(tasks)):
        ax = axes[row][col]
        result = by_key[(task, family)]
        settings = result["settings"]
        x = list(range(len(settings)))
        risk = [s["risk"] for s in settings]
        if result["certified"]:
            ax.axvspan(-0.5, result["certified"] - 0.5, color="tab:green", alpha=0.15, lw=0, gid="certified")
        ax.axhline(eps, color="tab:red", ls="--", lw=1)
        ax.plot(x, risk, "o-", color="tab:red", ms=4, lw=1, clip_on=False, zorder=3)
        if result["pick"]:
            i = [s["config"] for s in settings].index(result["pick"])
            ax.plot([i], [risk[i]], marker="*", ms=16, color="gold", mec="k", ls="", zorder=4, gid="pick",
                    clip_on=False)
        ax.set_yscale("symlog", linthresh=eps, linscale=1.5)
        ax.set_ylim(0, 1)
        ax.set_xticks(x)
        ax.set_xticklabels([s["value"] for s in settings], rotation=45, fontsize=8)
        ax.set_xlim(-0.5, len(settings) - 0.5)
        ax.set_title(f"{task}: {family}", fontsize=9)
        ax.tick_params(axis="y", labelsize=8, colors="tab:red")
        if col == 0:
            ax.set_ylabel("calibration risk", fontsize=9, color="tab:red")
        ax.set_xlabel(f"{result['swept']} (tested left to right)", fontsize=8)
        speed = ax.twinx()
        speed.plot(x, [s["speed_factor_nfe"] if s["speed_factor_nfe"] is not None else float("nan") for s in settings],
                   "s-", color="tab:blue", ms=3, lw=1)
        speed.set_ylim(bottom=0)
        speed.tick_params(axis="y", labelsize=8, colors="tab:blue")
        if col == len(tasks) - 1:
            speed.set_ylabel("speed factor, NFE (x)", fontsize=9, color="tab:blue")
    handles = [plt.Line2D([], [], color="tab:red", marker="o", ms=4, label="calibration risk (left)"),
               plt.Line2D([], [], color="tab:red", ls="--", label=f"max loss ε = {eps}"),
               plt.Rectangle((0, 0), 1, 1, color="tab:green", alpha=0.15, label="certified"),
               plt.Line2D([], [], marker="*", ms=14, color="gold", mec="k", ls="", label="pick (fewest forwards)"),
               plt.Line2D([], [], color="tab:blue", marker="s", ms=3, label="speed factor from NFE (right)")]
    fig.legend(handles=handles, loc="upper center", ncol=5, fontsize=9, frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(f"Calibration risk and speed against each solver's parameter (δ = {state['delta']})", y=1.03,
                 fontsize=11)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight"))
    plt.close(fig)
    return fig
