#!/usr/bin/env bash
# CI regression check: the short suite (first 3 examples of each task, every solver) on the default
# model, compared with the committed baseline. Deterministic figures (NFE, tokens per forward,
# accuracy) must match exactly; the wall-clock speed factor may fall by up to 50% (a shared CPU is
# noisy; a real loss of speed-up shows in NFE first). Usage: bash scripts/ci_compare.sh [RUN_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/ci-short}"
rm -rf "$out"
python -m sbd_bench run --model sbd-tiny --task suite --solver all --limit 3 --threads 1 --out "$out"
python -m sbd_bench compare results/baseline "$out" --wall-tol 0.5 --out "$out/compare.md"
