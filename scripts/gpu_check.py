"""The GPU check of the fast path (issues 5 and 11): one prepared script, < 8 minutes on an H200, no
downloaded weights. It prints every target of issue 11 as PASS/FAIL and writes them to its JSON.

A randomly initialised model with Llama-3.1-8B's dimensions, in bf16, batch 1, a 128-token prompt:
  warmup          compiling and capturing the default shapes (NTP 1; blocks 16, 17, 32 for k = 16)
  forward_batch_1 ms per forward of Q = 1, 16, 17, 32, 33, 64 query tokens over a 512-token context,
                  the way the core calls it (graph replay, then the block's rollback), back to back,
                  against the bandwidth floor (the bytes of weights a decode step reads / bandwidth)
  ntp_batch_1     NTP decode tokens/s: the fast path, the eager core, transformers' generate
  fixed_k_batch_1 decode tokens/s of ``fixed_k:k=4`` (4 tokens per forward, k = 16) against NTP's
  cuda_rng        CUDA random numbers after the captures (issue 11's "Offset increment" failure)
  records         the shipped sbd-tiny in float32 on this device: records of the fast path, the eager
                  path and batch 8 equal the CPU records (NFE, tokens, accuracy), 6 examples per task
  gpu_tests       the GPU-only tests (tests/test_fastpath_cuda.py)
  batch_sweep     NTP and fixed_k:k=4 tokens/s at batch 1, 8, 32 (and their 1- and 32-token forwards)
  training        scripts/train_check.py under torchrun on every GPU: a ~1B random Llama, SBD objective,
                  FSDP2 bf16, with and without activation checkpointing: step time, MFU, peak memory per
                  GPU beside train --plan's prediction (issue 18; alone with --training)
Speed does not depend on weights, only on shapes; a random model never stops, so every decode runs
to its length. The JSON is rewritten after every section, so a timeout keeps what was measured;
sections after the time budget are skipped (and say so).

    python scripts/gpu_check.py                            # GPU machine: results/gpu_check-DATE-DEVICE.json
    python scripts/gpu_check.py --tiny --out /tmp/check.json   # the same code on a tiny CPU model, compiled
    python scripts/gpu_check.py --training [--tiny]            # the training section alone
    python scripts/gpu_check.py --checkpoint DIR --gsm8k FILE  # a published checkpoint alone (below)

``--checkpoint DIR`` (a local folder of a published checkpoint, e.g. Nemotron-Labs-Diffusion-8B; no GPU is
needed with --tiny) decodes the first ``--limit`` GSM8K prompts of ``--gsm8k FILE`` (question, answer with
'#### N') through the chat template at the block size the family was trained with, with EB, confidence,
left-to-right, and where the family is a next-token model ntp, verified decoding and its own schedules
(NLD: nld_dlm, nld_spec), and prints accuracy,
tokens per forward (ours, and the vendor's count where a schedule has one) and decode tokens/s per
configuration; its run folder (records, report, page) is kept beside the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sbd_bench.core.decoding import Decoder  # noqa: E402
from sbd_bench.core.fastpath import FastPath  # noqa: E402
from sbd_bench.core.masks import Pattern  # noqa: E402
from sbd_bench.core.model import LoadedModel, device_name  # noqa: E402
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
PROMPT, CONTEXT, BLOCK = 128, 512, 16  # prompt tokens; context of the forward timings; block size k
# query tokens -> how many are causal, as the core shapes them: NTP; a block alone (k = 16); the first
# block after the prompt (1 + k); a block after a block (2k); the same for k = 32
SHAPES = {1: 1, 16: 0, 17: 1, 32: 16, 33: 1, 64: 32}
# issue 11's targets (H200): name -> (section, figure, comparison, threshold)
TARGETS = {
    "forward_1_ms": ("forward_batch_1", "ms_1", "<=", 5.2),
    "ntp_tokens_per_s": ("ntp_batch_1", "fast_tokens_per_s", ">=", 180.0),
    "forward_16_over_1": ("forward_batch_1", "ratio_16", "<=", 1.08),
    "forward_32_over_1": ("forward_batch_1", "ratio_32", "<=", 1.12),
    "fixed_k4_over_ntp": ("fixed_k_batch_1", "over_ntp", ">=", 3.5),
    "warmup_s": ("warmup", "warmup_s", "<=", 90.0),
    "records_identical": ("records", "identical", "==", True),
    "cuda_rng_after_fast_path": ("cuda_rng", "ok", "==", True),
    # issue 18: the 1B model's training step under FSDP on the GPUs present
    "training_mfu": ("training", "mfu", ">=", 0.35),
    "training_peak_within_10pct_of_plan": ("training", "peak_within_10pct_of_plan", "==", True),
}


GPU_ONLY = {"training_mfu", "training_peak_within_10pct_of_plan"}  # no CPU figure: n/a in --tiny


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
    return 2 * nbytes / seconds  # both buffers are freed on return


def random_ids(lm: LoadedModel, n: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, lm.model.config.vocab_size - 1, (n,), generator=generator).tolist()


def fast_decoder(lm: LoadedModel, tokens: int) -> Decoder:
    """A decoder on the model's fast path as the warm-up section set it (compiled or graphs only)."""
    return Decoder(lm, block_size=BLOCK, max_new_tokens=tokens, fast=True, compile=FastPath.for_model(lm).compile_asked)


