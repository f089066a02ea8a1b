"""RoPE cos/sin tables computed exactly as HF transformers computes them.

HF builds ``inv_freq`` in fp32, multiplies by the fp32 positions, takes cos/sin in fp32
and only then casts to the activation dtype. A table over ``max_position_embeddings``
built the same way holds the identical values, and gathering rows of it by position is
static-shaped (CUDA-graph safe) where HF's on-the-fly version is not.
"""

from __future__ import annotations

import torch


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def rope_tables(head_dim: int, theta: float, max_positions: int, dtype: torch.dtype,
                device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``[max_positions, head_dim]`` (the halves repeat, as in HF)."""
    pos = torch.arange(max_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq(head_dim, theta)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)
