"""Throughput (generated tokens per second) against batch size, per solver configuration: how much
of the multi-token gain survives as batches grow.

    python -m sbd_bench throughput --model sbd-tiny --task arith --solver ntp+entropy_bounded \\
        --batch-sizes 1,4,16 --limit 32 --out runs/throughput.json

For each batch size, every configuration back to back: one unrecorded warm-up batch, then every
example decoded in batches of that size, timed as a whole (median of ``--repeats``); tokens_per_s = generated tokens / wall time, speed_vs_ntp =
tokens_per_s / the NTP baseline's at the same batch size. Outputs at every batch size are compared
with batch 1's (``outputs_match_batch_1``; batching changes them only where rounding flips a near tie,
and never with --exact, whose rows are computed alone). A batch size that does
not fit in memory is reported with the largest size that fit, larger sizes of that configuration
are skipped, and the sweep goes on with the rest.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .options import add_decode_options


def parse_sizes(spec: str) -> list[int]:
    from ..types import UsageError

    try:
        sizes = sorted({int(s) for s in spec.split(",") if s.strip()})
    except ValueError:
        raise UsageError(f"--batch-sizes must be a comma list of integers such as 1,4,16 (got {spec!r})") from None
    if not sizes or sizes[0] < 1:
        raise UsageError(f"--batch-sizes must hold integers >= 1 (got {spec!r})")
    return sizes


def measure(lm, task, prompts: list[list[int]], solver, cfg, batch_size: int, repeats: int = 1) -> tuple[dict, list]:
    """Decode every prompt in batches of ``batch_size``, ``repeats`` times after one warm-up batch;
    returns (figures with the median wall time, per-prompt (output_ids, nfe))."""
    import statistics

    from ..core.model import device_clock
    from .samples import make_decoder

    def decode(part):
        decoder = make_decoder(lm, task, cfg)
        gens = decoder.generate_batch(part, solver)
        return gens, decoder.nfe

    decode(prompts[:batch_size])  # warm-up: allocations, kernel choice, CUDA graph captures
    walls = []
    for _ in range(repeats):
        gens, forwards = [], 0
        start = device_clock(lm.device)
        for i in range(0, len(prompts), batch_size):
            part_gens, part_forwards = decode(prompts[i : i + batch_size])
            gens += part_gens
            forwards += part_forwards
        walls.append(device_clock(lm.device) - start)
    wall = statistics.median(walls)
    tokens, nfe = sum(g.tokens for g in gens), sum(g.nfe for g in gens)
    return {"tokens": tokens, "wall_time_s": wall, "tokens_per_s": tokens / wall if wall > 0 else None,
            "batch_forwards": forwards, "nfe": nfe / len(gens), "tokens_per_forward": tokens / nfe if nfe else None,
            }, [(g.output_ids, g.nfe) for g in gens]


def sweep(lm, task, prompts, solvers, sizes: list[int], cfg, report=lambda line: None, repeats: int = 1) -> list[dict]:
    """Batch sizes outer, configurations inner, so that every configuration at one batch size is
    measured back to back (machine drift hits them alike) and speed_vs_ntp pairs within a size."""
    from .batches import free_memory, is_out_of_memory

    rows = []
    reference, largest_fit, failed_at = {}, {}, {}
    for size in sizes:
        ntp_speed = None
        for solver in solvers:
            label, row = solver.label, {"config": solver.label, "batch_size": size}
            if label in failed_at:  # a larger batch will not fit either
                rows.append({**row, "error": f"skipped: batch size {failed_at[label]} did not fit",
                             "largest_batch_size_that_fit": largest_fit.get(label)})
                continue
            try:
                figures, outputs = measure(lm, task, prompts, solver, cfg, size, repeats)
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is a result; the rest re-raised
                if not is_out_of_memory(exc):
                    raise
                free_memory(lm)
                report(f"warning: {label}: batch size {size} does not fit in memory; the largest size that fit "
                       f"was {largest_fit.get(label, 'none')}; going on with the other configurations")
                rows.append({**row, "error": "out of memory", "largest_batch_size_that_fit": largest_fit.get(label)})
                failed_at[label] = size
                continue
            largest_fit[label] = size
            reference.setdefault(label, outputs)
            if solver.name == "ntp":
                ntp_speed = figures["tokens_per_s"]
            rows.append({**row, **figures,
                         "outputs_match_batch_1": outputs == reference[label] if sizes[0] == 1 else None,
                         "speed_vs_ntp": figures["tokens_per_s"] / ntp_speed if ntp_speed and figures["tokens_per_s"] else None,
                         "error": None})
    return sorted(rows, key=lambda r: [s.label for s in solvers].index(r["config"]))


def is_throughput_file(path: Path) -> bool:
    """Whether ``path`` holds figures this command wrote (it may replace those, never another file)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and str(data.get("command", "")).startswith("python -m sbd_bench throughput")


