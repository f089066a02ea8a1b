"""The backend switch: one object with the hot operations of a Qwen3 layer.

``reference`` is pure torch (the kernels' oracle, HF rounding, host syncs allowed);
``triton`` runs the kernels in ``kernels/`` (CPU under TRITON_INTERPRET=1, or GPU) and is
the one that is CUDA-graph safe in decode. The model only ever calls these methods, so a
new backend (FlashInfer, say) is one more class.

Projections return *parts* ``[S, T, N]`` (``kernels/_parts.py``): the Triton backend's
decode GEMM may leave split-K partial sums for the next fused op to add, so the two
consumers of a projection (``add_rms_norm``, ``qkv_norm_rope_write``, ``qkv_attention``)
take parts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openinfer.errors import require
from openinfer.models.qwen3.batch import ForwardBatch


class ReferenceOps:
    name = "reference"

    def __init__(self) -> None:
        from openinfer.models.qwen3.kernels import reference
        self.r = reference

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return self.r.rms_norm(x, w, eps)

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` as parts ``[S, T, N]`` (here always ``S == 1``)."""
        return F.linear(x, w)[None]

    def add_rms_norm(self, parts: torch.Tensor, residual: torch.Tensor, w: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual += merged parts``, then RMSNorm: ``(normed, new residual)``."""
        return self.r.add_rms_norm(self.r.merge_parts(parts, residual.dtype), residual, w, eps)

    def linear_add_rms_norm(self, x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor,
                            norm_w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """A projection, then ``add_rms_norm``: the pair a backend may run as one launch."""
        return self.add_rms_norm(self.linear(x, w), residual, norm_w, eps)

    def qkv_norm_rope_write(self, qkv: torch.Tensor, q_w: torch.Tensor, k_w: torch.Tensor,
                            cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                            eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            slot_mapping: torch.Tensor, num_q_heads: int) -> torch.Tensor:
        return self.r.qkv_norm_rope_write(qkv, q_w, k_w, cos, sin, positions, eps, k_cache,
                                          v_cache, slot_mapping, num_q_heads)

    def qkv_attention(self, qkv: torch.Tensor, q_w: torch.Tensor, k_w: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, eps: float, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, batch: ForwardBatch, num_q_heads: int,
                      scale: float) -> torch.Tensor:
        """Attention from the QKV projection's parts: q/k norm + RoPE, K/V written to the
        batch's slots, then attention over each sequence's pages -> ``[T, Hq, D]``."""
        q = self.qkv_norm_rope_write(qkv, q_w, k_w, cos, sin, batch.positions, eps, k_cache,
                                     v_cache, batch.slot_mapping, num_q_heads)
        return self.attention(q, k_cache, v_cache, batch, scale)

    def gate_up_silu(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``silu(x W_gate^T) * (x W_up^T)`` from the fused ``[2I, K]`` weight."""
        return self.r.silu_mul(F.linear(x, w))

    def lm_head(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Logits in fp32, rounded through the model dtype first (as HF's bf16 head)."""
        return F.linear(x, w).float()

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  batch: ForwardBatch, scale: float) -> torch.Tensor:
        return self.r.paged_attention(q, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                                      batch.query_start_loc, scale)


class TritonOps(ReferenceOps):
    """Triton kernels; up to ``kernels.MAX_ROWS`` rows (decode) the projections are the
    skinny GEMM, beyond that cuBLAS (prefill is compute-bound, cuBLAS is right there)."""

    name = "triton"

    def __init__(self, decode_splits: int | None = None, block_m: int = 64,
                 block_n: int = 64, decode_from_qkv_rows: int | None = None,
                 fused_norm_rows: int | None = None) -> None:
        """``block_m``/``block_n``: prefill attention tiles (decode's are launch knobs of
        ``decode_attention``); decode batches of at most ``decode_from_qkv_rows`` rows
        (default: OPENINFER_DECODE_FROM_QKV_ROWS) run q/k norm + RoPE in the attention, and
        of at most ``fused_norm_rows`` (default: OPENINFER_SKINNY_FUSED_NORM_ROWS; see
        ``norm_in_tail``) the add + RMSNorm after o_proj and down_proj in their GEMM."""
        super().__init__()
        from openinfer.models.qwen3 import kernels
        from openinfer.models.qwen3.kernels.decode_attention import FROM_QKV_ROWS
        from openinfer.models.qwen3.kernels.skinny_linear import FUSED_NORM_ROWS
        self.k = kernels
        self.decode_splits = decode_splits
        self.block_m, self.block_n = block_m, block_n
        self.decode_from_qkv_rows = (FROM_QKV_ROWS if decode_from_qkv_rows is None
                                     else decode_from_qkv_rows)
        self.fused_norm_rows = FUSED_NORM_ROWS if fused_norm_rows is None else fused_norm_rows

    def _skinny(self, x: torch.Tensor) -> bool:
        return x.shape[0] <= self.k.MAX_ROWS

    def rms_norm(self, x, w, eps):
        return self.k.rms_norm(x, w, eps)[0]

    def linear(self, x, w):
        return self.k.skinny_linear(x, w) if self._skinny(x) else super().linear(x, w)

    def add_rms_norm(self, parts, residual, w, eps):
        return self.k.rms_norm(parts, w, eps, residual=residual)

    def norm_in_tail(self, x: torch.Tensor) -> bool:
        """Whether the projection of ``x`` does the add + RMSNorm after it in its GEMM's
        tail: batches of at most ``fused_norm_rows`` rows (``kernels.norm_in_tail``)."""
        return self.k.norm_in_tail(x.shape[0], self.fused_norm_rows)

    def linear_add_rms_norm(self, x, w, residual, norm_w, eps):
        """Where ``norm_in_tail``, the GEMM's last program does the add + norm
        (``skinny_linear_add_rms_norm``)."""
        if self.norm_in_tail(x):
            return self.k.skinny_linear_add_rms_norm(x, w, residual, norm_w, eps)
        return super().linear_add_rms_norm(x, w, residual, norm_w, eps)

    def qkv_norm_rope_write(self, qkv, q_w, k_w, cos, sin, positions, eps, k_cache, v_cache,
                            slot_mapping, num_q_heads):
        return self.k.qkv_norm_rope_write(qkv, q_w, k_w, cos, sin, positions, eps, k_cache,
                                          v_cache, slot_mapping, num_q_heads)

    def qkv_attention(self, qkv, q_w, k_w, cos, sin, eps, k_cache, v_cache, batch, num_q_heads,
                      scale):
        """A small decode batch takes one kernel (plus the split reduce) for q/k norm +
        RoPE + KV write + attention (``decode_attention`` with ``QKVParts``)."""
        small = batch.is_decode and batch.num_seqs <= self.decode_from_qkv_rows
        if not (small and self.k.can_take_qkv(k_cache.shape[-1])):
            return super().qkv_attention(qkv, q_w, k_w, cos, sin, eps, k_cache, v_cache, batch,
                                         num_q_heads, scale)
        src = self.k.QKVParts(qkv, num_q_heads, q_w, k_w, cos, sin, batch.positions,
                              batch.slot_mapping, eps)
        return self.k.decode_attention(src, k_cache, v_cache, batch.block_tables,
                                       batch.seq_lens, scale, self.decode_splits)

    def gate_up_silu(self, x, w):
        return self.k.skinny_gated(x, w) if self._skinny(x) else super().gate_up_silu(x, w)

    def lm_head(self, x, w):
        if self._skinny(x):
            return self.k.skinny_linear(x, w, out_dtype=torch.float32)[0]
        return super().lm_head(x, w)

    def attention(self, q, k_cache, v_cache, batch, scale):
        if batch.is_decode:
            return self.k.decode_attention(q, k_cache, v_cache, batch.block_tables,
                                           batch.seq_lens, scale, self.decode_splits)
        return self.k.prefill_attention(q, k_cache, v_cache, batch.block_tables,
                                        batch.seq_lens, batch.query_start_loc,
                                        batch.max_query_len, scale, self.block_m, self.block_n)


BACKENDS = {"reference": ReferenceOps, "triton": TritonOps}


def make_ops(backend: str | ReferenceOps) -> ReferenceOps:
    if isinstance(backend, ReferenceOps):
        return backend
    require(backend in BACKENDS, "backend", backend, f"one of {list(BACKENDS)}")
    return BACKENDS[backend]()
