"""The ``train`` subcommand: its options, and what it prints (log lines on stderr; the last stdout line
is JSON). Bad input is refused in one line before any model loads; under torchrun rank 0 says it.
Each mode (training, --plan, --export, --measure-throughput) reads its own options: one typed for
another mode, which it would ignore, is refused by name (``MODES``).

    python -m sbd_bench train --out ft --base M --data d.jsonl           # train, export to ft
    python -m sbd_bench train --plan --base M --world-size 8 --batch-size 4 --seq-len 2048
    python -m sbd_bench train --export --out ft [--export-to DIR]        # a HF folder from the checkpoint
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from ..types import UsageError
from .config import STRATEGIES, RefusalSaid, TrainConfig, TrainError, torchrun_world


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="fine-tune a causal LM with the SBD objective (or its NTP twin); torchrun for several GPUs",
        description="From scratch, the defaults are the shipped sbd-tiny's first stage: its architecture (Llama, "
                    "hidden 192, 4 layers, 4 heads, FFN 512, 128 positions, character tokenizer), batch 32, lr 2e-3; "
                    "sbd-tiny went on for 8000 steps, then 8000 more with --base (models/sbd-tiny/training_stages.jsonl). "
                    "Under torchrun the model is sharded with FSDP2 (--strategy); the global batch is "
                    "--batch-size x ranks x --grad-accum.",
        epilog="exit status: 0 trained (and exported); 2 bad input, or a non-finite loss (training stopped, the last "
               "checkpoint kept); 130 interrupted (the resume command is printed)")
    d = TrainConfig(out="")
    p.add_argument("--out", default=None, help="output folder: checkpoints while training, the HF model at the end "
                                               "(refused if it holds a checkpoint, unless --resume or --overwrite)")
    p.add_argument("--base", default=None, help="local HF model folder to fine-tune (default: a tiny Llama from scratch "
                                                "with the character tokenizer)")
    p.add_argument("--data", default=d.data, help="'suite', built-in task names (comma list), or a JSONL file with "
                                                  "prompt and completion, or chat 'messages', per line")
    p.add_argument("--objective", default=d.objective, choices=["sbd", "ntp"],
                   help="sbd: the two-copy SBD objective; ntp: its next-token twin on the same batches")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (the cosine schedule ends here)")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="sequences per forward on each rank; the global batch is this x ranks x --grad-accum")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="sequences per optimizer step over all ranks, instead of --batch-size (which it sets to this "
                        "/ ranks / --grad-accum: it must divide); keeps a run's batches the same on any number of GPUs")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-batches per optimizer step")
    p.add_argument("--strategy", default=None, choices=STRATEGIES,
                   help="single: one process; fsdp: FSDP2, each decoder layer then the root sharded (the default under "
                        "torchrun with > 1 rank); ddp: a replica per rank")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each decoder layer in the backward pass instead of keeping its activations")
    p.add_argument("--lora-rank", type=int, default=None, metavar="R",
                   help="train LoRA adapters of rank R (and the mask token's embedding) instead of every weight; "
                        "merged at export; needs peft (pip install 'sbd_bench[lora]')")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW, cosine down to 10%%)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="steps of linear learning-rate warm-up")
    p.add_argument("--min-block-size", type=int, default=d.min_block_size, help="smallest k drawn per step")
    p.add_argument("--block-size", type=int, default=d.block_size, help="k ~ U{min-block-size..block-size} per step")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the model's initialisation and of every batch")
    p.add_argument("--train-examples", type=int, default=d.train_examples, help="per built-in task")
    p.add_argument("--save-every", type=int, default=d.save_every, help="steps between (sharded) checkpoints")
    p.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                   help="leave after STEP with a checkpoint, the learning-rate schedule still that of --steps; "
                        "--resume continues (a job shorter than the run)")
    p.add_argument("--log-every", type=int, default=d.log_every, help="steps between log lines")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out (any number of ranks)")
    p.add_argument("--overwrite", action="store_true", help="replace the checkpoint in --out")
    p.add_argument("--export", action="store_true",
                   help="instead of training: write the HF model of the checkpoint in --out (to --export-to)")
    p.add_argument("--export-to", default=None, metavar="DIR",
                   help="with --export: the folder to write (default --out); refused if it holds files that are not an "
                        "earlier export of the same weights")
    p.add_argument("--device", default=None,
                   help=f"cpu|cuda[:N]|auto (default {d.device}; CUDA: bf16 compute, fp32 master weights; --plan "
                        f"assumes CUDA unless --device cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--hidden-size", type=int, default=d.hidden_size, help="from scratch: model width")
    p.add_argument("--layers", type=int, default=d.layers, help="from scratch: transformer layers")
    p.add_argument("--heads", type=int, default=d.heads, help="from scratch: attention heads (divide --hidden-size)")
    p.add_argument("--intermediate-size", type=int, default=d.intermediate_size, help="from scratch: FFN width")
    p.add_argument("--max-positions", type=int, default=d.max_positions, help="from scratch: longest sequence")
    p.add_argument("--measure-throughput", type=int, default=None, metavar="STEPS",
                   help="instead of training: time STEPS steps of SBD and NTP on copies of the model and the same "
                        "batches (under torchrun too), print tokens/s and the ratio per window; saves nothing")
    from .plan import add_plan_options

    add_plan_options(p)
    p.set_defaults(func=cmd_train)


# What each mode of `train` reads; an option typed for a mode that would ignore it is refused, named.
MODEL_OPTIONS = {"base", "hidden_size", "layers", "heads", "intermediate_size", "max_positions"}
PLAN_ONLY = {"plan", "dims", "world_size", "seq_len", "gpu_memory"}
MODES = {  # mode: (the options it reads, what the mode does (the refusal's reason))
    "plan": (PLAN_ONLY | MODEL_OPTIONS | {"batch_size", "global_batch_size", "grad_accum", "strategy", "objective",
                                          "activation_checkpointing", "lora_rank", "device"}, "--plan only plans"),
    "export": ({"export", "out", "export_to", "threads"}, "--export writes the model of the checkpoint in --out"),
    "measure_throughput": (MODEL_OPTIONS | {"measure_throughput", "data", "batch_size", "global_batch_size",
                                            "grad_accum", "strategy", "activation_checkpointing", "lora_rank", "lr",
                                            "min_block_size", "block_size", "seed", "train_examples", "log_every",
                                            "device", "threads"}, "--measure-throughput measures and saves nothing"),
}


def option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def typed_options(argv: list[str]) -> set[str]:
    """The destinations of the options typed in ``argv`` (``train ...``, abbreviated or not, whatever
    their value): a second parse of them in which every default is a marker."""
    parser = argparse.ArgumentParser(add_help=False)
    sub = parser.add_subparsers(dest="command")
    add_cli(sub)
    train = sub.choices["train"]
    marker = type("Unset", (list,), {})()
    train.set_defaults(**{action.dest: marker for action in train._actions})
    again = parser.parse_args(argv)
    return {dest for dest, value in vars(again).items() if value is not marker and dest not in ("command", "func")}


def check_mode_options(typed: set[str]) -> None:
    """Each mode reads its own options: one typed for another mode would be ignored; refused, named."""
    mode = next((m for m in MODES if m in typed), None)
    if mode is not None:
        reads, what = MODES[mode]
        ignored = sorted(option(dest) for dest in typed - reads)
        if ignored:
            raise TrainError(f"{what}: drop {', '.join(ignored)}")
        return
    owners = {"--plan": sorted(typed & (PLAN_ONLY - {"plan"})), "--export": sorted(typed & {"export_to"})}
    owners = {mode: dests for mode, dests in owners.items() if dests}
    if owners:
        parts = [f"{', '.join(map(option, dests))} {'goes' if len(dests) == 1 else 'go'} with {mode}"
                 for mode, dests in owners.items()]
        one = sum(map(len, owners.values())) == 1
        raise TrainError(f"{'; '.join(parts)}: training would ignore {'it' if one else 'them'}; add "
                         f"{' or '.join(owners)}, or drop {'it' if one else 'them'}")
    if {"global_batch_size", "batch_size"} <= typed:
        raise TrainError("give --global-batch-size or --batch-size, not both: --batch-size is set to the global batch "
                         "/ ranks / --grad-accum")


def _config(args) -> TrainConfig:
    launched = torchrun_world()
    keys = set(TrainConfig.__dataclass_fields__) - {"command", "out", "world_size"}
    # --device left out (None): the config's default
    values = {k: v for k, v in vars(args).items() if k in keys and not (v is None and k == "device")}
    return TrainConfig(out=args.out or "", world_size=launched[2] if launched else 1, command=_command(args),
                       **values)


def _command(args) -> str:
    """The command as typed, with torchrun's launcher in front under torchrun."""
    launched = torchrun_world()
    if launched and launched[2] > 1:
        return args.command_line.replace("python -m sbd_bench", f"torchrun --nproc-per-node {launched[2]} -m sbd_bench", 1)
    return args.command_line


