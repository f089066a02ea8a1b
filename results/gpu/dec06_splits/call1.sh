#!/usr/bin/env bash
# One call: GPU readback tests; validate with cached splits (<=33) + 3 GEMM stages (cached splits'
# served section faulted on 12-05, before IN_FLIGHT); decode bench of 8k-captured graphs with variants.
set -u
R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 3
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/nvidia-smi.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/backend/test_readback.py 2>&1 | tail -8 | tee $R/readback_gpu.txt
C="OPENINFER_DECODE_CACHED_SPLITS=1 OPENINFER_DECODE_MIN_SPLIT_TOKENS=32"
env $C OPENINFER_DECODE_MAX_SPLITS=33 OPENINFER_SKINNY_STAGES=3 OUT=$R/val timeout 250 bash scripts/device_validate.sh 2>&1 | tail -30
V="--variant s3:OPENINFER_SKINNY_STAGES=3 --variant c32:${C// /,},OPENINFER_DECODE_MAX_SPLITS=32 --variant c33:${C// /,},OPENINFER_DECODE_MAX_SPLITS=33 --variant c33s3:OPENINFER_SKINNY_STAGES=3,${C// /,},OPENINFER_DECODE_MAX_SPLITS=33"
timeout 175 python3 scripts/device_decode_bench.py --out $R/g8k --graph-context 8192 $V 2>&1 | tee $R/g8k.log | grep -v "^\[decode-bench" | tail -40
# (4k-captured bench dropped: device time)
cp $R/g8k/decode_bench.json $OUT/g8k_decode_bench.json; 
cp $R/val/validate.json $OUT/; cp $R/readback_gpu.txt $OUT/
tar czf $OUT/r.tgz --exclude='*.safetensors' -C /tmp r
