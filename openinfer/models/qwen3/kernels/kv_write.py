"""Scatter the new tokens' K and V into their arena pages (one program per token).

``slot = page * block_size + offset`` is the whole addressing contract, so the same kernel
serves prefill, decode and CUDA-graph padding rows (slot < 0: write nothing, which keeps
the padding page clean).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, s_kt, s_kh, s_vt, s_vh,
                     s_kp, s_ko, s_kch, s_vp, s_vo, s_vch, H, D,
                     PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    page = slot // PAGE
    off = slot % PAGE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < H) & (d < D) & (slot >= 0)
    k = tl.load(k_ptr + t * s_kt + h * s_kh + d, mask=mask)
    v = tl.load(v_ptr + t * s_vt + h * s_vh + d, mask=mask)
    tl.store(kc_ptr + page * s_kp + off * s_ko + h * s_kch + d, k, mask=mask)
    tl.store(vc_ptr + page * s_vp + off * s_vo + h * s_vch + d, v, mask=mask)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Same contract as :func:`reference.write_kv`; caches are strided arena views."""
    T, H, D = k.shape
    assert k.stride(-1) == v.stride(-1) == k_cache.stride(-1) == v_cache.stride(-1) == 1
    if T:
        _write_kv_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1),
                               v.stride(0), v.stride(1), *k_cache.stride()[:3],
                               *v_cache.stride()[:3], H, D, PAGE=k_cache.shape[1],
                               BLOCK_H=triton.next_power_of_2(H),
                               BLOCK_D=triton.next_power_of_2(D))
