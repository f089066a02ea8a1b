"""Make ``TRITON_INTERPRET=1`` usable with numpy >= 2.4 (triton-lang/triton#9171).

The interpreter turns a scalar tensor into a Python int with ``int(handle.data)``, but it
stores scalars as 1-element 1-D arrays, which numpy 2.4 refuses to convert. Any loop
whose bound is a loaded value (``range(0, seq_len, BLOCK)``) then fails on CPU while
working on the GPU. This patches that one conversion; it does nothing on a compiled run.
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
    interp._openinfer_patched = True


# The interpreter runs ``tl.dot`` as ``np.matmul`` on the raw storage, and stores bf16 as
# uint16 bits, so a bf16 dot would multiply integers. Kernels route every dot through
# ``mma`` below with ``UPCAST=INTERPRET``: fp32 operands on CPU, the native dot on GPU.
INTERPRET: bool = interpreting()