def cmd_throughput(args) -> int:
    import torch

    from ..analysis.records import check_output_file, write_json_atomic
    from ..core.model import device_name, load_model
    from ..registry import parse_solver_spec, solver_registry
    from ..tasks import expand_tasks, load_task
    from ..types import UsageError
    from .harness import choose_threads
    from .samples import RunConfig, use_fast_path

    sizes = parse_sizes(args.batch_sizes)
    for flag, value in (("--repeats", args.repeats), ("--limit", args.limit)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1 (got {value})")
    out = Path(args.out or f"runs/throughput-{time.strftime('%Y%m%d-%H%M%S')}.json")
    # before the model loads: a folder, an unwritable place or a file another command wrote costs nothing
    check_output_file(out, "throughput.json", is_throughput_file, "throughput")
    cfg = RunConfig(model=args.model, block_size=args.block_size, max_new_tokens=args.max_new_tokens,
                    max_block_forwards=args.max_block_forwards,
                    seed=args.seed, device=args.device, dtype=args.dtype, fast=args.fast, compile=args.compile,
                    cost_curve=False, threads=args.threads, temperature=args.temperature, top_p=args.top_p,
                    top_k=args.top_k, exact=args.exact)
    solvers = parse_solver_spec(args.solver, solver_registry(args.plugins), cfg.sampling)
    names = expand_tasks(args.task)
    if len(names) > 1 and args.task != "suite":  # the rest would be dropped without a word
        raise UsageError(f"throughput measures one task (got {len(names)}: {', '.join(names)}): give one --task, "
                         f"and measure the others in runs of their own")
    task = load_task(names[0])
    available = len(task.examples("test"))
    count = min(available, args.limit)
    too_large = [size for size in sizes if size > count]
    if too_large:  # the batch would hold only the examples there are: its figures would be batch `count`'s
        held = f"--limit {args.limit}" if count == args.limit else f"all of {task.name}'s"
        raise UsageError(f"--batch-sizes {', '.join(map(str, too_large))} {'is' if len(too_large) == 1 else 'are'} "
                         f"larger than the {count} examples decoded at each size ({held}): a batch cannot hold more "
                         f"examples than there are; give sizes up to {count}"
                         + (f", or raise --limit to {too_large[-1]}" if available >= too_large[-1] else ""))
    lm = load_model(args.model, device=args.device, dtype=args.dtype, exact=args.exact, family=args.family)
    threads, threads_chosen = choose_threads(args.threads, lm)
    torch.set_num_threads(threads)
    prompts = [task.encode(e, lm.tokenizer) for e in task.examples("test")[: args.limit]]
    rows = sweep(lm, task, prompts, solvers, sizes, cfg, report=lambda line: print(line, file=sys.stderr),
                 repeats=args.repeats)
    result = {"command": args.command_line, "date": time.strftime("%Y-%m-%d"),
              "model": lm.path, "task": task.name, "examples": len(prompts), "block_size": args.block_size,
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "device": str(lm.device),
              "device_name": device_name(lm.device), "threads": torch.get_num_threads(), "threads_chosen": threads_chosen,
              "fast": use_fast_path(cfg, lm), "exact": lm.exact,
              "torch": torch.__version__, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result)
    width = max([44, *(len(r["config"]) for r in rows)])  # every configuration's name whole (verify=on ends some)
    print(f"{'config':<{width}} {'batch':>5} {'tok/s':>9} {'vs ntp':>7} {'tok/fwd':>8} {'same':>5}", file=sys.stderr)
    for r in rows:
        if r.get("error"):
            print(f"{r['config']:<{width}} {r['batch_size']:>5} {r['error']}", file=sys.stderr)
            continue
        vs = "-" if r["speed_vs_ntp"] is None else f"{r['speed_vs_ntp']:.2f}"
        print(f"{r['config']:<{width}} {r['batch_size']:>5} {r['tokens_per_s']:>9.1f} {vs:>7} "
              f"{r['tokens_per_forward']:>8.2f} {str(r['outputs_match_batch_1']):>5}", file=sys.stderr)
    print(json.dumps({"out": str(out), "rows": len(rows), "errors": sum(bool(r.get("error")) for r in rows)}))
    mismatched = any(r.get("outputs_match_batch_1") is False for r in rows)
    return 1 if mismatched else 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("throughput", help="generated tokens/s against batch size, per solver configuration")
    add_decode_options(p)
    p.add_argument("--task", default="suite", help="one task name or JSONL file (the first, for 'suite')")
    p.add_argument("--solver", default="ntp+entropy_bounded", help="solver spec, as for `run`")
    p.add_argument("--batch-sizes", default="1,2,4,8", help="comma list")
    p.add_argument("--limit", type=int, default=16, help="examples decoded at every batch size")
    p.add_argument("--repeats", type=int, default=1, help="timed passes per point; the median is reported")
    p.add_argument("--out", default=None, help="JSON file for the figures (default: runs/throughput-DATE-TIME.json)")
    p.set_defaults(func=cmd_throughput)
