"""`tune`: each solver at the fastest setting whose accuracy loss against NTP is certified at most ε
(``--max-loss``) with probability at least 1 - δ (``--delta``), chosen on calibration examples and
checked on held-out ones.

    python -m sbd_bench tune --task suite:n_test=520 --max-loss 0.02 --delta 0.1 --threads 1 --out runs/tune \\
        --solver "entropy_bounded:gamma=0,0.01,0.1,0.35,1+confidence:tau=0.99,0.9,0.7"
    python -m sbd_bench tune --resume runs/tune          # after an interruption: decodes only what is missing
    python -m sbd_bench run --solver @runs/tune          # the picked settings

Steps, every decode through the run machinery (``harness.run``: records, resume, progress, batches and
sampling settings are `run`'s, and each part is a run folder that `report` and `compare` read):
  1. checks, before any model loads: ε and δ in (0, 1); each '+'-part of --solver one solver sweeping one
     parameter over at least two settings; enough calibration examples to certify anything
     (``ltt.min_examples``); enough examples in every task for the three parts; one sample per example;
  2. each task's examples split by a hash of their ids (``tuning.split_examples``): ``--order-examples``
     to fix the testing order, ``--calibration`` to certify, ``--held-out`` to check;
  3. the calibration run (``calibration/``): NTP and every setting on the ordering + calibration examples;
  4. per task and solver, the settings ordered by their mean NFE on the ordering examples (most first),
     tested in that order on the calibration examples, the certified one with the fewest forwards picked
     (``tuning.certify``); tune.json records it before anything more is decoded;
  5. a held-out run per task with a pick (``held_out/TASK/``): NTP and that task's picks;
  6. tune.json, tune.md and tune.png (``analysis/tuning.py``, from the records).
An interrupted tune resumes part by part: finished parts are kept, an unfinished one is resumed like
`run --resume`, and the picks are computed again from the same records, so they are the same. On a
finished tune, --resume decodes nothing and writes tune.json, tune.md and tune.png again from the records.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..analysis.ltt import check_levels, min_examples
from ..analysis.records import (SAMPLES, SUMMARY, RunFolderLock, prepare_output_folder, read_records, read_summary,
                                remove_empty_folders)
from ..analysis.tuning import (CALIBRATION, HELD_OUT, TUNE_FILE, TUNE_SCHEMA_VERSION, TuneFolderError, add_held_out,
                               calibration_provenance, certify, config_spec, read_tune, split_examples, write_tune)
from ..registry import parse_solver_spec, solver_registry
from ..tasks import JsonlTask, task_options
from ..types import Sampling, SamplingError, Task, UsageError
from .harness import Progress, load_tasks, resume, run
from .samples import RunConfig


@dataclass
class TuneConfig:
    """What `tune` does: ``run`` holds the model and decoding settings (its ``tasks``, ``solvers`` and
    ``out`` are the tune's: task specs, the solver sweeps, the tune folder); the rest is the tune's own."""

    run: RunConfig
    max_loss: float = 0.02  # ε: the largest risk certified
    delta: float = 0.1  # δ: the chance that some certified setting's risk is above ε after all
    calibration: int = 300  # examples per task the settings are tested on
    held_out: int = 200  # examples per task the picks are checked on
    order_examples: int = 20  # examples per task whose mean NFE fixes the testing order; 0: the order given
    split_seed: int = 0

    def __post_init__(self):
        check_levels(self.max_loss, self.delta)
        for flag, value, least in (("--calibration", self.calibration, 1), ("--held-out", self.held_out, 1),
                                   ("--order-examples", self.order_examples, 0)):
            if value < least:
                raise UsageError(f"{flag} must be >= {least} (got {value})")
        if self.run.samples > 1:
            raise SamplingError(f"tune certifies with one 0/1 loss per example (an exact binomial test over "
                                f"independent examples), and --samples {self.run.samples} gives dependent outcomes of "
                                f"each example: drop --samples (a --temperature with one sample per example is "
                                f"fine: each example's loss is then one draw)")
        needed = min_examples(self.max_loss, self.delta)
        if self.calibration < needed:
            raise UsageError(
                f"--calibration {self.calibration} cannot certify anything at --max-loss {self.max_loss} and --delta "
                f"{self.delta}: even with no loss at all the p-value (1 - {self.max_loss})^{self.calibration} = "
                f"{(1 - self.max_loss) ** self.calibration:.3g} is above {self.delta}; a certificate needs n >= "
                f"ln(delta) / ln(1 - max_loss), that is --calibration {needed} or more (more still to certify a "
                f"setting that loses any example)")

    @property
    def sizes(self) -> dict[str, int]:
        return {"order": self.order_examples, "calibration": self.calibration, "held_out": self.held_out}

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "run"},
                "run": self.run.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> "TuneConfig":
        values = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data and f.name != "run"}
        return cls(run=RunConfig.from_json(data["run"]), **values)


def tune_resume_command(out: Path) -> str:
    import shlex

    return f"python -m sbd_bench tune --resume {shlex.quote(str(out))}"


# ------------------------------------------------------------------------------------- the families
ABSENT = {"verify": "off", "temperature": "0", "top_p": "1", "top_k": "0"}  # core options a label leaves out
def solver_families(spec: str, registry: dict, sampling: Sampling) -> list[dict]:
    """Each '+'-part of ``spec``: one solver sweeping one parameter, its settings in the order given.
    NTP (the baseline, decoded anyway) is no family."""
    families = []
    for part in filter(None, (p.strip() for p in spec.split("+"))):
        settings = [s for s in parse_solver_spec(part, registry, sampling) if s.decodes_blocks]
        if not settings:
            continue
        names = list(dict.fromkeys(s.name for s in settings))
        if len(names) > 1:
            raise UsageError(f"tune compares the settings of one solver per '+'-part of --solver, and '{part}' holds "
                             f"{', '.join(names)}: join the solvers with '+', each with its sweep "
                             f"(e.g. entropy_bounded:gamma=0.1,0.35+confidence:tau=0.9,0.7)")
        if len(settings) == 1:
            raise UsageError(f"tune needs at least two settings of {names[0]} to choose from, and '{part}' gives "
                             f"one ({settings[0].label}): sweep one of its parameters, e.g. "
                             f"{names[0]}:{next(iter(settings[0].params), 'param')}=v1,v2,v3")
        keys = list(dict.fromkeys(k for s in settings for k in s.params))  # verify=off and greedy add none
        swept = [k for k in keys if len({repr(s.params.get(k)) for s in settings}) > 1]
        if len(swept) > 1:
            raise UsageError(f"tune tests one swept parameter per solver in one order, and '{part}' sweeps "
                             f"{', '.join(swept)}: fix all but one, or give each value of the others its own "
                             f"'+'-part (e.g. {names[0]}:{swept[0]}=...;{swept[1]}=A+{names[0]}:{swept[0]}=...;"
                             f"{swept[1]}=B)")
        key = swept[0]
        fixed = {k: v for k, v in settings[0].params.items() if k != key}
        label = names[0] + (":" + ",".join(f"{k}={v}" for k, v in fixed.items()) if fixed else "")
        families.append({"family": label, "solver": names[0], "swept": key, "configs": [s.label for s in settings],
                         "values": [str(s.params.get(key, ABSENT.get(key, "-"))) for s in settings],
                         "specs": [config_spec(s.name, s.params) for s in settings]})
    if not families:
        raise UsageError("tune needs at least one solver sweep in --solver, e.g. "
                         "--solver \"entropy_bounded:gamma=0.01,0.1,0.35+confidence:tau=0.95,0.9\"")
    seen: dict[str, str] = {}
    for family in families:
        for config in family["configs"]:
            if config in seen:
                raise UsageError(f"{config} is in two '+'-parts of --solver ({seen[config]} and {family['family']}): "
                                 f"give each solver's values in one list")
            seen[config] = family["family"]
    return families


# ------------------------------------------------------------------------------------------ the split
def task_splits(cfg: TuneConfig, tasks: list[Task]) -> dict[str, dict[str, list[str]]]:
    """Each task's three parts; a task with too few examples, without verdicts or sharing a name with
    another is refused (before any model loads)."""
    names = [task.name for task in tasks]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UsageError(f"--task names {twice[0]} twice (records are told apart by task name): tune each version "
                         f"of it in its own tune folder")
    sizes, needed = cfg.sizes, sum(cfg.sizes.values())
    splits = {}
    for spec, task in zip(cfg.run.tasks, tasks):
        examples = task.examples("test")
        if isinstance(task, JsonlTask) and any(e.answer is None for e in examples):
            raise UsageError(f"task {task.name}: some examples have no 'answer', and tune needs a verdict on every "
                             f"example (NTP right, the setting wrong): give answers, or tune on another task")
        if len(examples) < needed:
            hint = (f"draw more with the task option n_test, e.g. --task {task.name}:n_test={needed} "
                    f"(suite:n_test={needed} for every suite task)" if "n_test" in task_options(spec)
                    else "give a task with more examples")
            raise UsageError(f"tune needs {needed} examples of task {task.name} ({sizes['order']} to order the settings, "
                             f"{sizes['calibration']} to calibrate, {sizes['held_out']} held out) and it has "
                             f"{len(examples)}: {hint}, or lower --calibration, --held-out or --order-examples")
        splits[task.name] = split_examples([e.id for e in examples], task.name, cfg.split_seed, sizes)
    return splits


# --------------------------------------------------------------------------------------------- tune
def tune(cfg: TuneConfig, progress: Progress | None = None, resume_folder: bool = False) -> Path:
    """Calibrate, certify, pick and check, into the tune folder ``cfg.run.out`` (see the module
    docstring); with ``resume_folder``, finish the tune already there. Returns the folder."""
    progress = progress or Progress()
    out = Path(cfg.run.out)
    families = solver_families(cfg.run.solvers, solver_registry(cfg.run.plugins), cfg.run.sampling)
    tasks = load_tasks(cfg.run)
    splits = task_splits(cfg, tasks)
    if resume_folder:
        state = read_tune(out)
        if state["splits"] != splits or state["families"] != families:
            raise TuneFolderError(f"{out} was tuned on other examples or settings than its settings give now (a task's "
                                  f"examples or a solver changed): start a new tune folder")
        created = []
    else:
        if (out / TUNE_FILE).exists():
            raise TuneFolderError(f"{out} already holds a tune: finish it with `{tune_resume_command(out)}`, or choose "
                                  f"another --out")
        created = prepare_output_folder(out)
        state = {"schema_version": TUNE_SCHEMA_VERSION, "complete": False, "max_loss": cfg.max_loss,
                 "delta": cfg.delta, "sizes": cfg.sizes, "split_seed": cfg.split_seed, "tasks": list(splits),
                 "settings": {"command": cfg.run.command, **cfg.to_json()}, "families": families, "splits": splits,
                 "results": None, "resume_command": tune_resume_command(out)}
    try:
        with RunFolderLock(out, cfg.run.command):
            write_tune(out, state)
            _tune_locked(cfg, out, state, tasks, splits, progress)
    finally:
        remove_empty_folders(created)  # refused before tune.json was written: nothing left behind
    return out


def _tune_locked(cfg: TuneConfig, out: Path, state: dict, tasks: list[Task], splits: dict, progress: Progress) -> None:
    """Steps 3 to 6 of the module docstring, the tune folder locked."""
    families = state["families"]
    ids = {name: split["order"] + split["calibration"] for name, split in splits.items()}
    if not cfg.order_examples:
        progress.message("warning: --order-examples 0: each solver's settings are tested in the order given in "
                         "--solver, and that order decides what can be certified: list them from the safest to the "
                         "most aggressive (an aggressive-first list certifies nothing)")
    progress.message(f"tune: calibration, {len(families)} solver(s) and NTP on {len(tasks)} task(s), "
                     f"{cfg.order_examples} + {cfg.calibration} examples each, into {out / CALIBRATION}")
    summaries = [_part(cfg, out / CALIBRATION, cfg.run.tasks, cfg.run.solvers, ids, progress)]
    state["provenance"] = calibration_provenance(out)
    state["results"] = certify(state, read_records(out / CALIBRATION / SAMPLES))
    write_tune(out, state, plot=False)  # the picks are recorded before anything more is decoded
    held = {}
    for spec, task in zip(cfg.run.tasks, tasks):
        picks = list(dict.fromkeys(r["pick_spec"] for r in state["results"] if r["task"] == task.name and r["pick"]))
        if not picks:
            progress.message(f"tune: no setting certified on {task.name}: nothing to check on held-out examples")
            continue
        folder = out / HELD_OUT / task.name
        progress.message(f"tune: {task.name} held out, NTP and {len(picks)} pick(s) on {cfg.held_out} examples, "
                         f"into {folder}")
        summaries.append(_part(cfg, folder, [spec], "+".join(picks), {task.name: splits[task.name]["held_out"]},
                               progress))
        held[task.name] = read_records(folder / SAMPLES)
    add_held_out(state, held)
    state["failures"] = sum(len(s.get("failures") or []) for s in summaries)
    state["complete"] = all(s.get("complete") for s in summaries)
    state["resume_command"] = None if state["complete"] else tune_resume_command(out)
    write_tune(out, state)


def _part(cfg: TuneConfig, folder: Path, tasks: list[str], solvers: str, ids: dict[str, list[str]],
          progress: Progress) -> dict:
    """One part of the tune as a run folder: decoded, resumed, or kept as it is when complete; its summary."""
    if (folder / SUMMARY).exists():
        summary = read_summary(folder)
        if summary.get("complete"):
            progress.message(f"tune: {folder} is complete; kept")
            return summary
        resume(folder, progress=progress, command=cfg.run.command)
    else:  # new, or records without a summary (killed before it was written): continued by run
        run(dataclasses.replace(cfg.run, tasks=tasks, solvers=solvers, out=folder, example_ids=ids), progress=progress)
    return read_summary(folder)


def resume_tune(folder: Path, progress: Progress | None = None, command: str = "") -> Path:
    """Finish the tune in ``folder`` with the settings it was started with."""
    folder = Path(folder)
    state = read_tune(folder)
    if state.get("complete"):  # nothing to decode; the files are written again from the records
        state["provenance"] = calibration_provenance(folder)
        state["results"] = certify(state, read_records(folder / CALIBRATION / SAMPLES))
        add_held_out(state, {task: read_records(folder / HELD_OUT / task / SAMPLES) for task in state["tasks"]
                             if (folder / HELD_OUT / task / SAMPLES).exists()})
        write_tune(folder, state)
        (progress or Progress()).message(f"{folder} is complete: nothing to resume; tune.json, tune.md and tune.png "
                                         f"written again from its records")
        return folder
    cfg = TuneConfig.from_json(state["settings"])
    cfg.run.out = folder
    cfg.run.command = command or cfg.run.command
    return tune(cfg, progress, resume_folder=True)


def summary_line(state: dict, folder: Path) -> dict:
    """The machine-readable last line of `tune`."""
    results = state.get("results") or []
    return {"tune_dir": str(folder), "complete": bool(state.get("complete")),
            "picks": sum(1 for r in results if r["pick"]), "not_certified": sum(1 for r in results if not r["pick"]),
            "failures": state.get("failures", 0)}

