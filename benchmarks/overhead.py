"""The decoding core's per-forward overhead: everything a forward costs beyond the model call
(solver decision, BlockView proxies, reveal checks, bookkeeping, stop checks, cache rollback), as
a fraction of the model call itself.

    python benchmarks/overhead.py --model sbd-tiny --block-size 16
    python benchmarks/overhead.py --random-tiny      # random weights, sbd-tiny's dimensions
    python benchmarks/overhead.py --random-dims llama-3.1-8b --device cuda --dtype bfloat16   # on a GPU
    python benchmarks/overhead.py --model sbd-tiny --trace-ab     # the same decodes traced and not, alternating

The model is wrapped so that every call is timed (device synchronised around it); the decode time of
``Decoder.generate`` minus the time inside model calls, per forward, is the overhead. A solver that reads
the block's shadow (wino) asks the model for k more queries in each forward after a block's first: that
extra model time (the median model call with the shadow less the median one without it, per forward of
the decode) is printed on a line of its own, with the overhead as a fraction of the model call without it.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# sbd-tiny's shape (models/sbd-tiny/config.json), for a random stand-in before the trained one exists
TINY_DIMS = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=4, head_dim=48, max_position_embeddings=128)


class TimedModel:
    """Calls the wrapped model and keeps the wall time of each call."""

    def __init__(self, model, device):
        self.model, self.device, self.times, self.positions = model, device, [], []

    def __getattr__(self, name):  # config, dtype, ...: whatever the core reads from the model
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        out = self.model(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter() - start)
        self.positions.append(kwargs.get("position_ids"))  # looked at after the decode, not inside its time
        return out


def has_shadow(positions) -> bool:
    """Whether a forward's queries end with the block's shadow: its last half at the block's positions again."""
    if positions is None or positions.shape[1] < 2 or positions.shape[1] % 2:
        return False
    half = positions.shape[1] // 2
    return bool((positions[0, half:] == positions[0, :half]).all())


def shadow_extra(decoder, timed: TimedModel, context: int, k: int, rounds: int) -> float:
    """Seconds the block's shadow adds to one model call: block forwards of k queries with and without it,
    alternating on one cache of ``context`` positions, the difference of the medians of the model calls."""
    import torch

    lm = decoder.lm
    cache = decoder.new_cache(1, context + 2 * k)
    decoder.prefill(torch.randint(5, lm.model.config.vocab_size, (1, context), device=lm.device), cache)
    block, times = torch.full((1, k), lm.mask_token_id, device=lm.device), {False: [], True: []}
    for r in range(3 + 4 * rounds):  # 3 warm-up rounds
        for shadow in (False, True):
            timed.times.clear()
            decoder.block_step(block[:, :0], block, context, cache, shadow=shadow)
            if r >= 3:
                times[shadow].append(timed.times[0])
    return max(0.0, median(times[True]) - median(times[False]))


