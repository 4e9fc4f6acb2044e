#!/usr/bin/env bash
# Regenerate results/baseline deliberately (after a change that is meant to move NFE, accuracy or
# speed, or a new default model): the whole default suite, every solver, medians of 3 repeats on one
# thread, then the CI short suite compared against it as a check. Review `git diff --stat results/`
# and commit results/baseline with a message that says why the baseline moved. Beside `all`, the two lossless
# baselines decoded by transformers' generate (not in `all`: docs/baselines.md), so that the README's table and
# plot set verified SBD beside them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs
tmp="$(mktemp -d runs/baseline.XXXXXX)"
python -m sbd_bench run --model sbd-tiny --task suite --solver "all+hf_prompt_lookup+hf_assisted" --threads 1 --batch-size 1 --repeats 3 --out "$tmp/baseline"
rm -rf results/baseline
mkdir -p results
mv "$tmp/baseline" results/baseline
bash scripts/ci_compare.sh "$tmp/ci-short"
echo "results/baseline refreshed; commit it with the reason"
