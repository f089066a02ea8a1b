"""Paged decode attention: one query per sequence, flash-decoding split over the KV length.

With a small batch, one program per (sequence, kv head) leaves most SMs idle on long
contexts, so the KV range of each sequence is cut into ``num_splits`` equal chunks that
run in parallel and write a partial (normalised output, log-sum-exp); a second tiny kernel
merges them. All ``GROUP`` query heads that share a kv head are processed together, so K/V
is read once per group. Shapes depend only on (batch, heads, num_splits): no host sync and
no data-dependent shapes, so the pair can be captured in a CUDA graph; ``num_splits`` is a
compile-time constant chosen per batch bucket.

Tried and measured slower (results/gpu/tiles_attempt/): fixed 64-token tiles dealt
round-robin to the splits, the first read ahead of the PDL wait. On an H100 it cost 1-2% at
batch 1 and 3-16% at batch 32-64, so every program waits first and takes an equal share of
the sequence's actual length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._interpret import INTERPRET
from openinfer.models.qwen3.kernels._paged_tile import attend_tile, kv_tile
from openinfer.models.qwen3.kernels._pdl import pdl_args, pdl_wait
from openinfer.models.qwen3.kernels.prefill_attention import dot_precision


@triton.jit
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, o_ptr, part_ptr, lse_ptr, bt_ptr, seq_lens_ptr,
                         sm_scale, s_qt, s_qh, s_ot, s_oh, s_kp, s_ko, s_kh, s_vp, s_vo, s_vh,
                         s_bt, s_pb, s_ph, s_ps, s_lb, s_lh,
                         HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr,
                         NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
                         UPCAST: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    pdl_wait(PDL)
    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.cdiv(seq_len, NUM_SPLITS)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * s_qt + heads[:, None] * s_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + b * s_bt
    for start in range(lo, hi, BLOCK_N):
        k, v, n_mask = kv_tile(kc_ptr, vc_ptr, bt_row, start, hi, kvh, s_kp, s_ko, s_kh,
                               s_vp, s_vo, s_vh, offs_d, d_mask, PAGE, BLOCK_N)
        m_i, l_i, acc = attend_tile(q, k, v, n_mask[None, :], m_i, l_i, acc, sm_scale,
                                    DOT_PREC, UPCAST)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        tl.store(o_ptr + b * s_ot + heads[:, None] * s_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask)
    else:
        lse = tl.where(l_i > 0.0, m_i + tl.log(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        tl.store(part_ptr + b * s_pb + heads[:, None] * s_ph + split * s_ps + offs_d[None, :],
                 out, mask=mask)
        tl.store(lse_ptr + b * s_lb + heads * s_lh + split, lse, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(part_ptr, lse_ptr, o_ptr, s_pb, s_ph, s_ps, s_lb, s_lh, s_ot, s_oh,
                          HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                          BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pdl_wait(PDL)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    lse = tl.load(lse_ptr + b * s_lb + h * s_lh + offs_s, mask=s_mask, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, axis=0))          # split 0 is never empty: max is finite
    part = tl.load(part_ptr + b * s_pb + h * s_ph + offs_s[:, None] * s_ps + offs_d[None, :],
                   mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.sum(w, axis=0)
    tl.store(o_ptr + b * s_ot + h * s_oh + offs_d, out.to(o_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


def default_num_splits(batch: int, num_kv_heads: int, max_context: int) -> int:
    """About 512 programs (~4 per SM of a 132-SM H200) without cutting a full-length
    context into splits under 128 tokens; depends only on static sizes, so it is fixed per
    graph bucket. From a sweep on an H200 at bs 1 and 8, 1k and 4k context
    (``scripts/device_decode_bench.py --sweep``): bs 1 wants ~32 splits, bs 8 ~8."""
    want = triton.cdiv(512, batch * num_kv_heads)
    return max(1, min(64, want, triton.cdiv(max_context, 128)))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     num_splits: int | None = None, block_n: int = 64,
                     num_warps: int = 4) -> torch.Tensor:
    """q ``[B, Hq, D]`` (one token per sequence), caches ``[pages, block, Hk, D]``,
    ``seq_lens[b] >= 1`` -> out ``[B, Hq, D]``. Padding rows: seq_len 1 on a padding page."""
    B, Hq, D = q.shape
    Hk, page = k_cache.shape[2], k_cache.shape[1]
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert Hq % Hk == 0 and block_n >= 16
    if num_splits is None:
        num_splits = default_num_splits(B, Hk, block_tables.shape[1] * page)
    out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    part = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, Hq, num_splits), dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(D))
    group = Hq // Hk
    _decode_split_kernel[(B, Hk, num_splits)](
        q, k_cache, v_cache, out, part, lse, block_tables, seq_lens, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), *k_cache.stride()[:3],
        *v_cache.stride()[:3], block_tables.stride(0), *part.stride()[:3], *lse.stride()[:2],
        HEAD_DIM=D, GROUP=group, PAGE=page, NUM_SPLITS=num_splits,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_PREC=dot_precision(q.dtype), UPCAST=INTERPRET, num_warps=num_warps,
        **pdl_args(q.device))
    if num_splits > 1:
        _decode_reduce_kernel[(B, Hq)](
            part, lse, out, *part.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
            HEAD_DIM=D, NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d, **pdl_args(q.device))
    return out