def random_tiny(path: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sbd_bench.training.tokenizer import char_tokenizer

    tok = char_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=True, **TINY_DIMS)
    config.mask_token_id = tok.mask_token_id
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def random_lm(dims, device: str = "auto", dtype: str = "auto", max_positions: int = 4096):
    """A random-weight Llama with the given ``roofline.ModelDims`` built directly on the device (an 8B
    model never passes through CPU memory), with the char tokenizer; ids it cannot spell decode to
    nothing, which is fine for timing."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from sbd_bench.core.model import DTYPES, LoadedModel, pick_device
    from sbd_bench.training.tokenizer import char_tokenizer

    dev = pick_device(device)
    torch_dtype = DTYPES.get(dtype) or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    config = LlamaConfig(vocab_size=dims.vocab, hidden_size=dims.hidden, intermediate_size=dims.intermediate,
                         num_hidden_layers=dims.layers, num_attention_heads=dims.heads,
                         num_key_value_heads=dims.kv_heads, head_dim=dims.head_dim,
                         max_position_embeddings=max_positions, attn_implementation="sdpa")
    torch.manual_seed(0)
    with dev:
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype).eval()
    return LoadedModel(model=model, tokenizer=char_tokenizer(), mask_token_id=dims.vocab - 1, stop_token_ids=(),
                       path=f"random {dims}", device=dev, dtype=torch_dtype, attn_implementation="sdpa",
                       max_positions=max_positions, info={"num_parameters": sum(p.numel() for p in model.parameters())})


def measure_overhead(lm, solver, prompt_ids: list[int], block_size: int, max_new_tokens: int, repeats: int = 5,
                     trace: bool = False) -> dict:
    """Medians over ``repeats`` decodes (after one warm-up) of the per-forward model time and overhead;
    ``trace``: the decodes record their per-forward trace (traces.jsonl's)."""
    from sbd_bench.core.decoding import Decoder

    timed = TimedModel(lm.model, lm.device)
    decoder = Decoder(dataclasses.replace(lm, model=timed), block_size=block_size, max_new_tokens=max_new_tokens)
    decoder.generate_batch([prompt_ids], solver, trace=trace)
    model_s, overhead_s, shadow_s, nfe, shadowed = [], [], 0.0, 0, 0
    for _ in range(repeats):
        timed.times.clear()
        timed.positions.clear()
        gen = decoder.generate_batch([prompt_ids], solver, trace=trace)[0]
        calls = list(zip(timed.times, map(has_shadow, timed.positions)))[gen.prefill_forwards:]  # decode phase only
        inside = sum(t for t, _ in calls)
        nfe = gen.nfe
        model_s.append(inside / nfe)
        overhead_s.append((gen.decode_time_s - inside) / nfe)
        shadowed = sum(shadow for _, shadow in calls)
    if solver.reads_shadow and shadowed:  # what the shadow's k extra queries cost a model call
        shadow_s = shadow_extra(decoder, timed, len(prompt_ids) + max_new_tokens // 2, block_size, repeats)
    forward, overhead = median(model_s), median(overhead_s)
    result = {"config": solver.label, "nfe": nfe, "model_ms_per_forward": forward * 1e3,
              "overhead_ms_per_forward": overhead * 1e3, "overhead_fraction": overhead / forward}
    if shadow_s:  # the shadow is model work the solver asks for, not overhead: a line of its own
        shadow = shadow_s * shadowed / nfe  # per forward of the decode, as the other columns
        result.update(shadow_forwards=shadowed, shadow_ms_per_forward=shadow * 1e3,
                      block_model_ms_per_forward=(forward - shadow) * 1e3,
                      overhead_per_block_model_call=overhead / (forward - shadow))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sbd-tiny")
    parser.add_argument("--random-tiny", action="store_true", help="random weights with sbd-tiny's dimensions")
    parser.add_argument("--random-dims", default=None, help="random weights with a roofline preset's dimensions "
                                                               "(llama-3.1-8b, qwen3-8b)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--solver", default="ntp+entropy_bounded:gamma=0.35+fixed_k:k=4+confidence+margin+klass+wino")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trace-ab", action="store_true",
                        help="each configuration untraced and traced, alternating, for --rounds rounds: the overhead's "
                             "ratio traced / untraced")
    parser.add_argument("--rounds", type=int, default=6, help="with --trace-ab")
    args = parser.parse_args(argv)

    import torch

    from sbd_bench.core.model import load_model
    from sbd_bench.registry import parse_solver_spec, solver_registry
    from sbd_bench.analysis.roofline import PRESETS

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.random_dims:
            if args.random_dims not in PRESETS:
                parser.error(f"--random-dims must be one of {', '.join(PRESETS)}")
            lm = random_lm(PRESETS[args.random_dims], args.device, args.dtype)
        else:
            model = random_tiny(Path(tmp) / "m") if args.random_tiny else args.model
            lm = load_model(model, device=args.device, dtype=args.dtype)
        prompt = lm.tokenizer("12+34=", add_special_tokens=True)["input_ids"]
        lm.stop_token_ids = ()  # decode the whole budget: every configuration does the same work
        print(f"model {'random ' if args.random_tiny else ''}{lm.path} {lm.dtype} ({lm.info['num_parameters'] / 1e6:.2f}M params), "
              f"{lm.device}, {torch.get_num_threads()} threads, k={args.block_size}, {args.max_new_tokens} new tokens")
        if args.trace_ab:
            print("| config | overhead ms/forward, untraced | traced | traced / untraced |")
            print("|---|---|---|---|")
            for solver in parse_solver_spec(args.solver, solver_registry()):
                runs = {False: [], True: []}
                for r in range(args.rounds):
                    for trace in (False, True) if r % 2 == 0 else (True, False):
                        runs[trace].append(measure_overhead(lm, solver, prompt, args.block_size, args.max_new_tokens,
                                                            args.repeats, trace)["overhead_ms_per_forward"])
                off, on = median(runs[False]), median(runs[True])
                print(f"| {solver.label} | {off:.3f} | {on:.3f} | {on / off:.2f} |")
            return 0
        print("| config | nfe | model ms/forward | overhead ms/forward | overhead / model call |")
        print("|---|---|---|---|---|")
        for solver in parse_solver_spec(args.solver, solver_registry()):
            r = measure_overhead(lm, solver, prompt, args.block_size, args.max_new_tokens, args.repeats)
            print(f"| {r['config']} | {r['nfe']} | {r['model_ms_per_forward']:.3f} | {r['overhead_ms_per_forward']:.3f} "
                  f"| {r['overhead_fraction']:.2f} |")
            if "shadow_ms_per_forward" in r:  # not matched by overhead_ab.py's row pattern (its first cell has spaces)
                print(f"| {r['config']} shadow ({r['shadow_forwards']} forwards with it) | - | "
                      f"{r['shadow_ms_per_forward']:.3f} | - | overhead / model call without it: "
                      f"{r['overhead_per_block_model_call']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
