"""The backend switch: one object with the five hot operations of a Qwen3 layer.

``reference`` is pure torch (the kernels' oracle, HF rounding, host syncs allowed);
``triton`` runs the kernels in ``kernels/`` (CPU under TRITON_INTERPRET=1, or GPU) and is
the one that is CUDA-graph safe in decode. The model only ever calls these methods, so a
new backend (FlashInfer, say) is one more class.
"""

from __future__ import annotations

import torch

from openinfer.errors import require
from openinfer.models.qwen3.batch import ForwardBatch


class ReferenceOps:
    name = "reference"

    def __init__(self) -> None:
        from openinfer.models.qwen3.kernels import reference
        self.k = reference

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return self.k.rms_norm(x, w, eps)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k.add_rms_norm(x, residual, w, eps)

    def qk_norm_rope(self, q, k, q_w, k_w, cos, sin, positions, eps):
        return self.k.qk_norm_rope(q, k, q_w, k_w, cos, sin, positions, eps)

    def write_kv(self, k_cache, v_cache, k, v, slot_mapping) -> None:
        self.k.write_kv(k_cache, v_cache, k, v, slot_mapping)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  batch: ForwardBatch, scale: float) -> torch.Tensor:
        return self.k.paged_attention(q, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                                      batch.query_start_loc, scale)


class TritonOps(ReferenceOps):
    name = "triton"

    def __init__(self, decode_splits: int | None = None, block_m: int = 64,
                 block_n: int = 64) -> None:
        from openinfer.models.qwen3 import kernels
        self.k = kernels
        self.decode_splits = decode_splits
        self.block_m, self.block_n = block_m, block_n

    def rms_norm(self, x, w, eps):
        return self.k.rms_norm(x, w, eps)[0]

    def add_rms_norm(self, x, residual, w, eps):
        return self.k.rms_norm(x, w, eps, residual=residual)

    def attention(self, q, k_cache, v_cache, batch, scale):
        if batch.is_decode:
            return self.k.decode_attention(q, k_cache, v_cache, batch.block_tables,
                                           batch.seq_lens, scale, self.decode_splits,
                                           block_n=self.block_n)
        return self.k.prefill_attention(q, k_cache, v_cache, batch.block_tables,
                                        batch.seq_lens, batch.query_start_loc,
                                        batch.max_query_len, scale, self.block_m, self.block_n)


BACKENDS = {"reference": ReferenceOps, "triton": TritonOps}


def make_ops(backend: str | ReferenceOps) -> ReferenceOps:
    if isinstance(backend, ReferenceOps):
        return backend
    require(backend in BACKENDS, "backend", backend, f"one of {list(BACKENDS)}")
    return BACKENDS[backend]()
