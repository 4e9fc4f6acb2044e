"""SBD fine-tuning (SBD.md §2) and its NTP twin: the training loop.

    python -m sbd_bench train --out models/sbd-tiny                     # tiny Llama from scratch, suite
    python -m sbd_bench train --out models/ntp-tiny --objective ntp      # the NTP twin, same data/steps
    python -m sbd_bench train --base path/to/hf_model --data pairs.jsonl --out ft/  # fine-tune a model
    torchrun --nproc-per-node 8 -m sbd_bench train --base M --data d.jsonl --out ft --global-batch-size 64

A step's batch (its group, sequences, k, η and masks) comes from a generator seeded with (seed, step),
in one piece of ``global_batch_size`` rows. Micro-batch m of rank r is rows [m·N·b + r·b, m·N·b + (r+1)·b)
(b sequences per rank, N ranks, K micro-batches), and each slice's CE sum is divided by the label count
of the whole step: the gradients add up to those of the step's one token-mean, whatever N and K are.
So one process, N ranks and K accumulation steps train the same model (up to float rounding), and a
resumed run continues exactly as the uninterrupted one (checkpoint.py).
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .checkpoint import CHECKPOINT_DIR, LEGACY_STATE_FILE, LOG_FILE, STAGES_FILE
from .config import RefusalSaid, TrainConfig, TrainError, torchrun_world
from .objective import Batch, losses, make_batch

ARGS_FILE = "training_args.json"


class NonFiniteLoss(TrainError):
    """The loss or the gradient norm is inf or NaN: training stops before the update."""


def _has_checkpoint(out: Path) -> bool:
    return out.is_dir() and any((out / f).exists() for f in ("config.json", "model.safetensors", LEGACY_STATE_FILE,
                                                               CHECKPOINT_DIR, CHECKPOINT_DIR + ".old"))


def stage_entry(cfg: TrainConfig, par, base: Path | None, start: int) -> dict:
    from ..core.model import device_name

    return {"command": cfg.command, "objective": cfg.objective, "base": cfg.base if not cfg.resume else None,
            "resume": cfg.resume, "from_step": start, "to_step": cfg.steps, "batch_size": cfg.batch_size,
            "grad_accum": cfg.grad_accum, "world_size": par.world, "strategy": par.strategy,
            "global_batch_size": cfg.global_batch_size, "activation_checkpointing": cfg.activation_checkpointing,
            "lora_rank": cfg.lora_rank, "precision": par.precision, "lr": cfg.lr, "warmup": cfg.warmup,
            "data": cfg.data, "train_examples": cfg.train_examples, "device": str(par.device),
            "machine": device_name(par.device), "threads": cfg.threads,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def param_bytes(model) -> int:
    """Bytes of the parameters this rank holds (its shards under FSDP)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).untyped_storage().nbytes() for p in model.parameters())


