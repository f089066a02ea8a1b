"""Paged decode attention: one query per sequence, flash-decoding split over the KV length.

With a small batch, one program per (sequence, kv head) leaves most SMs idle on long
contexts, so the KV range of each sequence is cut into ``num_splits`` equal chunks that
run in parallel and write a partial (normalised output, log-sum-exp). The split that
finishes last for its (sequence, kv head) merges the partials, in split order, in the same
launch (``_arrivals``), so there is no second kernel and the merge order, hence the
result, is fixed. All ``GROUP`` query heads that share a kv head are processed together,
so K/V is read once per group. Shapes depend only on (batch, heads, num_splits): no host sync and no data-dependent
shapes, so the kernel can be captured in a CUDA graph; ``num_splits`` is a compile-time
constant chosen per batch bucket.

Under programmatic dependent launch (``_pdl``) the first K/V tile is read before waiting on
the previous kernel: a decode step writes only the newest token's K/V (the fused q/k-norm +
RoPE + KV-write kernel just before this one), so every older token is final and only that
one row is read again after the wait.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._arrivals import arrival_counters, arrive
from openinfer.models.qwen3.kernels._dot import mma
from openinfer.models.qwen3.kernels._interpret import INTERPRET
from openinfer.models.qwen3.kernels._pdl import pdl_args, pdl_wait

from openinfer.models.qwen3.kernels.prefill_attention import dot_precision


@triton.jit
def _kv_tile(kc_ptr, vc_ptr, bt_row, offs_n, mask_n, kvh, offs_d, d_mask, s_kp, s_ko, s_kh,
             s_vp, s_vo, s_vh, PAGE: tl.constexpr):
    page = tl.load(bt_row + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
    off = offs_n % PAGE
    kv_mask = mask_n[:, None] & d_mask[None, :]
    k = tl.load(kc_ptr + page[:, None] * s_kp + off[:, None] * s_ko + kvh * s_kh
                + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(vc_ptr + page[:, None] * s_vp + off[:, None] * s_vo + kvh * s_vh
                + offs_d[None, :], mask=kv_mask, other=0.0)    # in flight with K
    return k, v


@triton.jit
def _attend(q, k, v, n_mask, m_i, l_i, acc, sm_scale, DOT_PREC: tl.constexpr,
            UPCAST: tl.constexpr):
    """One online-softmax step over a K/V tile: the running (max, sum, output)."""
    s = mma(q, tl.trans(k), DOT_PREC, UPCAST) * sm_scale
    s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, DOT_PREC, UPCAST)
    return m_new, l_i, acc


@triton.jit
def _merge_splits(part_ptr, lse_ptr, o_ptr, b, kvh, s_pb, s_ph, s_ps, s_lb, s_lh, s_ot, s_oh,
                  HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr,
                  BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge the ``NUM_SPLITS`` partials of each head of the group, in split order. Reads
    go through L2 (``.cg``): the partials were written by other programs."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM
    for g in tl.static_range(GROUP):
        h = kvh * GROUP + g
        lse = tl.load(lse_ptr + b * s_lb + h * s_lh + offs_s, mask=s_mask,
                      other=float("-inf"), cache_modifier=".cg")
        w = tl.exp(lse - tl.max(lse, axis=0))          # split 0 is never empty: max is finite
        part = tl.load(part_ptr + b * s_pb + h * s_ph + offs_s[:, None] * s_ps + offs_d[None, :],
                       mask=s_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg")
        out = tl.sum(w[:, None] * part, axis=0) / tl.sum(w, axis=0)
        tl.store(o_ptr + b * s_ot + h * s_oh + offs_d, out.to(o_ptr.dtype.element_ty),
                 mask=d_mask)


@triton.jit
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, o_ptr, part_ptr, lse_ptr, cnt_ptr, bt_ptr,
                         seq_lens_ptr, sm_scale, s_qt, s_qh, s_ot, s_oh, s_kp, s_ko, s_kh,
                         s_vp, s_vo, s_vh, s_bt, s_pb, s_ph, s_ps, s_lb, s_lh,
                         HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr,
                         NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                         DOT_PREC: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_kv = tl.num_programs(1)
    # Graph inputs (lengths, page tables) and every K/V row but the newest are final before
    # the step starts: the first tile is read before the wait.
    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.cdiv(seq_len, NUM_SPLITS)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    bt_row = bt_ptr + b * s_bt
    offs_n = lo + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hi
    newest = offs_n == seq_len - 1
    k, v = _kv_tile(kc_ptr, vc_ptr, bt_row, offs_n, n_mask & ~newest, kvh, offs_d, d_mask,
                    s_kp, s_ko, s_kh, s_vp, s_vo, s_vh, PAGE)
    pdl_wait(PDL)
    k_new, v_new = _kv_tile(kc_ptr, vc_ptr, bt_row, offs_n, n_mask & newest, kvh, offs_d,
                            d_mask, s_kp, s_ko, s_kh, s_vp, s_vo, s_vh, PAGE)
    k = tl.where(newest[:, None], k_new, k)
    v = tl.where(newest[:, None], v_new, v)
    offs_g = tl.arange(0, BLOCK_G)
    g_mask = offs_g < GROUP
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * s_qt + heads[:, None] * s_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    m_i, l_i, acc = _attend(q, k, v, n_mask, m_i, l_i, acc, sm_scale, DOT_PREC, UPCAST)
    for start in range(lo + BLOCK_N, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        k, v = _kv_tile(kc_ptr, vc_ptr, bt_row, offs_n, n_mask, kvh, offs_d, d_mask,
                        s_kp, s_ko, s_kh, s_vp, s_vo, s_vh, PAGE)
        m_i, l_i, acc = _attend(q, k, v, n_mask, m_i, l_i, acc, sm_scale, DOT_PREC, UPCAST)
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
        if arrive(cnt_ptr + b * num_kv + kvh, NUM_SPLITS):
            _merge_splits(part_ptr, lse_ptr, o_ptr, b, kvh, s_pb, s_ph, s_ps, s_lb, s_lh,
                          s_ot, s_oh, HEAD_DIM, GROUP, NUM_SPLITS, BLOCK_S, BLOCK_D)


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
    """q ``[B, Hq, D]`` (one token per sequence, its K/V already in the cache at position
    ``seq_lens[b] - 1``), caches ``[pages, block, Hk, D]``, ``seq_lens[b] >= 1`` -> out
    ``[B, Hq, D]``. Padding rows: seq_len 1 on a padding page."""
    B, Hq, D = q.shape
    Hk, page = k_cache.shape[2], k_cache.shape[1]
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert Hq % Hk == 0 and block_n >= 16
    if num_splits is None:
        num_splits = default_num_splits(B, Hk, block_tables.shape[1] * page)
    out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    part = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, Hq, num_splits), dtype=torch.float32, device=q.device)
    counters = arrival_counters(q.device, B * Hk)
    group = Hq // Hk
    _decode_split_kernel[(B, Hk, num_splits)](
        q, k_cache, v_cache, out, part, lse, counters, block_tables, seq_lens, scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), *k_cache.stride()[:3],
        *v_cache.stride()[:3], block_tables.stride(0), *part.stride()[:3], *lse.stride()[:2],
        HEAD_DIM=D, GROUP=group, PAGE=page, NUM_SPLITS=num_splits,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_S=triton.next_power_of_2(num_splits),
        DOT_PREC=dot_precision(q.dtype), UPCAST=INTERPRET, num_warps=num_warps,
        **pdl_args(q.device))
    return out
