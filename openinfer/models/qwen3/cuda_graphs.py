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
from openinfer.models.qwen3.batch import FlatInputs, ForwardBatch, GraphInputs, SeqInput
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
        self.width = max_pages_per_seq
        self.inputs = {b: GraphInputs.of(FlatInputs.padding(b, b, self.width, padding_page, decode=True),
                                         model.device) for b in self.buckets}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def capture(self) -> None:
        """Capture the largest bucket first so smaller ones reuse its memory pool."""
        pool = None
        for b in reversed(self.buckets):
            self.graphs[b], self.outputs[b] = capture_forward(self.model, self.inputs[b].batch, self.arena, pool)
            pool = self.graphs[b].pool()
        torch.cuda.synchronize()

    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} exceeds the largest captured bucket {self.buckets[-1]}")

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Replay the decode of ``batch`` (1 token per sequence); logits ``[B, vocab]``, a
        view of the graph's static output that the next replay overwrites. Field by field
        (a dozen small copies); the engine's path is ``run_seqs``."""
        require(batch.is_decode, "batch.is_decode", batch.is_decode, "True (decode only)")
        n = batch.num_seqs
        b = self.bucket_for(n)
        w = batch.block_tables.shape[1]
        require(w <= self.width, "batch.block_tables", w, f"<= {self.width} pages per sequence")
        v = self.inputs[b].batch
        v.input_ids[:n].copy_(batch.input_ids)
        v.positions[:n].copy_(batch.positions)
        v.slot_mapping[:n].copy_(batch.slot_mapping)
        v.block_tables[:n, :w].copy_(batch.block_tables)
        v.block_tables[:n, w:].fill_(self.padding_page)
        v.seq_lens[:n].copy_(batch.seq_lens)
        v.input_ids[n:].zero_()
        v.positions[n:].zero_()
        v.slot_mapping[n:].fill_(-1)
        v.block_tables[n:].fill_(self.padding_page)
        v.seq_lens[n:].fill_(1)
        self.graphs[b].replay()
        return self.outputs[b][:n]

    def run_seqs(self, seqs: Sequence[SeqInput]) -> torch.Tensor:
        """``run`` from the sequences: the padded batch is built on the host and goes up in
        two copies, so a step's launch is two copies and a replay."""
        b = self.bucket_for(len(seqs))
        self.inputs[b].refill(FlatInputs.build(seqs, self.arena.block_size, self.width, self.padding_page,
                                               pad_to=(b, b), decode=True))
        self.graphs[b].replay()
        return self.outputs[b][:len(seqs)]


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
