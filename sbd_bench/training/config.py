"""The ``train`` command's settings, validated before anything loads (one line per bad value).

    >>> cfg = TrainConfig(out="ft", steps=100, batch_size=4, grad_accum=2, world_size=8)
    >>> cfg.global_batch_size          # 4 sequences per rank x 8 ranks x 2 accumulation steps = 64
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..types import UsageError

STRATEGIES = ("single", "fsdp", "ddp")
LARGEST = 2**31 - 1  # an integer setting past this is a typo (steps, sizes, counts): torch's int32 index range


class TrainError(UsageError):
    """Bad training input; the message names the problem and the fix."""


class RefusalSaid(TrainError):
    """A refusal rank 0 has printed already (before the other ranks were told, so that torchrun,
    which stops every rank once one exits, cannot cut it off): exit status 2, nothing more to say."""


def torchrun_world() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) inside a torchrun worker (even a 1-process one), else None."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and "MASTER_ADDR" not in os.environ:
        return None
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


@dataclass
class TrainConfig:
    out: str
    base: str | None = None  # HF folder to fine-tune; None: a tiny Llama from scratch
    data: str = "suite"  # task names / 'suite' / a JSONL file (prompt + completion, or chat messages)
    objective: str = "sbd"
    steps: int = 2000
    batch_size: int = 32  # sequences per forward on each rank (the micro-batch)
    grad_accum: int = 1  # micro-batches per optimizer step
    global_batch_size: int | None = None  # instead of --batch-size: sequences per optimizer step, all ranks
    lr: float = 2e-3  # sbd-tiny's first stage (models/sbd-tiny/training_stages.jsonl)
    warmup: int = 100
    weight_decay: float = 0.01
    min_block_size: int = 2
    block_size: int = 16  # k ~ U{min_block_size..block_size}
    seed: int = 0
    train_examples: int = 20000  # per built-in task
    save_every: int = 250
    stop_at: int | None = None  # leave after this step (with a checkpoint), the schedule still that of `steps`
    log_every: int = 25
    resume: bool = False
    overwrite: bool = False
    device: str = "cpu"
    threads: int | None = None
    strategy: str | None = None  # single | fsdp | ddp; default fsdp under torchrun with > 1 rank
    activation_checkpointing: bool = False
    lora_rank: int | None = None
    world_size: int = 1  # filled from torchrun's environment
    # from-scratch model (ignored with --base): the shipped sbd-tiny's architecture
    hidden_size: int = 192
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 128
    command: str = ""

    def __post_init__(self):
        for name, value in vars(self).items():
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > LARGEST:
                raise TrainError(f"--{name.replace('_', '-')} {value} is out of range (at most {LARGEST:,})")
        if self.objective not in ("sbd", "ntp"):
            raise TrainError(f"--objective must be sbd or ntp (got {self.objective!r})")
        if not 2 <= self.min_block_size <= self.block_size:
            raise TrainError(f"block sizes must satisfy 2 <= --min-block-size <= --block-size "
                             f"(got {self.min_block_size}, {self.block_size}); k=0 or 1 is no block")
        for name in ("steps", "batch_size", "grad_accum", "save_every", "log_every", "train_examples"):
            if getattr(self, name) < 1:
                raise TrainError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise TrainError(f"--lr must be a finite number > 0 (got {self.lr}); e.g. --lr 1e-4")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise TrainError(f"--weight-decay must be a finite number >= 0 (got {self.weight_decay})")
        if self.warmup < 0:
            raise TrainError(f"--warmup must be >= 0 steps (got {self.warmup}); 0 starts at the full --lr")
        if self.threads is not None and self.threads < 1:
            raise TrainError(f"--threads must be >= 1 (got {self.threads}); leave it out for torch's default")
        if self.lora_rank is not None and self.lora_rank < 1:
            raise TrainError(f"--lora-rank must be >= 1 (got {self.lora_rank}); leave it out to train every weight")
        if self.stop_at is not None and not 1 <= self.stop_at <= self.steps:
            raise TrainError(f"--stop-at must be a step in 1..--steps {self.steps} (got {self.stop_at})")
        if self.resume and self.overwrite:
            raise TrainError("--resume and --overwrite exclude each other: resume continues, overwrite starts over")
        self._resolve_strategy()
        self._resolve_batch()
        if self.base is None:
            for name in ("hidden_size", "layers", "heads", "intermediate_size", "max_positions"):
                if getattr(self, name) < 1:
                    raise TrainError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
            if self.hidden_size % self.heads:
                raise TrainError(f"--hidden-size {self.hidden_size} is not divisible by --heads {self.heads}: each head "
                                 f"gets hidden-size / heads dimensions; e.g. --hidden-size "
                                 f"{max(self.heads, self.hidden_size // self.heads * self.heads)}")

    def _resolve_strategy(self) -> None:
        if self.strategy is None:
            self.strategy = "fsdp" if self.world_size > 1 else "single"
        if self.strategy not in STRATEGIES:
            raise TrainError(f"--strategy must be one of {', '.join(STRATEGIES)} (got {self.strategy!r})")
        if self.strategy == "single" and self.world_size > 1:
            raise TrainError(f"--strategy single under torchrun with {self.world_size} ranks would train "
                             f"{self.world_size} identical copies: use --strategy fsdp or ddp, or run one process")

    def _resolve_batch(self) -> None:
        per_step = self.world_size * self.grad_accum
        if self.global_batch_size is None:
            self.global_batch_size = self.batch_size * per_step
            if self.global_batch_size > LARGEST:
                raise TrainError(f"the global batch --batch-size {self.batch_size} x {self.world_size} rank(s) x "
                                 f"--grad-accum {self.grad_accum} = {self.global_batch_size:,} is out of range (at "
                                 f"most {LARGEST:,})")
            return
        if self.global_batch_size < 1:
            raise TrainError(f"--global-batch-size must be >= 1 (got {self.global_batch_size})")
        if self.global_batch_size % per_step:
            raise TrainError(
                f"--global-batch-size {self.global_batch_size} is not divisible by {self.world_size} rank(s) x "
                f"--grad-accum {self.grad_accum} = {per_step}: each rank takes an equal slice of every micro-batch; "
                f"use a multiple of {per_step}, e.g. {max(1, self.global_batch_size // per_step) * per_step}")
        self.batch_size = self.global_batch_size // per_step

    @property
    def micro_batch_rows(self) -> int:
        """Sequences of one micro-batch over all ranks (the step's batch has grad_accum of them)."""
        return self.batch_size * self.world_size
