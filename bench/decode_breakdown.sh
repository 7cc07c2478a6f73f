#!/usr/bin/env bash
# Per-kernel GPU time of one graph-replayed decode step, by ncu: bench/decode_breakdown.sh OUTPREFIX ARGS...
# ARGS are `glimmer bench decode` arguments (one model), e.g. --synthetic qwen3-8b. Writes OUTPREFIX.csv
# (ncu's raw rows) and OUTPREFIX.md (kernels summed by name).
set -eu
out=${1:?usage: decode_breakdown.sh OUTPREFIX ARGS...}; shift
cd "$(dirname "$0")/.."
ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 -m glimmer_cupy.cli bench decode --runs 1 --gen 16 --profile-step "$@" > "$out.raw" 2>&1
grep -E '^"' "$out.raw" > "$out.csv"
python3 bench/ncu_summary.py "$out.csv" --title "One decode step of $*: kernels by name (ncu gpu__time_duration)" > "$out.md"
cat "$out.md"
