"""Command line: ``python -m sbd_bench {run,list,...}``.

Subcommands live with the code they drive: a module listed in ``COMMAND_MODULES`` defines
``add_cli(subparsers)``, which adds its parser and sets ``func``. Such modules import torch and other
heavy packages inside their functions, so that ``report`` and ``compare`` start fast.
Bad input (any ``UsageError``) is one line on stderr and exit status 2, never a traceback; the other
exit statuses are the ``EXIT_*`` constants below (also in every ``--help``).
"""
from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import re
import shlex
import shutil
import stat
import sys
import time
from collections import Counter

from .runner.options import add_decode_options, add_tune_options
from .types import UsageError

EXIT_OK = 0
EXIT_FAILED_SAMPLES = 1  # `run`: some samples failed (their records hold the error) or the run is incomplete
EXIT_USAGE = 2  # bad input, refused before anything was lost
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM; the resume command is printed
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (`list | head`): 128 + SIGPIPE, as Unix tools report

COMMAND_MODULES: list[str] = ["sbd_bench.training.command", "sbd_bench.analysis.report", "sbd_bench.analysis.compare",
                              "sbd_bench.analysis.roofline", "sbd_bench.runner.throughput", "sbd_bench.runner.lmeval_cli"]  # each adds its own subcommand


