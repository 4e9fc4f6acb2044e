"""Is the core's NTP path at least as fast as transformers' generate? Both decode the same prompt,
greedily, to the same length, interleaved in one process; prints the median times and their ratio.

    python scripts/ntp_vs_generate.py --model sbd-tiny --tokens 96 --repeats 15
"""
import argparse
import dataclasses
import json
import statistics
import time

import torch

from sbd_bench.core.decoding import Decoder
from sbd_bench.core.model import load_model
from sbd_bench.registry import solver_registry


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="sbd-tiny")
    parser.add_argument("--tokens", type=int, default=96)  # sbd-tiny: prompt + 96 < its 128 positions
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="1 keeps timings stable on a busy machine")
    parser.add_argument("--prompt", default="Compute 12+34 step by step.\n")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = dataclasses.replace(load_model(args.model, device="cpu", dtype="float32"), stop_token_ids=())
    prompt = lm.tokenizer(args.prompt)["input_ids"]
    decoder = Decoder(lm, block_size=16, max_new_tokens=args.tokens)
    ntp = solver_registry()["ntp"]()
    ids = torch.tensor([prompt])

    def core():
        return decoder.generate(prompt, ntp).output_ids

    # the core never emits the mask token (its logit is -inf); generate must not either, or a model whose
    # argmax is the mask token somewhere (an untrained one) makes the two differ for no fault of either
    suppress = {"suppress_tokens": [lm.mask_token_id]} if lm.mask_token_id >= 0 else {}

    def hf():
        with torch.inference_mode():
            out = lm.model.generate(ids, do_sample=False, max_new_tokens=args.tokens, eos_token_id=None,
                                    pad_token_id=lm.tokenizer.pad_token_id, **suppress)
        return out[0, len(prompt):].tolist()

    assert core() == hf(), "the core's NTP tokens differ from generate's"
    times = {"core": [], "generate": []}
    for _ in range(args.repeats):  # interleaved, so drift hits both alike
        for name, fn in (("core", core), ("generate", hf)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    core_s, hf_s = statistics.median(times["core"]), statistics.median(times["generate"])
    print(json.dumps({"model": lm.path, "tokens": args.tokens, "repeats": args.repeats, "threads": args.threads,
                      "core_s": round(core_s, 4), "generate_s": round(hf_s, 4),
                      "core_speedup_over_generate": round(hf_s / core_s, 3)}))


if __name__ == "__main__":
    main()
