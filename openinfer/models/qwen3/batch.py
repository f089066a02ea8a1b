"""What one forward step computes: new tokens of several sequences over their cached prefix.

``SeqInput`` is the caller's description of one sequence; ``ForwardBatch`` is the flat
tensor form that the model and the kernels read. Each sequence's K/V for the new tokens
is written into the arena first (``slot_mapping``), then attention reads the whole
``[0, seq_len)`` from the pages, so a cached prefix (ending anywhere, mid-block included)
and the new tokens are treated alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from openinfer.errors import ConfigError


@dataclass(frozen=True)
class SeqInput:
    token_ids: Sequence[int]   # the new tokens (>= 1)
    start: int                 # tokens of this sequence already in the arena
    page_table: Sequence[int]  # page ids covering positions [0, start + len(token_ids))


@dataclass
class ForwardBatch:
    """Flat, device-resident inputs; ``T`` new tokens over ``B`` sequences."""

    input_ids: torch.Tensor        # [T] int64
    positions: torch.Tensor        # [T] int64
    slot_mapping: torch.Tensor     # [T] int64, page * block_size + offset; < 0: don't write
    block_tables: torch.Tensor     # [B, max_pages] int32, padded with the padding page
    seq_lens: torch.Tensor         # [B] int32, start + new tokens
    query_start_loc: torch.Tensor  # [B + 1] int32, cumulative new-token counts
    last_token_index: torch.Tensor  # [B] int64, row of each sequence's last new token
    max_query_len: int             # host-side, so no kernel launch needs a device sync
    is_decode: bool                # every sequence has exactly one new token

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @classmethod
    def from_seqs(cls, seqs: Sequence[SeqInput], block_size: int,
                  device: str | torch.device = "cpu", max_pages: int | None = None,
                  padding_page: int = 0) -> ForwardBatch:
        if not seqs:
            raise ConfigError("seqs", [], "at least one sequence")
        need = [-(-(s.start + len(s.token_ids)) // block_size) for s in seqs]
        width = max_pages if max_pages is not None else max(need)
        ids, pos, slots, tables, qloc = [], [], [], [], [0]
        for i, s in enumerate(seqs):
            n = len(s.token_ids)
            if n < 1 or s.start < 0:
                raise ConfigError(f"seqs[{i}]", (s.start, n), "start >= 0 and >= 1 new token")
            if len(s.page_table) < need[i] or need[i] > width:
                raise ConfigError(f"seqs[{i}].page_table", list(s.page_table),
                                  f">= {need[i]} pages (start={s.start} + {n} tokens, "
                                  f"block_size={block_size}), at most max_pages={width}")
            ids += list(s.token_ids)
            for p in range(s.start, s.start + n):
                pos.append(p)
                slots.append(s.page_table[p // block_size] * block_size + p % block_size)
            row = list(s.page_table[:need[i]])
            tables.append(row + [padding_page] * (width - len(row)))
            qloc.append(qloc[-1] + n)
        i64 = dict(dtype=torch.int64, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        return cls(
            input_ids=torch.tensor(ids, **i64), positions=torch.tensor(pos, **i64),
            slot_mapping=torch.tensor(slots, **i64), block_tables=torch.tensor(tables, **i32),
            seq_lens=torch.tensor([s.start + len(s.token_ids) for s in seqs], **i32),
            query_start_loc=torch.tensor(qloc, **i32),
            last_token_index=torch.tensor(qloc[1:], **i64) - 1,
            max_query_len=max(len(s.token_ids) for s in seqs),
            is_decode=all(len(s.token_ids) == 1 for s in seqs))
