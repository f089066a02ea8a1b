"""Golden 0.6b/triton under launch knobs: is a top-1 miss the knobs' or the statistic's?
Run once per knob setting (knobs are read at import): prints one JSON line per spec."""
import json
import os
import sys
import tempfile

import torch

from experiments.validate.golden import GoldenSpec, golden_for_pack
from experiments.validate.main import ModelPack
from openinfer.models.qwen3 import preset, write_random_checkpoint

label = sys.argv[1]
mcfg = preset("0.6b", torch_dtype="bfloat16")
ckpt = write_random_checkpoint(mcfg, tempfile.mkdtemp() + "/0.6b", seed=0, dtype="bfloat16", device="cuda")
pack = ModelPack("0.6b", mcfg, ckpt, "cuda", torch.bfloat16)
for seed, steps in ((1, 32), (2, 32), (3, 32)):
    r = golden_for_pack(pack, ("triton",), GoldenSpec(block_size=16, decode_steps=steps, seed=seed))
    cases = r["backends"]["triton"]["cases"]
    row = {k: dict(passed=c["passed"], top1=round(c["top1_vs_fp32"], 4), hf_top1=round(c["hf_top1_vs_fp32"], 4),
                   rel=round(c["rel_err_vs_fp32"], 5), hf_rel=round(c["hf_rel_err_vs_fp32"], 5), rows=c["rows"])
           for k, c in cases.items()}
    print(json.dumps(dict(label=label, seed=seed, steps=steps, knobs={k: v for k, v in os.environ.items()
                                                                      if k.startswith("OPENINFER_")}, cases=row)),
          flush=True)
