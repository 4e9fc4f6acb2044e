"""Cost model: what a run's forwards-per-block profile is worth in wall-clock time on some hardware.

    python -m sbd_bench roofline --dims llama-3.1-8b --block-size 16          # forward cost curve
    python -m sbd_bench roofline runs/x                                       # predicted speed factors

A forward with q query tokens over a cache of c tokens costs, per matrix product and for attention,
``max(flops / peak_flops, bytes / bandwidth)`` (SBD.md §5), with real dimensions: q, k, v (grouped KV
heads), o, the gated FFN's three matrices, and the LM head. ``measured`` instead interpolates the
per-forward cost curve that ``run`` times on its own machine (1, k, 1+k and 2k query tokens).

A block that takes l forwards costs ``t(first) + (l-1)·t(k)``, where the first forward also carries
the previous block causally (q = 2k; q = 1+k right after the prompt); NTP costs ``t(1)`` per token.
The predicted wall-clock speed factor pairs each example with its NTP run and divides the totals, like
the measured one (metrics.py, speed_factor_wall).
Pure arithmetic on records: no torch here (``report`` imports this module); the cost curve is
measured by ``runner/costcurve.py``.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from ..types import UsageError
from .metrics import BASELINE_SOLVER, collapse_repeats, pairing_key, ratio_of_totals


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense bf16, FLOP/s
    bandwidth: float  # HBM, bytes/s


# Datasheet figures (SXM parts, dense bf16, no sparsity).
HARDWARE = {
    "H100": Hardware("H100", 989.4e12, 3.35e12),
    "H200": Hardware("H200", 989.4e12, 4.8e12),
    "A100": Hardware("A100", 312e12, 2.039e12),
}


@dataclass(frozen=True)
class ModelDims:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    bytes_per_value: int = 2  # bf16 weights, activations and cache

    @classmethod
    def from_config(cls, config: dict, bytes_per_value: int = 2) -> "ModelDims":
        """From a Hugging Face config dict (Llama/Qwen-style names)."""
        try:
            heads = config["num_attention_heads"]
            return cls(hidden=config["hidden_size"], layers=config["num_hidden_layers"], heads=heads,
                       kv_heads=config.get("num_key_value_heads") or heads,
                       head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                       intermediate=config["intermediate_size"], vocab=config["vocab_size"],
                       bytes_per_value=bytes_per_value)
        except KeyError as exc:
            raise UsageError(f"model config lacks {exc}: the cost model needs Llama/Qwen-style dimensions") from None

    def matrices(self) -> list[tuple[int, int]]:
        """(in, out) of every matrix product of one layer: attention projections and gated FFN."""
        h, q_dim, kv_dim, ffn = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return [(h, q_dim), (h, kv_dim), (h, kv_dim), (q_dim, h), (h, ffn), (h, ffn), (ffn, h)]

    @property
    def parameters(self) -> int:
        return self.layers * sum(i * o for i, o in self.matrices()) + 2 * self.hidden * self.vocab


PRESETS = {
    "llama-3.1-8b": ModelDims(4096, 32, 32, 8, 128, 14336, 128256),
    "qwen3-8b": ModelDims(4096, 36, 32, 8, 128, 12288, 151936),
}


def forward_time(dims: ModelDims, hw: Hardware, q: int, context: int, batch: int = 1) -> float:
    """Roofline time (s) of one forward: ``q`` query tokens per sequence, ``context`` cached tokens."""
    b, rows = dims.bytes_per_value, batch * q

    def matmul(n_in: int, n_out: int) -> float:
        flops = 2 * rows * n_in * n_out
        moved = n_in * n_out * b + rows * (n_in + n_out) * b  # weights once, activations in and out
        return max(flops / hw.peak_flops, moved / hw.bandwidth)

    keys = context + q  # every query may see the cache and the block: an upper bound for causal rows
    attn_flops = 2 * 2 * batch * dims.heads * q * keys * dims.head_dim  # QK^T and PV
    attn_bytes = batch * (2 * keys * dims.kv_heads + 2 * q * dims.heads) * dims.head_dim * b
    attention = max(attn_flops / hw.peak_flops, attn_bytes / hw.bandwidth)
    layer = sum(matmul(i, o) for i, o in dims.matrices()) + attention
    return dims.layers * layer + matmul(dims.hidden, dims.vocab)


def measured_time_fn(curve: dict) -> Callable[[int, int], float]:
    """t(q, context) from a measured cost curve: piecewise linear in q (context is fixed)."""
    points = sorted(zip(curve["query_tokens"], curve["time_s"]))
    if len(points) < 2:
        raise UsageError("the measured cost curve needs at least two points: re-run with the cost curve on")

    def t(q: int, context: int = 0) -> float:
        for (q0, t0), (q1, t1) in zip(points, points[1:]):
            if q <= q1 or (q1, t1) == points[-1]:
                return t0 + (t1 - t0) * (q - q0) / (q1 - q0)
        return points[-1][1]

    return t


def sample_cost(rec: dict, t: Callable[[int, int], float]) -> float:
    """Predicted time of one sample from its record: NTP one 1-token forward per nfe; a block solver
    t(1+k) or t(2k) for each block's first forward and t(k) for the others."""
    context = rec.get("prompt_tokens", 0) + rec.get("tokens", 0) // 2
    if rec["solver"] == BASELINE_SOLVER or not rec.get("forwards_per_block"):
        return rec["nfe"] * t(1, context)
    k = rec["block_size"]
    cost = 0.0
    for index, forwards in enumerate(rec["forwards_per_block"]):
        cost += t(1 + k if index == 0 else 2 * k, context) + (forwards - 1) * t(k, context)
    return cost


