"""Training checkpoints and the exported model folder.

A checkpoint is ``OUT/checkpoint/``: the model and AdamW state saved by every rank at once as shards
(``torch.distributed.checkpoint``), each rank's step and random state (``rank{R}.pt``), and the model
config and tokenizer (so resuming or exporting needs nothing but this folder). It is written as
``checkpoint.tmp`` and renamed into place once every rank has finished, so a kill mid-save leaves the
previous checkpoint whole. Loading reshards: a checkpoint written by N ranks resumes on M ranks (same
global batch) or in one process, with the same losses.

The export is a plain Hugging Face folder (safetensors, config with ``mask_token_id``, tokenizer with
the mask token, ``training_stages.jsonl``), written by rank 0 at the end of training and by
``train --export`` from any checkpoint; ``run --model`` loads it unchanged. LoRA adapters are merged.
"""
from __future__ import annotations

import contextlib
import shutil
import signal
import threading
from pathlib import Path

from .config import TrainError

CHECKPOINT_DIR = "checkpoint"
LEGACY_STATE_FILE = "training_state.pt"  # the one-process format before sharded checkpoints
STAGES_FILE = "training_stages.jsonl"  # one line per train command that shaped the weights, the base's first
LOG_FILE = "training_log.jsonl"


def latest(out: Path) -> Path | None:
    """The complete checkpoint in ``out`` (the previous one if the kill fell between two renames)."""
    for name in (CHECKPOINT_DIR, CHECKPOINT_DIR + ".old"):
        if (out / name / "rank0.pt").is_file() and (out / name / ".metadata").is_file():
            return out / name
    return None


def read_meta(checkpoint: Path) -> dict:
    """Step, world size, strategy, batch and settings of a checkpoint (rank 0's small file)."""
    import torch

    return torch.load(checkpoint / "rank0.pt", weights_only=False, map_location="cpu")["meta"]


def _state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)  # FQN keys, the same for every strategy
    return {"model": model_state, "optim": optim_state}


def save(model, optimizer, tokenizer, meta: dict, out: Path, par) -> None:
    """Every rank writes its shards; rank 0 writes the config and tokenizer and swaps the folder in. A Ctrl-C
    or SIGTERM meanwhile waits for the folder to be whole (``_signals_wait``)."""
    with _signals_wait() as received:
        _save(model, optimizer, tokenizer, meta, out, par)
    for signum in received:  # the checkpoint is whole: the run stops now, as at any other moment
        signal.raise_signal(signum)


@contextlib.contextmanager
def _signals_wait():
    """SIGINT and SIGTERM wait while a checkpoint is written, and are raised again once it is whole: one that
    lands while torch's file writer (C++) is calling back into Python can end the process with SIGABRT
    instead of raising. A second one during the write acts at once (the partial copy is removed, the
    previous checkpoint kept). Yields the signals received; changes nothing where a signal is ignored or
    left at its default (no Python handler), or off the main thread."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    caught = [signum for signum, handler in previous.items() if callable(handler)]

    def restore():
        for signum in caught:
            signal.signal(signum, previous[signum])

    def wait(signum, frame):
        if received:  # the second: at once
            restore()
            signal.raise_signal(signum)
        received.append(signum)

    for signum in caught:
        signal.signal(signum, wait)
    try:
        yield received
    finally:
        restore()


def _save(model, optimizer, tokenizer, meta: dict, out: Path, par) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from .parallel import unwrapped

    tmp, final, old = out / (CHECKPOINT_DIR + ".tmp"), out / CHECKPOINT_DIR, out / (CHECKPOINT_DIR + ".old")
    if par.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    par.barrier()
    failure = None
    try:
        with _one_process_ok():
            dcp.save(_state(model, optimizer), checkpoint_id=tmp, no_dist=not par.distributed)
        rng = {"cpu": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state(par.device) if par.device.type == "cuda" else None}
        torch.save({"meta": meta, "rng": rng}, tmp / f"rank{par.rank}.pt")
        if par.main:
            config = _base_model(unwrapped(model)).config
            config.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM mid-save: the previous checkpoint is the one kept
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointInterrupted(meta["step"]) from None
    except (OSError, RuntimeError, CheckpointException) as exc:  # a full disk, a quota, a file size limit
        if _interrupt_inside(exc):  # DCP wraps a Ctrl-C in its writer as a rank's failure
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointInterrupted(meta["step"]) from None
        failure = _write_failure(exc)
    failures = [f for f in par.gather(failure) if f]  # every rank learns whether all of them wrote
    if failures:
        if par.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(f"cannot write the checkpoint of step {meta['step']} in {out}: {failures[0]}")
    if par.main:
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    par.barrier()


class CheckpointWriteError(TrainError):
    """A checkpoint could not be written (its partial folder is removed; the previous one is kept)."""


class CheckpointInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) while a checkpoint was being written: its partial folder is removed, the
    previous checkpoint is kept, and the run ends as any interrupted run does (exit status 130)."""

    def __init__(self, step: int):
        super().__init__(f"while writing the checkpoint of step {step}")
        self.step = step


def _interrupt_inside(exc: BaseException) -> bool:
    """Whether a save failed because of a KeyboardInterrupt: DCP hands each rank's exception back in a
    CheckpointException, as (exception, traceback) per rank."""
    from torch.distributed.checkpoint.api import CheckpointException

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, KeyboardInterrupt):
            return True
        if isinstance(exc, CheckpointException):
            return any(_interrupt_inside(failure[0] if isinstance(failure, tuple) else failure)
                       for failure in exc.failures.values())
        exc = exc.__cause__ or exc.__context__
    return False


