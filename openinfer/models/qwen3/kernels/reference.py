"""Pure-torch references of every kernel, written to round exactly as HF transformers does.

They are the ``reference`` backend of the model and the oracle the Triton kernels are
tested against. They favour obviousness over speed (per-sequence loops, host syncs), so
they are never used under CUDA graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def merge_parts(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A projection's parts ``[S, T, N]`` -> ``[T, N]`` in ``dtype``: split-K partial sums
    are added in fp32 in order ``0 .. S-1`` and rounded once (as the kernels do)."""
    if parts.shape[0] == 1:
        return parts[0].to(dtype)
    total = parts[0].to(torch.float32)
    for p in parts[1:]:
        total = total + p.to(torch.float32)
    return total.to(dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """HF's ``act_fn(gate_proj(x)) * up_proj(x)`` from the fused ``[T, 2I]`` projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF ``Qwen3RMSNorm``: statistics in fp32, cast back, then scale in the input dtype."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x`` (in the model dtype, as HF's ``residual + hidden``), then norm."""
    residual = residual + x
    return rms_norm(residual, weight, eps), residual


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm over head_dim, then RoPE; q ``[T, Hq, D]``, k ``[T, Hk, D]``,
    cos/sin tables ``[max_pos, D]`` already in the model dtype (as HF casts them)."""
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V ``[T, Hk, D]`` into ``[pages, block, Hk, D]`` caches; slots < 0 skip."""
    block = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache[slots // block, slots % block] = k[keep]
    v_cache[slots // block, slots % block] = v[keep]


def qkv_norm_rope_write(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                        cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                        eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        slot_mapping: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """From the QKV projection's parts ``[S, T, (Hq + 2 Hk) D]``: per-head RMSNorm + RoPE
    of q and k, K and V written to their slots; returns q ``[T, Hq, D]``."""
    x = merge_parts(qkv, k_cache.dtype)
    T = x.shape[0]
    Hk, D = k_cache.shape[2], k_cache.shape[3]
    q_size, kv_size = num_q_heads * D, Hk * D
    q = x[:, :q_size].view(T, num_q_heads, D)
    k = x[:, q_size:q_size + kv_size].view(T, Hk, D)
    v = x[:, q_size + kv_size:].view(T, Hk, D)
    q, k = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, positions, eps)
    write_kv(k_cache, v_cache, k, v, slot_mapping)
    return q


def gather_kv(cache: torch.Tensor, pages: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` positions of one sequence, ``[n, Hk, D]``."""
    return cache[pages.long()].flatten(0, 1)[:n]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of each sequence's new queries (the last ``q_len`` positions of
    ``[0, seq_len)``) over its paged K/V; HF eager math (fp32 softmax, cast, matmul)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[2]
    qloc, lens = query_start_loc.tolist(), seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        q_beg, q_end = qloc[b], qloc[b + 1]
        n_q = q_end - q_beg
        k = gather_kv(k_cache, block_tables[b], seq_len).repeat_interleave(group, dim=1)
        v = gather_kv(v_cache, block_tables[b], seq_len).repeat_interleave(group, dim=1)
        qh = q[q_beg:q_end].transpose(0, 1)                        # [H, n_q, D]
        scores = torch.matmul(qh, k.permute(1, 2, 0)) * scale      # [H, n_q, seq_len]
        q_pos = torch.arange(seq_len - n_q, seq_len, device=q.device)[:, None]
        causal = torch.arange(seq_len, device=q.device)[None, :] <= q_pos
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[q_beg:q_end] = torch.matmul(probs, v.transpose(0, 1)).transpose(0, 1)
    return out
