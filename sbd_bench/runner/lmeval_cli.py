"""The two ways to run lm-evaluation-harness tasks through SBD (runner/lmeval.py holds the model):

    python -m sbd_bench lm-eval --model models/sbd-tiny --tasks gsm8k --include-path my_tasks \\
        --solver entropy_bounded:gamma=0.1 --out runs/lm-eval     # our command: lm-eval's evaluator per
                                                                  # configuration (NTP first), our run folder
    sbd-lm-eval --model sbd_bench --model_args pretrained=models/sbd-tiny,solver=ntp,out=runs/x --tasks gsm8k
                                                                  # lm-eval's own command line and flags

Only argparse and the standard library at import: `python -m sbd_bench --help` and every other command
never import lm_eval (tests/test_lmeval.py). Offline mode is set before lm_eval loads, so a hub dataset
without a local copy fails in one line instead of waiting on the network.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from ..types import UsageError

INSTALL_HINT = 'pip install -c constraints.txt -e ".[lmeval]"'


def _go_offline() -> None:
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"


def _need_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401 - the package alone (its __init__ is small); the evaluator loads later
    except ImportError:
        raise UsageError(f"lm-eval is not installed: {INSTALL_HINT}") from None


def load_lm_eval_tasks(names: list[str], include_paths: list[str]):
    """(task manager, {task name: output type}) for lm-eval task names or YAML paths; every failure to
    find a task or read its data is one UsageError line."""
    from lm_eval.tasks import TaskManager, get_task_dict

    for path in include_paths:
        if not Path(path).is_dir():
            raise UsageError(f"--include-path {path} is not a folder: give the folder that holds your task YAMLs")
    manager = None
    if include_paths:  # the ~14,700 built-in YAMLs take seconds to index: skipped when the user's hold every task
        own = TaskManager(include_path=include_paths, include_defaults=False)
        if all(name in own.all_tasks or name.endswith((".yaml", ".yml")) for name in names):
            manager = own
    manager = manager or TaskManager(include_path=include_paths or None)
    unknown = [name for name in names if name not in manager.all_tasks and not Path(name).is_file()]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], manager.all_tasks, n=3)
        guess = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UsageError(f"lm-eval knows no task {unknown[0]!r}{guess}: check the name (`lm-eval ls tasks` lists "
                         f"them), give a YAML path, or add the folder of your task YAMLs with --include-path DIR")
    try:
        task_dict = get_task_dict(names, manager)
    except Exception as exc:  # noqa: BLE001 - lm-eval and datasets raise many kinds; each becomes one line
        raise UsageError(describe_task_error(exc, names)) from None
    types = {}

    def walk(tree):
        for key, value in tree.items():
            if isinstance(value, dict):
                walk(value)
            else:
                types[value.config.task] = value.OUTPUT_TYPE

    walk(task_dict)
    return manager, types


def describe_task_error(exc: BaseException, names: list[str], flag: str = "--include-path") -> str:
    """One line for a task lm-eval or datasets could not load, naming the fix."""
    text = " ".join(str(exc).split())
    kind = type(exc).__name__
    which = ", ".join(names) or "the tasks"
    if "offline" in text.lower() or kind in ("ConnectionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError") \
            or "Couldn't reach" in text or "couldn't be found on the Hugging Face Hub" in text:
        return (f"a task of {which} reads a dataset from the Hugging Face Hub ({text[:160]}): nothing is downloaded: "
                f"point the task at a local copy (dataset_path: json, dataset_kwargs: data_files: {{test: FILE.jsonl}} "
                f"in a task YAML of your own, given with {flag} DIR; docs/lm-eval.md)")
    if isinstance(exc, FileNotFoundError) or "Unable to find" in text or "doesn't exist" in text:
        return (f"a data file of {which} was not found ({text[:200]}): data_files in a task YAML are read relative "
                f"to the working directory ({os.getcwd()}), not to the YAML; give a path from there or an absolute one")
    if "Tasks not found" in text or "not a registered task" in text:
        return (f"lm-eval knows no such task ({text[:200]}): check the name (`lm-eval ls tasks` lists them), give a "
                f"YAML path, or add the folder of your task YAMLs with {flag} DIR")
    return f"lm-eval could not load {which}: {kind}: {text[:300]}"


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)


def copy_lm_eval_verdicts(records: list[dict], samples: dict) -> None:
    """Each generation record gets lm-eval's score of its request: ``correct`` from the task's first
    metric under its first filter (0/1 metrics; others leave it null), ``answer`` lm-eval's target, and
    ``score_detail.lm_eval`` the metric, filter and value."""
    verdicts = {}
    for task, entries in samples.items():
        first_filter = entries[0].get("filter") if entries else None
        for entry in entries:
            if entry.get("filter") != first_filter or not entry.get("metrics"):
                continue
            metric = entry["metrics"][0]
            verdicts[(task, str(entry["doc_id"]))] = (metric, first_filter, entry.get(metric), entry.get("target"))
    for record in records:
        doc = str(record["id"]).split(".")[0]
        found = verdicts.get((record["task"], doc))
        if found is None:
            continue
        metric, filter_name, value, target = found
        record["answer"] = None if target is None else str(target)
        record["correct"] = bool(value) if value in (0, 1) and not record["error"] else None
        record["score_detail"] = {"lm_eval": {"metric": metric, "filter": filter_name, "value": value}}


def cmd_lm_eval(args) -> int:
    _go_offline()  # before anything imports datasets or huggingface_hub, which read it once
    _need_lm_eval()
    from ..analysis.records import RunFolderError, prepare_output_folder, read_records
    from ..analysis.report import check_report_folder
    from ..core.model import load_model, pick_device, resolve_model_path
    from ..registry import parse_solver_spec, solver_registry

    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not names:
        raise UsageError("lm-eval needs --tasks: lm-eval task names or YAML paths, comma separated (e.g. --tasks "
                         "gsm8k_local --include-path my_tasks; docs/lm-eval.md)")
    configs = parse_solver_spec(args.solver, solver_registry(args.plugins))  # a bad spec costs nothing
    resolve_model_path(args.model)
    pick_device(args.device)
    out = Path(args.out or f"runs/lm-eval-{time.strftime('%Y%m%d-%H%M%S')}")
    created = prepare_output_folder(out)
    try:
        check_report_folder(out, also=("summary.json",))
        if (out / "samples.jsonl").exists() and read_records(out / "samples.jsonl"):
            raise RunFolderError(f"{out} already holds records: choose another --out")
        manager, types = load_lm_eval_tasks(names, args.include_path)
        likelihood = sorted(t for t, kind in types.items() if kind != "generate_until")
        solvers = [c for c in configs if c.label != "ntp"]
        if likelihood and len(likelihood) == len(types):
            if solvers:
                raise UsageError(f"{', '.join(likelihood)}: log-likelihood tasks only, and a solver has no effect on "
                                 f"them (they are scored by the NTP path, one causal forward per request): drop "
                                 f"--solver or give --solver ntp")
            configs = [c for c in configs if c.label == "ntp"][:1]
        elif likelihood and solvers:
            print(f"note: {', '.join(likelihood)} are log-likelihood tasks, scored by the NTP path: the solver has no "
                  f"effect on them (it decodes {', '.join(sorted(set(types) - set(likelihood)))})", file=sys.stderr)
        lm = load_model(args.model, device=args.device, dtype=args.dtype, exact=args.exact)
        return _evaluate(args, out, lm, configs, names, manager, types)
    except BaseException:
        from ..analysis.records import remove_empty_folders

        remove_empty_folders(created)
        raise


def _evaluate(args, out: Path, lm, configs, names, manager, types) -> int:
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import make_table

    from .lmeval import SBDLM, write_run_folder

    records, results_dirs, model = [], {}, None
    for solver in configs:
        model = SBDLM(pretrained=args.model, solver=solver,
                      block_size=args.block_size, batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                      seed=args.seed, max_block_forwards=args.max_block_forwards, threads=args.threads,
                      exact=args.exact, command=args.command_line, loaded=lm, records=records)
        model.stream = out / "samples.jsonl"  # each record appended as decoded; the folder is written at the end
        results = simple_evaluate(model=model, tasks=names, task_manager=manager, limit=args.limit,
                                  num_fewshot=args.num_fewshot, log_samples=True, bootstrap_iters=0,
                                  random_seed=args.seed, numpy_random_seed=args.seed, torch_random_seed=args.seed,
                                  fewshot_random_seed=args.seed)
        samples = results.pop("samples")
        tracker = EvaluationTracker(output_path=str(out / "lm_eval"))  # lm-eval's own files: lm_eval/CONFIG/
        tracker.general_config_tracker.model_name_sanitized = _safe(solver.label)
        tracker.save_results_aggregated(results=results, samples=samples)
        for task_name in results["configs"]:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
        results_dirs[solver.label] = str(out / "lm_eval" / _safe(solver.label))
        copy_lm_eval_verdicts([r for r in records if r["config"] == solver.label], samples)
        print(f"lm-eval, {solver.label}:\n{make_table(results)}", file=sys.stderr)
    model.cfg.solvers = args.solver
    model.cfg.tasks = names
    write_run_folder(out, model.cfg, lm, model.threads_chosen, records,  # log-likelihood requests: each configuration's
                     {"tasks": types, "limit": args.limit, "results": results_dirs,
                      "loglikelihood_requests": dict(model.loglikelihood_requests)})
    summary = json.loads((out / "summary.json").read_text())
    failures = summary.get("failures") or []
    print(json.dumps({"run_dir": str(out), "complete": summary["complete"], "rows": len(summary["rows"]),
                      "failures": len(failures), "lm_eval_results": results_dirs}))
    return 0 if not failures else 1


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("lm-eval", help="lm-evaluation-harness tasks decoded by solver configurations: "
                                              "lm-eval's results and a run folder (needs .[lmeval])",
                              epilog="exit status: 0 done; 1 some requests failed; 2 bad input (a task, its data, "
                                     "a solver spec), nothing decoded")
    p.add_argument("--model", default="sbd-tiny", help="shipped model name or local HF folder")
    p.add_argument("--tasks", default="", help="lm-eval task names or YAML paths, comma separated")
    p.add_argument("--include-path", action="append", default=[], metavar="DIR",
                   help="folder of lm-eval task YAMLs of your own (data_files relative to the working directory)")
    p.add_argument("--solver", default="ntp",
                   help="as for run: one lm-eval evaluation per configuration, ntp first (log-likelihood tasks: "
                        "ntp only)")
    p.add_argument("--block-size", type=int, default=16, help="k, the positions decoded together in a block")
    p.add_argument("--max-block-forwards", type=int, default=None, metavar="N", help="as for run")
    p.add_argument("--batch-size", type=int, default=1, help="generation requests decoded together (as for run)")
    p.add_argument("--limit", type=float, default=None, help="lm-eval's --limit: first N documents of each task")
    p.add_argument("--num-fewshot", type=int, default=None, help="lm-eval's --num_fewshot")
    p.add_argument("--seed", type=int, default=0, help="lm-eval's seeds (few-shot draws) and ours")
    p.add_argument("--plugins", action="append", default=[], metavar="DIR", help="folder of solver .py files")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda[:N]")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (as for run)")
    p.add_argument("--exact", action="store_true", help="as for run")
    p.add_argument("--out", default=None, help="run folder (default: runs/lm-eval-DATE-TIME)")
    p.set_defaults(func=cmd_lm_eval)


def harness_main(argv: list[str] | None = None) -> int:
    """lm-eval's own command line (``lm_eval ...``) with the ``sbd_bench`` model registered (lm-eval finds
    models only in its own process); a UsageError of ours, or a task lm-eval cannot load, is one line and
    exit status 2."""
    _go_offline()
    try:
        _need_lm_eval()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from lm_eval.__main__ import cli_evaluate

    from . import lmeval  # noqa: F401 - registers the model

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        cli_evaluate()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ConnectionError, KeyError, ValueError) as exc:
        print(f"error: {describe_task_error(exc, [], '--include_path')}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(harness_main())
