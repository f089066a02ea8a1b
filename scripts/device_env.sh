# Sourced by the GPU-machine scripts (device_validate.sh, device_tune_and_validate.sh).
# The device image has torch/triton/transformers/safetensors but not simpy, and nothing
# can be downloaded there: simpy comes from the carried wheel (.whl/simpy-*.whl; carry:
# [".whl"]). The repo is not pip-installed (its pins would pull packages the device cannot
# fetch): it runs from the working tree through PYTHONPATH.
if ! python3 -c "import simpy" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/simpy-*.whl \
    || { echo "simpy wheel install failed (is .whl carried?)"; exit 3; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

# The card, its driver, clocks (now and the most it may run at), power limit and temperature
# into $1 (and on the terminal): two cards of one name may run at different clocks.
gpu_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv 2>&1 | tee "$1"
  nvidia-smi --query-gpu=clocks.max.sm,clocks.max.memory,power.limit --format=csv 2>&1 | tee -a "$1"
}