def decode_rate(decoder: Decoder, prompt: list[int], solver, repeats: int) -> dict:
    """Decode tokens/s (prefill excluded, as a long answer sees it): the median over ``repeats``
    decodes after one untimed decode; and the output ids."""
    decoder.generate(prompt, solver)
    gens = [decoder.generate(prompt, solver) for _ in range(repeats)]
    seconds = statistics.median(g.decode_time_s for g in gens)
    return {"tokens": gens[0].tokens, "nfe": gens[0].nfe, "decode_s": seconds, "tokens_per_s": gens[0].tokens / seconds,
            "output_ids": gens[0].output_ids}


# ------------------------------------------------------------------------------------- sections
def warmup(lm: LoadedModel, compile: bool, tokens: int) -> dict:
    """Compile and capture the default shapes at batch 1 (NTP; the first block after the prompt, 1 + k;
    later first forwards, 2k; the others, k) on the cache every later batch-1 section uses."""
    path = FastPath.for_model(lm, compile)
    path.cache(1, CONTEXT + 2 * BLOCK * 2 + 1)  # one capacity for the whole script at batch 1
    started = time.perf_counter()
    solvers = solver_registry()
    for solver in (solvers["ntp"](), solvers["fixed_k"](k=4)):
        Decoder(lm, block_size=BLOCK, max_new_tokens=tokens, fast=True, compile=compile).generate(
            random_ids(lm, PROMPT, 1), solver)
    sync(lm.device)
    return {"warmup_s": path.warmup_s, "graphs": path.captures, "wall_s": time.perf_counter() - started,
            "status": path.status, "compile": compile}


@torch.inference_mode()  # as in Decoder.forward: the cache's tensors are inference tensors
def forward_times(lm: LoadedModel, batch: int, context: int, queries: list[int], steps: int) -> dict:
    """Milliseconds per forward of Q query tokens over a cache of ``context`` positions through the
    fast path, as the core calls it (``SHAPES``: how many of the Q are causal; the logits of the block
    only), each followed by the rollback of its Q positions. ``steps`` forwards back to back, one
    synchronisation: the device's time per forward, not the host's."""
    path = FastPath.for_model(lm)
    cache = path.cache(batch, context + max(queries) + 1)
    decoder = fast_decoder(lm, 1)
    generator = torch.Generator().manual_seed(batch)
    vocab = lm.model.config.vocab_size
    decoder.prefill(torch.randint(3, vocab - 1, (batch, context), generator=generator).to(lm.device), cache)
    ms = {}
    for q in queries:
        ids = torch.randint(3, vocab - 1, (batch, q), generator=generator).to(lm.device)
        positions = torch.arange(context, context + q, device=lm.device)[None].expand(batch, -1)
        n_causal = SHAPES[q]
        pattern, keep = Pattern(n_causal, q - n_causal), (q - n_causal) or 1

        def run(n: int) -> None:
            for _ in range(n):
                path.forward(ids, positions, pattern, cache, keep=keep)
                cache.advance(q)
                cache.rollback(q)

        run(3)  # capture (and compile, if not done) outside the timing
        sync(lm.device)
        start = time.perf_counter()
        run(steps)
        sync(lm.device)
        ms[q] = 1000 * (time.perf_counter() - start) / steps
    out = {"context": context, "batch": batch, "steps": steps, "ms": ms}
    out.update({f"ms_{q}": v for q, v in ms.items()})
    out.update({f"ratio_{q}": v / ms[queries[0]] for q, v in ms.items()})
    return out


