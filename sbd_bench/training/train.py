"""SBD fine-tuning (SBD.md §2) and its NTP twin: ``python -m sbd_bench train``.

    python -m sbd_bench train --out models/sbd-tiny                     # tiny Llama from scratch, suite
    python -m sbd_bench train --out models/ntp-tiny --objective ntp      # the NTP twin, same data/steps
    python -m sbd_bench train --base path/to/hf_model --data pairs.jsonl --out ft/  # fine-tune a model

The objective itself (two-copy input, attention mask, losses) is ``objective.py``.
The NTP objective is the clean half alone, with the same batches, prompts and targets.

Batches, k, η and masks of step s come from a generator seeded with (seed, s), so a run resumed from a
checkpoint continues exactly as the uninterrupted run would (on CPU).
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..types import UsageError
from .objective import Batch, losses, make_batch

STATE_FILE = "training_state.pt"
LOG_FILE = "training_log.jsonl"
ARGS_FILE = "training_args.json"
STAGES_FILE = "training_stages.jsonl"  # one line per train command that shaped the weights, the base's first


class TrainError(UsageError):
    """Bad training input; the message names the problem and the fix."""


@dataclass
class TrainConfig:
    out: str
    base: str | None = None  # HF folder to fine-tune; None: a tiny Llama from scratch
    data: str = "suite"  # task names / 'suite' / a JSONL file with prompt + completion
    objective: str = "sbd"
    steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3  # sbd-tiny's first stage (models/sbd-tiny/training_stages.jsonl)
    warmup: int = 100
    weight_decay: float = 0.01
    min_block_size: int = 2
    block_size: int = 16  # k ~ U{min_block_size..block_size}
    seed: int = 0
    train_examples: int = 20000  # per built-in task
    save_every: int = 250
    log_every: int = 25
    resume: bool = False
    overwrite: bool = False
    device: str = "cpu"
    threads: int | None = None
    # from-scratch model (ignored with --base): the shipped sbd-tiny's architecture
    hidden_size: int = 192
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 128
    command: str = ""

    def __post_init__(self):
        if self.objective not in ("sbd", "ntp"):
            raise TrainError(f"--objective must be sbd or ntp (got {self.objective!r})")
        if not 2 <= self.min_block_size <= self.block_size:
            raise TrainError(f"block sizes must satisfy 2 <= --min-block-size <= --block-size "
                             f"(got {self.min_block_size}, {self.block_size}); k=0 or 1 is no block")
        for name in ("steps", "batch_size", "save_every", "log_every", "train_examples"):
            if getattr(self, name) < 1:
                raise TrainError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if not self.lr > 0:
            raise TrainError(f"--lr must be > 0 (got {self.lr})")
        if self.resume and self.overwrite:
            raise TrainError("--resume and --overwrite exclude each other: resume continues, overwrite starts over")
        if self.base is None:
            for name in ("hidden_size", "layers", "heads", "intermediate_size", "max_positions"):
                if getattr(self, name) < 1:
                    raise TrainError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
            if self.hidden_size % self.heads:
                raise TrainError(f"--hidden-size {self.hidden_size} is not divisible by --heads {self.heads}: each head "
                                 f"gets hidden-size / heads dimensions; e.g. --hidden-size "
                                 f"{max(self.heads, self.hidden_size // self.heads * self.heads)}")


# ------------------------------------------------------------------------------------------ data
def training_groups(data: str, tokenizer, train_examples: int, seed: int) -> list[list[tuple[list[int], list[int]]]]:
    """Groups of (prompt ids, completion ids + EOS): one group per built-in task's train split, or
    one for a JSONL file. A step draws its whole batch from one group: sequences of one task have
    similar lengths, so the batch wastes little on padding (about half the positions otherwise)."""
    eos = tokenizer.eos_token_id
    path = Path(data)
    if path.suffix == ".jsonl" or path.is_file():
        rows = _read_pairs(path)
        return [[(tokenizer(p, add_special_tokens=True)["input_ids"],
                  tokenizer(c, add_special_tokens=False)["input_ids"] + [eos]) for p, c in rows]]
    from ..tasks import expand_tasks, load_task

    groups = []
    for name in expand_tasks(data):
        task = load_task(name)
        if not hasattr(task, "n_train"):
            raise TrainError(f"task '{name}' has no train split: train on the built-in suite tasks or a JSONL file "
                             f"with prompt and completion fields")
        task.n_train, task.seed = train_examples, seed
        groups.append([(task.encode(ex, tokenizer), tokenizer(ex.answer, add_special_tokens=False)["input_ids"] + [eos])
                       for ex in task.examples("train")])
    return groups


def _read_pairs(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        raise TrainError(f"data file {path} does not exist: give a JSONL file with prompt/completion or task names")
    from ..tasks import iter_jsonl

    rows = []
    for number, row in iter_jsonl(path, TrainError):
        for name in ("prompt", "completion"):
            if name not in row:
                raise TrainError(f"{path}:{number}: no '{name}' field: training data needs "
                                 f"{{\"prompt\": ..., \"completion\": ...}} per line")
            if not isinstance(row[name], str):
                raise TrainError(f"{path}:{number}: '{name}' is {json.dumps(row[name])[:40]}, not a string: write it "
                                 f"as a JSON string (in quotes)")
        if not row["completion"]:
            raise TrainError(f"{path}:{number}: 'completion' is empty: there is nothing to learn from that line")
        rows.append((row["prompt"], row["completion"]))
    if not rows:
        raise TrainError(f"{path} holds no examples: add lines like {{\"prompt\": \"1+1=\", \"completion\": \"2\"}}")
    return rows


# ----------------------------------------------------------------------------------------- model
def _has_checkpoint(out: Path) -> bool:
    return out.is_dir() and any((out / f).exists() for f in ("config.json", "model.safetensors", STATE_FILE))


def build_model(cfg: TrainConfig, source: Path | None):
    """(model, tokenizer): from ``source`` (a base model or a checkpoint to resume) or from scratch.
    A tokenizer without a mask (or pad) token gets one, and the embeddings are resized."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ..core.model import MASK_TOKEN
    from .tokenizer import char_tokenizer

    if source is None:
        tokenizer = char_tokenizer()
        torch.manual_seed(cfg.seed)
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
            max_position_embeddings=cfg.max_positions, tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = LlamaForCausalLM(config)
    else:
        if not (source / "config.json").exists():
            raise TrainError(f"--base {source} has no config.json: give a local Hugging Face model folder")
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=torch.float32,
                                                         attn_implementation="sdpa")
        except Exception as exc:
            raise TrainError(f"cannot load the model in {source}: {str(exc).splitlines()[0][:200]}; "
                             f"give a local Hugging Face folder with config, weights and tokenizer") from exc
    added = {}
    if tokenizer.mask_token is None:
        added["mask_token"] = MASK_TOKEN
    if tokenizer.pad_token is None:
        added["pad_token"] = "<pad>"
    if tokenizer.eos_token is None:
        raise TrainError(f"the tokenizer in {source} has no EOS token: completions must end with one")
    if added:
        tokenizer.add_special_tokens(added)
        model.resize_token_embeddings(len(tokenizer))
    model.config.mask_token_id = tokenizer.mask_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.bos_token_id = tokenizer.bos_token_id
    return model, tokenizer


