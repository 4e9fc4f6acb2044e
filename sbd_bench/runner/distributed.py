"""Data-parallel runs under torchrun: each rank decodes its share of the examples, rank 0 writes one
run folder with the records and summary a single process would have written (timings aside).

    torchrun --nproc-per-node 8 -m sbd_bench run --model M --task T --out runs/x        # one node
    torchrun --nnodes 2 --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
             --nproc-per-node 8 -m sbd_bench run ...                                   # two nodes

The split is deterministic: example i (in the single-process order) goes to rank i mod world_size.
Each rank runs the ordinary harness into ``OUT/.rankR`` (its records flushed as it goes, so a
crash loses little), then the records are gathered on rank 0 (gloo on CPU, NCCL on GPU), put back
in the single-process order, and summarised once. Any rank that fails makes the whole run fail:
rank 0 names the rank and its error, writes ``summary.json`` with ``complete: false``, and every
rank exits non-zero.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import traceback
from dataclasses import replace
from pathlib import Path

from ..analysis.records import write_json_atomic
from ..types import UsageError

GATHER_TIMEOUT_HOURS = 72  # how long rank 0 waits for the slowest rank's records


class DistributedError(UsageError):
    """A data-parallel run that cannot start or did not finish; the message names the rank and fix."""


def launched() -> bool:
    """True inside a torchrun worker group of more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def shard_work(work, rank: int, world: int) -> list:
    """Rank ``rank``'s share: items rank, rank + world, ... of the single-process order."""
    if world > len(work):
        raise DistributedError(f"torchrun started {world} ranks for {len(work)} examples: start at most "
                               f"{len(work)} processes (--nproc-per-node x --nnodes), or run more examples")
    return list(work[rank::world])


def merge_in_order(per_rank: list[list[dict]]) -> list[dict]:
    """Records of every rank, in the single-process order. A rank's records come example by example
    (all configurations of one example together); its j-th example is global example rank + j*world."""
    world, keyed = len(per_rank), []
    for rank, records in enumerate(per_rank):
        example, last = -1, None
        for position, rec in enumerate(records):
            if (rec["task"], rec["id"]) != last:
                example, last = example + 1, (rec["task"], rec["id"])
            keyed.append((rank + example * world, position, rec))
    return [rec for *_, rec in sorted(keyed, key=lambda item: item[:2])]


def _rank_device(cfg, local_rank: int) -> str:
    import torch

    if cfg.device in ("auto", "cuda") and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return f"cuda:{local_rank}"
    if cfg.device.startswith("cuda:"):
        raise DistributedError(f"--device {cfg.device} under torchrun: use --device auto (rank r takes cuda:LOCAL_RANK)")
    return cfg.device


