"""Reading a projection's *parts*: ``[S, T, N]`` split-K partial sums (fp32) or ``S == 1``.

The skinny decode GEMM may split K and leave the ``S`` partial sums to its consumer; every
consumer kernel reads its input through ``load_parts``, which adds the parts in a fixed
order (``0 .. S-1``, fp32) and rounds once to the model dtype, as a GEMM's epilogue would.
With ``S == 1`` it is a plain load (the round trip through fp32 is exact).
``load_parts_with(..., ".cg")`` reads through L2 only: for parts that other SMs of the same
grid wrote (a fused tail, ``_arrivals``).
"""

import triton
import triton.language as tl


@triton.jit
def load_parts_with(ptr, s_part, offs, mask, NUM_PARTS: tl.constexpr, dt: tl.constexpr,
                    CACHE: tl.constexpr):
    x = tl.load(ptr + offs, mask=mask, other=0.0, cache_modifier=CACHE).to(tl.float32)
    for s in tl.static_range(1, NUM_PARTS):
        x += tl.load(ptr + s * s_part + offs, mask=mask, other=0.0,
                     cache_modifier=CACHE).to(tl.float32)
    return x.to(dt)


@triton.jit
def load_parts(ptr, s_part, offs, mask, NUM_PARTS: tl.constexpr, dt: tl.constexpr):
    return load_parts_with(ptr, s_part, offs, mask, NUM_PARTS, dt, "")
