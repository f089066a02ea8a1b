"""CUDA-graph capture of steps with prompt tokens, one graph per (tokens, sequences) bucket.

UNTESTED ON CPU, like ``cuda_graphs``: it needs a GPU and the ``triton`` backend. Why: an
eager step with a prompt chunk launches ~360 kernels from Python, and on the H200 the host
takes longer to launch them (10-26 ms for a 100-200 token chunk, varying with the host's
load) than the GPU takes to run them (~7 ms), so prefill steps were bound by, and as noisy
as, the host. A graph replay launches them in one call.

A step of ``T`` new tokens over ``B`` sequences (prefill chunks and decode rows alike)
replays the graph of the smallest bucket ``(t >= T, b >= B)``; ``FlatInputs.build(pad_to=)``
pads it (padding tokens write nothing and belong to no sequence; padding sequences have
no tokens and the attention kernel skips them), and two copies refill the graph's static
inputs. The prefill attention grid is sized by ``t`` at capture; programs past a
sequence's length return at once. Steps that need logits of every token (prompt
logprobs) or exceed the largest bucket run eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from openinfer.backend.buckets import PREFILL_SEQ_BUCKETS, PREFILL_TOKEN_BUCKETS, prefill_bucket
from openinfer.errors import require
from openinfer.models.qwen3.batch import FlatInputs, GraphInputs, SeqInput
from openinfer.models.qwen3.cuda_graphs import capture_forward
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.models.qwen3.model import Qwen3Model


class PrefillGraphs:
    def __init__(self, model: Qwen3Model, arena: KVArena, max_pages_per_seq: int,
                 token_buckets: Sequence[int] = PREFILL_TOKEN_BUCKETS,
                 seq_buckets: Sequence[int] = PREFILL_SEQ_BUCKETS, padding_page: int = 0) -> None:
        require(torch.cuda.is_available() and model.device.type == "cuda", "device",
                model.device, "a CUDA device (CUDA graphs)")
        require(model.ops.name == "triton", "backend", model.ops.name,
                "'triton' (the reference backend syncs with the host)")
        for name, b in (("prefill_token_buckets", token_buckets), ("prefill_seq_buckets", seq_buckets)):
            require(len(b) > 0 and list(b) == sorted(set(b)) and b[0] >= 1, name, list(b),
                    "strictly increasing sizes >= 1")
        self.model, self.arena = model, arena
        self.token_buckets, self.seq_buckets = tuple(token_buckets), tuple(seq_buckets)
        self.width, self.padding_page = max_pages_per_seq, padding_page
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.inputs: dict[tuple[int, int], GraphInputs] = {}

    def bucket_for(self, tokens: int, seqs: int) -> tuple[int, int] | None:
        """The graph a step of ``tokens`` new tokens over ``seqs`` sequences replays, or
        ``None`` (it runs eagerly)."""
        return prefill_bucket(tokens, seqs, self.token_buckets, self.seq_buckets)

    def capture(self) -> None:
        """Largest bucket first, so the smaller ones reuse its memory pool. Each graph is
        captured over a batch of padding only (token 0, nothing written)."""
        pool = None
        for t in reversed(self.token_buckets):
            for b in reversed(self.seq_buckets):
                inputs = GraphInputs.of(FlatInputs.padding(t, b, self.width, self.padding_page), self.model.device)
                self.inputs[t, b] = inputs
                self.graphs[t, b], self.outputs[t, b] = capture_forward(self.model, inputs.batch, self.arena, pool)
                pool = self.graphs[t, b].pool()
        torch.cuda.synchronize()

    def run(self, seqs: Sequence[SeqInput], key: tuple[int, int]) -> torch.Tensor:
        """Replay the step of ``seqs`` in graph ``key`` (from ``bucket_for``); logits of each
        sequence's last new token ``[B, vocab]``, a view of the graph's static output that
        the next replay of this graph overwrites."""
        self.inputs[key].refill(FlatInputs.build(seqs, self.arena.block_size, self.width, self.padding_page,
                                                 pad_to=key))
        self.graphs[key].replay()
        return self.outputs[key][:len(seqs)]