def predicted_speed_factors(records: list[dict], t: Callable[[int, int], float]) -> dict[tuple[str, str], float]:
    """(config, task) -> Σ cost(ntp) / Σ cost(config) over the paired examples: a ratio of totals, as
    the measured speed_factor_wall."""
    samples = [r for r in collapse_repeats(records) if not r.get("error")]
    base = {pairing_key(r): sample_cost(r, t) for r in samples if r["solver"] == BASELINE_SOLVER}
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in samples:
        if pairing_key(r) in base:
            pairs[(r["config"], r["task"])].append((base[pairing_key(r)], sample_cost(r, t)))
    factors = {key: ratio_of_totals(values) for key, values in pairs.items()}
    return {key: value for key, value in factors.items() if value is not None}


def run_dims(summary: dict) -> ModelDims | None:
    config = (summary.get("provenance") or {}).get("model_config")
    return ModelDims.from_config(config) if config else None


def prediction_columns(summary: dict, records: list[dict], hardware=("H100",), batch: int = 1,
                       presets=("llama-3.1-8b",)) -> dict[str, dict[tuple[str, str], float]]:
    """Column name -> predicted speed factors: the measured curve, each hardware with the run's own model
    dimensions, and each hardware with a preset's (what this decoding profile would give at that size)."""
    columns: dict[str, dict] = {}
    curve = summary.get("cost_curve")
    if curve:
        columns["pred_measured"] = predicted_speed_factors(records, measured_time_fn(curve))
    dims = run_dims(summary)
    for hw_name in hardware:
        hw = HARDWARE[hw_name]
        targets = ([("this_model", dims)] if dims else []) + [(p, PRESETS[p]) for p in presets]
        for label, d in targets:
            columns[f"pred_{hw_name}_{label}"] = predicted_speed_factors(
                records, lambda q, c, d=d, hw=hw: forward_time(d, hw, q, c, batch))
    return columns


