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

# Clocks under load: sample the SM clock, power and utilisation every 200 ms in the
# background (clocks_start FILE) and append a summary of the busy samples to $2
# (clocks_stop FILE SUMMARY). Two cards of one name may hold different clocks under load
# (power or thermal caps), which gpu_info's idle reading cannot show.
clocks_start() {
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu \
    --format=csv,noheader,nounits -lms 200 > "$1" 2>/dev/null &
  CLOCKS_PID=$!
}
clocks_stop() {
  kill "${CLOCKS_PID:-}" 2>/dev/null; wait "${CLOCKS_PID:-}" 2>/dev/null
  python3 - "$1" <<'PY' 2>&1 | tee -a "$2"
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    try:
        sm, mem, power, util, temp = (float(v) for v in line.split(','))
    except ValueError:
        continue
    if util > 0:
        rows.append((sm, mem, power, temp))
if not rows:
    print('clocks under load: no busy sample')
else:
    col = list(zip(*rows))
    print(f'clocks under load ({len(rows)} busy samples of 200 ms): SM MHz median '
          f'{statistics.median(col[0]):.0f} min {min(col[0]):.0f}; memory MHz median '
          f'{statistics.median(col[1]):.0f}; power W median {statistics.median(col[2]):.0f} '
          f'max {max(col[2]):.0f}; temperature C max {max(col[3]):.0f}')
PY
}
