"""The GPU check of the scale work (issue 5): one prepared script, < 8 minutes on an H200, no weights.

A randomly initialised model with Llama-3.1-8B's dimensions, in bf16, measures:
  1. NTP tokens/s at batch 1: the fast path (static cache + CUDA graphs), the reference eager path,
     and transformers' ``generate``, against the bandwidth roofline (weight bytes / bandwidth);
  2. the time of 16-, 32- (and 64-) token block forwards against a 1-token forward (CUDA graphs);
  3. tokens/s against batch size 1..32 through the batched core and fast path: NTP, and block
     decoding at 4 tokens per forward (fixed_k:k=4, k=16; a random model cannot say how many an SBD
     model would reveal), with the times of 1- and 32-token forwards at each batch size.
Speed does not depend on weights, only on shapes; a random model never stops, so every decode runs
to its length. The JSON is rewritten after every section, so a timeout keeps what was measured.

    python scripts/gpu_check.py                       # on the GPU machine: results/gpu_check-DATE-DEVICE.json
    python scripts/gpu_check.py --tiny --out /tmp/x.json   # CPU smoke run of the same code, seconds
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sbd_bench.core.batching import BatchDecoder  # noqa: E402
from sbd_bench.core.decoding import Decoder, attention_mask  # noqa: E402
from sbd_bench.core.fastpath import FastPath  # noqa: E402
from sbd_bench.core.model import LoadedModel  # noqa: E402
from sbd_bench.registry import solver_registry  # noqa: E402

LLAMA_31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192},
                   tie_word_embeddings=False)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, tie_word_embeddings=False)
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # bytes/s, vendor figures (SXM)


class _NoText:
    """The core decodes output text for its records; these random ids have none to show."""

    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


def build_model(tiny: bool, device: torch.device) -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = TINY if tiny else LLAMA_31_8B
    dtype = torch.float32 if tiny else torch.bfloat16
    config = LlamaConfig(**dims, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):  # initialise in place on the GPU: 16 GB never pass through the host
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.eval()
    return LoadedModel(model=model, tokenizer=_NoText(), mask_token_id=dims["vocab_size"] - 1, stop_token_ids=(),
                       path="random-init " + ("tiny" if tiny else "Llama-3.1-8B dims"), device=device, dtype=dtype,
                       attn_implementation="sdpa", max_positions=config.max_position_embeddings,
                       info={"num_parameters": sum(p.numel() for p in model.parameters())})


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, after one untimed run."""
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measured_bandwidth(device: torch.device, nbytes: int) -> float:
    """Device-to-device copy bandwidth (read + write bytes per second): what streaming weights can reach."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device, 5)
    del src, dst
    return 2 * nbytes / seconds


# ------------------------------------------------------------------------------------- sections
def ntp_batch_one(lm: LoadedModel, prompt: list[int], tokens: int, repeats: int) -> dict:
    ntp = solver_registry()["ntp"]()
    fast = Decoder(lm, block_size=16, max_new_tokens=tokens, fast=True)
    eager = Decoder(lm, block_size=16, max_new_tokens=tokens)
    ids = torch.tensor([prompt], device=lm.device)
    outputs = {}

    def run_fast():
        outputs["fast"] = fast.generate(prompt, ntp).output_ids

    def run_eager():
        outputs["eager"] = eager.generate(prompt, ntp).output_ids

    def run_generate():
        with torch.inference_mode():
            out = lm.model.generate(ids, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                                    eos_token_id=None, pad_token_id=0)
        outputs["generate"] = out[0, len(prompt):].tolist()

    seconds = {name: timed(fn, lm.device, repeats)
               for name, fn in (("fast", run_fast), ("eager", run_eager), ("generate", run_generate))}

    def agree(a, b):  # leading tokens in common (bf16 kernels may break a near-tie differently)
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return n

    # whole decodes include prefill; the per-token rate is what a long answer sees
    return {"tokens": tokens, "prompt_tokens": len(prompt), "seconds": seconds,
            "tokens_per_s": {k: tokens / v for k, v in seconds.items()},
            "fast_over_generate": seconds["generate"] / seconds["fast"],
            "fast_over_eager": seconds["eager"] / seconds["fast"],
            "fast_path_status": FastPath.for_model(lm).status,
            "leading_tokens_equal": {"fast_vs_eager": agree(outputs["fast"], outputs["eager"]),
                                     "fast_vs_generate": agree(outputs["fast"], outputs["generate"])}}


@torch.inference_mode()  # as in Decoder.forward: the cache's tensors are inference tensors
def forward_times(lm: LoadedModel, batch: int, context: int, queries: list[int], repeats: int) -> dict:
    """Seconds per forward of Q query tokens over a cache of ``context`` positions, through the fast
    path (graphs on CUDA), the way the core calls it: write Q positions, then roll them back."""
    path = FastPath.for_model(lm)
    cache = path.cache(batch, context + max(queries) + 1)
    decoder = Decoder(lm, fast=True)
    prompt = torch.randint(3, lm.model.config.vocab_size - 1, (batch, context), device=lm.device)
    decoder.prefill(prompt, cache)
    out = {}
    for q in queries:
        ids = torch.randint(3, lm.model.config.vocab_size - 1, (batch, q), device=lm.device)
        positions = torch.arange(context, context + q, device=lm.device)[None].expand(batch, -1)
        mask = cache.fit_mask(attention_mask(context, 1, q - 1, lm.dtype, lm.device), q)

        def step():
            path.forward(ids, positions, mask, cache)
            cache.rollback(q)

        out[q] = timed(step, lm.device, repeats)
    return {"context": context, "batch": batch, "seconds": out, "ratio_to_1": {q: t / out[1] for q, t in out.items()}}


def batched_decode(lm: LoadedModel, prompt_len: int, tokens: int, batch: int, solver) -> dict:
    """Tokens/s of ``batch`` ragged prompts decoded together through the fast path. ``fixed_k:k=4``
    commits 4 tokens per forward whatever the (random) model says: the cost of SBD's block forwards
    at a known tokens-per-forward, to set against NTP at the same batch size."""
    decoder = Decoder(lm, block_size=16, max_new_tokens=tokens, fast=True)
    gen = torch.Generator().manual_seed(batch)
    lengths = [prompt_len - (i % 8) for i in range(batch)]  # ragged, like real prompts
    prompts = [torch.randint(3, lm.model.config.vocab_size - 1, (n,), generator=gen).tolist() for n in lengths]
    result = {}

    def run():
        result["gens"] = BatchDecoder(decoder).generate(prompts, solver)

    seconds = timed(run, lm.device, 1)
    generated = sum(g.tokens for g in result["gens"])
    return {"solver": solver.label, "batch": batch, "tokens": generated, "seconds": seconds,
            "tokens_per_s": generated / seconds, "nfe": sum(g.nfe for g in result["gens"]) / batch}


# ----------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny float32 model on CPU: exercise the code, no GPU")
    parser.add_argument("--out", default=None, help="default: results/gpu_check-DATE-DEVICE.json")
    parser.add_argument("--tokens", type=int, default=None, help="NTP tokens per decode (default 256; tiny 24)")
    args = parser.parse_args()

    device = torch.device("cpu" if args.tiny else "cuda")
    if not args.tiny and not torch.cuda.is_available():
        sys.exit("error: no CUDA device: run on the GPU machine, or pass --tiny for a CPU smoke run")
    tokens = args.tokens or (24 if args.tiny else 256)
    repeats = 2 if args.tiny else 3
    batches = [1, 2, 4] if args.tiny else [1, 2, 4, 8, 16, 32]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    out = Path(args.out or ROOT / "results" / f"gpu_check-{time.strftime('%Y-%m-%d')}-{name.replace(' ', '_')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = {"command": "python scripts/gpu_check.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
              "device": str(device), "device_name": name, "torch": torch.__version__,
              "cuda": torch.version.cuda, "tiny": args.tiny}

    def save(section: str, value) -> None:
        result[section] = value
        result["elapsed_s"] = time.perf_counter() - started
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"[{result['elapsed_s']:6.1f}s] {section}: {json.dumps(value)[:400]}", file=sys.stderr, flush=True)

    lm = build_model(args.tiny, device)
    all_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    embedding = lm.model.get_input_embeddings().weight
    # a decode step reads every weight once, except the input embedding table (one row per token);
    # counting it would flatter the fast path by ~7% on Llama-3.1-8B
    weight_bytes = all_bytes - embedding.numel() * embedding.element_size()
    save("model", {"name": lm.path, "parameters": lm.info["num_parameters"], "weight_bytes": all_bytes,
                   "weight_bytes_read_per_step": weight_bytes, "dtype": str(lm.dtype).removeprefix("torch.")})

    bandwidth = measured_bandwidth(device, (1 << 30) if not args.tiny else (1 << 24))
    peak = next((v for k, v in PEAK_BANDWIDTH.items() if k in name), None)
    save("bandwidth", {"measured_copy_bytes_per_s": bandwidth, "vendor_peak_bytes_per_s": peak,
                       "roofline_tokens_per_s_measured": bandwidth / weight_bytes,
                       "roofline_tokens_per_s_vendor": peak / weight_bytes if peak else None})

    prompt = torch.randint(3, lm.model.config.vocab_size - 1, (128,), generator=torch.Generator().manual_seed(0)).tolist()
    ntp = ntp_batch_one(lm, prompt, tokens, repeats)
    roof = result["bandwidth"]
    ntp["fraction_of_roofline_measured"] = ntp["tokens_per_s"]["fast"] / roof["roofline_tokens_per_s_measured"]
    if roof["roofline_tokens_per_s_vendor"]:
        ntp["fraction_of_roofline_vendor"] = ntp["tokens_per_s"]["fast"] / roof["roofline_tokens_per_s_vendor"]
    save("ntp_batch_1", ntp)

    queries = [1, 16, 17, 32, 33, 64]  # 1: NTP; k, 1+k, 2k for k = 16 and 32 (k, 1+k, 2k = 32, 33, 64)
    save("block_forward_batch_1", forward_times(lm, 1, 512, queries, 10 if not args.tiny else 3))

    per_batch, solvers = [], solver_registry()
    for batch in batches:
        ntp_row = batched_decode(lm, 128, tokens, batch, solvers["ntp"]())
        block_row = batched_decode(lm, 128, tokens, batch, solvers["fixed_k"](k=4))
        per_batch.append({"batch": batch, "ntp": ntp_row, "fixed_k4_block16": block_row,
                          "block_over_ntp": block_row["tokens_per_s"] / ntp_row["tokens_per_s"],
                          "forward": forward_times(lm, batch, 512, [1, 32], 5 if not args.tiny else 2)})
        save("batch_sweep", per_batch)
    save("fast_path_status", FastPath.for_model(lm).status)
    targets = {"fast_over_generate>=1.5": ntp["fast_over_generate"] >= 1.5,
               "fraction_of_roofline>=0.6": ntp.get("fraction_of_roofline_vendor", ntp["fraction_of_roofline_measured"]) >= 0.6,
               "forward_32_over_1<=1.1": result["block_forward_batch_1"]["ratio_to_1"][32] <= 1.1}
    save("targets", targets)
    print(json.dumps({"out": str(out), "elapsed_s": round(result["elapsed_s"], 1), **targets}))


if __name__ == "__main__":
    main()
