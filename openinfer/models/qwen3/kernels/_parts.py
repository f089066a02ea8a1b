"""Reading a projection's *parts*: ``[S, T, N]`` split-K partial sums (fp32) or ``S == 1``.

The skinny decode GEMM may split K and leave the ``S`` partial sums to its consumer; every
consumer kernel reads its input through ``load_parts``, which adds the parts in a fixed
order (``0 .. S-1``, fp32) and rounds once to the model dtype, as a GEMM's epilogue would.
With ``S == 1`` it is a plain load (the round trip through fp32 is exact).
"""

import triton
import triton.language as tl


@triton.jit
def _load(ptr, mask, CG: tl.constexpr):
    if CG:
        return tl.load(ptr, mask=mask, other=0.0, cache_modifier=".cg")
    else:
        return tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def load_parts(ptr, s_part, offs, mask, NUM_PARTS: tl.constexpr, dt: tl.constexpr,
               CG: tl.constexpr):
    """``CG`` reads through L2 only (``.cg``): for parts other programs of the same launch
    wrote (``_arrivals``), which this SM's L1 does not see."""
    x = _load(ptr + offs, mask, CG).to(tl.float32)
    for s in tl.static_range(1, NUM_PARTS):
        x += _load(ptr + s * s_part + offs, mask, CG).to(tl.float32)
    return x.to(dt)
