#!/usr/bin/env bash
# One short GPU call that only measures: the decode bench of the tree and of each
# LABEL:VAR=VALUE variant side by side (each worker a fresh process), then, on an H200 (or
# with ABLATE=1), where the bs1 step's time goes: by removing each kind of kernel
# (scripts/decode_ablation.py) and from the kernels' own timestamps in the unchanged step
# (scripts/decode_timeline.py). No validate:
# use device_tune_and_validate.sh once a variant is worth making the default.
#
#   [ABLATE=auto|1|0] [ABLATE_TIMEOUT=S] [TIMELINE_TIMEOUT=S] [BENCH_TIMEOUT=S] [BASE=DIR] \
#     scripts/device_bench_and_ablate.sh LABEL:VAR=VALUE[,VAR=VALUE...] ...
#
# BASE: an older tree's package beside the working tree's, as ``before`` (make it with
# ``mkdir -p .bench_base && git archive REV openinfer | tar -x -C .bench_base``).
#
# Carry `.whl/` (the simpy wheel). Writes $OUT/nvidia-smi.txt (with the clocks under
# load), $OUT/decode_bench.json, $OUT/bench.log and, when it ablates, $OUT/ablation.json,
# $OUT/ablation.log, $OUT/timeline.json and $OUT/timeline.log (seven files: the device
# hands back at most eight); worker files stay under $WORK/bench.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-results/tmp/device}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/bench_ablate}; rm -rf "$WORK/bench" "$WORK/abl" "$WORK/tl"; mkdir -p "$WORK"
source scripts/device_env.sh
gpu_info "$OUT/nvidia-smi.txt"
clocks_start "$WORK/clocks.csv"
V=(); for v in "$@"; do V+=(--variant "$v"); done
[ -n "${BASE:-}" ] && V+=(--base "$BASE")
timeout "${BENCH_TIMEOUT:-280}" python3 scripts/device_decode_bench.py --out "$WORK/bench" "${V[@]}" \
  > "$OUT/bench.log" 2>&1
cp "$WORK/bench/decode_bench.json" "$OUT/" 2>/dev/null
grep -v "^\[decode-bench" "$OUT/bench.log" | tail -45
case "${ABLATE:-auto}" in
  1) ablate=1 ;;
  0) ablate=0 ;;
  *) nvidia-smi -L | grep -q H200 && ablate=1 || ablate=0 ;;
esac
if [ "$ablate" = 1 ]; then
  timeout "${ABLATE_TIMEOUT:-200}" python3 scripts/decode_ablation.py --out "$WORK/abl" > "$OUT/ablation.log" 2>&1
  cp "$WORK/abl/ablation.json" "$OUT/" 2>/dev/null
  tail -22 "$OUT/ablation.log"
  timeout "${TIMELINE_TIMEOUT:-60}" python3 scripts/decode_timeline.py --out "$WORK/tl" > "$OUT/timeline.log" 2>&1
  cp "$WORK/tl/timeline.json" "$OUT/" 2>/dev/null
  grep -v -i "warn" "$OUT/timeline.log" | tail -36
fi
clocks_stop "$WORK/clocks.csv" "$OUT/nvidia-smi.txt"