def record_stage(cfg: TrainConfig, out: Path, base: Path | None, start: int, par, held: int = 0) -> None:
    """Append this command to ``training_stages.jsonl``: what trained the weights, stage by stage. A
    fine-tune starts from its base's stages (and its log), so a shipped folder tells its whole history."""
    stages = out / STAGES_FILE
    if not cfg.resume and base is not None:
        for name in (STAGES_FILE, LOG_FILE):
            if (base / name).is_file():
                (out / name).write_bytes((base / name).read_bytes())
    previous = stages.read_text(encoding="utf-8").splitlines() if stages.is_file() else []
    entry = {"stage": len(previous) + 1, **stage_entry(cfg, par, base, start), "param_bytes_per_rank": held}
    with open(stages, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")
    with open(out / LOG_FILE, "a", encoding="utf-8") as handle:  # log lines that follow belong to this stage
        handle.write(json.dumps({"stage": entry["stage"], "command": cfg.command, "from_step": start}) + "\n")


def drop_log_past(log_path: Path, step: int) -> None:
    """A killed run has logged windows past its last checkpoint; the resumed run trains and logs those
    steps again, so the earlier lines go (one line per step, the one that belongs to the weights)."""
    if not log_path.is_file():
        return
    lines = log_path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        log_path.write_text("".join(kept), encoding="utf-8")


# ------------------------------------------------------------------------------------------ steps
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine down to 10% of --lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def step_generator(seed: int, step: int):
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def draw_step(groups, cfg: TrainConfig, step: int, pad_id: int, mask_id: int, dtype=None, with_mask: bool = True) -> Batch:
    """Step ``step``'s whole batch (``global_batch_size`` rows): group, indices, k, η and masks all
    from the (seed, step) generator."""
    import torch

    gen = step_generator(cfg.seed, step)
    k = int(torch.randint(cfg.min_block_size, cfg.block_size + 1, (1,), generator=gen))
    pairs = groups[int(torch.randint(len(groups), (1,), generator=gen))]
    indices = torch.randint(len(pairs), (cfg.global_batch_size,), generator=gen).tolist()
    return make_batch(pairs, indices, k, cfg.objective, gen, pad_id, mask_id, dtype, with_mask=with_mask)


def micro_batches(batch: Batch, cfg: TrainConfig, rank: int, dtype):
    """This rank's slices of the step's batch, one per accumulation step."""
    b, rows = cfg.batch_size, cfg.micro_batch_rows
    for m in range(cfg.grad_accum):
        first = m * rows + rank * b
        yield batch.rows(first, first + b, dtype)


def train_step(model, optimizer, batch: Batch, cfg: TrainConfig, par, step: int) -> dict:
    """One optimizer step over this rank's slices; returns the step's sums over all ranks."""
    from .parallel import autocast, grad_norm_and_clip, mask_dtype, sync_gradients

    # each rank's loss is its CE sum over the step's label count, times N: DDP and FSDP average the
    # ranks' gradients, so the result is the gradient of the step's one token-mean
    denominator = max(1, batch.label_count()) / par.world
    sums = [0.0, 0, 0.0, 0]  # ntp CE, ntp targets, matp CE, matp targets
    for m, part in enumerate(micro_batches(batch, cfg, par.rank, mask_dtype(par))):
        with sync_gradients(model, par, last=m == cfg.grad_accum - 1), autocast(par):
            loss, ntp_sum, ntp_n, matp_sum, matp_n = losses(model, part, par.device, denominator)
            loss.backward()
        sums = [a + float(b) for a, b in zip(sums, (ntp_sum, ntp_n, matp_sum, matp_n))]
    ntp, ntp_n, matp, matp_n = par.sum(sums)
    norm = grad_norm_and_clip(model, 1.0)
    loss = (ntp + matp) / max(1, ntp_n + matp_n)
    if not (math.isfinite(loss) and math.isfinite(norm)):
        optimizer.zero_grad(set_to_none=True)
        what = f"the loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {norm}"
        raise NonFiniteLoss(f"step {step + 1}: {what} (lr {lr_at(step, cfg):.3g}): training stopped before this "
                            f"update; lower --lr (or raise --warmup) and start again, or --resume from the last "
                            f"checkpoint")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"ntp": ntp, "ntp_n": ntp_n, "matp": matp, "matp_n": matp_n, "grad_norm": norm}


# ------------------------------------------------------------------------------------------- run
def prepare(cfg: TrainConfig, par, source: Path | None, from_checkpoint: bool, out: Path | None, log):
    """Model (wrapped for the strategy), tokenizer, optimizer and data."""
    import torch

    from .data import fit_to_context, training_groups
    from .parallel import wrap

    from .model import build_tokenizer, context_length

    from_file = Path(cfg.data).suffix in (".jsonl", ".gz") or Path(cfg.data).is_file()
    warn = log if par.main else (lambda line: None)

    def read_data(tokenizer):
        groups = training_groups(cfg.data, tokenizer, cfg.train_examples, cfg.seed, cache_dir=out, warn=warn)
        return fit_to_context(groups, cfg.block_size, context_length(cfg, source), from_file, warn)

    # rank 0 reads, checks (and caches) the data with the tokenizer before any weights load, the others wait:
    # a bad line or block size is refused before minutes of loading, in one line
    groups = main_first(par, lambda: read_data(build_tokenizer(cfg, source, from_checkpoint)[0]))
    model, tokenizer = build_on_ranks(cfg, par, source, from_checkpoint, log)
    if groups is None:  # the other ranks: rank 0's cache of a file; built-in tasks drawn alike
        groups = read_data(tokenizer)
    model = wrap(model.train(), cfg, par)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    return model, tokenizer, optimizer, groups