class ProgressBar:
    """A run's progress on stderr. On a terminal: a tqdm bar whose ETA comes from the mean rate since
    the sweep began (so it settles instead of jumping with each sample), with messages printed above
    it in full. In a log (not a terminal): one plain line at the first sample, about every 5% and at
    the last. The first failure of each configuration is printed when it happens; `cmd_run` lists
    every failing configuration again at the end."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.bar = None
        self.failed: set[str] = set()
        self.total = self.done = self.initial = 0
        self.started = time.perf_counter()

    def message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def start(self, total: int, done: int) -> None:
        self.total, self.done, self.initial, self.started = total, done, done, time.perf_counter()
        if self.stream.isatty() and done < total:
            from tqdm import tqdm

            try:  # a terminal that reports no size (a bare pty) gets $COLUMNS x $LINES or 80 x 24: tqdm
                sized = min(os.get_terminal_size(self.stream.fileno())) > 0  # would draw nothing at all
            except (AttributeError, OSError, ValueError):
                sized = False
            fallback = shutil.get_terminal_size()
            self.bar = tqdm(total=total, initial=done, file=self.stream, unit="sample", smoothing=0, desc="decoding",
                            dynamic_ncols=sized, ncols=None if sized else fallback.columns,
                            nrows=None if sized else fallback.lines)

    def update(self, record: dict) -> None:
        self.done += 1
        label = f"{record['task']}/{record['id']} {record['config']}"
        if record.get("error") and record["config"] not in self.failed:
            self.failed.add(record["config"])
            self.message(f"failed: {record['config']} on {record['task']}/{record['id']}: {record['error']}")
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
            return
        count, todo = self.done - self.initial, self.total - self.initial
        if count in (1, todo) or count % max(1, todo // 20) == 0:
            elapsed = time.perf_counter() - self.started
            left = elapsed / count * (self.total - self.done)
            print(f"[{self.done}/{self.total}] {elapsed:.0f}s elapsed, ~{left:.0f}s left, {label}",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def cmd_run(args) -> int:
    from pathlib import Path

    from .analysis.metrics import ntp_mismatch_warning
    from .analysis.records import read_records
    from .analysis.tuning import expand_tuned
    from .core.model import check_model_folder, pick_device
    from .runner import distributed
    from .runner.harness import RunConfig, resume, resume_command, run
    from .tasks import expand_tasks

    command = args.command_line
    progress = ProgressBar()
    if args.resume and distributed.launched():
        raise UsageError("--resume runs in one process: resume a data-parallel run without torchrun")
    if args.resume:
        ignored = sorted(typed_options(args.argv, args) - {"command", "resume"})
        if ignored:  # they would be ignored: the run's own settings are what it is finished with
            raise UsageError(f"--resume finishes a run with the settings it was started with: drop "
                             f"{', '.join(_as_typed(name, args.argv) for name in ignored)} (other settings are "
                             f"another run: give it a new --out folder)")
        out = Path(args.resume)
    else:
        check_model_folder(args.model, args.family)  # the cheapest checks first: a typo in --model costs no work
        pick_device(args.device)  # before anything loads (the model loader checks again)
        if distributed.launched() and not args.out:
            raise UsageError("under torchrun pass --out DIR: every rank must name the same run folder")
        out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
        cfg = RunConfig(model=args.model, family=args.family, tasks=expand_tasks(args.task), solvers=expand_tuned(args.solver), out=out,
                        block_size=args.block_size, max_new_tokens=args.max_new_tokens, limit=args.limit,
                        max_block_forwards=args.max_block_forwards,
                        seed=args.seed, plugins=args.plugins, device=args.device, dtype=args.dtype,
                        attn_implementation=args.attn, command=command, repeats=args.repeats, warmup=args.warmup,
                        cost_curve=not args.no_cost_curve, report=not args.no_report, threads=args.threads,
                        chat_template=args.chat_template, thinking={"on": True, "off": False}.get(args.thinking),
                        batch_size=args.batch_size, fast=args.fast, compile=args.compile, device_map=args.device_map,
                        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, samples=args.samples,
                        pass_k=args.pass_k, exact=args.exact, trace=_trace_count(args.trace))
    try:
        if args.resume:
            run_dir = resume(out, progress=progress, command=command)
        elif distributed.launched():
            run_dir = distributed.run_data_parallel(cfg, progress=progress)
            if run_dir is None:  # not rank 0: rank 0 reports for the whole run
                return 0
        else:
            run_dir = run(cfg, progress=progress)
    except KeyboardInterrupt:
        return _interrupted(out, progress)
    except BrokenPipeError:  # the run stopped at a sample boundary; its summary and report say how to resume
        try:
            print(f"\nthe output's reader went away: stopped; finish the run with\n  {resume_command(out)}",
                  file=sys.stderr)
        except OSError:
            pass  # stderr is that pipe too (`2>&1 | head`)
        raise
    summary = json.loads((run_dir / "summary.json").read_text())
    _print_table(summary["rows"])
    for line in failure_lines(summary):
        print(line, file=sys.stderr)
    mismatch = ntp_mismatch_warning(read_records(run_dir / "samples.jsonl"),
                                    exact=bool((summary.get("provenance") or {}).get("exact")))
    if mismatch:
        print(f"warning: {mismatch}", file=sys.stderr)
    failures = summary.get("failures") or []
    print(json.dumps({"run_dir": str(run_dir), "complete": summary["complete"], "rows": len(summary["rows"]),
                      "failures": len(failures)}))
    return EXIT_OK if summary["complete"] and not failures else EXIT_FAILED_SAMPLES


def _trace_count(value: str) -> int | None:
    """--trace's count of examples per task; None for 'all'."""
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--trace {value!r} must be a count of examples per task or 'all' (--trace alone: every "
                         f"sample; --trace 0: none)") from None