def run_data_parallel(cfg, progress=None) -> Path | None:
    """Run ``cfg`` as this torchrun rank. Returns the run folder on rank 0 and None on the others."""
    import torch.distributed as dist

    from ..analysis.records import read_records
    from .harness import run

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cfg.device_map is not None:
        raise DistributedError("--device-map cannot be combined with torchrun: each rank holds a whole model on "
                               "its own GPU; for a model larger than one GPU run one process with --device-map auto")
    _check_enough_examples(cfg, world)  # every rank stops here alike, before any rendezvous
    if rank == 0 and read_records(Path(cfg.out) / "samples.jsonl"):  # (torchrun then stops the others)
        raise DistributedError(f"{cfg.out} already holds records: choose another --out "
                               f"(a data-parallel run always starts afresh)")
    device = _rank_device(cfg, local_rank)
    # ranks talk only at the end, and one may finish hours before the last: the default collective
    # timeout (10 min for NCCL) would kill a long, unevenly split run at the final gather
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo",
                            timeout=datetime.timedelta(hours=GATHER_TIMEOUT_HOURS))
    out = Path(cfg.out)
    try:
        shard_dir = out / f".rank{rank}"
        status = {"rank": rank, "error": None, "usage_error": False}
        records, summary, traces = [], None, b""
        try:
            shard_cfg = replace(cfg, out=shard_dir, device=device, shard=(rank, world), report=False,
                                cost_curve=cfg.cost_curve and rank == 0)  # one report, one cost curve: rank 0's
            run(shard_cfg, progress if rank == 0 else None)
            records = read_records(shard_dir / "samples.jsonl")
            summary = json.loads((shard_dir / "summary.json").read_text())
            if (shard_dir / "traces.jsonl").exists():
                traces = (shard_dir / "traces.jsonl").read_bytes()
        except UsageError as exc:
            status.update(error=str(exc), usage_error=True)
        except Exception as exc:  # noqa: BLE001 - reported by rank 0 for the whole run
            status["error"] = f"{type(exc).__name__}: {exc}"
            shard_dir.mkdir(parents=True, exist_ok=True)
            (shard_dir / "error.txt").write_text(traceback.format_exc())
        gathered = [None] * world if rank == 0 else None
        dist.gather_object((status, records, summary, traces), gathered, dst=0)
        outcome = [None]
        if rank == 0:
            outcome[0] = _write_merged(out, gathered, cfg, world)
            if outcome[0] is not None:  # printed before the others learn of it and exit, which
                print(f"error: {outcome[0]}", file=sys.stderr, flush=True)  # makes torchrun stop rank 0
        dist.broadcast_object_list(outcome, src=0)
        # every rank past the broadcast before any tears its connections down: gloo aborts a process (SIGABRT,
        # "connection closed by peer") whose peer closes while it is still reading the last message
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if outcome[0] is not None:
        sys.exit(2)  # exit status 2, as for any UsageError; rank 0 has said why
    if (out / f".rank{rank}").exists():
        shutil.rmtree(out / f".rank{rank}")
    return out if rank == 0 else None


def _check_enough_examples(cfg, world: int) -> None:
    from ..tasks import load_task

    count = sum(len(load_task(name).examples("test")[: cfg.limit]) for name in cfg.tasks)
    shard_work(range(count), 0, world)


def _write_merged(out: Path, gathered: list, cfg, world: int) -> str | None:
    """On rank 0: write samples.jsonl, summary.json (and the report) for the whole run. Returns None
    when every rank succeeded, else the message that says which rank failed and why."""
    from ..analysis.records import RecordWriter
    from .harness import write_summary

    statuses = [status for status, _, _, _ in gathered]
    failures = [s for s in statuses if s["error"]]
    errors = {s["error"] for s in failures}
    if failures and len(failures) == world and len(errors) == 1 and failures[0]["usage_error"]:
        return failures[0]["error"]  # the same bad input on every rank: no run folder to speak of
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.jsonl").unlink(missing_ok=True)
    writer = RecordWriter(out / "samples.jsonl")
    for record in merge_in_order([recs for _, recs, _, _ in gathered]):
        writer.write(record)
    writer.close()
    traces = b"".join(lines for _, _, _, lines in gathered)
    if traces:
        (out / "traces.jsonl").write_bytes(traces)
    summaries = [summary for _, _, summary, _ in gathered]
    base = next((summary for summary in summaries if summary), None) or {"provenance": {}}
    provenance = dict(base.get("provenance", {}))
    provenance["config"] = {**provenance.get("config", {}), "out": str(out), "shard": None}
    provenance["world_size"] = world
    summary = {**base, "provenance": provenance}
    planned = sum(((s or {}).get("samples") or {}).get("planned", 0) for s in summaries)
    write_summary(out, summary, planned)
    if failures:
        summary["error"] = "; ".join(f"rank {s['rank']}: {s['error']}" for s in failures)
        summary["complete"] = False
        write_json_atomic(out / "summary.json", summary)
        names = ", ".join(str(s["rank"]) for s in failures)
        first = failures[0]
        return (f"rank {names} of {world} failed ({first['error']}); the run is incomplete: "
                f"{out / 'summary.json'} says complete: false (details under {out}/.rank{first['rank']})")
    if cfg.report:
        from ..analysis.report import write_report

        write_report(out)
    return None