def _write_failure(exc: BaseException) -> str:
    """The cause of a failed save in words (an OSError's strerror; DCP wraps each rank's in a
    CheckpointException whose text is a traceback)."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(exc, CheckpointException):
        exc = next(iter(exc.failures.values()))[0]
    seen = set()
    while exc is not None and not isinstance(exc, OSError) and id(exc) not in seen:  # the OSError under a wrapper
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc).splitlines()[0][:200] if exc is not None else "unknown error"


def load(model, optimizer, checkpoint: Path, par) -> dict:
    """Weights and optimizer state from ``checkpoint`` (resharded to this world size); the random
    state too when the world size is the one that wrote it. Returns the checkpoint's meta."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer)
    with _one_process_ok():
        dcp.load(state, checkpoint_id=checkpoint, no_dist=not par.distributed)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mine = checkpoint / f"rank{par.rank}.pt"
    extra = torch.load(mine if mine.is_file() else checkpoint / "rank0.pt", weights_only=False, map_location="cpu")
    if extra["meta"]["world_size"] == par.world:
        torch.set_rng_state(extra["rng"]["cpu"])
        if par.device.type == "cuda" and extra["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(extra["rng"]["cuda"], par.device)
    return extra["meta"]


@contextlib.contextmanager
def _one_process_ok():
    """DCP warns that it 'assumes' one process when there is no process group: here that is the intent."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _base_model(model):
    """The transformers model under a peft wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def export(model, tokenizer, dest: Path, par, history: Path | None = None) -> None:
    """Write the plain HF folder (rank 0; every rank takes part in gathering the shards)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from .parallel import unwrapped

    inner = unwrapped(model)
    if par.strategy == "fsdp":
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # a tied weight (lm_head = embeddings) appears under both names: keep the one the model saves
        names = {n for n, _ in inner.named_parameters(remove_duplicate=False)} - {n for n, _ in inner.named_parameters()}
        full = {k: v for k, v in full.items() if k not in names}
    else:
        full = None  # the module itself holds the full weights
    if not par.main:
        return
    if hasattr(inner, "merge_and_unload"):  # LoRA: fold the adapters into the weights
        inner = inner.merge_and_unload()
    _quiet_saves()
    dest.mkdir(parents=True, exist_ok=True)
    inner.save_pretrained(dest, state_dict=full, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    if history is not None and history.resolve() != dest.resolve():
        for name in (STAGES_FILE, LOG_FILE):
            if (history / name).is_file():
                shutil.copyfile(history / name, dest / name)


def _quiet_saves() -> None:
    """transformers draws a 'Writing model shards' bar on stderr at every save: not in train's output."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def check_export_folder(out: Path, dest: Path) -> None:
    """``--export-to DEST``, before anything loads: a folder that can be written and holds nothing the
    export would overwrite or mix with, unless it is an earlier export of these weights (its
    training_stages.jsonl the start of OUT's: this run's, or its --base's) or OUT itself."""
    from ..analysis.records import free_path, prepare_output_folder

    prepare_output_folder(dest, "--export-to", keep=False)  # a file, under a file, unwritable: one line each
    if not dest.is_dir() or dest.resolve() == out.resolve():
        return
    held = sorted(p.name for p in dest.iterdir())
    if not held:
        return
    history = out / STAGES_FILE
    theirs = dest / STAGES_FILE
    if history.is_file() and theirs.is_file():
        mine, earlier = history.read_bytes().splitlines(), theirs.read_bytes().splitlines()
        if earlier and mine[:len(earlier)] == earlier:
            return
    shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
    whose = (f"the export of another training run (its {STAGES_FILE} is not the start of {out}'s)" if theirs.is_file()
             else "not an export of sbd_bench's")
    raise TrainError(f"--export-to {dest} holds {shown}, which are {whose}: the export would overwrite or mix with "
                     f"them; give an empty or new folder, e.g. --export-to {free_path(dest)}")


def export_checkpoint(out: Path, dest: Path, log=print) -> Path:
    """``train --export``: the checkpoint in ``out``, written by any number of ranks, as a HF folder."""
    checkpoint = latest(out)
    if checkpoint is None:
        if (out / LEGACY_STATE_FILE).is_file() and (out / "model.safetensors").is_file():
            raise TrainError(f"{out} was written by an earlier sbd_bench whose checkpoints are already Hugging Face "
                             f"folders: load it with run --model {out}")
        raise TrainError(f"--export: {out} holds no checkpoint ({CHECKPOINT_DIR}/): give the --out folder of a "
                         f"train run that saved at least once")
    from .config import TrainConfig
    from .model import build_model
    from .parallel import Parallel

    meta = read_meta(checkpoint)
    cfg = TrainConfig(**{**meta["config"], "strategy": "single", "world_size": 1, "global_batch_size": None,
                         "resume": False, "overwrite": False})
    import torch

    model, tokenizer = build_model(cfg, checkpoint, from_checkpoint=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    par = Parallel("single", 0, 0, 1, torch.device("cpu"))
    load(model, optimizer, checkpoint, par)
    export(model, tokenizer, dest, par, history=out)
    log(f"exported the step-{meta['step']} checkpoint of {out} (written by {meta['world_size']} rank(s)) to {dest}")
    return dest


def legacy_refusal(out: Path) -> None:
    if (out / LEGACY_STATE_FILE).is_file() and latest(out) is None:
        raise TrainError(f"--resume: {out} holds a {LEGACY_STATE_FILE} from an earlier sbd_bench, not a sharded "
                         f"{CHECKPOINT_DIR}/: continue its weights as a new stage with --base {out} --out NEW")
