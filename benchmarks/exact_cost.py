"""What ``--exact`` costs: the same examples decoded with the plain model and the exact one (core/exact.py),
interleaved in one process (the order alternates per example), so that a busy machine slows both alike.

    python benchmarks/exact_cost.py                                   # sbd-tiny, 5 examples of each suite task
    python benchmarks/exact_cost.py --dtype bfloat16 --limit 10

Per configuration: total decode time without and with --exact, their ratio, and the wall speed factor
against ntp (ratio of total decode times, as in the records) in each mode; whether the outputs of the two
modes are the same (in float32 on the shipped model they are; in bf16 they may differ at near ties).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sbd-tiny")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--task", default="arith,reverse,record,tag")
    parser.add_argument("--solver", default="ntp+entropy_bounded:gamma=0.35+entropy_bounded:gamma=0.35;verify=on"
                                            "+fixed_k:k=16;verify=on")
    parser.add_argument("--limit", type=int, default=5, help="examples of each task")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from sbd_bench.core.decoding import Decoder
    from sbd_bench.core.model import load_model
    from sbd_bench.registry import parse_solver_spec, solver_registry
    from sbd_bench.tasks import load_task

    torch.set_num_threads(args.threads)
    lms = {mode: load_model(args.model, device="cpu", dtype=args.dtype, exact=mode == "exact")
           for mode in ("plain", "exact")}
    solvers = parse_solver_spec(args.solver, solver_registry())
    work = [(task, task.encode(example, lms["plain"].tokenizer)) for task in map(load_task, args.task.split(","))
            for example in task.examples("test")[: args.limit]]
    decode_s = {(mode, s.label): 0.0 for mode in lms for s in solvers}
    outputs = {(mode, s.label): [] for mode in lms for s in solvers}
    nfe = {s.label: 0 for s in solvers}
    for index, (task, ids) in enumerate([work[0]] + work):  # the first example once more, unrecorded: warm-up
        for solver in solvers:
            for mode in (("plain", "exact") if index % 2 else ("exact", "plain")):
                decoder = Decoder(lms[mode], block_size=args.block_size, max_new_tokens=task.max_new_tokens,
                                  stop_strings=task.stop)
                gen = decoder.generate(ids, solver)
                if index:
                    decode_s[(mode, solver.label)] += gen.decode_time_s
                    outputs[(mode, solver.label)].append(gen.output_ids)
                    nfe[solver.label] += gen.nfe if mode == "plain" else 0
    ntp = solvers[0].label
    print(f"{args.model}, {args.dtype}, {len(work)} examples ({args.task}, {args.limit} each), k={args.block_size}, "
          f"{torch.get_num_threads()} thread(s), CPU")
    print("| config | NFE | decode s plain | decode s --exact | --exact / plain | wall speed factor plain "
          "| wall speed factor --exact | same outputs |")
    print("|---|---|---|---|---|---|---|---|")
    for solver in solvers:
        plain, exact = decode_s[("plain", solver.label)], decode_s[("exact", solver.label)]
        same = outputs[("plain", solver.label)] == outputs[("exact", solver.label)]
        print(f"| {solver.label} | {nfe[solver.label]} | {plain:.2f} | {exact:.2f} | {exact / plain:.1f}x "
              f"| {decode_s[('plain', ntp)] / plain:.2f}x | {decode_s[('exact', ntp)] / exact:.2f}x | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
