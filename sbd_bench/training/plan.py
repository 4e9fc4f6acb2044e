"""``train --plan``: what a training run needs per GPU, without training.

    python -m sbd_bench train --plan --dims llama-3.1-8b --world-size 8 --batch-size 1 --seq-len 2048 --gpu-memory 80

Parameters are counted on the meta device (the model's real modules, no memory). Bytes per GPU:
  weights      fp32 master weights: all P (single, ddp) or this rank's FSDP shard (each tensor's rows
               split over N, padded to a multiple of N, as FSDP2 does)
  in flight    on CUDA, bf16 copies: autocast's copy of every weight (single, ddp), or under FSDP the
               unsharded root (embeddings, LM head, final norm) and two decoder layers (the one
               computing and the one prefetched)
  gradients    fp32, the trained parameters (or their shard); under FSDP plus one unsharded layer's
               bf16 gradients before the reduce-scatter
  optimizer    AdamW: exp_avg and exp_avg_sq in fp32 and a 4-byte step count per trained tensor
  activations  what the backward pass keeps, for T = batch x 2·seq-len tokens (SBD's two copies;
               seq-len for NTP): per decoder layer a·(10h + 4i) + 4·(heads + 2) bytes per token
               (a = 2 in bf16, 4 in fp32; measured exactly for transformers' Llama with sdpa in fp32 on the
               CPU by tests/test_training_features.py), or with activation checkpointing a·h per layer plus
               one layer recomputed; the logits, their fp32 log-softmax and its gradient (T·V·(a + 8)),
               and the (batch, 1, 2L, 2L) attention mask
A run fits when the sum is within --gpu-memory; the CUDA allocator's cache and the CUDA context
(about 1-3 GB) come on top and are not counted.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .config import TrainError

GB = 1e9
# the tokenizers of the --dims presets' published models (none has a mask token): Llama-3.1's fills its
# embedding, so the mask token adds a row; Qwen3's leaves spare rows (151,669 tokens in 151,936 rows)
PRESET_TOKENS = {"llama-3.1-8b": 128_256, "qwen3-8b": 151_669}


def add_plan_options(p) -> None:
    p.add_argument("--plan", action="store_true",
                   help="instead of training: parameters and bytes per GPU (weights, gradients, optimizer state, "
                        "activations) for --world-size, --batch-size, --seq-len and --strategy, and whether they fit "
                        "--gpu-memory")
    p.add_argument("--dims", default=None, metavar="PRESET",
                   help="with --plan: a model by its dimensions instead of --base (llama-3.1-8b, qwen3-8b)")
    p.add_argument("--world-size", type=int, default=None, help="with --plan: GPUs (default: torchrun's, else 1)")
    p.add_argument("--seq-len", type=int, default=2048, help="with --plan: tokens per sequence (prompt + completion)")
    p.add_argument("--gpu-memory", type=float, default=80.0, help="with --plan: GB per GPU (80: H100/A100, 141: H200)")


@dataclass
class Plan:
    parameters: int
    trained: int
    world_size: int
    strategy: str
    batch_size: int
    seq_len: int
    activation_checkpointing: bool
    weights: float
    in_flight: float
    gradients: float
    optimizer: float
    activations: float
    gpu_memory: float
    embedding_rows: int = 0  # the vocabulary the run trains: the model's rows, or more for the added tokens

    @property
    def total(self) -> float:
        return self.weights + self.in_flight + self.gradients + self.optimizer + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_memory


def meta_model(config):
    """The model's modules on the meta device: real shapes, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def preset_config(name: str):
    from transformers import LlamaConfig, Qwen3Config

    from ..analysis.roofline import PRESETS

    if name not in PRESETS:
        raise TrainError(f"unknown --dims {name!r}: use one of {', '.join(PRESETS)}, or --base FOLDER")
    d = PRESETS[name]
    shape = dict(hidden_size=d.hidden, num_hidden_layers=d.layers, num_attention_heads=d.heads,
                 num_key_value_heads=d.kv_heads, head_dim=d.head_dim, intermediate_size=d.intermediate,
                 vocab_size=d.vocab, tie_word_embeddings=False)
    return Qwen3Config(**shape) if name.startswith("qwen3") else LlamaConfig(**shape)


