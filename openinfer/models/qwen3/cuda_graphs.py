"""CUDA-graph capture of the decode step, one graph per batch-size bucket.

UNTESTED ON CPU: this needs a GPU (it was written for the H200 runs) and the ``triton``
backend, whose decode path has no host sync and no data-dependent shape. Each bucket's
graph reads static input buffers; a batch of ``B`` rows is copied into the first ``B``
rows and the rest become padding rows: token 0 at position 0, seq_len 1, every page entry
the padding page, slot -1 (nothing written). The splits of the decode kernel are fixed per
bucket at capture time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from openinfer.backend.buckets import GRAPH_BUCKETS
from openinfer.errors import require
from openinfer.models.qwen3.batch import ForwardBatch
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.models.qwen3.model import Qwen3Model


class DecodeGraphs:
    def __init__(self, model: Qwen3Model, arena: KVArena, max_pages_per_seq: int,
                 buckets: Sequence[int] = GRAPH_BUCKETS, padding_page: int = 0) -> None:
        require(torch.cuda.is_available() and model.device.type == "cuda", "device",
                model.device, "a CUDA device (CUDA graphs)")
        require(model.ops.name == "triton", "backend", model.ops.name,
                "'triton' (the reference backend syncs with the host)")
        require(list(buckets) == sorted(set(buckets)) and buckets[0] >= 1, "buckets",
                buckets, "strictly increasing batch sizes >= 1")
        self.model, self.arena = model, arena
        self.buckets = list(buckets)
        self.padding_page = padding_page
        n, dev = self.buckets[-1], model.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.full((n, max_pages_per_seq), padding_page, dtype=torch.int32,
                                       device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.last_token_index = torch.arange(n, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _batch(self, b: int) -> ForwardBatch:
        return ForwardBatch(self.input_ids[:b], self.positions[:b], self.slot_mapping[:b],
                            self.block_tables[:b], self.seq_lens[:b],
                            self.query_start_loc[:b + 1], self.last_token_index[:b],
                            max_query_len=1, is_decode=True)

    def capture(self) -> None:
        """Capture the largest bucket first so smaller ones reuse its memory pool."""
        pool = None
        for b in reversed(self.buckets):
            self.graphs[b], self.outputs[b] = capture_forward(self.model, self._batch(b), self.arena, pool)
            pool = self.graphs[b].pool()
        torch.cuda.synchronize()

    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} exceeds the largest captured bucket {self.buckets[-1]}")

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Replay the decode of ``batch`` (1 token per sequence); logits ``[B, vocab]``, a
        view of the graph's static output that the next replay overwrites."""
        require(batch.is_decode, "batch.is_decode", batch.is_decode, "True (decode only)")
        n = batch.num_seqs
        b = self.bucket_for(n)
        w = batch.block_tables.shape[1]
        require(w <= self.block_tables.shape[1], "batch.block_tables", w,
                f"<= {self.block_tables.shape[1]} pages per sequence")
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.block_tables[:n, :w].copy_(batch.block_tables)
        self.block_tables[:n, w:].fill_(self.padding_page)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.input_ids[n:b].zero_()
        self.positions[n:b].zero_()
        self.slot_mapping[n:b].fill_(-1)
        self.block_tables[n:b].fill_(self.padding_page)
        self.seq_lens[n:b].fill_(1)
        self.graphs[b].replay()
        return self.outputs[b][:n]


def capture_forward(model: Qwen3Model, batch: ForwardBatch, arena: KVArena, pool: Any = None
                    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """One graph of ``model.forward(batch)`` over static inputs, and its static output. Two
    eager passes on a side stream first: Triton compiles and cuBLAS picks its kernels
    outside the capture, which may not launch anything new."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model.forward(batch, arena)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        out = model.forward(batch, arena)
    return g, out
