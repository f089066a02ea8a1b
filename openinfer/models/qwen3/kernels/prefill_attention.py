"""Paged causal attention for prefill with a cached prefix (varlen, GQA).

Sequence ``b`` has ``q_len`` new queries at positions ``[seq_len - q_len, seq_len)``; its
K/V for ``[0, seq_len)`` (cached prefix + the new tokens, already written) live in the
pages of ``block_tables[b]``. One program handles ``BLOCK_M`` queries of one head and
streams K/V in ``BLOCK_N``-token tiles, gathering each token's page from the block table,
so the prefix may end anywhere inside a page and ``BLOCK_N`` need not equal the page size.
Online softmax in fp32 (FlashAttention-2 style); tiles past the causal edge are skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._interpret import INTERPRET
from openinfer.models.qwen3.kernels._paged_tile import attend_tile, kv_tile


@triton.jit
def _prefill_kernel(q_ptr, kc_ptr, vc_ptr, o_ptr, bt_ptr, seq_lens_ptr, qloc_ptr, sm_scale,
                    s_qt, s_qh, s_ot, s_oh, s_kp, s_ko, s_kh, s_vp, s_vo, s_vh, s_bt,
                    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    m_blk = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    q_beg = tl.load(qloc_ptr + b)
    q_len = tl.load(qloc_ptr + b + 1) - q_beg
    if m_blk * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - q_len
    kvh = h // GROUP
    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    rows = (q_beg + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * s_qt + h * s_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = ctx + offs_m
    kv_end = tl.minimum(seq_len, ctx + (m_blk + 1) * BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * s_bt
    for start in range(0, kv_end, BLOCK_N):
        k, v, n_mask = kv_tile(kc_ptr, vc_ptr, bt_row, start, kv_end, -1, kvh, s_kp, s_ko, s_kh,
                               s_vp, s_vo, s_vh, offs_d, d_mask, PAGE, BLOCK_N)
        offs_n = start + tl.arange(0, BLOCK_N)
        visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
        m_i, l_i, acc = attend_tile(q, k, v, visible, m_i, l_i, acc, sm_scale, DOT_PREC,
                                    UPCAST)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_ptr + rows[:, None] * s_ot + h * s_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 runs are accuracy checks, so keep them IEEE (no TF32) on the GPU too."""
    return "ieee" if dtype == torch.float32 else "tf32"


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor,
                      query_start_loc: torch.Tensor, max_query_len: int, scale: float,
                      block_m: int = 64, block_n: int = 64) -> torch.Tensor:
    """q ``[T, Hq, D]``, caches ``[pages, block, Hk, D]`` -> out ``[T, Hq, D]``.
    ``max_query_len`` is host-side (it sizes the grid) so no device sync is needed."""
    T, Hq, D = q.shape
    Hk = k_cache.shape[2]
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert Hq % Hk == 0 and block_m >= 16 and block_n >= 16
    out = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    B = seq_lens.shape[0]
    grid = (triton.cdiv(max_query_len, block_m), B, Hq)
    _prefill_kernel[grid](q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc,
                          scale, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                          *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0),
                          HEAD_DIM=D, GROUP=Hq // Hk, PAGE=k_cache.shape[1], BLOCK_M=block_m,
                          BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(D)),
                          DOT_PREC=dot_precision(q.dtype), UPCAST=INTERPRET)
    return out
