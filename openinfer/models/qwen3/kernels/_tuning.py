"""Launch-tuning knobs read once from the environment, for side-by-side GPU benchmarks.

A knob changes only how a kernel is launched (tile sizes, warps, tiles read before the PDL
wait), never what it computes, so ``scripts/device_decode_bench.py --variant`` can time
several settings of the same tree in one call. A bad value is a ConfigError naming the
variable at import, not a launch failure inside a captured graph.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from openinfer.errors import require


def env_choice(var: str, default: int, allowed: Sequence[int], what: str) -> int:
    """The integer in ``var`` (``default`` when unset), which must be one of ``allowed``."""
    text = os.environ.get(var, str(default))
    require(text.isdigit() and int(text) in allowed, var, text,
            f"one of {', '.join(map(str, allowed))} ({what})")
    return int(text)


def knobs_set(prefix: str = "OPENINFER_") -> dict[str, str]:
    """The knobs this process was started with (``prefix``...), sorted: what a report or a
    printout must name, since it did not run the tree's defaults."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefix)}
