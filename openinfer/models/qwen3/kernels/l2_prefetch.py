"""Read weights into L2 ahead of the GEMM that needs them, while HBM would otherwise idle.

A bs-1 decode step streams every weight once, so it runs at the speed of HBM only while a
GEMM runs. Between a layer's QKV projection and its ``o_proj`` sit RoPE and the two
attention kernels: ~10 µs in which HBM carries only a few MB of KV. This kernel, launched
on a side stream in that window, pulls the next weights (``o_proj``, then the head of
``gate_up``) into L2 with an evict-last hint, so the GEMM that follows reads them from L2.
Weights are never written during a step, so the side stream needs no ordering with the
main one except the join before the GEMM (which only saves time if the lines are there).

The loads are kept alive by a store that never happens (``sum != sum`` is false for
finite weights); the sum itself is a few FMAs per loaded vector, far below the load rate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096   # elements per load: 8 KB of bf16 per program per iteration


@triton.jit
def _l2_prefetch_kernel(w_ptr, sink_ptr, n, per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lo = pid.to(tl.int64) * per_program
    hi = tl.minimum(lo + per_program, n)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(w_ptr + offs, mask=offs < hi, other=0.0, eviction_policy="evict_last")
        acc += x.to(tl.float32)
    total = tl.sum(acc, axis=0)
    tl.store(sink_ptr + pid, total, mask=total != total)


def l2_prefetch(w: torch.Tensor, max_bytes: int, sink: torch.Tensor) -> int:
    """Launch the read of the first ``min(max_bytes, w.nbytes)`` bytes of the contiguous
    ``w`` on the current stream; returns the bytes covered. ``sink``: >= programs fp32."""
    assert w.is_contiguous()
    n = min(w.numel(), max_bytes // w.element_size())
    if n <= 0:
        return 0
    programs = min(sink.numel(), triton.cdiv(n, BLOCK))
    per_program = triton.cdiv(triton.cdiv(n, programs), BLOCK) * BLOCK
    _l2_prefetch_kernel[(triton.cdiv(n, per_program),)](w, sink, n, per_program, BLOCK=BLOCK,
                                                        num_warps=4)
    return n * w.element_size()
