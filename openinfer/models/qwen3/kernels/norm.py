"""Fused (residual add +) RMSNorm over rows of the hidden state.

Memory-bound, so fusing is where it pays: one pass reads the projection output and the
residual, writes the new residual and the normed value. The projection output arrives as
*parts* (``_parts``): split-K partial sums of the decode GEMM are added here, so the split
costs no launch of its own. Every intermediate is rounded to the model dtype where HF
rounds it, so bf16 results match the torch reference bit for bit in the common case.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._parts import load_parts_with
from openinfer.models.qwen3.kernels._pdl import pdl_args, pdl_wait
from openinfer.models.qwen3.kernels._tuning import env_choice

# A decode step's norm is one program per row (one at batch 1) whose time is the latency of
# its reads. Triton's default is 4; on an H100, 8 made no difference beyond noise
# (results/gpu/tiles_attempt/), 2 cost batch 8 2.4-3.1% and 1 cost batch 1 and 8 8-10%
# (results/gpu/dec07_norm_warps_h100/).
NORM_WARPS = env_choice("OPENINFER_NORM_WARPS", 4, (1, 2, 4, 8, 16), "warps per RMSNorm row")


@triton.jit
def add_rms_norm_row(x_ptr, s_xs, r_ptr, w, o_ptr, ro_ptr, cols, mask, N, eps,
                     HAS_RESIDUAL: tl.constexpr, NUM_PARTS: tl.constexpr, dt: tl.constexpr,
                     CACHE: tl.constexpr):
    """One row: parts summed (+ residual, stored), normed and scaled by ``w``. Shared by
    the norm kernel and the decode GEMM's fused tail (``skinny_linear``), so both round
    alike."""
    x = load_parts_with(x_ptr, s_xs, cols, mask, NUM_PARTS, dt, CACHE)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + cols, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(dt)
        tl.store(ro_ptr + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (w.to(tl.float32) * (xf * inv).to(dt).to(tl.float32)).to(dt)
    tl.store(o_ptr + cols, y, mask=mask)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, o_ptr, ro_ptr, s_xs, s_x, s_r, s_o, s_ro, N, eps,
                     HAS_RESIDUAL: tl.constexpr, NUM_PARTS: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)        # a weight: safe before the wait
    pdl_wait(PDL)
    add_rms_norm_row(x_ptr + row * s_x, s_xs, r_ptr + row * s_r, w, o_ptr + row * s_o,
                     ro_ptr + row * s_ro, cols, mask, N, eps, HAS_RESIDUAL, NUM_PARTS,
                     o_ptr.dtype.element_ty, "")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x [T, N]`` -> ``(norm(x), None)``; with ``residual``: ``s = residual + x`` and
    ``(norm(s), s)``. ``x`` may also be parts ``[S, T, N]`` (summed first; the result
    then takes the residual's dtype). Rows may be strided; the last dim is contiguous."""
    assert x.stride(-1) == 1 and weight.is_contiguous()
    parts = x if x.dim() == 3 else x[None]
    assert parts.shape[0] == 1 or residual is not None, "parts need the residual's dtype"
    S, T, N = parts.shape
    dtype = residual.dtype if residual is not None else x.dtype
    out = torch.empty((T, N), dtype=dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else None
    r = residual if residual is not None else out
    ro = res_out if res_out is not None else out
    if T:
        _rms_norm_kernel[(T,)](parts, r, weight, out, ro, parts.stride(0), parts.stride(1),
                               r.stride(0), out.stride(0), ro.stride(0), N, eps,
                               HAS_RESIDUAL=residual is not None, NUM_PARTS=S,
                               BLOCK=triton.next_power_of_2(N), num_warps=NORM_WARPS,
                               **pdl_args(x.device))
    return out, res_out
