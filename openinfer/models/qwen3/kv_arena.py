"""The paged KV arena: one tensor ``[num_pages, num_layers, 2, block_size, kv_heads, head_dim]``.

Page-major on purpose: everything one block of tokens contributes to the cache (K and V of
every layer) is one contiguous slab, so offloading or restoring a block is one memcpy
(``arena.page(p)``), not ``2 * num_layers`` strided ones. Kernels see a layer through the
strided views ``k(layer)`` / ``v(layer)`` ``[num_pages, block_size, kv_heads, head_dim]``.

The arena has no allocation policy. Callers conventionally keep page 0 as the padding
page that padding rows of a batch point at; it is zero-initialised so such rows read
finite values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openinfer.errors import require
from openinfer.models.qwen3.config import Qwen3Config


@dataclass
class KVArena:
    data: torch.Tensor  # [num_pages, num_layers, 2, block_size, num_kv_heads, head_dim]

    @classmethod
    def allocate(cls, num_pages: int, num_layers: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu") -> KVArena:
        require(isinstance(num_pages, int) and num_pages >= 1, "num_pages", num_pages,
                "an int >= 1")
        require(isinstance(block_size, int) and block_size >= 1, "block_size", block_size,
                "an int >= 1")
        return cls(torch.zeros(num_pages, num_layers, 2, block_size, num_kv_heads, head_dim,
                               dtype=dtype, device=device))

    @classmethod
    def for_config(cls, cfg: Qwen3Config, num_pages: int, block_size: int,
                   dtype: torch.dtype | None = None,
                   device: str | torch.device = "cpu") -> KVArena:
        return cls.allocate(num_pages, cfg.num_hidden_layers, block_size,
                            cfg.num_key_value_heads, cfg.head_dim, dtype or cfg.dtype, device)

    @staticmethod
    def bytes_per_page_for(cfg: Qwen3Config, block_size: int, dtype: torch.dtype) -> int:
        """Size of one page, e.g. to size the arena from free GPU memory."""
        item = torch.empty((), dtype=dtype).element_size()
        return cfg.num_hidden_layers * 2 * block_size * cfg.kv_size * item

    # -- geometry -----------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.data.shape[0]

    @property
    def num_layers(self) -> int:
        return self.data.shape[1]

    @property
    def block_size(self) -> int:
        return self.data.shape[3]

    @property
    def num_kv_heads(self) -> int:
        return self.data.shape[4]

    @property
    def head_dim(self) -> int:
        return self.data.shape[5]

    @property
    def bytes_per_page(self) -> int:
        return self.data[0].numel() * self.data.element_size()

    # -- views ----------------------------------------------------------------------------
    def k(self, layer: int) -> torch.Tensor:
        """Keys of one layer, ``[num_pages, block_size, kv_heads, head_dim]`` (strided)."""
        return self.data[:, layer, 0]

    def v(self, layer: int) -> torch.Tensor:
        return self.data[:, layer, 1]

    def page(self, page_id: int) -> torch.Tensor:
        """All layers' K and V of one block: a contiguous ``[layers, 2, block, heads, dim]``."""
        return self.data[page_id]
