"""Command line: ``python -m sbd_bench {run,list,...}``.

Subcommands live with the code they drive: a module listed in ``COMMAND_MODULES`` defines
``add_cli(subparsers)``, which adds its parser and sets ``func``. Such modules import torch and other
heavy packages inside their functions, so that ``report`` and ``compare`` start fast.
Bad input (any ``UsageError``) is one line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

from .types import UsageError

COMMAND_MODULES: list[str] = ["sbd_bench.training.train", "sbd_bench.analysis.report", "sbd_bench.analysis.compare",
                              "sbd_bench.analysis.roofline", "sbd_bench.runner.throughput"]  # each adds its own subcommand


def _progress(done: int, total: int, elapsed: float, what: str) -> None:
    if not sys.stderr.isatty() and done not in (1, total) and done % max(1, total // 20):
        return  # in logs, about twenty lines per run
    eta = elapsed / done * (total - done)
    end = "\n" if done == total or not sys.stderr.isatty() else ""
    print(f"\r[{done}/{total}] {elapsed:6.1f}s elapsed, ~{eta:5.0f}s left  {what[:60]:<60}", end=end,
          file=sys.stderr, flush=True)


def cmd_run(args) -> int:
    from pathlib import Path

    from .core.model import resolve_model_path
    from .runner import distributed
    from .runner.harness import RunConfig, resume, run
    from .tasks import expand_tasks

    command = " ".join(["python -m sbd_bench", *sys.argv[1:]])
    if args.resume and distributed.launched():
        raise UsageError("--resume runs in one process: resume a data-parallel run without torchrun")
    if args.resume:
        run_dir = resume(Path(args.resume), progress=_progress, command=command)
    else:
        resolve_model_path(args.model)  # the cheapest check first: a typo in --model costs no work
        if distributed.launched() and not args.out:
            raise UsageError("under torchrun pass --out DIR: every rank must name the same run folder")
        out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
        cfg = RunConfig(model=args.model, tasks=expand_tasks(args.task), solvers=args.solver, out=out,
                        block_size=args.block_size, max_new_tokens=args.max_new_tokens, limit=args.limit,
                        seed=args.seed, plugins=args.plugins, device=args.device, dtype=args.dtype,
                        attn_implementation=args.attn, command=command, repeats=args.repeats, warmup=args.warmup,
                        cost_curve=not args.no_cost_curve, report=not args.no_report, threads=args.threads,
                        chat_template=args.chat_template, thinking={"on": True, "off": False}.get(args.thinking),
                        batch_size=args.batch_size, fast=args.fast, compile=args.compile, device_map=args.device_map)
        if distributed.launched():
            run_dir = distributed.run_data_parallel(cfg, progress=_progress)
            if run_dir is None:  # not rank 0: rank 0 reports for the whole run
                return 0
        else:
            run_dir = run(cfg, progress=_progress)
    summary = json.loads((run_dir / "summary.json").read_text())
    _print_table(summary["rows"])
    print(json.dumps({"run_dir": str(run_dir), "complete": summary["complete"], "rows": len(summary["rows"]),
                      "failures": len(summary.get("failures") or [])}))
    return 0 if summary["complete"] else 1


def _print_table(rows: list[dict]) -> None:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    header = f"{'task':<14} {'config':<44} {'n':>4} {'acc':>6} {'nfe':>8} {'tok/fwd':>8} {'speed_nfe':>9} {'speed_wall':>10}"
    print(header, file=sys.stderr)
    for r in rows:
        print(f"{r['task'][:14]:<14} {r['config'][:44]:<44} {r['n']:>4} {fmt(r['accuracy'], '6.3f')} "
              f"{fmt(r['nfe'], '8.1f')} {fmt(r['tokens_per_forward'], '8.2f')} {fmt(r['speed_factor_nfe'], '9.2f')} "
              f"{fmt(r['speed_factor_wall'], '10.2f')}", file=sys.stderr)


def cmd_list(args) -> int:
    import dataclasses

    from .registry import solver_registry
    from .tasks import task_registry

    print("solvers:")
    for name, cls in sorted(solver_registry(args.plugins).items()):
        params = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(cls)) or "no parameters"
        print(f"  {name:<16} {params:<32} {cls.description}")
    print("tasks:")
    for name, cls in sorted(task_registry().items()):
        tag = " [suite]" if cls.suite else ""
        print(f"  {name:<16} {cls.description}{tag}")
    print("  FILE.jsonl       any JSONL file with id, prompt and optional answer per line")
    print("  NAME:path=FILE   a benchmark read from a local data file, e.g. gsm8k:path=gsm8k_test.jsonl")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sbd_bench", description="Set Block Decoding benchmark suite")
    sub = parser.add_subparsers(dest="command", required=True)

    run_p = sub.add_parser("run", help="decode tasks with solver configurations and write records")
    run_p.add_argument("--model", default="sbd-tiny", help="shipped model name or local HF folder (default: sbd-tiny)")
    run_p.add_argument("--solver", default="all",
                       help="'all', a name, a comma list, sweeps 'entropy_bounded:gamma=0.1,0.35;proxy=margin', "
                            "several joined by '+' (ntp is always added as the baseline)")
    run_p.add_argument("--task", default="suite",
                       help="task names, 'suite' or JSONL files, comma separated; benchmarks read a local file: "
                            "gsm8k:path=FILE (see 'list')")
    run_p.add_argument("--chat-template", action="store_true",
                       help="benchmark prompts through the tokenizer's chat template (instruct/reasoning models)")
    run_p.add_argument("--thinking", choices=["on", "off"], default=None,
                       help="reasoning mode of the chat template (enable_thinking); default: the template's own")
    run_p.add_argument("--block-size", type=int, default=16)
    run_p.add_argument("--max-new-tokens", type=int, default=None, help="default: each task's own budget")
    run_p.add_argument("--limit", type=int, default=None, help="first N examples of each task")
    run_p.add_argument("--seed", type=int, default=0)
    run_p.add_argument("--out", default=None, help="run folder (default: runs/DATE-TIME)")
    run_p.add_argument("--plugins", action="append", default=[], metavar="DIR", help="folder of solver .py files")
    run_p.add_argument("--device", default="auto", help="auto|cpu|cuda[:N]")
    run_p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    run_p.add_argument("--attn", default="sdpa", help="attention implementation: sdpa|eager|flash_attention_2")
    run_p.add_argument("--batch-size", type=int, default=1,
                       help="sequences decoded together (same outputs and NFE as 1; halved on out-of-memory)")
    run_p.add_argument("--fast", action=argparse.BooleanOptionalAction, default=None,
                       help="preallocated KV cache + CUDA graphs (default: on for CUDA, off on CPU)")
    run_p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                       help="torch.compile the fast path's forward inside its graphs (default: on with the graphs; "
                            "--no-compile keeps graphs only)")
    run_p.add_argument("--device-map", default=None, metavar="auto",
                       help="spread a model larger than one GPU over all GPUs (needs accelerate)")
    run_p.add_argument("--repeats", type=int, default=1, help="timed decodes per example and config; medians reported")
    run_p.add_argument("--warmup", type=int, default=1, help="unrecorded decodes per config before timing (default 1)")
    run_p.add_argument("--resume", metavar="RUN_DIR", default=None,
                       help="finish an interrupted run with its own settings (other flags are ignored)")
    run_p.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: torch's); 1 gives steadier timings on a shared machine")
    run_p.add_argument("--no-cost-curve", action="store_true", help="skip timing the 1, k, 2k-token forwards")
    run_p.add_argument("--no-report", action="store_true", help="skip writing report.md and the plots")
    run_p.set_defaults(func=cmd_run)

    list_p = sub.add_parser("list", help="list solvers (with parameters and defaults) and tasks")
    list_p.add_argument("--plugins", action="append", default=[], metavar="DIR")
    list_p.set_defaults(func=cmd_list)

    for name in COMMAND_MODULES:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished samples are kept in the run folder", file=sys.stderr)
        return 130
