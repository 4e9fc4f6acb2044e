"""Batched runs: the harness's records for ``--batch-size N``, decoded N examples of one task at a
time by the core's ``Decoder.generate_batch``, with a batch that does not fit in memory halved until it fits.

    >>> for record in batched_records(lm, todo, cfg): writer.write(record)

Outputs and NFE are batch 1's (core/decoding.py) wherever rounding does not flip a near tie (a product
over B rows rounds differently from one over 1); with --exact, bit for bit (core/exact.py). Records
come in the batch-1 order, and a sample's timings are its 1/N share of its batch's. The N samples of one
example (``--samples``) are decoded side by side in one batch, each row with its own seed.
"""
from __future__ import annotations

import torch

from ..core.decoding import BrokenModelError
from ..core.fastpath import FastPath
from ..types import Solver, UsageError
from .memory import MemoryMonitor
from .samples import Planned, failed_sample, make_decoder, sample_record


class BatchSizeError(UsageError):
    """A batch size the run cannot use; the message names the fix."""


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or a CPU allocation failure (a RuntimeError from the allocator)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


class FittingBatcher:
    """Decodes lists of prompts in batches of at most ``size``; when a batch does not fit in memory,
    halves the size until one fits, says so on ``report`` once that size has worked, and goes on with
    it. Results do not depend on the size (batching equals batch 1, see the module docstring), only the
    timing does."""

    def __init__(self, size: int, report=None, free=None):
        self.requested = self.size = size
        self.report = report or (lambda line: None)
        self.free = free or free_memory  # called after an out-of-memory, before the retry
        self._failed: int | None = None  # the size that did not fit, until a smaller one has worked

    def run(self, decode, items: list) -> list:
        """``decode(items[i:j]) -> list`` over all items, in order."""
        out, i = [], 0
        while i < len(items):
            part = items[i : i + self.size]
            try:
                out += decode(part)
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is handled, the rest re-raised
                if not is_out_of_memory(exc):
                    raise
                self.free()
                if len(part) == 1:
                    raise BatchSizeError("one sequence alone does not fit in memory: use a smaller model, "
                                         "--dtype bfloat16, --device-map auto, or a smaller --max-new-tokens") from None
                self._failed = self._failed or len(part)
                self.size = max(1, len(part) // 2)
                continue
            if self._failed:
                self.report(f"warning: batch size {self._failed} does not fit in memory; decoding {len(part)} "
                            f"at a time instead, the largest size tried that fits (requested: {self.requested})")
                self._failed = None
            i += len(part)
        return out


def free_memory(lm=None) -> None:
    """Give memory back after an out-of-memory: the fast path's preallocated caches and graphs of
    ``lm`` (the next batch allocates its own), then the allocator's cached blocks."""
    import gc

    if lm is not None:
        FastPath.release(lm)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _example_chunks(todo: list[Planned], batch_size: int) -> list[list[list[Planned]]]:
    """Group ``todo`` (examples outer) into chunks of at most ``batch_size`` consecutive units of one
    task (they share stop strings and budget); a unit is the planned items of one (example, sample)."""
    units: list[list[Planned]] = []
    for item in todo:
        last = units[-1][0] if units else None
        if last and last.task is item.task and last.example is item.example and last.sample == item.sample:
            units[-1].append(item)
        else:
            units.append([item])
    chunks: list[list[list[Planned]]] = []
    for unit in units:
        if chunks and chunks[-1][0][0].task is unit[0].task and len(chunks[-1]) < batch_size:
            chunks[-1].append(unit)
        else:
            chunks.append([unit])
    return chunks


def _decode_chunk(lm, cfg, batcher: FittingBatcher, chunk: list[list[Planned]], repeat: int, solver: Solver) -> dict:
    """{unit index in chunk: record} for the chunk's units that need (repeat, solver)."""
    needed = {i: item for i, unit in enumerate(chunk) for item in unit if item.repeat == repeat and item.solver is solver}
    task = chunk[0][0].task

    def decode(part: list[int]) -> list[dict]:
        items = [needed[i] for i in part]
        seeds = [item.seed for item in items]
        options = {} if all(seed is None for seed in seeds) else {"seeds": seeds}  # a greedy run: --seed for all
        with MemoryMonitor(lm.device) as mem:
            gens = make_decoder(lm, task, cfg).generate_batch([item.ids for item in items], solver, **options)
        return [sample_record(task, item.example, item.ids, solver, cfg, repeat, gen, mem.result, len(part),
                              item.sample, item.seed) for item, gen in zip(items, gens)]

    try:
        return dict(zip(needed, batcher.run(decode, list(needed))))
    except BrokenModelError:  # as at batch 1: the run stops
        raise
    except Exception as exc:  # noqa: BLE001 - as at batch 1: the error is recorded, the sweep goes on
        free_memory(lm)
        return {i: failed_sample(task, item.example, item.ids, solver, cfg, repeat, exc, item.sample, item.seed)
                for i, item in needed.items()}


def batched_records(lm, todo: list[Planned], cfg, report=None):
    """The records of ``todo``, in that order, decoded ``cfg.batch_size`` (example, sample) units of one
    task at a time (one batch per repeat and configuration): the N samples of one example share batches."""
    import sys

    batcher = FittingBatcher(cfg.batch_size, report or (lambda line: print(line, file=sys.stderr, flush=True)),
                             free=lambda: free_memory(lm))
    for chunk in _example_chunks(todo, cfg.batch_size):
        done: dict[tuple, dict] = {}
        for repeat, solver in dict.fromkeys((item.repeat, item.solver) for unit in chunk for item in unit):
            for i, record in _decode_chunk(lm, cfg, batcher, chunk, repeat, solver).items():
                done[(i, repeat, solver.label)] = record
        for i, unit in enumerate(chunk):
            for item in unit:
                yield done[(i, item.repeat, item.solver.label)]


def warm_up_batches(lm, work: list, solvers: list[Solver], cfg) -> None:
    """One unrecorded batch per configuration, so that batch-shaped first-call costs (allocations,
    CUDA graph captures) stay out of the timings."""
    task = work[0][0]
    prompts = [ids for t, _, ids in work if t is task][: cfg.batch_size]
    for solver in solvers:
        try:
            make_decoder(lm, task, cfg).generate_batch(prompts, solver)
        except Exception:  # noqa: BLE001 - a batch that fails here fails (and is recorded) in the sweep
            free_memory(lm)
