"""Fused RMSNorm kernels: (residual add +) RMSNorm, and per-head q/k RMSNorm + RoPE.

Both are memory-bound, so fusing is where they pay: the add+norm reads the two inputs once
and writes the new residual and the normed value in the same pass; the head norm + RoPE
reads q/k straight out of the fused QKV GEMM output (strided, no copy) and writes the
rotated heads once. Every intermediate is rounded to the model dtype where HF rounds it,
so bf16 results match the torch reference bit for bit in the common case.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, o_ptr, ro_ptr, s_x, s_r, s_o, s_ro, N, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0)
    dt = x.dtype
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * s_r + cols, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(dt)
        tl.store(ro_ptr + row * s_ro + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = (w.to(tl.float32) * (xf * inv).to(dt).to(tl.float32)).to(dt)
    tl.store(o_ptr + row * s_o + cols, y, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x [T, N]`` -> ``(norm(x), None)``; with ``residual``: ``s = residual + x`` and
    ``(norm(s), s)``. Rows may be strided; the last dim must be contiguous."""
    assert x.stride(-1) == 1 and weight.is_contiguous()
    T, N = x.shape
    out = torch.empty((T, N), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else None
    r = residual if residual is not None else x
    ro = res_out if res_out is not None else out
    if T:
        _rms_norm_kernel[(T,)](x, r, weight, out, ro, x.stride(0), r.stride(0), out.stride(0),
                               ro.stride(0), N, eps, HAS_RESIDUAL=residual is not None,
                               BLOCK=triton.next_power_of_2(N))
    return out, res_out


@triton.jit
def _head_norm_rope_kernel(x_ptr, o_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, s_xt, s_xh,
                           s_ot, s_oh, s_c, eps, HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs = tl.arange(0, HALF)
    src = x_ptr + t * s_xt + h * s_xh
    x1 = tl.load(src + offs)
    x2 = tl.load(src + HALF + offs)
    dt = x1.dtype
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    inv = 1.0 / tl.sqrt((tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / (2 * HALF) + eps)
    w1 = tl.load(w_ptr + offs).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)
    y1 = (w1 * (f1 * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    y2 = (w2 * (f2 * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * s_c + offs).to(tl.float32)   # HF's table repeats its halves
    s = tl.load(sin_ptr + pos * s_c + offs).to(tl.float32)
    o1 = ((y1 * c).to(dt).to(tl.float32) - (y2 * s).to(dt).to(tl.float32)).to(dt)
    o2 = ((y2 * c).to(dt).to(tl.float32) + (y1 * s).to(dt).to(tl.float32)).to(dt)
    dst = o_ptr + t * s_ot + h * s_oh
    tl.store(dst + offs, o1)
    tl.store(dst + HALF + offs, o2)


def head_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   positions: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [T, H, D]`` (any row/head strides) -> contiguous RMSNorm-over-D + RoPE of it."""
    T, H, D = x.shape
    assert x.stride(-1) == 1 and D % 2 == 0 and triton.next_power_of_2(D // 2) == D // 2, \
        "the Triton head norm needs a contiguous, power-of-two head_dim"
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    out = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
    if T:
        _head_norm_rope_kernel[(T, H)](x, out, weight, cos, sin, positions, x.stride(0),
                                       x.stride(1), out.stride(0), out.stride(1),
                                       cos.stride(0), eps, HALF=D // 2)
    return out


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`reference.qk_norm_rope`."""
    return (head_norm_rope(q, q_weight, cos, sin, positions, eps),
            head_norm_rope(k, k_weight, cos, sin, positions, eps))
