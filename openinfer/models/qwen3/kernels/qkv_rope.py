"""Fused per-head q/k RMSNorm + RoPE + paged KV write, straight from the QKV projection.

One launch per layer instead of three (q norm+RoPE, k norm+RoPE, KV scatter): program
``(t, h)`` takes query head ``h < Hq`` of token ``t`` and writes it normed and rotated to
``q``; program ``(t, Hq + j)`` takes kv head ``j``, norms and rotates K and writes it with
V into the token's arena slot (``slot < 0``: nothing, which keeps the padding page clean).
K never round-trips through a separate tensor. The projection arrives as *parts*
``[S, T, (Hq + 2 Hk) D]`` (``_parts``). Intermediates are rounded where HF rounds them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._parts import load_parts
from openinfer.models.qwen3.kernels._pdl import pdl_args, pdl_wait


@triton.jit
def norm_rope_heads(heads, s_part, w_ptr, c, s, eps, mask, NUM_PARTS: tl.constexpr,
                    HALF: tl.constexpr, dt: tl.constexpr):
    """RMSNorm over each head of ``heads`` (``[R, 1]`` pointers to a head's first element;
    ``mask [R, 1]``), then rotate-half RoPE with the position's ``c``/``s`` ``[HALF]`` (or
    ``[R, HALF]``): the two halves ``[R, HALF]``, rounded where HF rounds. The decode
    attention runs it on the query heads of one kv head, this file's kernel on one head."""
    offs = tl.arange(0, HALF)[None, :]
    m = mask & (offs < HALF)
    f1 = load_parts(heads + offs, s_part, 0, m, NUM_PARTS, dt).to(tl.float32)
    f2 = load_parts(heads + HALF + offs, s_part, 0, m, NUM_PARTS, dt).to(tl.float32)
    inv = 1.0 / tl.sqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / (2 * HALF) + eps)
    w1 = tl.load(w_ptr + offs).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)
    y1 = (w1 * (f1 * inv[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    y2 = (w2 * (f2 * inv[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    o1 = ((y1 * c).to(dt).to(tl.float32) - (y2 * s).to(dt).to(tl.float32)).to(dt)
    o2 = ((y2 * c).to(dt).to(tl.float32) + (y1 * s).to(dt).to(tl.float32)).to(dt)
    return o1, o2


@triton.jit
def _qkv_rope_write_kernel(x_ptr, q_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr,
                           kc_ptr, vc_ptr, s_xs, s_xt, s_qt, s_qh, s_c, s_kp, s_ko, s_kh,
                           s_vp, s_vo, s_vh, eps, HQ: tl.constexpr, HK: tl.constexpr,
                           PAGE: tl.constexpr, NUM_PARTS: tl.constexpr, HALF: tl.constexpr,
                           PDL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, HALF)
    # Positions and the RoPE tables are step inputs, not written by the kernel before:
    # their two dependent reads go ahead of the wait.
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * s_c + offs).to(tl.float32)   # HF's table repeats its halves
    s = tl.load(sin_ptr + pos * s_c + offs).to(tl.float32)
    pdl_wait(PDL)
    dt = q_ptr.dtype.element_ty
    row = x_ptr + t * s_xt
    one = tl.full([1, 1], 0, tl.int32)
    if h < HQ:
        o1, o2 = norm_rope_heads(row + h * (2 * HALF) + one, s_xs, qw_ptr, c, s, eps, one == 0,
                                 NUM_PARTS, HALF, dt)
        dst = q_ptr + t * s_qt + h * s_qh + offs[None, :]
        tl.store(dst, o1)
        tl.store(dst + HALF, o2)
    else:
        j = h - HQ
        slot = tl.load(slot_ptr + t).to(tl.int64)
        keep = (offs < HALF) & (slot >= 0)
        page = tl.where(slot >= 0, slot // PAGE, 0)
        off = tl.where(slot >= 0, slot % PAGE, 0)
        k1, k2 = norm_rope_heads(row + (HQ + j) * (2 * HALF) + one, s_xs, kw_ptr, c, s, eps,
                                 one == 0, NUM_PARTS, HALF, dt)
        k_dst = kc_ptr + page * s_kp + off * s_ko + j * s_kh + offs[None, :]
        tl.store(k_dst, k1, mask=keep[None, :])
        tl.store(k_dst + HALF, k2, mask=keep[None, :])
        v_src = row + (HQ + HK + j) * (2 * HALF)
        v1 = load_parts(v_src, s_xs, offs, keep, NUM_PARTS, dt)
        v2 = load_parts(v_src + HALF, s_xs, offs, keep, NUM_PARTS, dt)
        v_dst = vc_ptr + page * s_vp + off * s_vo + j * s_vh
        tl.store(v_dst + offs, v1, mask=keep)
        tl.store(v_dst + HALF + offs, v2, mask=keep)


def qkv_norm_rope_write(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                        cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                        eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        slot_mapping: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Same contract as :func:`reference.qkv_norm_rope_write`: ``qkv`` parts
    ``[S, T, (Hq + 2 Hk) D]``, caches ``[pages, block, Hk, D]`` (strided arena views) ->
    the normed, rotated queries ``[T, Hq, D]``; K and V land in the caches."""
    S, T, width = qkv.shape
    Hk, D = k_cache.shape[2], k_cache.shape[3]
    assert width == (num_q_heads + 2 * Hk) * D and qkv.stride(-1) == 1
    assert D % 2 == 0 and triton.next_power_of_2(D // 2) == D // 2, \
        "the Triton head norm needs a power-of-two head_dim"
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    assert k_cache.stride(-1) == v_cache.stride(-1) == 1
    q = torch.empty((T, num_q_heads, D), dtype=k_cache.dtype, device=qkv.device)
    if T:
        _qkv_rope_write_kernel[(T, num_q_heads + Hk)](
            qkv, q, q_weight, k_weight, cos, sin, positions, slot_mapping, k_cache, v_cache,
            qkv.stride(0), qkv.stride(1), q.stride(0), q.stride(1), cos.stride(0),
            *k_cache.stride()[:3], *v_cache.stride()[:3], eps, HQ=num_q_heads, HK=Hk,
            PAGE=k_cache.shape[1], NUM_PARTS=S, HALF=D // 2, **pdl_args(qkv.device))
    return q