def _shard(numel: int, rows: int, world: int) -> int:
    """Elements of one rank's FSDP2 shard of a tensor: rows split over the ranks, padded."""
    return math.ceil(rows / world) * (numel // max(1, rows))


def plan(model, world: int, strategy: str, batch_size: int, seq_len: int, objective: str = "sbd",
         checkpointing: bool = False, cuda: bool = True, trained=None, gpu_memory: float = 80.0) -> Plan:
    """Bytes per GPU for ``model`` (real or meta). ``trained``: the names of trained parameters (LoRA)."""
    from .parallel import decoder_layers

    params = dict(model.named_parameters(remove_duplicate=True))
    trained = set(params) if trained is None else set(trained)
    P = sum(p.numel() for p in params.values())
    T_numel = sum(params[n].numel() for n in trained)
    a = 2 if cuda else 4
    shard = (lambda p: _shard(p.numel(), p.shape[0] if p.dim() else 1, world)) if strategy == "fsdp" else (lambda p: p.numel())
    held = sum(shard(p) for p in params.values())
    held_trained = sum(shard(params[n]) for n in trained)
    layers = decoder_layers(model)
    layer_numel = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    weights, gradients, in_flight = 4 * held, 4 * held_trained, 0
    if strategy == "fsdp" and world > 1:
        root = P - sum(sum(p.numel() for p in layer.parameters()) for layer in layers)
        in_flight = a * (root + 2 * layer_numel)  # unsharded: the root, the layer computing, the one prefetched
        gradients += a * layer_numel  # one layer's unsharded gradients before the reduce-scatter
    elif cuda and strategy != "fsdp":
        in_flight = 2 * P  # autocast's bf16 copy of each weight, alive until the backward pass uses it
    optimizer = 8 * held_trained + 4 * len(trained)
    c = model.config
    h, i, heads, V = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.vocab_size
    length = 2 * seq_len if objective == "sbd" else seq_len
    tokens = batch_size * length
    per_layer = a * (10 * h + 4 * i) + 4 * (heads + 2)
    kept = len(layers) * (a * h) + per_layer if checkpointing else len(layers) * per_layer
    activations = tokens * (kept + V * (a + 8)) + (batch_size * length * length * a if objective == "sbd" else 0)
    return Plan(P, T_numel, world, strategy, batch_size, seq_len, checkpointing, weights / GB, in_flight / GB, gradients / GB,
                optimizer / GB, activations / GB, gpu_memory, V)


def cmd_plan(args, quiet: bool = False) -> int:
    """Print the plan (``quiet``: check the options only; torchrun's ranks > 0 leave the printing to rank 0)."""
    import re

    from .config import LARGEST, TrainConfig, torchrun_world

    launched = torchrun_world()
    world = args.world_size if args.world_size is not None else (launched[2] if launched else 1)
    for flag, value in (("--world-size", world), ("--seq-len", args.seq_len)):
        if not 1 <= value <= LARGEST:
            raise TrainError(f"{flag} must be >= 1 (got {value})" if value < 1 else f"{flag} {value} is out of range")
    if not (math.isfinite(args.gpu_memory) and args.gpu_memory > 0):
        raise TrainError(f"--gpu-memory must be a finite number of GB > 0 (got {args.gpu_memory:g}), e.g. 80 (H100) "
                         f"or 141 (H200)")
    if args.device is not None and not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", args.device):
        raise TrainError(f"unknown --device {args.device!r}: use auto, cpu, cuda or cuda:N")
    if args.dims and args.base:
        raise TrainError("give --dims or --base, not both: --dims plans a preset's dimensions, --base a model folder")
    if (args.strategy or "") == "single" and world > 1:
        raise TrainError("--strategy single plans one GPU: leave out --world-size, or plan fsdp or ddp")
    # the settings a run would have on `world` ranks (batch, LoRA, dimensions), checked as train checks them
    cfg = TrainConfig(out="", world_size=world, base=args.base, objective=args.objective, batch_size=args.batch_size,
                      global_batch_size=args.global_batch_size, grad_accum=args.grad_accum, strategy=args.strategy,
                      lora_rank=args.lora_rank, hidden_size=args.hidden_size, layers=args.layers, heads=args.heads,
                      intermediate_size=args.intermediate_size, max_positions=args.max_positions)
    strategy, batch = cfg.strategy, cfg.batch_size
    if args.dims:
        config = preset_config(args.dims)
        name, tokens = args.dims, PRESET_TOKENS[args.dims] + 1  # and the mask token
    elif args.base:
        from transformers import AutoConfig

        from .model import build_tokenizer

        if not (Path(args.base) / "config.json").is_file():
            raise TrainError(f"--base {args.base} has no config.json: give a local Hugging Face model folder")
        config, name = AutoConfig.from_pretrained(args.base, local_files_only=True), args.base
        tokens = len(build_tokenizer(cfg, Path(args.base))[0])  # with the mask (and pad) token train adds
    else:
        from transformers import LlamaConfig

        from .tokenizer import char_tokenizer

        tokens = len(char_tokenizer())  # the mask token included: from scratch the model is built for it
        config = LlamaConfig(vocab_size=tokens, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                             num_hidden_layers=args.layers, num_attention_heads=args.heads,
                             max_position_embeddings=args.max_positions, tie_word_embeddings=True)
        name = "from scratch"
    rows = config.vocab_size
    config.vocab_size = max(rows, tokens)  # added tokens take spare rows, else the embeddings grow (model.py)
    model = meta_model(config)
    trained = None
    if args.lora_rank:
        from .model import check_peft, with_lora

        check_peft(cfg)
        model = with_lora(model, args.lora_rank, 0)
        trained = [n for n, p in model.named_parameters() if p.requires_grad]
    cuda = args.device is None or args.device.startswith(("cuda", "auto"))
    result = plan(model, world, strategy, batch, args.seq_len, args.objective, args.activation_checkpointing, cuda,
                  trained, args.gpu_memory)
    ac = ", activation checkpointing" if result.activation_checkpointing else ""
    def count(n: int) -> str:
        return f"{n / 1e9:.3f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"

    if quiet:
        return 0
    unit = "GPU" if cuda else "process"
    grown = f", grown from {rows:,} for the tokens train adds" if config.vocab_size > rows else ""
    print(f"plan: {name}, {count(result.parameters)} parameters ({count(result.trained)} trained, "
          f"{config.vocab_size:,} embedding rows{grown}), {strategy} on {world} {unit}(s), batch {batch} x "
          f"{args.seq_len} tokens per {unit} ({args.objective}{ac}), {'bf16 compute' if cuda else 'fp32'}",
          file=sys.stderr)
    labels = {"weights": "weights (fp32 master)", "in_flight": "weights in flight", "gradients": "gradients",
              "optimizer": "optimizer (AdamW)", "activations": "activations", "total": "total"}
    for key, label in labels.items():
        print(f"  {label:<22} {getattr(result, key):8.2f} GB per {unit}", file=sys.stderr)
    verdict = "fits" if result.fits else "does NOT fit"
    print(f"  {verdict} in {args.gpu_memory:g} GB (allocator cache and CUDA context not counted)", file=sys.stderr)
    print(json.dumps({**asdict(result), "total": result.total, "fits": result.fits, "model": name}))
    return 0