def save_checkpoint(model, tokenizer, optimizer, step: int, cfg: TrainConfig, out: Path) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / ARGS_FILE).write_text(json.dumps(asdict(cfg), indent=1) + "\n")
    tmp = out / (STATE_FILE + ".tmp")
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "config": asdict(cfg)}, tmp)
    tmp.replace(out / STATE_FILE)


def record_stage(cfg: TrainConfig, out: Path, base: Path | None, start: int, device) -> None:
    """Append this command to ``training_stages.jsonl``: what trained the weights, stage by stage. A
    fine-tune starts from its base's stages (and its log), so a shipped folder tells its whole history."""
    from ..core.model import device_name

    stages = out / STAGES_FILE
    if not cfg.resume and base is not None:
        for name in (STAGES_FILE, LOG_FILE):
            if (base / name).is_file():
                (out / name).write_bytes((base / name).read_bytes())
    previous = stages.read_text(encoding="utf-8").splitlines() if stages.is_file() else []
    machine = device_name(device)
    entry = {"stage": len(previous) + 1, "command": cfg.command, "objective": cfg.objective,
             "base": cfg.base if not cfg.resume else None, "resume": cfg.resume, "from_step": start, "to_step": cfg.steps,
             "batch_size": cfg.batch_size, "lr": cfg.lr, "warmup": cfg.warmup, "data": cfg.data,
             "train_examples": cfg.train_examples, "device": str(device), "machine": machine,
             "threads": cfg.threads, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
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


# ------------------------------------------------------------------------------------------ loop
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine down to 10% of --lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def step_generator(seed: int, step: int):
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def draw_step(groups, cfg: TrainConfig, step: int, pad_id: int, mask_id: int, dtype=None) -> Batch:
    """Step ``step``'s batch: group, indices, k, η and masks all from the (seed, step) generator."""
    import torch

    gen = step_generator(cfg.seed, step)
    k = int(torch.randint(cfg.min_block_size, cfg.block_size + 1, (1,), generator=gen))
    pairs = groups[int(torch.randint(len(groups), (1,), generator=gen))]
    indices = torch.randint(len(pairs), (cfg.batch_size,), generator=gen).tolist()
    return make_batch(pairs, indices, k, cfg.objective, gen, pad_id, mask_id, dtype)


def check_fits(groups, cfg: TrainConfig, max_positions: int | None) -> None:
    if max_positions is None:
        return
    if cfg.block_size > max_positions:
        raise TrainError(f"--block-size {cfg.block_size} is larger than the model's sequence length "
                         f"(max_position_embeddings={max_positions}): use a block size <= {max_positions}")
    worst = max(len(p) + len(c) + cfg.block_size - 1 for pairs in groups for p, c in pairs)  # last block padded
    if worst > max_positions:
        raise TrainError(f"a training sequence needs {worst} positions (prompt + completion + block padding) but the "
                         f"model holds {max_positions}: shorten the data, lower --block-size or raise --max-positions")


def train(cfg: TrainConfig, log=print) -> Path:
    import torch

    out = Path(cfg.out)
    if _has_checkpoint(out) and not (cfg.resume or cfg.overwrite):
        raise TrainError(f"{out} already holds a checkpoint: pass --resume to continue it or --overwrite to replace it")
    if cfg.resume and not (out / STATE_FILE).exists():
        raise TrainError(f"--resume: {out} holds no {STATE_FILE}; start a new run without --resume")
    from ..analysis.records import prepare_output_folder

    prepare_output_folder(out, keep=False)  # a file, a path under a file, no permission: refused before any work
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    from ..core.model import pick_device

    device = pick_device(cfg.device)
    base = Path(cfg.base) if cfg.base else None
    if base is not None and not base.is_dir():
        raise TrainError(f"--base {base} is not a folder: give a local Hugging Face model folder")
    model, tokenizer = build_model(cfg, out if cfg.resume else base)
    groups = training_groups(cfg.data, tokenizer, cfg.train_examples, cfg.seed)
    check_fits(groups, cfg, getattr(model.config, "max_position_embeddings", None))
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    start = 0
    if cfg.resume:
        state = torch.load(out / STATE_FILE, map_location=device, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        drop_log_past(out / LOG_FILE, start)
    elif cfg.overwrite and out.is_dir():
        for name in (STATE_FILE, LOG_FILE, STAGES_FILE):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    record_stage(cfg, out, base, start, device)
    # CUDA: bf16 autocast, and the mask in the dtype the attention scores will have there (sdpa
    # wants a float mask in the query's dtype). CPU: float32 throughout, reproducible.
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null()
    mask_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    pad_id, mask_id = tokenizer.pad_token_id, tokenizer.mask_token_id
    n_params = sum(p.numel() for p in model.parameters())
    log(f"train: {cfg.objective} objective, {n_params / 1e6:.2f}M params, {sum(map(len, groups))} examples in {len(groups)} group(s), "
        f"steps {start}->{cfg.steps}, device {device}")
    window = {"ntp": 0.0, "ntp_n": 0, "matp": 0.0, "matp_n": 0, "tokens": 0, "time": 0.0}
    t_start = time.perf_counter()
    with open(out / LOG_FILE, "a", encoding="utf-8") as log_file:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            batch = draw_step(groups, cfg, step, pad_id, mask_id, mask_dtype)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            with autocast:
                loss, ntp_sum, ntp_n, matp_sum, matp_n = losses(model, batch, device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            window["ntp"] += float(ntp_sum); window["ntp_n"] += ntp_n
            window["matp"] += float(matp_sum); window["matp_n"] += matp_n
            window["tokens"] += batch.tokens; window["time"] += time.perf_counter() - t0
            done = step + 1
            if done % cfg.log_every == 0 or done == cfg.steps:
                record = {
                    "step": done, "loss_ntp": window["ntp"] / max(1, window["ntp_n"]),
                    "loss_matp": window["matp"] / max(1, window["matp_n"]) if window["matp_n"] else None,
                    "tokens_per_s": window["tokens"] / max(1e-9, window["time"]), "lr": lr_at(step, cfg),
                    "elapsed_s": time.perf_counter() - t_start,
                }
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
                eta = record["elapsed_s"] / (done - start) * (cfg.steps - done)
                matp = "-" if record["loss_matp"] is None else f"{record['loss_matp']:.4f}"
                log(f"[{done}/{cfg.steps}] loss_ntp {record['loss_ntp']:.4f} loss_matp {matp} "
                    f"{record['tokens_per_s']:.0f} tok/s, {record['elapsed_s']:.0f}s elapsed, ~{eta:.0f}s left")
                window = dict.fromkeys(window, 0)
            if done % cfg.save_every == 0 or done == cfg.steps:
                save_checkpoint(model, tokenizer, optimizer, done, cfg, out)
    return out


def measure_throughput(cfg: TrainConfig, steps: int, log=print) -> dict:
    """Train two copies of one model side by side, SBD and NTP objectives, on the very same batches
    (same k, same sequences, same lengths), alternating step by step so machine drift hits both;
    return tokens/s of each and their ratio. Tokens are the real (unpadded) sequence tokens, so the
    SBD figure pays for its second copy. Nothing is saved."""
    import copy

    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    from ..core.model import pick_device

    device = pick_device(cfg.device)
    model, tokenizer = build_model(cfg, Path(cfg.base) if cfg.base else None)
    groups = training_groups(cfg.data, tokenizer, cfg.train_examples, cfg.seed)
    check_fits(groups, cfg, getattr(model.config, "max_position_embeddings", None))
    models = {"sbd": model.to(device).train(), "ntp": copy.deepcopy(model).to(device).train()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=cfg.lr) for name, m in models.items()}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null()
    mask_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    seconds, tokens = {"sbd": 0.0, "ntp": 0.0}, 0
    for step in range(steps + 1):  # step 0 warms up and is not timed
        sbd_batch = draw_step(groups, cfg, step, tokenizer.pad_token_id, tokenizer.mask_token_id, mask_dtype)
        ntp_batch = Batch(ids=sbd_batch.ids, ntp_labels=sbd_batch.ntp_labels, k=sbd_batch.k, tokens=sbd_batch.tokens)
        for name, batch in (("sbd", sbd_batch), ("ntp", ntp_batch)):
            t0 = time.perf_counter()
            with autocast:
                loss = losses(models[name], batch, device)[0]
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            optimizers[name].step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if step:
                seconds[name] += time.perf_counter() - t0
        tokens += sbd_batch.tokens if step else 0
    result = {"steps": steps, "tokens": tokens, "threads": torch.get_num_threads(), "device": str(device),
              "sbd_tokens_per_s": tokens / seconds["sbd"], "ntp_tokens_per_s": tokens / seconds["ntp"],
              "sbd_over_ntp": seconds["ntp"] / seconds["sbd"]}
    log(f"throughput over {steps} steps: SBD {result['sbd_tokens_per_s']:.0f} tok/s, NTP {result['ntp_tokens_per_s']:.0f} "
        f"tok/s, SBD/NTP = {result['sbd_over_ntp']:.3f}")
    return result


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------------- CLI
def add_cli(subparsers) -> None:
    p = subparsers.add_parser("train", help="fine-tune a causal LM with the SBD objective (or its NTP twin)",
                              description="From scratch, the defaults are the shipped sbd-tiny's first stage: its "
                                          "architecture (Llama, hidden 192, 4 layers, 4 heads, FFN 512, 128 positions, "
                                          "character tokenizer), batch 32, lr 2e-3; sbd-tiny went on for 8000 steps, then "
                                          "8000 more with --base (models/sbd-tiny/training_stages.jsonl).")
    d = TrainConfig(out="")
    p.add_argument("--out", default=None, help="output HF folder (required; refused if it holds a checkpoint, "
                                               "unless --resume or --overwrite)")
    p.add_argument("--base", default=None, help="local HF model folder to fine-tune (default: a tiny Llama from scratch "
                                                "with the character tokenizer)")
    p.add_argument("--data", default=d.data, help="'suite', built-in task names (comma list), or a JSONL file with "
                                                  "prompt and completion per line")
    p.add_argument("--objective", default=d.objective, choices=["sbd", "ntp"],
                   help="sbd: the two-copy SBD objective; ntp: its next-token twin on the same batches")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (the cosine schedule ends here)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per step")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW, cosine down to 10%%)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="steps of linear learning-rate warm-up")
    p.add_argument("--min-block-size", type=int, default=d.min_block_size, help="smallest k drawn per step")
    p.add_argument("--block-size", type=int, default=d.block_size, help="k ~ U{min-block-size..block-size} per step")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the model's initialisation and of every batch")
    p.add_argument("--train-examples", type=int, default=d.train_examples, help="per built-in task")
    p.add_argument("--save-every", type=int, default=d.save_every, help="steps between checkpoints")
    p.add_argument("--log-every", type=int, default=d.log_every, help="steps between log lines")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument("--overwrite", action="store_true", help="replace the checkpoint in --out")
    p.add_argument("--device", default=d.device, help="cpu|cuda[:N]|auto (CUDA trains under bf16 autocast)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--hidden-size", type=int, default=d.hidden_size, help="from scratch: model width")
    p.add_argument("--layers", type=int, default=d.layers, help="from scratch: transformer layers")
    p.add_argument("--heads", type=int, default=d.heads, help="from scratch: attention heads (divide --hidden-size)")
    p.add_argument("--intermediate-size", type=int, default=d.intermediate_size, help="from scratch: FFN width")
    p.add_argument("--max-positions", type=int, default=d.max_positions, help="from scratch: longest sequence")
    p.add_argument("--measure-throughput", type=int, default=None, metavar="STEPS",
                   help="instead of training: time STEPS steps of SBD and NTP on copies of the model and the same "
                        "batches, print tokens/s and the ratio; saves nothing")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    keys = set(TrainConfig.__dataclass_fields__) - {"command", "out"}
    cfg = TrainConfig(out=args.out or "", **{k: v for k, v in vars(args).items() if k in keys},
                      command=args.command_line)
    if args.measure_throughput is not None:
        if args.measure_throughput < 1:
            raise TrainError(f"--measure-throughput must be >= 1 (got {args.measure_throughput})")
        result = measure_throughput(cfg, args.measure_throughput, log=lambda line: print(line, file=sys.stderr))
        print(json.dumps(result))
        return 0
    if not args.out:
        raise TrainError("--out is required: the folder the trained model is saved to")
    out = train(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps({"out": str(out), "steps": cfg.steps, "objective": cfg.objective}))
    return 0
