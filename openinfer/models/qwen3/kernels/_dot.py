"""``mma``: ``tl.dot`` with the interpreter workaround of ``_interpret`` (bf16 upcast)."""

import triton
import triton.language as tl


@triton.jit
def mma(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)