def ntp_batch_one(lm: LoadedModel, tokens: int, repeats: int, slow_repeats: int) -> dict:
    ntp = solver_registry()["ntp"]()
    prompt = random_ids(lm, PROMPT, 0)
    fast = decode_rate(fast_decoder(lm, tokens), prompt, ntp, repeats)
    slow = max(8, tokens // 4)  # the eager core and generate: fewer tokens (their rate per token is the figure)
    eager = decode_rate(Decoder(lm, block_size=BLOCK, max_new_tokens=slow), prompt, ntp, slow_repeats)
    ids = torch.tensor([prompt], device=lm.device)
    generated = {}

    def run_generate():
        with torch.inference_mode():
            out = lm.model.generate(ids, do_sample=False, max_new_tokens=slow, min_new_tokens=slow,
                                    eos_token_id=None, pad_token_id=0)
        generated["ids"] = out[0, len(prompt):].tolist()

    generate_s = timed(run_generate, lm.device, slow_repeats)  # prefill included: generate cannot split it

    def agree(a, b):  # leading tokens in common (bf16 kernels may break a near-tie differently)
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    return {"tokens": tokens, "slow_tokens": slow, "prompt_tokens": len(prompt),
            "fast_tokens_per_s": fast["tokens_per_s"], "fast_ms_per_token": 1000 / fast["tokens_per_s"],
            "eager_tokens_per_s": eager["tokens_per_s"], "generate_tokens_per_s": slow / generate_s,
            "fast_over_eager": fast["tokens_per_s"] / eager["tokens_per_s"],
            "fast_over_generate": fast["tokens_per_s"] / (slow / generate_s),
            "leading_tokens_equal": {"fast_vs_eager": agree(fast["output_ids"], eager["output_ids"]),
                                     "fast_vs_generate": agree(fast["output_ids"], generated["ids"])},
            "status": FastPath.for_model(lm).status}


def fixed_k_batch_one(lm: LoadedModel, tokens: int, repeats: int, ntp_rate: float) -> dict:
    solver = solver_registry()["fixed_k"](k=4)
    rate = decode_rate(fast_decoder(lm, tokens), random_ids(lm, PROMPT, 0), solver, repeats)
    return {"solver": solver.label, "tokens": rate["tokens"], "nfe": rate["nfe"], "tokens_per_s": rate["tokens_per_s"],
            "tokens_per_forward": rate["tokens"] / rate["nfe"], "ntp_tokens_per_s": ntp_rate,
            "over_ntp": rate["tokens_per_s"] / ntp_rate}


def cuda_rng(device: torch.device) -> dict:
    """Random numbers on the device after the fast path captured its graphs: the draws run, and a
    reseeded generator repeats them (the captures left the default generator's state usable)."""
    if device.type != "cuda":
        return {"ok": True, "note": "no CUDA device: nothing to check"}
    try:
        torch.cuda.manual_seed(7)
        first = torch.randint(0, 1000, (8,), device=device).tolist()
        torch.cuda.manual_seed(7)
        again = torch.randint(0, 1000, (8,), device=device).tolist()
        return {"ok": first == again, "draws": first}
    except RuntimeError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def records(device: torch.device, limit: int, batch: int, compile: bool) -> dict:
    """The shipped sbd-tiny in float32 on ``device``: its records with the fast path, without it, and
    at batch ``batch`` equal the CPU reference's (output ids, NFE, correctness), sample by sample."""
    from sbd_bench.analysis.records import load_run
    from sbd_bench.runner.harness import RunConfig, run
    from sbd_bench.tasks import expand_tasks

    def run_records(**kw) -> dict:
        # a scratch run folder, removed once read (they piled up in the temp dir, one per run of the check)
        with tempfile.TemporaryDirectory(prefix="gpu-check-records-") as out:
            cfg = RunConfig(model="sbd-tiny", tasks=expand_tasks("suite"), solvers="all", out=Path(out), limit=limit,
                            dtype="float32", cost_curve=False, report=False, warmup=0, trace=0, **kw)
            summary, records = load_run(run(cfg))
        return {"records": {(r["config"], r["task"], str(r["id"])): (r["output_ids"], r["nfe"], r["correct"])
                            for r in records},
                "fast_path": summary["provenance"].get("fast_path")}

    reference = run_records(device="cpu", fast=False)["records"]
    runs = {"fast": run_records(device=str(device), fast=True, compile=compile),
            "no_fast": run_records(device=str(device), fast=False),
            f"fast_batch_{batch}": run_records(device=str(device), fast=True, compile=compile, batch_size=batch)}
    result = {"samples": len(reference), "device": str(device)}
    for name, got in runs.items():
        differ = sorted(k for k in reference if got["records"].get(k) != reference[k])
        result[name] = {"differ": len(differ), "first_differences": [list(k) for k in differ[:5]],
                        "fast_path": got["fast_path"]}
    result["identical"] = all(result[name]["differ"] == 0 for name in runs)
    return result


def batched_decode(lm: LoadedModel, tokens: int, batch: int, solver) -> dict:
    """Tokens/s of ``batch`` ragged prompts decoded together through the fast path. ``fixed_k:k=4``
    commits 4 tokens per forward whatever the (random) model says: the cost of SBD's block forwards
    at a known tokens-per-forward, to set against NTP at the same batch size."""
    decoder = fast_decoder(lm, tokens)
    prompts = [random_ids(lm, PROMPT - (i % 8), 100 + i) for i in range(batch)]  # ragged, like real prompts
    result = {}

    def run():
        result["gens"] = decoder.generate_batch(prompts, solver)

    seconds = timed(run, lm.device, 1)
    generated = sum(g.tokens for g in result["gens"])
    return {"solver": solver.label, "batch": batch, "tokens": generated, "seconds": seconds,
            "tokens_per_s": generated / seconds, "nfe": sum(g.nfe for g in result["gens"]) / batch}


def gpu_tests() -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_fastpath_cuda.py")], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return {"returncode": done.returncode, "tail": done.stdout.strip().splitlines()[-1:] or done.stderr[-500:],
            "seconds": time.perf_counter() - started}


