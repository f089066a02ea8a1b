"""Write a seeded random Qwen3 checkpoint that HF transformers and openinfer both load.

    python -m experiments.make_checkpoint size=tiny|0.6b|1.7b|4b|8b out=DIR [seed=0]
                                          [dtype=bfloat16|float32]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from experiments.cli import parse_overrides
from openinfer.errors import ConfigError, require
from openinfer.models.qwen3.checkpoint import write_random_checkpoint
from openinfer.models.qwen3.config import PRESETS, preset


@dataclass
class CheckpointArgs:
    size: str
    out: str
    seed: int = 0
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        require(self.size in PRESETS, "size", self.size, f"one of {list(PRESETS)}")
        require(bool(self.out), "out", self.out, "an output directory")
        require(self.dtype in ("bfloat16", "float32"), "dtype", self.dtype, "bfloat16 or float32")
        require(self.seed >= 0, "seed", self.seed, "an int >= 0")


def parse_args(argv: list[str]) -> CheckpointArgs:
    """``key=value`` arguments, read as every command's are (``experiments.cli``): an
    unknown key (a dotted one too), a value of the wrong type or a missing size or out
    raises ConfigError naming it; ``--help`` prints the keys and exits 0."""
    return parse_overrides(CheckpointArgs, argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"make_checkpoint: {e}\n{__doc__}", file=sys.stderr)
        return 2
    cfg = preset(args.size)
    t0 = time.perf_counter()
    out = write_random_checkpoint(cfg, args.out, seed=args.seed, dtype=args.dtype)
    print(f"wrote {args.size} ({cfg.num_parameters() / 1e6:.1f}M params, {args.dtype}, "
          f"seed={args.seed}) to {out} in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
