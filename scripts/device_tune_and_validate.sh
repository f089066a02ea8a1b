#!/usr/bin/env bash
# One GPU call that measures launch knobs and then validates: the decode bench of the tree
# and of each --variant (each worker a fresh process), `validate` on the tree's defaults,
# then validate's bench section again with the variant that beat the tree by more than 1%
# at every point of the PICK_BATCHES batches (default 1; e.g. PICK_BATCHES=32,64), judged by
# its worst point against the tree's same point. Built for a card the knobs were not tuned on.
# ABLATE=1 also runs scripts/decode_ablation.py and scripts/decode_timeline.py after the
# bench (where the bs1 step's time goes; about 20 s each, cut at 75 and 45 s so that the
# worst case stays inside a 600 s device call: bench 240 + 75 + 45 + validate 220), before
# validate. The re-run of a winning variant (120 s more) only comes when the bench
# finished early enough to leave room for it.
#
#   [PICK_BATCHES=B[,B...]] [ABLATE=0|1] scripts/device_tune_and_validate.sh LABEL:VAR=VALUE[,VAR=VALUE...] ...
#
# Carry `.whl/` (the simpy wheel). Writes $OUT/decode_bench.json, $OUT/validate.json,
# $OUT/ablation.json and .log and $OUT/timeline.log (with ABLATE=1; its json is in r.tgz),
# $OUT/validate_best.json (when a variant won) and $OUT/r.tgz (logs and worker files).
set -u
cd "$(dirname "$0")/.."
R=/tmp/tune; rm -rf $R; mkdir -p $R
OUT=${OUT:-results/tmp/device}; mkdir -p "$OUT"
# the bench half (and with ABLATE=1 the ablation and the timeline) is the measuring-only script's
OUT=$R WORK=$R ABLATE=${ABLATE:-0} ABLATE_TIMEOUT=75 TIMELINE_TIMEOUT=45 BENCH_TIMEOUT=240 \
  bash scripts/device_bench_and_ablate.sh "$@" | tail -110
cp $R/nvidia-smi.txt $R/decode_bench.json $R/ablation.json $R/ablation.log $R/timeline.log "$OUT/" 2>/dev/null
OUT=$R/val timeout 220 bash scripts/device_validate.sh 2>&1 | tail -16
cp $R/val/validate.json "$OUT/" 2>/dev/null
BEST=$(python3 - $R/bench/decode_bench.json "${PICK_BATCHES:-1}" "$@" <<'PY'
import json, sys
workers = json.load(open(sys.argv[1]))['workers']
batches = {int(b) for b in sys.argv[2].split(',')}
env = {label: kv.replace(',', ' ') for label, kv in (a.split(':', 1) for a in sys.argv[3:])}
def points(w):
    return {(p['batch'], p['context']): p['median_s']
            for p in w.get('decode', {}).get('points', []) if p['batch'] in batches}
base = points(workers['after'])
def worst_ratio(w):
    mine = points(w)
    return max(mine[k] / base[k] for k in base) if base and set(mine) == set(base) else float('inf')
best = min(((worst_ratio(w), k) for k, w in workers.items() if k in env), default=(float('inf'), ''))
print(env[best[1]] if best[0] < 0.99 else '')
PY
)
echo "fastest variant beyond 1% at batches ${PICK_BATCHES:-1}: '${BEST}'"
if [ -n "$BEST" ] && [ "$SECONDS" -gt 460 ]; then
  echo "no re-run with '$BEST': ${SECONDS} s gone, and it takes up to 120 s of a 600 s call"
elif [ -n "$BEST" ]; then
  env $BEST OUT=$R/valbest timeout 120 bash scripts/device_validate.sh sections=bench 2>&1 | tail -10
  cp $R/valbest/validate.json "$OUT/validate_best.json" 2>/dev/null; echo "$BEST" > $R/best_env.txt
fi
tar czf "$OUT/r.tgz" --exclude='*.safetensors' -C /tmp tune