def training(tiny: bool) -> dict:
    """scripts/train_check.py under torchrun on every GPU present (2 CPU ranks with --tiny), without and
    with activation checkpointing: step time, MFU, peak memory per GPU beside --plan's prediction."""
    ranks = 2 if tiny else max(1, torch.cuda.device_count())
    out = {"ranks": ranks}
    runs = (("plain", []), ("activation_checkpointing", ["--activation-checkpointing"]))
    for name, flags in runs[:1] if tiny else runs:  # tiny: the code path once (no GPU figures to compare)
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={ranks}", str(ROOT / "scripts" / "train_check.py"),
                               *(["--tiny"] if tiny else []), *flags], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=900)
        lines = done.stdout.strip().splitlines()
        out[name] = json.loads(lines[-1]) if done.returncode == 0 and lines else {"error": done.stderr[-1500:]}
    plain = out["plain"].get("peak_memory_bytes_per_gpu")
    ac = out.get("activation_checkpointing", {}).get("peak_memory_bytes_per_gpu")
    out["mfu"] = out["plain"].get("mfu")
    out["peak_within_10pct_of_plan"] = (abs(out["plain"]["peak_over_plan"] - 1) <= 0.10
                                        if out["plain"].get("peak_over_plan") else None)
    out["checkpointing_saves_bytes"] = plain - ac if plain and ac else None
    return out


# what --checkpoint decodes per family, beside ntp and verified decoding: its own schedules where it has some
FAMILY_SCHEDULES = {"nemotron_labs_diffusion": "nld_dlm+nld_spec"}


