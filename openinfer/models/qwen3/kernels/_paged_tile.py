"""The two steps every paged-attention kernel repeats: fetch a K/V tile, fold it in.

Prefill and decode attention differ in which queries a program owns and which keys it
may see; both gather ``BLOCK_N`` tokens' K and V through the page table (the tile may
start anywhere inside a page and span several) and update an online softmax in fp32
(FlashAttention-2 style). Keeping one copy keeps their numerics identical.
"""

import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._dot import mma


@triton.jit
def kv_tile(kc_ptr, vc_ptr, bt_row, start, end, skip, kvh, s_kp, s_ko, s_kh, s_vp, s_vo,
            s_vh, offs_d, d_mask, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """K and V ``[BLOCK_N, BLOCK_D]`` of tokens ``[start, start + BLOCK_N)`` below ``end``
    but ``skip`` (a token not written yet, or -1), zeros elsewhere, and the mask of the
    tokens read."""
    offs_n = start + tl.arange(0, BLOCK_N)
    n_mask = (offs_n < end) & (offs_n != skip)
    page = tl.load(bt_row + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
    off = offs_n % PAGE
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(kc_ptr + page[:, None] * s_kp + off[:, None] * s_ko + kvh * s_kh
                + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(vc_ptr + page[:, None] * s_vp + off[:, None] * s_vo + kvh * s_vh
                + offs_d[None, :], mask=kv_mask, other=0.0)    # in flight with K
    return k, v, n_mask


@triton.jit
def attend_tile(q, k, v, visible, m_i, l_i, acc, sm_scale, DOT_PREC: tl.constexpr,
                UPCAST: tl.constexpr):
    """Online-softmax update of (row max, row sum, output) with one tile; ``visible``
    ``[rows, BLOCK_N]`` (or broadcastable) says which scores count."""
    s = mma(q, tl.trans(k), DOT_PREC, UPCAST) * sm_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, DOT_PREC, UPCAST)
    return m_new, l_i, acc


@triton.jit
def attend_row(q, k_row, v_row, m_i, l_i, acc, sm_scale):
    """``attend_tile`` with one token, ``k_row``/``v_row`` ``[1, BLOCK_D]``: a dot product
    per query row instead of a tile product, so the decode kernel folds in the newest
    token without widening it to a tile (registers: it is live across the whole loop)."""
    s = tl.sum(q.to(tl.float32) * k_row.to(tl.float32), axis=1) * sm_scale
    m_new = tl.maximum(m_i, s)
    p = tl.exp(s - m_new)
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p.to(v_row.dtype).to(tl.float32)[:, None] * v_row.to(tl.float32)
    return m_new, l_i, acc
