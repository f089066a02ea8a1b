#!/usr/bin/env bash
# The one command for the GPU machine: python -m experiments.validate into $OUT.
#
#   scripts/device_validate.sh [key=value ...]      (keys: experiments/validate/main.py)
#
# Carry `.whl/` (the simpy wheel; scripts/device_env.sh says why). Writes
# $OUT/validate.json, the timing JSONL files and $OUT/validate.log; prints the summary
# table last.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/tmp/device}
mkdir -p "$OUT"
source scripts/device_env.sh
gpu_info "$OUT/nvidia-smi.txt"
python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__, torch.cuda.is_available())"
python3 -m experiments.validate report="$OUT/validate.json" out_dir="$OUT" "$@" 2>&1 | tee "$OUT/validate.log"
rc=$?
ls -la "$OUT"
exit $rc