def main_first(par, work):
    """``work()`` on rank 0 while the other ranks wait (they get None). A refusal there ends every rank:
    rank 0 says it, the others leave quietly with it (no rank is left waiting to time out)."""
    result, refusal = None, None
    if par.main:
        try:
            result = work()
        except TrainError as exc:
            if par.world == 1:
                raise
            refusal = exc
            print(f"error: {exc}", file=sys.stderr, flush=True)  # before the others may exit (cli.main's line)
    said = par.broadcast(str(refusal) if refusal is not None else None) if par.world > 1 else None
    if said is not None:
        raise RefusalSaid(said)
    return result


def build_on_ranks(cfg: TrainConfig, par, source: Path | None, from_checkpoint: bool = False, log=None):
    """(model, tokenizer). Under torchrun rank 0 alone builds (or loads) the weights in host memory;
    the other ranks build the same modules on the meta device (shapes, no memory) from rank 0's config,
    and ``wrap`` copies rank 0's weights into their shards or replicas: a node holds the fp32 model in
    host memory once, not once per GPU. LoRA runs build on every rank (one GPU is its use)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .model import build_model

    if par.world == 1 or cfg.lora_rank:
        return build_model(cfg, source, from_checkpoint, log)
    model, tokenizer = main_first(par, lambda: build_model(cfg, source, from_checkpoint, log)) or (None, None)
    config, tokenizer = par.broadcast((model.config, tokenizer) if par.main else None)
    if not par.main:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
        model.tie_weights()  # as rank 0's model: one parameter for tied embeddings
    assert len(list(model.parameters())) == par.broadcast(len(list(model.parameters()))), "ranks build other modules"
    return model, tokenizer


def check_resume(cfg: TrainConfig, out: Path) -> tuple[Path, dict]:
    """The checkpoint to resume and its meta; refused before any model loads when it cannot continue."""
    from .checkpoint import latest, legacy_refusal, read_meta

    legacy_refusal(out)
    checkpoint = latest(out)
    if checkpoint is None:
        raise TrainError(f"--resume: {out} holds no checkpoint ({CHECKPOINT_DIR}/); start a new run without --resume")
    meta = read_meta(checkpoint)
    if meta["global_batch_size"] != cfg.global_batch_size:
        world, accum = cfg.world_size, cfg.grad_accum
        raise TrainError(f"--resume: the checkpoint in {out} trained with a global batch of {meta['global_batch_size']} "
                         f"({meta['world_size']} rank(s) x {meta['batch_size']} x {meta['grad_accum']} accumulation), "
                         f"this run would use {cfg.global_batch_size} ({world} x {cfg.batch_size} x {accum}): pass "
                         f"--global-batch-size {meta['global_batch_size']} to continue it (any world size reshards)")
    if meta["step"] >= cfg.steps:
        where = "the end" if meta["step"] == cfg.steps else "past the end"
        raise TrainError(f"--resume: the checkpoint in {out} is at step {meta['step']}, {where} of --steps {cfg.steps}: "
                         f"nothing to train; raise --steps to train on, or write its model with train --export --out "
                         f"{out}")
    if cfg.stop_at is not None and cfg.stop_at <= meta["step"]:
        raise TrainError(f"--resume: the checkpoint in {out} is at step {meta['step']}: --stop-at {cfg.stop_at} is not "
                         f"after it; give a later step, or leave --stop-at out")
    if bool(meta["config"].get("lora_rank")) != bool(cfg.lora_rank) or meta["config"]["objective"] != cfg.objective:
        raise TrainError(f"--resume: the checkpoint in {out} trained with --objective {meta['config']['objective']} "
                         f"and --lora-rank {meta['config'].get('lora_rank')}: resume it with the same ones")
    return checkpoint, meta


def train(cfg: TrainConfig, log=print, par=None) -> Path:
    import torch

    from ..analysis.records import prepare_output_folder
    from . import checkpoint as ckpt
    from .model import check_peft
    from .parallel import check_launch, start

    out = Path(cfg.out)
    check_launch(cfg)
    check_peft(cfg)
    theirs = [name for name in ("config.json", "model.safetensors") if (out / name).is_file()]
    if theirs and not any((out / name).exists() for name in (STAGES_FILE, CHECKPOINT_DIR, LEGACY_STATE_FILE)):
        from ..analysis.records import free_path

        # a model folder no train run wrote (no history, no checkpoint): --overwrite must not replace it either
        raise TrainError(f"--out {out} holds {', '.join(theirs)}, which are not a train run's (no {STAGES_FILE}): "
                         f"training would overwrite them; give an empty or new folder, e.g. --out {free_path(out)}")
    if _has_checkpoint(out) and not (cfg.resume or cfg.overwrite):
        raise TrainError(f"{out} already holds a checkpoint: pass --resume to continue it or --overwrite to replace it")
    resume_from = check_resume(cfg, out)[0] if cfg.resume else None
    base = Path(cfg.base) if cfg.base else None
    if base is not None and not base.is_dir():
        raise TrainError(f"--base {base} is not a folder: give a local Hugging Face model folder")
    # a file, a path under a file, no permission: refused before any work. Under torchrun rank 0 alone makes
    # and removes the probe folder (two ranks doing it at once left it behind, or failed the other's probe)
    launched = torchrun_world()
    prepare_output_folder(out, keep=False, write=not launched or launched[0] == 0)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    par = par or start(cfg)
    if not par.main:
        log = lambda line: None  # noqa: E731 - rank 0 speaks for the run
    try:
        out = _train(cfg, par, out, base, resume_from, log)
        par.leave()  # together: no rank leaves while rank 0 still exports
        return out
    finally:
        par.close()  # an error's exit (nothing left to do after leave)


def _train(cfg: TrainConfig, par, out: Path, base: Path | None, resume_from: Path | None, log) -> Path:
    """1. model, data, optimizer; 2. the checkpoint, or a new stage; 3. the steps, logged per window
    and saved every --save-every; 4. the export (not after --stop-at)."""
    from . import checkpoint as ckpt

    # the data is read before the output folder is made: a bad line leaves nothing behind
    model, tokenizer, optimizer, groups = prepare(cfg, par, resume_from or base, resume_from is not None, out, log)
    start = begin_stage(cfg, par, out, base, resume_from, model, optimizer, log)
    log(f"train: {cfg.objective} objective, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params "
        f"({sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6:.2f}M trained), "
        f"{sum(map(len, groups))} examples in {len(groups)} group(s), steps {start}->{cfg.steps}, {par.strategy} on "
        f"{par.world} x {par.device.type}, batch {cfg.global_batch_size} = {cfg.batch_size} x {par.world} rank(s) x "
        f"{cfg.grad_accum} accumulation, {par.precision}")
    window, saved, last = Window(start, cfg.steps), start, min(cfg.steps, cfg.stop_at or cfg.steps)
    with open(out / LOG_FILE, "a", encoding="utf-8") if par.main else contextlib.nullcontext() as log_file:
        for step in range(start, last):
            t0 = time.perf_counter()
            batch = draw_step(groups, cfg, step, tokenizer.pad_token_id, tokenizer.mask_token_id, with_mask=False)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            try:
                sums = train_step(model, optimizer, batch, cfg, par, step)
            except NonFiniteLoss as exc:
                kept = f"the last good checkpoint (step {saved}) is kept in {out}" if saved else "no checkpoint was saved"
                raise NonFiniteLoss(f"{exc}; {kept}") from None
            window.add(sums, batch.tokens, time.perf_counter() - t0)
            done = step + 1
            if done % cfg.log_every == 0 or done == last:
                log(window.close(done, lr_at(step, cfg), sums["grad_norm"], log_file))
            if done % cfg.save_every == 0 or done == last:
                meta = {"step": done, "world_size": par.world, "strategy": par.strategy, "batch_size": cfg.batch_size,
                        "grad_accum": cfg.grad_accum, "global_batch_size": cfg.global_batch_size, "config": asdict(cfg)}
                try:
                    ckpt.save(model, optimizer, tokenizer, meta, out, par)
                except ckpt.CheckpointWriteError as exc:
                    kept = (f"the step-{saved} checkpoint is kept: free some space, then continue with --resume"
                            if saved else "no checkpoint was saved: free some space and start again")
                    raise ckpt.CheckpointWriteError(f"{exc}; {kept}") from None
                saved = done
                log(f"checkpoint: step {done} saved in {out / CHECKPOINT_DIR}")
    if last < cfg.steps:
        log(f"stopped after step {last} (--stop-at) with its checkpoint in {out}; continue with --resume")
        return out
    ckpt.export(model, tokenizer, out, par)
    log(f"exported the trained model to {out} (python -m sbd_bench run --model {out})")
    return out


def begin_stage(cfg: TrainConfig, par, out: Path, base: Path | None, resume_from: Path | None, model, optimizer,
                log) -> int:
    """Load the checkpoint (resume) or clear the folder (overwrite), and record the stage; the first step."""
    import shutil

    from . import checkpoint as ckpt

    if par.main:
        out.mkdir(parents=True, exist_ok=True)
    par.barrier()
    start = 0
    if resume_from is not None:
        meta = ckpt.load(model, optimizer, resume_from, par)
        start = meta["step"]
        if meta["world_size"] != par.world:
            log(f"resuming the step-{start} checkpoint of {meta['world_size']} rank(s) on {par.world}: resharded")
    held = max(par.gather(param_bytes(model)))  # the largest rank's weights (--plan predicts it)
    if par.main:
        if resume_from is not None:
            drop_log_past(out / LOG_FILE, start)
        elif cfg.overwrite:
            for name in (LOG_FILE, STAGES_FILE, LEGACY_STATE_FILE):
                (out / name).unlink(missing_ok=True)
            for name in (CHECKPOINT_DIR, CHECKPOINT_DIR + ".old"):
                shutil.rmtree(out / name, ignore_errors=True)
        record_stage(cfg, out, base, start, par, held)
        (out / ARGS_FILE).write_text(json.dumps(asdict(cfg), indent=1) + "\n")
    return start


class Window:
    """The loss sums, tokens and seconds of the steps since the last log line."""

    def __init__(self, start: int, steps: int):
        self.start, self.steps, self.t_start = start, steps, time.perf_counter()
        self.reset()

    def reset(self) -> None:
        self.ntp = self.matp = self.seconds = 0.0
        self.ntp_n = self.matp_n = self.tokens = 0

    def add(self, sums: dict, tokens: int, seconds: float) -> None:
        self.ntp += sums["ntp"]; self.ntp_n += sums["ntp_n"]  # noqa: E702
        self.matp += sums["matp"]; self.matp_n += sums["matp_n"]  # noqa: E702
        self.tokens += tokens
        self.seconds += seconds

    def close(self, done: int, lr: float, grad_norm: float, log_file) -> str:
        """Write the window's log record (rank 0) and return its line for the terminal."""
        elapsed = time.perf_counter() - self.t_start
        record = {"step": done, "loss": (self.ntp + self.matp) / max(1, self.ntp_n + self.matp_n),
                  "loss_ntp": self.ntp / max(1, self.ntp_n),
                  "loss_matp": self.matp / self.matp_n if self.matp_n else None, "grad_norm": grad_norm,
                  "tokens_per_s": self.tokens / max(1e-9, self.seconds), "lr": lr, "elapsed_s": elapsed}
        if log_file is not None:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
        self.reset()
        eta = elapsed / (done - self.start) * (self.steps - done)
        matp = "-" if record["loss_matp"] is None else f"{record['loss_matp']:.4f}"
        return (f"[{done}/{self.steps}] loss {record['loss']:.4f} (ntp {record['loss_ntp']:.4f}, matp {matp}), "
                f"grad norm {grad_norm:.3f}, {record['tokens_per_s']:.0f} tok/s, {elapsed:.0f}s elapsed, ~{eta:.0f}s left")


