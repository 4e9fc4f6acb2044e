#!/usr/bin/env bash
# Verified decoding is lossless: on the shipped default model and the whole default suite (160 examples),
# every verified configuration's output ids must equal ntp's, example by example, and so must those of the
# lossless baselines decoded by transformers' generate (hf_prompt_lookup, hf_assisted: docs/baselines.md).
# Runs the suite with the verified configurations (and their unverified twins, for the table), then checks
# the records.
# Usage: bash scripts/lossless_check.sh [RUN_DIR] [extra `run` flags, e.g. --batch-size 4 --fast]
# Exit status 1 when any verified output differs from ntp's. Not part of CI (minutes of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/lossless}"
shift || true
solvers="ntp+entropy_bounded:verify=on,off+entropy_bounded:gamma=0,1;verify=on+fixed_k:k=16;verify=on,off"
solvers="$solvers+fixed_k:k=4;verify=on+confidence:verify=on+factor:verify=on+left_to_right:verify=on"
# the ported samplers: one that reads the previous forward, one that revokes (at its default, and drafting wide
# with a strict shadow, which revokes), the schedule, the margin and position rules
solvers="$solvers+klass:verify=on+wino:verify=on+wino:tau_in=0;tau_out=1;verify=on+dilated:verify=on+margin:verify=on"
solvers="$solvers+pc_sampler:n=2;verify=on+hf_prompt_lookup+hf_assisted"
rm -rf "$out"
python -m sbd_bench run --model sbd-tiny --task suite --solver "$solvers" --threads 1 --out "$out" "$@"
python - "$out" <<'EOF'
import json, sys
from collections import Counter
from pathlib import Path

from sbd_bench.analysis.metrics import baseline_records, collapse_repeats, pairing_key
from sbd_bench.analysis.records import load_run

summary, records = load_run(Path(sys.argv[1]))  # the records checked field by field, as report reads them
ntp = baseline_records(collapse_repeats(records))
lossless = lambda solver, params: (params or {}).get("verify") == "on" or solver.startswith("hf_")  # noqa: E731
verified = [r for r in records if lossless(r["solver"], r["params"])]
differ = Counter((r["config"], r["task"]) for r in verified
                 if r["error"] or r["output_ids"] != ntp[pairing_key(r)]["output_ids"])
more = Counter((r["config"], r["task"]) for r in verified if not r["error"] and r["nfe"] > ntp[pairing_key(r)]["nfe"])
print("| config | task | n | = ntp | NFE speed factor | acceptance % | wall speed factor | examples with more NFE than ntp |")
print("|---|---|---|---|---|---|---|---|")
for row in summary["rows"]:
    if lossless(row["solver"], row["params"]) or row["solver"] == "ntp":
        key, total = (row["config"], row["task"]), row["n"] + row["errors"]
        acc = "-" if row["acceptance_rate"] is None else f"{100 * row['acceptance_rate']:.1f}"
        print(f"| {row['config']} | {row['task']} | {row['n']} | {total - differ[key]}/{total} "
              f"| {row['speed_factor_nfe']:.2f}x | {acc} | {row['speed_factor_wall']:.2f}x | {more[key]} |")
print(json.dumps({"verified_samples": len(verified), "differ_from_ntp": sum(differ.values()),
                  "more_nfe_than_ntp": sum(more.values())}))
sys.exit(1 if differ or not verified else 0)
EOF
