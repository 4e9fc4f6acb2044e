"""Batched runs: the harness's records for ``--batch-size N``, decoded N examples of one task at a
time by the core's ``Decoder.generate_batch``, with a batch that does not fit in memory halved until it fits.

    >>> for record in batched_records(lm, todo, cfg): writer.write(record)

Outputs and NFE equal batch 1's (core/decoding.py); records come in the batch-1 order, and a sample's
timings are its 1/N share of its batch's.
"""
from __future__ import annotations

import torch

from ..core.fastpath import FastPath
from ..types import Solver, UsageError
from .memory import MemoryMonitor
from .samples import failed_sample, make_decoder, sample_record


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
    it. Results do not depend on the size (batching equals batch 1), only the timing does."""

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


def _example_chunks(todo: list, batch_size: int) -> list[list[tuple]]:
    """Group ``todo`` [(task, example, ids, repeat, solver)] (examples outer) into chunks of at most
    ``batch_size`` consecutive examples of one task (they share stop strings and budget). Each chunk
    is a list of (task, example, ids, [(repeat, solver), ...])."""
    examples: list[tuple] = []
    for task, example, ids, repeat, solver in todo:
        if examples and examples[-1][0] is task and examples[-1][1] is example:
            examples[-1][3].append((repeat, solver))
        else:
            examples.append((task, example, ids, [(repeat, solver)]))
    chunks: list[list[tuple]] = []
    for item in examples:
        if chunks and chunks[-1][0][0] is item[0] and len(chunks[-1]) < batch_size:
            chunks[-1].append(item)
        else:
            chunks.append([item])
    return chunks


def _decode_chunk(lm, cfg, batcher: FittingBatcher, chunk: list[tuple], repeat: int, solver: Solver) -> dict:
    """{example index in chunk: record} for the chunk's examples that need (repeat, solver)."""
    needed = [i for i, (_, _, _, wanted) in enumerate(chunk) if any(r == repeat and s is solver for r, s in wanted)]
    task = chunk[0][0]

    def decode(part: list[int]) -> list[dict]:
        with MemoryMonitor(lm.device) as mem:
            gens = make_decoder(lm, task, cfg).generate_batch([chunk[i][2] for i in part], solver)
        return [sample_record(task, chunk[i][1], chunk[i][2], solver, cfg, repeat, gen, mem.result, len(part))
                for i, gen in zip(part, gens)]

    try:
        return dict(zip(needed, batcher.run(decode, needed)))
    except Exception as exc:  # noqa: BLE001 - as at batch 1: the error is recorded, the sweep goes on
        free_memory(lm)
        return {i: failed_sample(task, chunk[i][1], chunk[i][2], solver, cfg, repeat, exc) for i in needed}


def batched_records(lm, todo: list, cfg, report=None):
    """The records of ``todo`` [(task, example, ids, repeat, solver)], in that order, decoded
    ``cfg.batch_size`` examples of one task at a time (one batch per repeat and configuration)."""
    import sys

    batcher = FittingBatcher(cfg.batch_size, report or (lambda line: print(line, file=sys.stderr, flush=True)),
                             free=lambda: free_memory(lm))
    for chunk in _example_chunks(todo, cfg.batch_size):
        done: dict[tuple, dict] = {}
        for repeat, solver in dict.fromkeys(pair for *_, wanted in chunk for pair in wanted):
            for i, record in _decode_chunk(lm, cfg, batcher, chunk, repeat, solver).items():
                done[(i, repeat, solver.label)] = record
        for i, (_, _, _, wanted) in enumerate(chunk):
            for repeat, solver in wanted:
                yield done[(i, repeat, solver.label)]


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
