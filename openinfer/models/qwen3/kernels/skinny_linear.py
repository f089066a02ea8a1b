"""Skinny GEMM for decode: ``x @ W^T`` for a few rows of ``x`` (at most ``MAX_ROWS``).

A decode step multiplies one to a few rows by every weight matrix, so its time is the
time to stream W from memory once. Each program owns ``BLOCK_N`` rows of W (output
columns) and, with split-K, one range of K; it streams its W tiles through ``tl.dot``
(``x`` padded to 16 rows, which costs tensor-core time only) so Triton pipelines the
loads with ``num_stages``, and enough programs are launched to keep every SM reading.

Outputs are *parts* ``[S, M, N]``: with ``S == 1`` the product rounded once to the weight
dtype (or an ``out_dtype`` such as fp32 for the logits, rounded through the weight dtype
first so the values equal ``F.linear(x, W).float()`` up to summation order); with split-K
``S > 1`` fp32 partial sums that the consumer kernel (the fused residual-add + RMSNorm,
or the fused q/k norm + RoPE + KV write) adds up in a fixed order before rounding: no
extra launch and no atomics, so a step stays bitwise reproducible.

``gated``: W is ``[gate; up]`` ``[2I, K]`` and the result is ``silu(x W_g^T) * (x W_u^T)``
``[M, I]``, each intermediate rounded where HF's ``act(gate(x)) * up(x)`` rounds it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import torch
import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._arrivals import arrival_counters, arrive
from openinfer.models.qwen3.kernels._dot import mma
from openinfer.models.qwen3.kernels._interpret import INTERPRET
from openinfer.models.qwen3.kernels._pdl import pdl_args, pdl_wait
from openinfer.models.qwen3.kernels.prefill_attention import dot_precision
from openinfer.models.qwen3.kernels.qkv_rope import check_qkv_args, qkv_rope_head

MAX_ROWS = 16   # tl.dot's smallest M: up to this many rows cost one pass over W


@triton.jit
def _load_x(x_rows, offs_k, k_mask, m_mask, nw_ptr, inv, NORMED: tl.constexpr,
            dt: tl.constexpr):
    """One K tile of the input rows; ``NORMED``: the rows are a residual sum ``s`` and the
    tile is ``RMSNorm(s)`` (``inv`` = each row's 1 / rms), rounded where HF rounds it."""
    x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
    if NORMED:
        nw = tl.load(nw_ptr + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        x = (nw[None, :] * (x.to(tl.float32) * inv[:, None]).to(dt).to(tl.float32)).to(dt)
    return x


@triton.jit
def _add_norm_epilogue(acc, y_ptr, r_ptr, sq_ptr, cnt_ptr, pid_n, offs_m, offs_n, m_mask,
                       n_mask, s_ys, s_ym, s_rm, s_sqm, SPLIT_K: tl.constexpr,
                       dt: tl.constexpr):
    """The residual add of the RMSNorm that follows this projection, done by the last
    split of each N tile: ``s = residual + product`` (in place) and the tile's share of
    each row's sum of squares, which the consumer's ``NORMED`` input completes."""
    mask = m_mask[:, None] & n_mask[None, :]
    last = True
    if SPLIT_K > 1:
        tl.store(y_ptr + tl.program_id(1) * s_ys + offs_m[:, None] * s_ym + offs_n[None, :],
                 acc, mask=mask)
        last = arrive(cnt_ptr + pid_n, SPLIT_K)
    if last:
        if SPLIT_K > 1:
            ptrs = y_ptr + offs_m[:, None] * s_ym + offs_n[None, :]
            acc = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
            for p in tl.static_range(1, SPLIT_K):
                acc += tl.load(ptrs + p * s_ys, mask=mask, other=0.0, cache_modifier=".cg")
        r_ptrs = r_ptr + offs_m[:, None] * s_rm + offs_n[None, :]
        r = tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        s_new = (r + acc.to(dt).to(tl.float32)).to(dt)
        tl.store(r_ptrs, s_new, mask=mask)
        sf = tl.where(mask, s_new.to(tl.float32), 0.0)
        tl.store(sq_ptr + offs_m * s_sqm + pid_n, tl.sum(sf * sf, axis=1), mask=m_mask)


@triton.jit
def _product(x_ptr, w_ptr, M, N, K, k_per_split, s_xm, s_wn, sq_in_ptr, s_sqi, tiles_in,
             nw_ptr, eps, GATED: tl.constexpr, NORMED: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
             DOT_PREC: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    """This program's fp32 product over its N tile and K range (and the up half's, if
    ``GATED``), with the tile's row/column offsets and masks: the loop every skinny kernel
    shares."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    x_rows = x_ptr + offs_m[:, None] * s_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * s_wn
    dt = w_ptr.dtype.element_ty
    # The first W tile is read before waiting on the previous kernel (weights are never
    # written during a step), so the stream of W starts while that kernel drains.
    # (Names differ from the loop's so that no tile becomes a loop-carried value.)
    offs_k0 = k_lo + tl.arange(0, BLOCK_K)
    k_mask0 = offs_k0 < k_hi
    w_mask0 = n_mask[:, None] & k_mask0[None, :]
    w0 = tl.load(w_rows + offs_k0[None, :], mask=w_mask0, other=0.0)
    w_up0 = w0
    if GATED:
        w_up0 = tl.load(w_rows + N * s_wn + offs_k0[None, :], mask=w_mask0, other=0.0)
    pdl_wait(PDL)
    inv = tl.zeros([BLOCK_M], tl.float32)
    if NORMED:      # each row's 1 / rms from the producer's per-tile sums of squares
        offs_t = tl.arange(0, BLOCK_T)
        sq = tl.load(sq_in_ptr + offs_m[:, None] * s_sqi + offs_t[None, :],
                     mask=m_mask[:, None] & (offs_t < tiles_in)[None, :], other=0.0)
        inv = 1.0 / tl.sqrt(tl.sum(sq, axis=1) / K + eps)
    x0 = _load_x(x_rows, offs_k0, k_mask0, m_mask, nw_ptr, inv, NORMED, dt)
    acc = mma(x0, tl.trans(w0), DOT_PREC, UPCAST)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if GATED:
        acc_up = mma(x0, tl.trans(w_up0), DOT_PREC, UPCAST)
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_hi
        x = _load_x(x_rows, offs_k, k_mask, m_mask, nw_ptr, inv, NORMED, dt)
        w_mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=w_mask, other=0.0)
        acc += mma(x, tl.trans(w), DOT_PREC, UPCAST)
        if GATED:
            w_up = tl.load(w_rows + N * s_wn + offs_k[None, :], mask=w_mask, other=0.0)
            acc_up += mma(x, tl.trans(w_up), DOT_PREC, UPCAST)
    return acc, acc_up, offs_m, offs_n, m_mask, n_mask


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, K, k_per_split, s_xm, s_wn, s_ys, s_ym,
                   sq_in_ptr, s_sqi, tiles_in, nw_ptr, eps, r_ptr, s_rm, sq_out_ptr, s_sqo,
                   cnt_ptr, GATED: tl.constexpr, ROUND: tl.constexpr, NORMED: tl.constexpr,
                   ADD_NORM: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                   DOT_PREC: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    acc, acc_up, offs_m, offs_n, m_mask, n_mask = _product(
        x_ptr, w_ptr, M, N, K, k_per_split, s_xm, s_wn, sq_in_ptr, s_sqi, tiles_in, nw_ptr,
        eps, GATED, NORMED, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_T, DOT_PREC, UPCAST, PDL)
    pid_n = tl.program_id(0)
    dt = w_ptr.dtype.element_ty
    if ADD_NORM:
        _add_norm_epilogue(acc, y_ptr, r_ptr, sq_out_ptr, cnt_ptr, pid_n, offs_m, offs_n,
                           m_mask, n_mask, s_ys, s_ym, s_rm, s_sqo, SPLIT_K, dt)
    else:
        if GATED:
            gate = acc.to(dt).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
            out = (act * acc_up.to(dt).to(tl.float32)).to(dt)
        elif ROUND:
            out = acc.to(dt)
        else:
            out = acc
        tl.store(y_ptr + tl.program_id(1) * s_ys + offs_m[:, None] * s_ym + offs_n[None, :],
                 out.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _skinny_qkv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, k_per_split, s_xm, s_wn, s_ys, s_ym,
                       sq_in_ptr, s_sqi, tiles_in, nw_ptr, eps, cnt_ptr, q_ptr, qw_ptr,
                       kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, kc_ptr, vc_ptr, s_qt, s_qh,
                       s_c, s_kp, s_ko, s_kh, s_vp, s_vo, s_vh, head_eps, HQ: tl.constexpr,
                       HK: tl.constexpr, PAGE: tl.constexpr, HALF: tl.constexpr,
                       NORMED: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
                       DOT_PREC: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    """The QKV projection with the q/k norm + RoPE + KV write as its epilogue: the parts
    are stored as for ``qkv_rope``'s input, and the last program to finish a head's tiles
    (all splits; for a kv head, its K and its V tiles) runs that head's ``qkv_rope_head``
    for every row, reading the parts back through L2."""
    acc, acc_up, offs_m, offs_n, m_mask, n_mask = _product(
        x_ptr, w_ptr, M, N, K, k_per_split, s_xm, s_wn, sq_in_ptr, s_sqi, tiles_in, nw_ptr,
        eps, False, NORMED, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_T, DOT_PREC, UPCAST, PDL)
    pid_n = tl.program_id(0)
    out = acc
    if SPLIT_K == 1:
        out = acc.to(w_ptr.dtype.element_ty)
    tl.store(y_ptr + tl.program_id(1) * s_ys + offs_m[:, None] * s_ym + offs_n[None, :],
             out.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])
    head = (pid_n * BLOCK_N) // (2 * HALF)
    tiles = (2 * HALF // BLOCK_N) * SPLIT_K          # programs per head
    group = tl.where(head < HQ + HK, head, head - HK)  # V tiles join their K head
    if arrive(cnt_ptr + group, tl.where(head < HQ, tiles, 2 * tiles)):
        for t in range(M):
            qkv_rope_head(y_ptr, q_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr,
                          kc_ptr, vc_ptr, t, group, s_ys, s_ym, s_qt, s_qh, s_c, s_kp, s_ko,
                          s_kh, s_vp, s_vo, s_vh, head_eps, HQ, HK, PAGE, SPLIT_K, HALF, True)


@dataclass(frozen=True)
class SkinnyConfig:
    """Tile sizes and launch shape; all static, so a captured graph keeps one choice."""

    block_n: int = 32
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """SMs of ``device``; 132 (an H100/H200) where there is no GPU (interpreter runs)."""
    if device.type != "cuda":
        return 132
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def default_config(n: int, k: int, gated: bool, may_split: bool, sms: int) -> SkinnyConfig:
    """32-row tiles; split K until there are >= 2 programs per SM (QKV: 2 splits, o_proj
    and down_proj of a 4B: 4) where the consumer takes parts; a gated product cannot split
    (its epilogue is nonlinear). The LM head (N ~ 152k) takes wider tiles. Chosen from a
    sweep on an H200 (``scripts/device_decode_bench.py --sweep``)."""
    if n >= 256 * sms:
        return SkinnyConfig(block_n=64, block_k=256, num_stages=3)
    block_n, block_k = 32, 128
    blocks = triton.cdiv(n, block_n)
    split = 1
    if may_split and not gated:
        while blocks * split < 2 * sms and split < 8 and k // (2 * split) >= 2 * block_k:
            split *= 2
    return SkinnyConfig(block_n=block_n, block_k=block_k, split_k=split)


@dataclass(frozen=True)
class NormedRows:
    """The input of a projection that starts with an RMSNorm: the rows ``s`` (the residual
    stream after the previous projection's add), per-tile sums of their squares, and the
    norm's weight. ``RMSNorm(s)`` is computed where the consumer loads its K tiles, so the
    norm costs no launch of its own (``skinny_linear_add_norm`` makes these)."""

    s: torch.Tensor          # [M, K], the model dtype
    sumsq: torch.Tensor      # [M, tiles] fp32
    weight: torch.Tensor     # [K]
    eps: float

    @property
    def shape(self) -> torch.Size:
        return self.s.shape


def _input_args(x: torch.Tensor | NormedRows, w: torch.Tensor, y: torch.Tensor
                ) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
    """The input rows and the kernel arguments that describe the input: (rows, runtime
    arguments after ``s_wn``..., constexprs)."""
    normed = isinstance(x, NormedRows)
    rows = x.s if normed else x
    assert rows.shape[0] <= MAX_ROWS and rows.stride(-1) == 1 and w.stride(-1) == 1
    assert w.shape[1] == rows.shape[1]
    sq, nw, eps = (x.sumsq, x.weight, x.eps) if normed else (y, y, 0.0)
    args = dict(sq_in_ptr=sq, s_sqi=sq.stride(0), tiles_in=sq.shape[1] if normed else 0,
                nw_ptr=nw, eps=eps)
    const = dict(NORMED=normed, BLOCK_T=triton.next_power_of_2(sq.shape[1]) if normed else 1,
                 BLOCK_M=MAX_ROWS, DOT_PREC=dot_precision(w.dtype), UPCAST=INTERPRET)
    return rows, args, const


def _k_per_split(k: int, cfg: SkinnyConfig) -> int:
    return triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k


def _launch(x: torch.Tensor | NormedRows, w: torch.Tensor, y: torch.Tensor, n: int,
            gated: bool, cfg: SkinnyConfig, add_norm: tuple[torch.Tensor, torch.Tensor,
                                                             torch.Tensor] | None = None) -> None:
    """``add_norm``: (residual, sumsq out, counters) of the ``ADD_NORM`` epilogue."""
    rows, args, const = _input_args(x, w, y)
    M, K = rows.shape
    res, sq_out, cnt = add_norm if add_norm is not None else (y, y, y)
    _skinny_kernel[(triton.cdiv(n, cfg.block_n), cfg.split_k)](
        rows, w, y, M, n, K, _k_per_split(K, cfg), rows.stride(0), w.stride(0), y.stride(0),
        y.stride(1), *args.values(), res, res.stride(0), sq_out, sq_out.stride(0), cnt,
        GATED=gated, ROUND=cfg.split_k == 1, ADD_NORM=add_norm is not None,
        SPLIT_K=cfg.split_k, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, **const,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_args(w.device))


def skinny_linear(x: torch.Tensor | NormedRows, w: torch.Tensor,
                  out_dtype: torch.dtype | None = None,
                  cfg: SkinnyConfig | None = None) -> torch.Tensor:
    """``x [M, K]`` (M <= 16) or ``NormedRows``, ``w [N, K]`` -> parts ``[S, M, N]``
    (module docstring). An ``out_dtype`` (the logits' fp32) asks for the finished
    product: no split-K."""
    N, K = w.shape
    cfg = cfg or default_config(N, K, False, out_dtype is None, sm_count(w.device))
    assert out_dtype is None or cfg.split_k == 1, "out_dtype asks for a finished product"
    dtype = torch.float32 if cfg.split_k > 1 else (out_dtype or w.dtype)
    y = torch.empty((cfg.split_k, x.shape[0], N), dtype=dtype, device=w.device)
    _launch(x, w, y, N, False, cfg)
    return y


def skinny_linear_add_norm(x: torch.Tensor | NormedRows, w: torch.Tensor,
                           residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                           cfg: SkinnyConfig | None = None) -> NormedRows:
    """``residual += x @ w^T`` in place, returned as the ``NormedRows`` input of the next
    projection, whose RMSNorm (weight ``norm_weight``) it carries."""
    N, K = w.shape
    assert residual.shape == (x.shape[0], N) and residual.stride(-1) == 1
    cfg = cfg or default_config(N, K, False, True, sm_count(w.device))
    tiles = triton.cdiv(N, cfg.block_n)
    y = torch.empty((cfg.split_k, x.shape[0], N) if cfg.split_k > 1 else (1, 1, 1),
                    dtype=torch.float32, device=w.device)
    sumsq = torch.empty((x.shape[0], tiles), dtype=torch.float32, device=w.device)
    cnt = arrival_counters(w.device, tiles)
    _launch(x, w, y, N, False, cfg, add_norm=(residual, sumsq, cnt))
    return NormedRows(residual, sumsq, norm_weight, eps)


def skinny_qkv_rope_write(x: torch.Tensor | NormedRows, w: torch.Tensor, q_weight: torch.Tensor,
                          k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          positions: torch.Tensor, eps: float, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, slot_mapping: torch.Tensor, num_q_heads: int,
                          cfg: SkinnyConfig | None = None) -> torch.Tensor:
    """``qkv_rope.qkv_norm_rope_write(skinny_linear(x, w), ...)`` in one launch: the
    normed, rotated queries ``[M, Hq, D]``; K and V land in the caches."""
    N, K = w.shape
    Hk, D = k_cache.shape[2], k_cache.shape[3]
    check_qkv_args(N, num_q_heads, k_cache, v_cache, cos, sin)
    if cfg is None:
        cfg = default_config(N, K, False, True, sm_count(w.device))
        cfg = replace(cfg, block_n=min(cfg.block_n, D))
    assert D % cfg.block_n == 0, "a head is a whole number of N tiles"
    M = x.shape[0]
    y = torch.empty((cfg.split_k, M, N), dtype=torch.float32 if cfg.split_k > 1 else w.dtype,
                    device=w.device)
    q = torch.empty((M, num_q_heads, D), dtype=k_cache.dtype, device=w.device)
    rows, args, const = _input_args(x, w, y)
    cnt = arrival_counters(w.device, num_q_heads + Hk)
    _skinny_qkv_kernel[(triton.cdiv(N, cfg.block_n), cfg.split_k)](
        rows, w, y, M, N, K, _k_per_split(K, cfg), rows.stride(0), w.stride(0), y.stride(0),
        y.stride(1), *args.values(), cnt, q, q_weight, k_weight, cos, sin, positions,
        slot_mapping, k_cache, v_cache, q.stride(0), q.stride(1), cos.stride(0),
        *k_cache.stride()[:3], *v_cache.stride()[:3], eps, HQ=num_q_heads, HK=Hk,
        PAGE=k_cache.shape[1], HALF=D // 2, SPLIT_K=cfg.split_k, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, **const, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_args(w.device))
    return q


def skinny_gated(x: torch.Tensor | NormedRows, w: torch.Tensor,
                 cfg: SkinnyConfig | None = None) -> torch.Tensor:
    """``x [M, K]`` (M <= 16) or ``NormedRows``, ``w = [gate; up] [2I, K]`` ->
    ``silu(x g^T) * (x u^T)`` ``[M, I]`` in the weight dtype."""
    two_i, K = w.shape
    assert two_i % 2 == 0
    n = two_i // 2
    cfg = cfg or default_config(n, K, True, False, sm_count(w.device))
    assert cfg.split_k == 1, "a gated product cannot split K"
    y = torch.empty((1, x.shape[0], n), dtype=w.dtype, device=w.device)
    _launch(x, w, y, n, True, cfg)
    return y[0]
