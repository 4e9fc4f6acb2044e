#!/usr/bin/env bash
# CI regression check: the short suite (first 3 examples of each task, every solver) on the default
# model, compared with the committed baseline. Deterministic figures (NFE, tokens per forward,
# accuracy) must match exactly; the wall-clock speed factor may fall by up to 50% (a shared CPU is
# noisy; a real loss of speed-up shows in NFE first). Timings are medians of 3 decodes, as in the
# baseline: with one decode of 3 examples the wall speed factor moved by up to 36% between two runs
# here. Batch 1, as the baseline (a batched run's wall factors compare throughput). Usage: bash scripts/ci_compare.sh [RUN_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/ci-short}"
rm -rf "$out"
python -m sbd_bench run --model sbd-tiny --task suite --solver all --limit 3 --threads 1 --batch-size 1 --repeats 3 --out "$out"
python -m sbd_bench compare results/baseline "$out" --wall-tol 0.5 --out "$out/compare.md"