def cmd_tune(args) -> int:
    """`tune` (runner/tune.py): the calibration and held-out runs with the progress bar of `run`, the
    picks table on stderr, one JSON line on stdout."""
    from pathlib import Path

    from .analysis.tuning import read_tune, stderr_lines
    from .core.model import check_model_folder, pick_device
    from .runner import distributed
    from .runner.harness import RunConfig
    from .runner.tune import TuneConfig, resume_tune, summary_line, tune, tune_resume_command
    from .tasks import expand_tasks

    if distributed.launched():
        raise UsageError("tune runs in one process: start it without torchrun")
    progress = ProgressBar()
    if args.resume:
        ignored = sorted(typed_options(args.argv, args) - {"command", "resume"})
        if ignored:
            raise UsageError(f"--resume finishes a tune with the settings it was started with: drop "
                             f"{', '.join(_as_typed(name, args.argv) for name in ignored)}")
        out = Path(args.resume)
    else:
        if not args.solver:
            raise UsageError("tune needs --solver: one sweep per solver joined by '+', e.g. "
                             "--solver \"entropy_bounded:gamma=0.01,0.1,0.35+confidence:tau=0.95,0.9\"")
        out = Path(args.out or f"runs/tune-{time.strftime('%Y%m%d-%H%M%S')}")
        run_cfg = RunConfig(model=args.model, family=args.family, tasks=expand_tasks(args.task), solvers=args.solver, out=out,
                            block_size=args.block_size, max_new_tokens=args.max_new_tokens, seed=args.seed,
                            plugins=args.plugins, device=args.device, dtype=args.dtype, attn_implementation=args.attn,
                            command=args.command_line, repeats=args.repeats, warmup=args.warmup,
                            cost_curve=not args.no_cost_curve, report=not args.no_report, threads=args.threads,
                            chat_template=args.chat_template, thinking={"on": True, "off": False}.get(args.thinking),
                            batch_size=args.batch_size, fast=args.fast, compile=args.compile,
                            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, samples=args.samples,
                            exact=args.exact, max_block_forwards=args.max_block_forwards, trace=0)
        cfg = TuneConfig(run=run_cfg, max_loss=args.max_loss, delta=args.delta, calibration=args.calibration,
                         held_out=args.held_out, order_examples=args.order_examples, split_seed=args.split_seed)
        check_model_folder(args.model, args.family)
        pick_device(args.device)
    try:
        folder = resume_tune(out, progress, args.command_line) if args.resume else tune(cfg, progress)
    except KeyboardInterrupt:
        progress.close()
        if (out / "tune.json").exists():
            print(f"\ninterrupted: everything decoded so far is kept in {out}; finish the tune with\n"
                  f"  {tune_resume_command(out)}", file=sys.stderr)
        else:
            print(f"\ninterrupted before {out} held a tune: there is nothing to resume; start it again", file=sys.stderr)
        return EXIT_INTERRUPTED
    state = read_tune(folder)
    for line in stderr_lines(state) if state.get("results") else []:
        print(line, file=sys.stderr)
    line = summary_line(state, folder)
    print(json.dumps(line))
    return EXIT_OK if line["complete"] and not line["failures"] else EXIT_FAILED_SAMPLES


def _interrupted(out, progress: ProgressBar) -> int:
    """Ctrl-C or SIGTERM: say what is kept and the exact command that finishes the run."""
    from .runner.harness import resume_command

    progress.close()
    if (out / "summary.json").exists():
        print(f"\ninterrupted: the samples finished so far are kept in {out}; finish the run with\n"
              f"  {resume_command(out)}", file=sys.stderr)
    else:
        print(f"\ninterrupted before {out} held a summary: there is nothing to resume; start the run again",
              file=sys.stderr)
    return EXIT_INTERRUPTED


def failure_lines(summary: dict) -> list[str]:
    """One line per configuration with failed samples: how many of its samples, on which tasks, and why."""
    failures = summary.get("failures") or []
    configs = {r["config"] for r in summary.get("rows") or []} | {f["config"] for f in failures}
    per_config = (summary.get("samples") or {}).get("planned", 0) // max(1, len(configs))
    lines = []
    for config in dict.fromkeys(f["config"] for f in failures):
        mine = [f for f in failures if f["config"] == config]
        tasks = Counter(f["task"] for f in mine)
        errors = Counter(f["error"] for f in mine).most_common()
        others = f" (and {len(errors) - 1} other error(s); all in samples.jsonl)" if len(errors) > 1 else ""
        lines.append(f"failed: {config}: {len(mine)} of {per_config} samples "
                     f"({', '.join(f'{t} {n}' for t, n in tasks.items())}): {errors[0][0]}{others}")
    return lines


