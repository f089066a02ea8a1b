"""Make ``TRITON_INTERPRET=1`` usable with numpy >= 2.4 (triton-lang/triton#9171), and
make it round to bf16 as the GPU does.

The interpreter turns a scalar tensor into a Python int with ``int(handle.data)``, but it
stores scalars as 1-element 1-D arrays, which numpy 2.4 refuses to convert. Any loop
whose bound is a loaded value (``range(0, seq_len, BLOCK)``) then fails on CPU while
working on the GPU. Its fp32 -> bf16 casts truncate, where the GPU rounds to nearest even.
This patches those two things; it does nothing on a compiled run.
"""

from __future__ import annotations

import os


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def patch_interpreter() -> None:
    if not interpreting():
        return
    from triton.runtime import interpreter as interp

    if getattr(interp, "_openinfer_patched", False):
        return
    original = interp._patch_lang_tensor

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched
    _round_bf16_to_nearest_even(interp)
    interp._openinfer_patched = True


def _round_bf16_to_nearest_even(interp) -> None:
    """fp32 -> bf16 as the GPU does it: round to nearest even. The interpreter truncates
    (with ``fp_downcast_rounding="rtne"`` too: 28 of 64 random values matched torch's cast
    on triton 3.6.0), a bias that compounds over a kernel's roundings, so a bf16 kernel
    under the interpreter drifted from the same kernel on a GPU. RTZ casts keep the
    interpreter's truncation."""
    import numpy as np
    import torch
    import triton.language as tl

    original = interp._convert_float

    rtz = interp._ir.ROUNDING_MODE.RTZ

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16 and rounding_mode != rtz:
            as_fp32 = torch.from_numpy(np.ascontiguousarray(data).view(np.float32))
            bits = as_fp32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return bits.reshape(data.shape)
        return original(data, src, dst, rounding_mode)

    interp._convert_float = convert


# The interpreter runs ``tl.dot`` as ``np.matmul`` on the raw storage, and stores bf16 as
# uint16 bits, so a bf16 dot would multiply integers. Kernels route every dot through
# ``mma`` below with ``UPCAST=INTERPRET``: fp32 operands on CPU, the native dot on GPU.
INTERPRET: bool = interpreting()
