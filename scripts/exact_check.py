"""Verified = NTP and batch N = batch 1, counted over many samples on random bf16 Llama and Qwen3 models
(the issue-23 check; tox -e exact). For each model (tests/tiny_models.build_issue_model: the weights of
../shared/tools/make_tiny_model.py FOLDER FAMILY SEED), block size and batch size it runs

    python -m sbd_bench run --model M --task prompts.jsonl --solver SPEC --dtype bfloat16 --threads 1 ...

and counts the verified samples whose output differs from ntp's, and, at batch N > 1, the samples of
every configuration whose record (outputs, NFE, reveals, drafts) differs from batch 1's.

    python scripts/exact_check.py --exact          # must find 0 and 0 (exit 1 otherwise)
    python scripts/exact_check.py                  # the plain rates, for the docs (exit 0)
    python scripts/exact_check.py --shipped        # sbd-tiny, the whole suite, every solver, --exact:
                                                   # records = results/baseline's but for timings and memory

The last stdout line is JSON. Minutes of CPU (about 25 with --exact on 2 busy cores): not part of CI;
tests/test_exact.py holds a small version.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import string
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

VERIFIED = ("fixed_k:k=16;verify=on+fixed_k:k=4;verify=on+entropy_bounded:gamma=0.35,1.5;verify=on"
            "+confidence:verify=on+factor:verify=on+left_to_right:verify=on+random_order:n=2;verify=on")
UNVERIFIED = "entropy_bounded:gamma=0.35"  # orders by entropy: near-equal entropies must not reorder at batch N
RECORD_FIELDS = ("output_ids", "stop_reason", "nfe", "revealed_per_forward", "forwards_per_block",
                 "drafted_per_block", "accepted_per_block", "replaced_per_block")
REPRODUCER = "1)= *"  # the issue's prompt: NTP's top two logits one bf16 step apart (llama, seed 11, k=3)


def prompts(n: int) -> list[dict]:
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + " +-=*/.,;:|$()[]{}"
    rows = [{"id": "p2", "prompt": REPRODUCER}]
    rows += [{"id": f"r{i}", "prompt": "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))}
             for i in range(n - 1)]
    return rows


def decode(model: Path, task: Path, out: Path, block_size: int, batch_size: int, args) -> list[dict]:
    from sbd_bench.analysis.metrics import collapse_repeats
    from sbd_bench.analysis.records import load_run
    from sbd_bench.cli import main

    argv = ["run", "--model", str(model), "--task", str(task), "--solver", f"ntp+{VERIFIED}+{UNVERIFIED}",
            "--dtype", args.dtype, "--block-size", str(block_size), "--max-new-tokens", str(args.max_new_tokens),
            "--batch-size", str(batch_size), "--threads", "1", "--warmup", "0", "--no-cost-curve", "--no-report",
            "--out", str(out)] + (["--exact"] if args.exact else [])
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time
    if main(argv) != 0:
        raise SystemExit(f"`python -m sbd_bench {' '.join(argv)}` failed: see above")
    return collapse_repeats(load_run(out)[1])


NOT_COMPARED = ("wall_time_s", "prefill_time_s", "decode_time_s", "peak_memory_bytes", "peak_memory_source", "memory",
                "exact", "repeat")  # what may differ from the baseline's records: timings, memory, the setting


def shipped(args) -> int:
    """The default suite on the shipped model with --exact against results/baseline (float32, plain):
    every record field but timings and memory must be equal."""
    from sbd_bench.analysis.metrics import sample_key
    from sbd_bench.analysis.records import load_run
    from sbd_bench.cli import main as sbd

    out = Path(args.out) / "shipped"
    shutil.rmtree(out, ignore_errors=True)
    argv = ["run", "--model", "sbd-tiny", "--task", "suite", "--solver", "all", "--threads", "1", "--exact",
            "--warmup", "0", "--no-cost-curve", "--out", str(out)]
    if sbd(argv) != 0:
        raise SystemExit(f"`python -m sbd_bench {' '.join(argv)}` failed: see above")
    baseline = {sample_key(r): r for r in load_run(ROOT / "results" / "baseline")[1] if r.get("repeat", 0) == 0}
    records = load_run(out)[1]
    differ = [r for r in records if {k: v for k, v in r.items() if k not in NOT_COMPARED}
              != {k: v for k, v in baseline[sample_key(r)].items() if k not in NOT_COMPARED}]
    for r in differ[:10]:
        print(f"differs from the baseline: {r['config']} on {r['task']}/{r['id']}")
    print(json.dumps({"shipped_records": len(records), "baseline_records": len(baseline), "differ": len(differ)}))
    return 1 if differ or len(records) != len(baseline) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exact", action="store_true", help="decode with --exact (then any difference fails)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--families", default="llama,qwen3")
    parser.add_argument("--seeds", default="11,12")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--block-sizes", default="3,8")
    parser.add_argument("--batch-sizes", default="1,4", help="the first is the reference for the others")
    parser.add_argument("--max-new-tokens", type=int, default=33)
    parser.add_argument("--out", default="runs/exact-check")
    parser.add_argument("--shipped", action="store_true", help="instead: sbd-tiny's suite with --exact against "
                                                                  "results/baseline, field by field")
    args = parser.parse_args()
    if args.shipped:
        return shipped(args)
    from tiny_models import build_issue_model

    out = Path(args.out) / ("exact" if args.exact else "plain")
    task = out / "prompts.jsonl"
    task.parent.mkdir(parents=True, exist_ok=True)
    task.write_text("".join(json.dumps(row) + "\n" for row in prompts(args.prompts)))
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    lines, totals, started = [], dict(verified=0, differ_from_ntp=0, batch_records=0, differ_from_batch_1=0), time.time()
    for family in args.families.split(","):
        for seed in map(int, args.seeds.split(",")):
            model = Path(args.out) / "models" / f"{family}-s{seed}"
            if not (model / "config.json").exists():
                build_issue_model(model, family, seed)
            for block_size in map(int, args.block_sizes.split(",")):
                reference = None
                for batch_size in batch_sizes:
                    records = decode(model, task, out / f"{family}-s{seed}-k{block_size}-b{batch_size}", block_size,
                                     batch_size, args)
                    ntp = {r["id"]: r["output_ids"] for r in records if r["solver"] == "ntp"}
                    verified = [r for r in records if (r["params"] or {}).get("verify") == "on"]
                    differ = sum(r["output_ids"] != ntp[r["id"]] for r in verified)
                    mine = {(r["config"], r["id"]): [r[f] for f in RECORD_FIELDS] for r in records}
                    if reference is None:
                        reference, moved = mine, "-"
                    else:
                        moved = sum(mine[key] != reference[key] for key in reference)
                        totals["batch_records"] += len(reference)
                        totals["differ_from_batch_1"] += moved
                    totals["verified"] += len(verified)
                    totals["differ_from_ntp"] += differ
                    lines.append(f"| {family} | {seed} | {block_size} | {batch_size} | {len(verified)} | {differ} | "
                                 f"{moved} |")
    print(f"\n{'--exact' if args.exact else 'plain'}, {args.dtype}, {args.prompts} prompts, "
          f"max {args.max_new_tokens} new tokens, {time.time() - started:.0f} s")
    print("| family | seed | block size | batch | verified samples | differ from ntp | records differing from batch "
          f"{batch_sizes[0]} |\n|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    print(json.dumps({"exact": args.exact, "dtype": args.dtype, **totals}))
    failed = args.exact and (totals["differ_from_ntp"] or totals["differ_from_batch_1"])
    return 1 if failed or not totals["verified"] else 0


if __name__ == "__main__":
    sys.exit(main())
