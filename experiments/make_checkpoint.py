"""Write a seeded random Qwen3 checkpoint that HF transformers and openinfer both load.

    python -m experiments.make_checkpoint size=tiny|0.6b|1.7b|4b|8b out=DIR [seed=0]
                                          [dtype=bfloat16|float32]
"""

from __future__ import annotations

import sys
import time

from omegaconf import OmegaConf

from openinfer.errors import ConfigError, require
from openinfer.models.qwen3.checkpoint import write_random_checkpoint
from openinfer.models.qwen3.config import PRESETS, preset

DEFAULTS = {"size": None, "out": None, "seed": 0, "dtype": "bfloat16"}


def parse_args(argv: list[str]) -> dict:
    """``key=value`` arguments (OmegaConf dotlist) merged over DEFAULTS; unknown or
    missing keys raise ConfigError naming them."""
    for a in argv:   # each key as typed: a dotted one (out.x=1) would nest under a known key
        key, sep, value = a.partition("=")
        require(bool(sep), "argument", a, "key=value")
        require(key in DEFAULTS, key, value, f"one of the keys {', '.join(DEFAULTS)}")
    given = OmegaConf.to_container(OmegaConf.from_dotlist(argv))
    args = {**DEFAULTS, **given}
    require(args["size"] in PRESETS, "size", args["size"], f"one of {list(PRESETS)}")
    require(args["out"] is not None, "out", None, "an output directory")
    require(args["dtype"] in ("bfloat16", "float32"), "dtype", args["dtype"],
            "bfloat16 or float32")
    require(type(args["seed"]) is int and args["seed"] >= 0, "seed", args["seed"],
            "an int >= 0")
    args["out"] = str(args["out"])
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--help"], ["-h"]):
        print(__doc__)
        return 0
    try:
        args = parse_args(argv)
    except ConfigError as e:
        print(f"make_checkpoint: {e}\n{__doc__}", file=sys.stderr)
        return 2
    cfg = preset(args["size"])
    t0 = time.perf_counter()
    out = write_random_checkpoint(cfg, args["out"], seed=args["seed"], dtype=args["dtype"])
    print(f"wrote {args['size']} ({cfg.num_parameters() / 1e6:.1f}M params, {args['dtype']}, "
          f"seed={args['seed']}) to {out} in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
