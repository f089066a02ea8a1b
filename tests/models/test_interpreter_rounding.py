"""The Triton interpreter's fp32 -> bf16 casts round as the GPU's do (kernels/_interpret.py).

Every bf16 kernel's CPU test leans on this: the interpreter's own cast truncates, so a
kernel's output drifted from what the same kernel gives on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from openinfer.models.qwen3 import kernels  # noqa: F401  (applies the interpreter patch)
from openinfer.models.qwen3.kernels._interpret import interpreting

pytestmark = pytest.mark.skipif(not interpreting(), reason="a check of the CPU interpreter")


@triton.jit
def _to_bf16(x_ptr, cast_ptr, stored_ptr, rtz_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(cast_ptr + offs, x.to(tl.bfloat16))
    tl.store(stored_ptr + offs, x)                      # the store's own cast
    tl.store(rtz_ptr + offs, x.to(tl.bfloat16, fp_downcast_rounding="rtz"))


def test_fp32_to_bf16_rounds_to_nearest_even_as_torch():
    g = torch.Generator().manual_seed(0)
    # random values, exact ties (the low 16 bits 0x8000: even and odd kept halves),
    # values that round up into the next exponent, signs and zeros
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3FFFFFFF, 0xBF7FFF80, 0, 0x80000000],
                        dtype=torch.int64).to(torch.int32)
    x = torch.cat([torch.randn(250, generator=g), bits.view(torch.float32)])[:256]
    cast, stored, rtz = (torch.empty(256, dtype=torch.bfloat16) for _ in range(3))
    _to_bf16[(1,)](x, cast, stored, rtz, 256)
    want = x.to(torch.bfloat16)
    assert torch.equal(cast.view(torch.int16), want.view(torch.int16))
    assert torch.equal(stored.view(torch.int16), want.view(torch.int16))
    truncated = (x.view(torch.int32) >> 16).to(torch.int16)
    assert torch.equal(rtz.view(torch.int16), truncated)     # rtz still truncates
    assert not torch.equal(want.view(torch.int16), truncated)  # the cases tell them apart
