"""The Qwen3 decoder over a paged KV arena.

One ``forward`` serves cold prefill, prefill after a prefix-cache hit, chunked prefill,
decode and mixed batches: every sequence brings its new tokens, its start position and
its page table (``ForwardBatch``); each layer writes the new K/V into the arena, then
attends over ``[0, seq_len)`` read back from the pages. Plain tensors, no nn.Module: the
weights are loaded once and the forward is a function of (weights, batch, arena), which
is what CUDA-graph capture wants.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from openinfer.errors import require
from openinfer.models.qwen3.batch import ForwardBatch, SeqInput
from openinfer.models.qwen3.config import Qwen3Config
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.models.qwen3.ops import ReferenceOps, make_ops
from openinfer.models.qwen3.rope import rope_tables
from openinfer.models.qwen3.weights import LayerWeights, Qwen3Weights, load_weights


class Qwen3Model:
    def __init__(self, cfg: Qwen3Config, weights: Qwen3Weights,
                 backend: str | ReferenceOps = "reference") -> None:
        self.cfg = cfg
        self.w = weights
        self.ops = make_ops(backend)
        self.device = weights.embed_tokens.device
        self.dtype = weights.embed_tokens.dtype
        self.cos, self.sin = rope_tables(cfg.head_dim, cfg.rope_theta,
                                         cfg.max_position_embeddings, self.dtype, self.device)
        self.scale = cfg.head_dim ** -0.5

    @classmethod
    def from_pretrained(cls, ckpt_dir: str | Path, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None,
                        backend: str | ReferenceOps = "reference") -> Qwen3Model:
        cfg = Qwen3Config.from_json(ckpt_dir)
        return cls(cfg, load_weights(ckpt_dir, cfg, device, dtype), backend)

    def make_arena(self, num_pages: int, block_size: int) -> KVArena:
        return KVArena.for_config(self.cfg, num_pages, block_size, self.dtype, self.device)

    def make_batch(self, seqs: Sequence[SeqInput], arena: KVArena,
                   max_pages: int | None = None) -> ForwardBatch:
        return ForwardBatch.from_seqs(seqs, arena.block_size, self.device, max_pages)

    # -- forward ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, arena: KVArena,
                all_logits: bool = False) -> torch.Tensor:
        """Logits ``[B, vocab]`` of each sequence's last new token (``[T, vocab]`` over all
        new tokens with ``all_logits``), in fp32. Writes the new K/V into ``arena``.

        Each projection's residual add is fused with the RMSNorm that follows it (the
        next layer's input norm, or the final norm after the last layer)."""
        self._check_arena(arena)
        eps, layers = self.cfg.rms_norm_eps, self.w.layers
        residual = F.embedding(batch.input_ids, self.w.embed_tokens)
        x = self.ops.rms_norm(residual, layers[0].input_norm, eps)
        for i, lw in enumerate(layers):
            attn = self._attention(i, lw, x, batch, arena)
            x, residual = self.ops.linear_add_rms_norm(attn, lw.o_proj, residual, lw.post_norm,
                                                       eps)
            next_norm = layers[i + 1].input_norm if i + 1 < len(layers) else self.w.norm
            x, residual = self.ops.linear_add_rms_norm(self.ops.gate_up_silu(x, lw.gate_up_proj),
                                                       lw.down_proj, residual, next_norm, eps)
        if not (all_logits or batch.is_decode):   # decode: every row is a last token
            x = x.index_select(0, batch.last_token_index)
        return self.ops.lm_head(x, self.w.lm_head)

    def __call__(self, seqs: Sequence[SeqInput], arena: KVArena,
                 all_logits: bool = False) -> torch.Tensor:
        return self.forward(self.make_batch(seqs, arena), arena, all_logits)

    def _attention(self, i: int, lw: LayerWeights, x: torch.Tensor, batch: ForwardBatch,
                   arena: KVArena) -> torch.Tensor:
        """Attention output ``[T, q_size]``, before ``o_proj``; K/V of the new tokens are
        written into layer ``i`` of the arena on the way."""
        c = self.cfg
        o = self.ops.qkv_attention(self.ops.linear(x, lw.qkv_proj), lw.q_norm, lw.k_norm,
                                   self.cos, self.sin, c.rms_norm_eps, arena.k(i), arena.v(i),
                                   batch, c.num_attention_heads, self.scale)
        return o.view(x.shape[0], c.q_size)

    def _check_arena(self, arena: KVArena) -> None:
        c = self.cfg
        want = (c.num_hidden_layers, 2, arena.block_size, c.num_key_value_heads, c.head_dim)
        require(tuple(arena.data.shape[1:]) == want and arena.data.dtype == self.dtype,
                "arena", (tuple(arena.data.shape), arena.data.dtype),
                f"[pages, *{want}] of dtype {self.dtype}")