# ------------------------------------------------------------------------------------------ the CLI
def _curve_table(dims: ModelDims, k: int, context: int, batch: int, hardware: list[str]) -> list[str]:
    lines = [f"forward time, {dims.parameters / 1e9:.2f}B parameters, context {context}, batch {batch}, k={k}",
             "| hardware | t(1) ms | t(k) ms | t(2k) ms | t(k)/t(1) | t(2k)/t(1) |", "|---|---|---|---|---|---|"]
    for hw in (HARDWARE[name] for name in hardware):
        t1, tk, t2k = (forward_time(dims, hw, q, context, batch) for q in (1, k, 2 * k))
        lines.append(f"| {hw.name} | {t1 * 1e3:.3f} | {tk * 1e3:.3f} | {t2k * 1e3:.3f} | {tk / t1:.3f} | {t2k / t1:.3f} |")
    return lines


def cmd_roofline(args) -> int:
    from pathlib import Path

    from .records import load_run

    hardware = [h.strip() for h in args.hardware.split(",") if h.strip()]
    unknown = [h for h in hardware if h not in HARDWARE]
    if unknown or not hardware:
        raise UsageError(f"unknown --hardware {', '.join(unknown) or repr(args.hardware)}: use a comma list of "
                         f"{', '.join(HARDWARE)}")
    for flag, value, least in (("--block-size", args.block_size, 1), ("--batch", args.batch, 1),
                               ("--context", args.context, 0)):
        if value < least:
            raise UsageError(f"{flag} must be >= {least} (got {value})")
    if args.run_dir is None:
        if args.dims not in PRESETS:
            raise UsageError(f"--dims {args.dims!r} needs a RUN_DIR; without one use a preset: {', '.join(PRESETS)}")
        dims = PRESETS[args.dims]
        print("\n".join(_curve_table(dims, args.block_size, args.context, args.batch, hardware)))
        print(json.dumps({name: {str(q): forward_time(dims, HARDWARE[name], q, args.context, args.batch)
                                 for q in (1, args.block_size, 2 * args.block_size)} for name in hardware}))
        return 0
    if args.dims != "run" and args.dims not in PRESETS:
        raise UsageError(f"unknown --dims {args.dims!r}: use 'run' or one of {', '.join(PRESETS)}")
    summary, records = load_run(Path(args.run_dir))
    presets = [] if args.dims == "run" else [args.dims]
    columns = prediction_columns(summary, records, hardware=hardware, batch=args.batch, presets=presets)
    from .metrics import summarize

    rows = summarize(records)
    names = list(columns)
    print("| config | task | speed_factor_nfe | speed_factor_wall | " + " | ".join(names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for r in rows:
        cells = [_fmt(columns[n].get((r["config"], r["task"]))) for n in names]
        print(f"| {r['config']} | {r['task']} | {_fmt(r['speed_factor_nfe'])} | {_fmt(r['speed_factor_wall'])} | "
              + " | ".join(cells) + " |")
    curve = summary.get("cost_curve")
    if curve:
        print("measured forward times (ms): " + ", ".join(
            f"q={q}: {t * 1e3:.3f}" for q, t in zip(curve["query_tokens"], curve["time_s"])), file=sys.stderr)
    print(json.dumps({"rows": len(rows), "predictions": names}))
    return 0


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("roofline", help="cost model: forward cost curve, predicted wall-clock speed factors")
    p.add_argument("run_dir", nargs="?", default=None, help="run folder: predict its speed factors (default: print a curve)")
    p.add_argument("--hardware", default="H100,H200,A100", help=f"comma list of {', '.join(HARDWARE)}")
    p.add_argument("--dims", default="run", help=f"'run' (the run's model) or a preset: {', '.join(PRESETS)}")
    p.add_argument("--batch", type=int, default=1, help="sequences per forward")
    p.add_argument("--block-size", type=int, default=16, help="k for the printed curve")
    p.add_argument("--context", type=int, default=1024, help="cached tokens for the printed curve")
    p.set_defaults(func=cmd_roofline)


__all__ = ["HARDWARE", "PRESETS", "Hardware", "ModelDims", "forward_time",
           "predicted_speed_factors", "prediction_columns", "sample_cost"]