def say(line: str) -> None:
    """A log line on stderr; a reader that went away costs no work (the rest of the log is dropped)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (BrokenPipeError, OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())


def cmd_train(args) -> int:
    launched = torchrun_world()
    try:
        return _cmd_train(args)
    except UsageError as exc:
        if launched and launched[0] != 0:
            if not isinstance(exc, RefusalSaid):
                # every rank refuses alike and rank 0 prints the line; torchrun stops the other ranks as soon
                # as one exits, so this one gives rank 0 the time to print it (and is stopped meanwhile)
                time.sleep(10)
            return 2
        if isinstance(exc, RefusalSaid):
            return 2  # printed already
        raise


def _cmd_train(args) -> int:
    from .plan import cmd_plan

    typed = typed_options(args.argv) if hasattr(args, "argv") else set()
    check_mode_options(typed)
    launched = torchrun_world()
    if args.plan:
        return cmd_plan(args, quiet=bool(launched and launched[0] != 0))
    if args.export:
        if not args.out:
            raise TrainError("--export needs --out: the folder of the train run whose checkpoint to export")
        from .checkpoint import check_export_folder, export_checkpoint

        dest = Path(args.export_to or args.out)
        check_export_folder(Path(args.out), dest)
        if launched and launched[0] != 0:
            return 0  # one process writes the folder (rank 0)
        if args.threads:
            if args.threads < 1:
                raise TrainError(f"--threads must be >= 1 (got {args.threads}); leave it out for torch's default")
            import torch

            torch.set_num_threads(args.threads)
        export_checkpoint(Path(args.out), dest, log=say)
        _stdout({"exported": str(dest)})
        return 0
    cfg = _config(args)
    if args.measure_throughput is not None:
        if args.measure_throughput < 1:
            raise TrainError(f"--measure-throughput must be >= 1 (got {args.measure_throughput})")
        from .train import measure_throughput

        result = measure_throughput(cfg, args.measure_throughput, log=say)
        if result is not None:
            _stdout(result)
        return 0
    if not args.out:
        raise TrainError("--out is required: the folder the trained model is saved to")
    from .train import train

    try:
        with _sigterm_as_interrupt():
            out = train(cfg, log=say)
    except KeyboardInterrupt as exc:
        return _interrupted(cfg, exc)
    _stdout({"out": str(out), "steps": cfg.steps, "objective": cfg.objective,
             "stopped_at": cfg.stop_at if cfg.stop_at and cfg.stop_at < cfg.steps else None})
    return 0


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (a cluster's time limit, torchrun stopping its workers) ends the run like Ctrl-C."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stdout(result: dict) -> None:
    launched = torchrun_world()
    if launched is None or launched[0] == 0:
        print(json.dumps(result), flush=True)


def _interrupted(cfg: TrainConfig, exc: KeyboardInterrupt | None = None) -> int:
    """Ctrl-C or SIGTERM: what is kept, and the exact command that continues (and the one that exports)."""
    from .checkpoint import CheckpointInterrupted, latest, read_meta

    launched = torchrun_world()
    if launched and launched[0] != 0:
        return 130
    out = Path(cfg.out)
    checkpoint = latest(out)
    if checkpoint is None:
        say(f"\ninterrupted before the first checkpoint (every --save-every {cfg.save_every} steps): nothing to resume "
            f"in {out}; start the run again")
        return 130
    words = [w for w in shlex.split(cfg.command) if w not in ("--overwrite", "--resume")]
    resume = " ".join(map(shlex.quote, words)) + " --resume"
    step = read_meta(checkpoint)["step"]
    during = (f" while writing the step-{exc.step} checkpoint (its partial copy is removed)"
              if isinstance(exc, CheckpointInterrupted) else "")
    say(f"\ninterrupted{during}: the step-{step} checkpoint is kept in {out}; continue with\n  {resume}\n"
        f"or write its model now with\n  python -m sbd_bench train --export --out {shlex.quote(str(out))}")
    return 130