# ------------------------------------------------------------------------------------ throughput
def measure_throughput(cfg: TrainConfig, steps: int, log=print, par=None) -> dict:
    """Train two copies of one model side by side, SBD and NTP objectives, on the very same batches
    (same k, same sequences, same lengths), alternating step by step so machine drift hits both, with
    the run's strategy (under torchrun: every rank, the global batch); log tokens/s of each and their
    ratio per window of --log-every steps, and return the totals. Tokens are the real (unpadded)
    sequence tokens, so the SBD figure pays for its second copy. Nothing is saved."""
    import copy

    import torch

    from .data import fit_to_context, training_groups
    from .model import check_peft
    from .parallel import autocast, check_launch, mask_dtype, start, wrap

    check_launch(cfg)
    check_peft(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    par = par or start(cfg)
    if not par.main:
        log = lambda line: None  # noqa: E731
    try:
        model, tokenizer = build_on_ranks(cfg, par, Path(cfg.base) if cfg.base else None, log=log)
        groups = training_groups(cfg.data, tokenizer, cfg.train_examples, cfg.seed, warn=log)
        groups = fit_to_context(groups, cfg.block_size, getattr(model.config, "max_position_embeddings", None),
                                Path(cfg.data).is_file(), log)
        models = {"ntp": wrap(copy.deepcopy(model).train(), cfg, par), "sbd": wrap(model.train(), cfg, par)}
        optimizers = {name: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=cfg.lr)
                      for name, m in models.items()}
        total = {"sbd": 0.0, "ntp": 0.0, "tokens": 0}
        window = dict(total)
        windows = []
        for step in range(steps + 1):  # step 0 warms up and is not timed
            batch = draw_step(groups, cfg, step, tokenizer.pad_token_id, tokenizer.mask_token_id, with_mask=False)
            twin = Batch(ids=batch.ids, ntp_labels=batch.ntp_labels, k=batch.k, tokens=batch.tokens,
                         starts=batch.starts, lengths=batch.lengths, padded_ends=batch.padded_ends)
            for name, whole in (("sbd", batch), ("ntp", twin)):
                par.barrier()
                t0 = time.perf_counter()
                denominator = max(1, whole.label_count()) / par.world
                for part in micro_batches(whole, cfg, par.rank, mask_dtype(par)):
                    with autocast(par):
                        loss = losses(models[name], part, par.device, denominator)[0]
                        loss.backward()
                optimizers[name].step()
                optimizers[name].zero_grad(set_to_none=True)
                if par.device.type == "cuda":
                    torch.cuda.synchronize(par.device)
                par.barrier()  # the step ends when the slowest rank is done
                if step:
                    window[name] += time.perf_counter() - t0
            window["tokens"] += batch.tokens if step else 0
            if step and (step % cfg.log_every == 0 or step == steps):
                windows.append(_throughput_window(window, step))
                log(f"[{step}/{steps}] SBD {windows[-1]['sbd_tokens_per_s']:.0f} tok/s, NTP "
                    f"{windows[-1]['ntp_tokens_per_s']:.0f} tok/s, SBD/NTP = {windows[-1]['sbd_over_ntp']:.3f}")
                total = {key: total[key] + window[key] for key in total}
                window = dict.fromkeys(window, 0)
        result = {**_throughput_window(total, steps), "tokens": total["tokens"], "threads": torch.get_num_threads(),
                  "device": str(par.device), "world_size": par.world, "strategy": par.strategy,
                  "global_batch_size": cfg.global_batch_size, "windows": windows}
        log(f"throughput over {steps} steps: SBD {result['sbd_tokens_per_s']:.0f} tok/s, NTP "
            f"{result['ntp_tokens_per_s']:.0f} tok/s, SBD/NTP = {result['sbd_over_ntp']:.3f}")
        par.leave()
        return result
    finally:
        par.close()


def _throughput_window(window: dict, step: int) -> dict:
    return {"steps": step, "sbd_tokens_per_s": window["tokens"] / max(1e-9, window["sbd"]),
            "ntp_tokens_per_s": window["tokens"] / max(1e-9, window["ntp"]),
            "sbd_over_ntp": window["ntp"] / max(1e-9, window["sbd"])}
