#!/usr/bin/env bash
# The one command for the GPU machine: python -m experiments.validate into $OUT.
#
#   scripts/device_validate.sh [key=value ...]      (keys: experiments/validate/main.py)
#
# The device image has torch/triton/transformers/safetensors but not simpy: it is
# installed offline from the carried wheel (.whl/simpy-*.whl; carry: [".whl"]). The repo
# is not pip-installed (its pins would pull packages the device cannot fetch): it runs
# from the working tree through PYTHONPATH. Writes $OUT/validate.json, the timing JSONL
# files and $OUT/validate.log; prints the summary table last.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/tmp/device}
mkdir -p "$OUT"
if ! python3 -c "import simpy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/simpy-*.whl \
    || { echo "simpy wheel install failed (is .whl carried?)"; exit 3; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__, torch.cuda.is_available())"
python3 -m experiments.validate report="$OUT/validate.json" out_dir="$OUT" "$@" 2>&1 | tee "$OUT/validate.log"
rc=$?
ls -la "$OUT"
exit $rc