def checkpoint(folder: str, gsm8k: str, limit: int, tiny: bool, run_dir: Path) -> dict:
    """GSM8K through a published checkpoint with ntp, verify=on, EB, confidence and its family's schedules."""
    from sbd_bench.core.families import detect_family, read_config, stock_config, trained_block_size

    path = Path(folder)
    family = detect_family(path)
    config = stock_config(family, read_config(path)) if family.config_class else None
    block = (trained_block_size(family, config) if config is not None else None) or 16
    # ntp and verified decoding where the family is a next-token model (run adds ntp; an aligned family drops it)
    solvers = "+".join(filter(None, [f"fixed_k:k={block};verify=on" if family.next_token else None,
                                     "entropy_bounded:gamma=0.1", "confidence:tau=0.9", "left_to_right:n=1",
                                     FAMILY_SCHEDULES.get(family.name)]))
    command = [sys.executable, "-m", "sbd_bench", "run", "--model", folder, "--task", f"gsm8k:path={gsm8k}",
               "--limit", str(limit), "--solver", solvers, "--block-size", str(block), "--chat-template",
               "--no-cost-curve", "--trace", "1", "--out", str(run_dir),
               *(["--device", "cpu", "--dtype", "float32", "--max-new-tokens", "48"] if tiny else
                 ["--device", "cuda", "--dtype", "bfloat16"])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    rows = json.loads((run_dir / "summary.json").read_text())["rows"]
    return {"family": family.name, "block_size": block, "command": " ".join(command), "run_dir": str(run_dir),
            "rows": [{"config": r["config"], "accuracy": r["accuracy"], "tokens_per_forward": r["tokens_per_forward"],
                      "vendor_tokens_per_forward": r.get("vendor_tokens_per_forward"),
                      "decode_tokens_per_s": r["tokens"] / r["decode_time_s"] if r.get("decode_time_s") else None}
                     for r in rows]}


def verdicts(result: dict) -> dict:
    """Each target: its figure, the threshold, PASS/FAIL (MISSING when its section did not run; n/a for
    a speed target on the tiny CPU model, where only the correctness targets mean anything)."""
    out = {}
    for name, (section, figure, op, threshold) in TARGETS.items():
        value = (result.get(section) or {}).get(figure)
        if value is None and result["tiny"] and name in GPU_ONLY and "error" not in (result.get(section) or {"error": 1}):
            verdict = "n/a"  # the section ran on the CPU, where these figures do not exist
        elif value is None:
            verdict = "MISSING"
        elif result["tiny"] and op != "==":
            verdict = "n/a"
        else:
            ok = {"<=": value <= threshold, ">=": value >= threshold, "==": value == threshold}[op]
            verdict = "PASS" if ok else "FAIL"
        out[name] = {"value": value, "target": f"{op} {threshold}", "verdict": verdict}
    return out


# ----------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny float32 model on CPU: exercise the code, no GPU")
    parser.add_argument("--out", default=None, help="default: results/gpu_check-DATE-DEVICE.json")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per batch-1 decode (default 256; tiny 24)")
    parser.add_argument("--no-compile", action="store_true", help="graphs only (the fallback), no torch.compile")
    parser.add_argument("--training", action="store_true",
                        help="the training section only (scripts/train_check.py on every GPU: ~1B model, FSDP)")
    parser.add_argument("--checkpoint", metavar="DIR", default=None,
                        help="a published checkpoint's folder: decode --gsm8k prompts with every kind of decoder (alone)")
    parser.add_argument("--gsm8k", metavar="FILE", default=None, help="GSM8K test JSONL for --checkpoint")
    parser.add_argument("--limit", type=int, default=20, help="GSM8K prompts --checkpoint decodes (default 20)")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="skip a section that would end past this many seconds, by its expected "
                             "H200 duration (default 450: the whole check stays under 8 minutes)")
    args = parser.parse_args()

    device = torch.device("cpu" if args.tiny else "cuda")
    if not args.tiny and not torch.cuda.is_available():
        sys.exit("error: no CUDA device: run on the GPU machine, or pass --tiny for a CPU smoke run")
    compile = not args.no_compile  # on CPU too: the dry run compiles what the GPU run compiles
    tokens = args.tokens or (24 if args.tiny else 256)
    repeats, slow_repeats = (2, 1) if args.tiny else (3, 1)
    batches = [1, 2] if args.tiny else [1, 8, 32]
    name = device_name(device)
    out = Path(args.out or ROOT / "results" / f"gpu_check-{time.strftime('%Y-%m-%d')}-{re.sub(r'[^A-Za-z0-9.-]+', '_', name).strip('_')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = {"command": "python scripts/gpu_check.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
              "device": str(device), "device_name": name, "torch": torch.__version__,
              "cuda": torch.version.cuda, "tiny": args.tiny, "compile": compile, "skipped": []}

    def save(section: str, value) -> None:
        result[section] = value
        result["elapsed_s"] = time.perf_counter() - started
        result["targets"] = verdicts(result)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"[{result['elapsed_s']:6.1f}s] {section}: {json.dumps(value, default=str)[:300]}", file=sys.stderr,
              flush=True)

    def section(name: str, fn, *fn_args, expected_s: float = 10.0) -> None:
        if time.perf_counter() - started + (0 if args.tiny else expected_s) > args.budget_s:
            result["skipped"].append(name)
            save("skipped", result["skipped"])
            return
        try:
            save(name, fn(*fn_args))
        except Exception as exc:  # noqa: BLE001 - one section's failure is recorded; the others still run
            save(name, {"error": f"{type(exc).__name__}: {exc}"})

    if args.checkpoint:  # a published checkpoint: its own section, its own model
        if not args.gsm8k:
            sys.exit("error: --checkpoint needs --gsm8k FILE (GSM8K's test split as JSONL: question, answer)")
        section("checkpoint", checkpoint, args.checkpoint, args.gsm8k, args.limit, args.tiny,
                out.with_suffix(""), expected_s=300)
        print(json.dumps({"out": str(out), "checkpoint": result.get("checkpoint")}, default=str))
        return
    if args.training:  # the decoding model is not needed: the training check builds its own
        section("training", training, args.tiny, expected_s=240)
        save("targets", verdicts(result))
        print(json.dumps({"out": str(out), "training": result.get("training")}, default=str))
        return

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # generate's notes on random weights would drown the progress lines
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
                       "floor_ms_measured": 1000 * weight_bytes / bandwidth,
                       "floor_ms_vendor": 1000 * weight_bytes / peak if peak else None})

    # expected_s: H200 durations (the 8B model's compiles about a minute each, sbd-tiny's about half)
    section("warmup", warmup, lm, compile, 2 * BLOCK, expected_s=90)
    section("forward_batch_1", forward_times, lm, 1, CONTEXT, list(SHAPES), 5 if args.tiny else 30)
    if "ms_1" in (result.get("forward_batch_1") or {}):
        floor = result["bandwidth"]["floor_ms_vendor"] or result["bandwidth"]["floor_ms_measured"]
        result["forward_batch_1"]["fraction_of_bandwidth_1"] = floor / result["forward_batch_1"]["ms_1"]
    section("ntp_batch_1", ntp_batch_one, lm, tokens, repeats, slow_repeats, expected_s=30)
    ntp_rate = (result.get("ntp_batch_1") or {}).get("fast_tokens_per_s")
    if ntp_rate:
        section("fixed_k_batch_1", fixed_k_batch_one, lm, tokens, repeats, ntp_rate)
    section("cuda_rng", cuda_rng, device)
    # tiny: the shipped model's records uncompiled (its compiles would double the dry run's time; the
    # compiled path is what the sections above ran)
    section("records", records, device, 1 if args.tiny else 6, 2 if args.tiny else 8, compile and not args.tiny,
            expected_s=150)
    section("gpu_tests", gpu_tests, expected_s=60)
    sweep = []

    def sweep_row(batch: int) -> list:
        solvers = solver_registry()
        ntp_row = batched_decode(lm, tokens // 2, batch, solvers["ntp"]())
        block_row = batched_decode(lm, tokens // 2, batch, solvers["fixed_k"](k=4))
        sweep.append({"batch": batch, "ntp": ntp_row, "fixed_k4": block_row,
                      "fixed_k4_over_ntp": block_row["tokens_per_s"] / ntp_row["tokens_per_s"],
                      "forward": forward_times(lm, batch, CONTEXT, [1, 32], 3 if args.tiny else 10)})
        return sweep

    for batch in batches:  # last: the figures of the table, no target of their own; batch 8
        section("batch_sweep", sweep_row, batch, expected_s=90 if batch == 8 else 20)  # compiles batches > 1
    section("training", training, args.tiny, expected_s=240)  # issue 18; alone: --training
    result["fast_path_status"] = FastPath.for_model(lm).status
    save("targets", verdicts(result))
    for target, verdict in result["targets"].items():
        print(f"{verdict['verdict']:8} {target:26} {verdict['value']!s:>24}  (target {verdict['target']})")
    print(json.dumps({"out": str(out), "elapsed_s": round(result["elapsed_s"], 1), "skipped": result["skipped"],
                      **{k: v["verdict"] for k, v in result["targets"].items()}}))


if __name__ == "__main__":
    main()