def _print_table(rows: list[dict], width: int | None = None) -> None:
    """The summary rows on stderr, one line each. Task and configuration names are never cut: their
    columns are as wide as the longest. Where the line must fit ``width`` (default: the terminal's
    when stderr is one; a log keeps its lines whole), a configuration name too long for the room left
    wraps at its commas onto the lines below it, in its column. With several samples per example, ``acc``
    is pass@1 and pass@k follows it. The columns, their short headers and formats are the ``run`` entries of
    analysis/columns.py's table, the one that report.md and report.html read too: ``accept`` is the acceptance
    rate of verified configurations (and of the generate baselines), ``= NTP %`` the share of their samples whose
    output is NTP's ("-" for the others), ``speed_wall`` the decode-time factor, a ratio of totals."""
    from .analysis.columns import run_columns

    task_width = max([4, *(len(r["task"]) for r in rows)])
    columns = run_columns(rows)
    numbers = " ".join(f"{header:>{w}}" for header, w, _ in columns)
    config_width = max([6, *(len(r["config"]) for r in rows)])
    if width is None and sys.stderr.isatty():
        width = shutil.get_terminal_size().columns
    if width:
        config_width = min(config_width, max(20, width - task_width - len(numbers) - 2))
    print(f"{'task':<{task_width}} {'config':<{config_width}} {numbers}", file=sys.stderr)
    for r in rows:
        first, *more = _wrap(r["config"], config_width)
        cells = " ".join(f"{cell(r):>{w}}" for _, w, cell in columns)
        print(f"{r['task']:<{task_width}} {first:<{config_width}} {cells}", file=sys.stderr)
        for piece in more:
            print(f"{'':<{task_width}} {piece}", file=sys.stderr)


def _wrap(name: str, width: int) -> list[str]:
    """A configuration name in lines of at most ``width`` characters, broken after ':' or ',' (inside
    a piece longer than a line only where it must)."""
    lines = [""]
    for piece in filter(None, re.findall(r"[^,:]*[,:]?", name)):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return [line[i:i + width] for line in lines for i in range(0, len(line), width)]


def print_models() -> None:
    from .core.families import FAMILIES, FAMILY_FILE
    from .core.model import shipped_models

    print("model families (detected from config.json's model_type; a folder's sbd_family.json overrides it):")
    for family in FAMILIES.values():
        types = ", ".join(family.model_types) or "any stock transformers causal LM"
        state = "decoded" if family.supported else "refused: " + family.reason
        print(f"  {family.name:<24} {family.description} [model_type: {types}] ({state})")
    print(f"  {FAMILY_FILE:<24} {{\"family\": \"NAME\"}} in a model folder names its family")
    print("shipped models (--model NAME):")
    for name in shipped_models():
        print(f"  {name}")


