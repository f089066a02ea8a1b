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
        return FlatInputs.build(seqs, block_size, max_pages, padding_page).upload(device)


@dataclass
class FlatInputs:
    """A batch's inputs as two host lists (every int64 field, then every int32 field), so a
    step uploads two tensors instead of seven, and a captured graph's static inputs are two
    buffers one copy each can refill. ``pad_to=(tokens, seqs)`` pads for a prefill-graph
    bucket: extra tokens get position 0, token 0 and slot -1 (nothing written) and belong to
    no sequence; extra sequences have no new tokens (the attention kernels skip them) and a
    seq_len of 1 over the padding page. ``pad_to=(b, b), decode=True`` pads a decode batch
    for a decode-graph bucket: each extra row is one such token of its own (decode kernels
    read one token per row)."""

    ids64: list[int]     # input_ids [T], positions [T], slot_mapping [T], last_token_index [B]
    ids32: list[int]     # block_tables [B * width], seq_lens [B], query_start_loc [B + 1]
    tokens: int
    seqs: int
    width: int
    max_query_len: int
    is_decode: bool

    @classmethod
    def build(cls, seqs: Sequence[SeqInput], block_size: int, max_pages: int | None = None,
              padding_page: int = 0, pad_to: tuple[int, int] | None = None,
              decode: bool = False) -> FlatInputs:
        if not seqs:
            raise ConfigError("seqs", [], "at least one sequence")
        need = [-(-(s.start + len(s.token_ids)) // block_size) for s in seqs]
        width = max_pages if max_pages is not None else max(need)
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        tables: list[int] = []
        qloc = [0]
        lens: list[int] = []
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
            tables += row + [padding_page] * (width - len(row))
            qloc.append(qloc[-1] + n)
            lens.append(s.start + n)
        T, B = len(ids), len(seqs)
        last = [q - 1 for q in qloc[1:]]
        max_q = max(len(s.token_ids) for s in seqs)
        is_decode = max_q == 1
        if pad_to is None:
            return cls(ids + pos + slots + last, tables + lens + qloc, T, B, width, max_q, is_decode)
        pt, pb = pad_to
        if pt < T or pb < B or (decode and (pt != pb or not is_decode)):
            want = "(b, b), b >= the rows of a decode batch" if decode else f">= ({T}, {B})"
            raise ConfigError("pad_to", pad_to, f"{want}: the tokens and sequences to pad to")
        extra_t, extra_b = pt - T, pb - B
        ids += [0] * extra_t
        pos += [0] * extra_t
        slots += [-1] * extra_t
        last += list(range(T, pt)) if decode else [0] * extra_b
        tables += [padding_page] * (extra_b * width)
        lens += [1] * extra_b
        qloc += list(range(T + 1, pt + 1)) if decode else [T] * extra_b
        return cls(ids + pos + slots + last, tables + lens + qloc, pt, pb, width,
                   1 if decode else pt, decode)

    @classmethod
    def padding(cls, tokens: int, seqs: int, width: int, padding_page: int = 0,
                decode: bool = False) -> FlatInputs:
        """A batch of padding only, what a graph is captured over: no token writes a page;
        ``decode``: one token per row (``tokens == seqs``), else no sequence owns a token."""
        if decode and tokens != seqs:
            raise ConfigError("padding", (tokens, seqs), "tokens == seqs for a decode batch")
        last = list(range(seqs)) if decode else [0] * seqs
        qloc = list(range(seqs + 1)) if decode else [0] * (seqs + 1)
        return cls([0] * (2 * tokens) + [-1] * tokens + last,
                   [padding_page] * (seqs * width) + [1] * seqs + qloc,
                   tokens, seqs, width, 1 if decode else tokens, decode)

    def upload(self, device: str | torch.device) -> ForwardBatch:
        """The batch on ``device``, in two non-blocking uploads."""
        return self.views(upload(self.ids64, torch.int64, device), upload(self.ids32, torch.int32, device))

    def views(self, ids64: torch.Tensor, ids32: torch.Tensor) -> ForwardBatch:
        """The ForwardBatch over two tensors laid out as ``ids64`` / ``ids32``."""
        T, B, n_tab = self.tokens, self.seqs, self.seqs * self.width
        return ForwardBatch(
            input_ids=ids64[:T], positions=ids64[T:2 * T], slot_mapping=ids64[2 * T:3 * T],
            last_token_index=ids64[3 * T:3 * T + B], block_tables=ids32[:n_tab].view(B, self.width),
            seq_lens=ids32[n_tab:n_tab + B], query_start_loc=ids32[n_tab + B:n_tab + 2 * B + 1],
            max_query_len=self.max_query_len, is_decode=self.is_decode)


@dataclass
class GraphInputs:
    """A captured graph's static inputs: two device buffers in ``FlatInputs``' layout and
    the batch view over them that the graph was captured on. ``refill`` puts a batch of the
    same (tokens, seqs, width) shape in with two non-blocking copies, so a replay's launch
    is two copies and the replay."""

    ids64: torch.Tensor
    ids32: torch.Tensor
    batch: ForwardBatch

    @classmethod
    def of(cls, flat: FlatInputs, device: str | torch.device) -> GraphInputs:
        ids64 = torch.tensor(flat.ids64, dtype=torch.int64, device=device)
        ids32 = torch.tensor(flat.ids32, dtype=torch.int32, device=device)
        return cls(ids64, ids32, flat.views(ids64, ids32))

    def refill(self, flat: FlatInputs) -> None:
        self.ids64.copy_(pinned(flat.ids64, torch.int64), non_blocking=True)
        self.ids32.copy_(pinned(flat.ids32, torch.int32), non_blocking=True)


def upload(values: Sequence[float], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A host list as a device tensor without stalling the host: on CUDA through pinned
    memory and a non-blocking copy (a plain ``torch.tensor(..., device="cuda")`` waits for
    every kernel already queued on the stream, so a step would hold the host thread for its
    whole GPU time)."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=dtype)
    return pinned(values, dtype).to(device, non_blocking=True)


def pinned(values: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
    """A pinned host tensor: a non-blocking copy from it does not wait for the stream, and
    the caching host allocator keeps it alive until that copy is done."""
    return torch.tensor(values, dtype=dtype).pin_memory()
