#!/usr/bin/env bash
# Verified decoding is lossless: on the shipped default model and the whole default suite (160 examples),
# every verified configuration's output ids must equal ntp's, example by example. Runs the suite with
# the verified configurations (and their unverified twins, for the table), then checks the records.
# Usage: bash scripts/lossless_check.sh [RUN_DIR] [extra `run` flags, e.g. --batch-size 4 --fast]
# Exit status 1 when any verified output differs from ntp's. Not part of CI (minutes of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/lossless}"
shift || true
solvers="ntp+entropy_bounded:verify=on,off+entropy_bounded:gamma=0,1;verify=on+fixed_k:k=16;verify=on,off"
solvers="$solvers+fixed_k:k=4;verify=on+confidence:verify=on+factor:verify=on+left_to_right:verify=on"
rm -rf "$out"
python -m sbd_bench run --model sbd-tiny --task suite --solver "$solvers" --threads 1 --out "$out" "$@"
python - "$out" <<'EOF'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
ntp = {(r["task"], r["id"]): r for r in records if r["solver"] == "ntp"}
verified = [r for r in records if (r["params"] or {}).get("verify") == "on"]
differ = [r for r in verified if r["error"] or r["output_ids"] != ntp[(r["task"], r["id"])]["output_ids"]]
more = [r for r in verified if r["nfe"] > ntp[(r["task"], r["id"])]["nfe"]]
print("| config | task | n | = ntp | NFE speed factor | acceptance % | wall speed factor | examples with more NFE than ntp |")
print("|---|---|---|---|---|---|---|---|")
for row in json.loads((run / "summary.json").read_text())["rows"]:
    if row["params"].get("verify") == "on" or row["solver"] == "ntp":
        same = sum(1 for r in verified if (r["config"], r["task"]) == (row["config"], row["task"]) and r not in differ)
        worse = sum(1 for r in more if (r["config"], r["task"]) == (row["config"], row["task"]))
        acc = "-" if row["acceptance_rate"] is None else f"{100 * row['acceptance_rate']:.1f}"
        print(f"| {row['config']} | {row['task']} | {row['n']} | {same if row['solver'] != 'ntp' else row['n']}/{row['n']} "
              f"| {row['speed_factor_nfe']:.2f}x | {acc} | {row['speed_factor_wall']:.2f}x | {worse} |")
print(json.dumps({"verified_samples": len(verified), "differ_from_ntp": len(differ), "more_nfe_than_ntp": len(more)}))
sys.exit(1 if differ or not verified else 0)
EOF