def cmd_list(args) -> int:
    import dataclasses

    from .registry import solver_registry
    from .tasks import task_registry

    if args.models:
        print_models()
        return 0
    solvers = solver_registry(args.plugins)  # a bad --plugins is refused before a line is printed
    print("solvers:")
    for name, cls in sorted(solvers.items()):
        params = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(cls)) or "no parameters"
        print(f"  {name:<16} {params:<32} {cls.description}")
    print("  every spec also takes the core's options: verify=on|off (block solvers), temperature=T, top_p=P, top_k=K")
    print("tasks:")
    for name, cls in sorted(task_registry().items()):
        tag = " [suite]" if cls.suite else ""
        print(f"  {name:<16} {cls.description}{tag}")
    print("  FILE.jsonl       any JSONL file with id, prompt and optional answer per line")
    print("  NAME:path=FILE   a benchmark read from a local data file, e.g. gsm8k:path=gsm8k_test.jsonl")
    print_models()
    return 0


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already says it or there is none."""

    def _get_help_string(self, action):
        text = action.help or ""
        # identity, not equality: 0 and 0.0 are defaults to show (`0 in (False,)` is true)
        hidden = action.default is None or action.default is False or action.default == [] \
            or action.default is argparse.SUPPRESS
        if action.option_strings and not hidden and "default" not in text:
            text += " (default: %(default)s)"
        return text


def typed_options(argv: list[str], args: argparse.Namespace) -> set[str]:
    """The destinations of the options typed in ``argv`` (abbreviated or not, whatever their value):
    a second parse in which every default is a marker (a list, so that `append` options copy it)."""
    marker = type("Unset", (list,), {})()
    again = build_parser(defaults={dest: marker for dest in vars(args)}).parse_args(argv)
    return {dest for dest, value in vars(again).items() if value is not marker}


def _as_typed(dest: str, argv: list[str]) -> str:
    """The option of ``dest`` as the user typed it (``--no-fast``, ``--sol``), else its full name."""
    option = "--" + dest.replace("_", "-")
    for token in argv:
        name = token.split("=", 1)[0]
        if len(name) > 2 and name.startswith("--") and (option.startswith(name)
                                                        or option.startswith(name.replace("--no-", "--", 1))):
            return name
    return option


def build_parser(defaults: dict | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sbd_bench", description="Set Block Decoding benchmark suite",
                                     epilog="exit status: 0 done; 1 `run` with failed samples or incomplete, "
                                            "`compare` with a regression; 2 bad input; 130 interrupted")
    sub = parser.add_subparsers(dest="command", required=True)

    run_p = sub.add_parser("run", help="decode tasks with solver configurations and write records",
                           epilog="exit status: 0 every sample decoded; 1 some samples failed (one line per failing "
                                  "configuration at the end) or the run is incomplete; 2 bad input, nothing lost; "
                                  "130 interrupted (the resume command is printed)")
    add_decode_options(run_p)
    run_p.add_argument("--solver", default="all",
                       help="'all', a name, a comma list, sweeps 'entropy_bounded:gamma=0.1,0.35;proxy=margin', "
                            "several joined by '+' (ntp is always added as the baseline); @TUNE_DIR: the settings "
                            "`tune` picked there (@TUNE_DIR:TASK: that task's)")
    run_p.add_argument("--task", default="suite",
                       help="task names, 'suite' or JSONL files, comma separated; benchmarks read a local file: "
                            "gsm8k:path=FILE (see 'list')")
    run_p.add_argument("--chat-template", action="store_true",
                       help="benchmark prompts through the tokenizer's chat template (instruct/reasoning models)")
    run_p.add_argument("--thinking", choices=["on", "off"], default=None,
                       help="reasoning mode of the chat template (enable_thinking); default: the template's own")
    run_p.add_argument("--limit", type=int, default=None, help="first N examples of each task (default: all)")
    run_p.add_argument("--out", default=None, help="run folder (default: runs/DATE-TIME)")
    run_p.add_argument("--attn", default="sdpa", help="attention implementation: sdpa|eager|flash_attention_2")
    run_p.add_argument("--batch-size", type=int, default=None,
                       help="sequences decoded together (outputs and NFE those of 1 but where rounding flips a near "
                            "tie; bit for bit with --exact; halved on out-of-memory; default: 16 for a float32 model "
                            "under 100M parameters on the CPU, where outputs are batch 1's, else 1; recorded)")
    run_p.add_argument("--device-map", default=None, metavar="auto",
                       help="spread a model larger than one GPU over all GPUs (needs accelerate)")
    run_p.add_argument("--repeats", type=int, default=1, help="timed decodes per example and config; medians reported")
    run_p.add_argument("--warmup", type=int, default=1, help="unrecorded decodes per config before timing")
    run_p.add_argument("--samples", type=int, default=1,
                       help="decodes of each example per configuration, each with its own recorded seed (pass@k's N)")
    run_p.add_argument("--pass-k", type=int, default=None, metavar="K",
                       help="the k of pass@k reported with --samples N > 1 (default: N)")
    run_p.add_argument("--resume", metavar="RUN_DIR", default=None,
                       help="finish an interrupted run with the settings it was started with (alone: other flags are refused)")
    run_p.add_argument("--no-cost-curve", action="store_true", help="skip timing the 1, k, 2k-token forwards")
    run_p.add_argument("--no-report", action="store_true", help="skip writing report.md and the plots")
    run_p.add_argument("--trace", nargs="?", const="all", default="1", metavar="N|all",
                       help="record every forward (traces.jsonl, the report's decoding timelines) of the first N "
                            "examples of each task, decoded again untimed (default 1; --trace alone: every sample; "
                            "0: none)")
    run_p.set_defaults(func=cmd_run)

    tune_p = sub.add_parser("tune", help="each solver at its fastest setting whose accuracy loss against NTP is "
                                         "certified below --max-loss (Learn then Test), checked on held-out examples",
                            epilog="exit status: 0 done; 1 some samples failed; 2 bad input, nothing decoded; "
                                   "130 interrupted (the resume command is printed)")
    add_decode_options(tune_p)
    add_tune_options(tune_p)
    tune_p.add_argument("--solver", default=None,
                        help="one sweep per solver, joined by '+': 'entropy_bounded:gamma=0.01,0.1,0.35+confidence:"
                             "tau=0.95,0.9' (ntp is the baseline, always decoded)")
    tune_p.add_argument("--task", default="suite",
                        help="as for run; each task needs --order-examples + --calibration + --held-out examples "
                             "(the synthetic tasks draw more with n_test: suite:n_test=520)")
    tune_p.add_argument("--out", default=None, help="tune folder (default: runs/tune-DATE-TIME)")
    tune_p.add_argument("--resume", metavar="TUNE_DIR", default=None,
                        help="finish an interrupted tune with the settings it was started with (alone)")
    tune_p.add_argument("--chat-template", action="store_true", help="as for run")
    tune_p.add_argument("--thinking", choices=["on", "off"], default=None, help="as for run")
    tune_p.add_argument("--attn", default="sdpa", help="as for run")
    tune_p.add_argument("--batch-size", type=int, default=1, help="as for run")
    tune_p.add_argument("--repeats", type=int, default=1, help="as for run")
    tune_p.add_argument("--warmup", type=int, default=1, help="as for run")
    tune_p.add_argument("--samples", type=int, default=1, help="refused above 1: one 0/1 loss per example")
    tune_p.add_argument("--no-cost-curve", action="store_true", help="as for run")
    tune_p.add_argument("--no-report", action="store_true", help="skip each part's report.md and plots")
    tune_p.set_defaults(func=cmd_tune)

    list_p = sub.add_parser("list", help="list solvers (with parameters and defaults), tasks and model families")
    list_p.add_argument("--models", action="store_true", help="only the model families and the shipped models")
    list_p.add_argument("--plugins", action="append", default=[], metavar="DIR",
                        help="folder of solver .py files, listed with the built-in ones")
    list_p.set_defaults(func=cmd_list)

    for name in COMMAND_MODULES:
        importlib.import_module(name).add_cli(sub)
    for command in sub.choices.values():
        command.formatter_class = DefaultsHelpFormatter
        if defaults:
            command.set_defaults(**defaults)
    return parser


def _stdout_is_full() -> bool:
    """Whether stdout is what ran out of space: /dev/full refuses even an empty write; a file on a full
    disk has no free block."""
    fd = sys.stdout.fileno()
    try:
        os.write(fd, b"")
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.fstatvfs(fd).f_bavail == 0
    except OSError:
        return True


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.command_line = " ".join(["python -m sbd_bench", *map(shlex.quote, argv)])  # as recorded in provenance
    args.argv = argv
    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that went away shows up here, not in the interpreter's exit
        return status
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `list | head`: stop quietly; stdout goes to /dev/null so the interpreter's final flush is silent
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        if _stdout_is_full():  # `list > /dev/full`, or stdout to a file on the full disk
            where = "stdout"
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush stays silent
        else:
            where = exc.filename or "a file"
        print(f"error: cannot write {where}: {exc.strerror}: free some space, or send the output to another "
              f"disk", file=sys.stderr)
        return EXIT_USAGE
