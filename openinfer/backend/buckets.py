"""The CUDA-graph buckets, one set for the simulator and the real executor.

Decode, spec §1.4 (``batch_decode_buffers.rs``): 1, 2, 4, 8, 16, 20, 24, 32, 40, ... (step
8) ..., 256; a pure decode step of ``n`` rows replays the graph of the next bucket up.
Steps with prompt tokens (``openinfer.models.qwen3.prefill_graphs``, when on): ``T`` new
tokens over ``B`` sequences replay the smallest (tokens, seqs) bucket that holds them.
"""

from __future__ import annotations

from bisect import bisect_left

GRAPH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 20, 24) + tuple(range(32, 257, 8))


PREFILL_TOKEN_BUCKETS: tuple[int, ...] = (32, 64, 128, 256, 512)
PREFILL_SEQ_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16)


def prefill_bucket(tokens: int, seqs: int, token_buckets: tuple[int, ...] = PREFILL_TOKEN_BUCKETS,
                   seq_buckets: tuple[int, ...] = PREFILL_SEQ_BUCKETS) -> tuple[int, int] | None:
    """The (tokens, seqs) graph a step with prompt tokens replays, or ``None``: it runs
    eagerly (larger than the largest bucket)."""
    i, j = bisect_left(token_buckets, tokens), bisect_left(seq_buckets, seqs)
    if i == len(token_buckets) or j == len(seq_buckets):
        return None
    return token_buckets[i], seq_buckets[j]


def buckets_up_to(n: int) -> tuple[int, ...]:
    """The buckets below ``n``, then ``n`` itself: what an engine capped at ``n`` rows captures."""
    if n < 1:
        raise ValueError(f"buckets_up_to: n={n}, expected an int >= 1")
    return tuple(b for b in GRAPH_BUCKETS if b < n) + (n,)


__all__ = ["GRAPH_BUCKETS", "PREFILL_SEQ_BUCKETS", "PREFILL_TOKEN_BUCKETS", "buckets_up_to",
           "prefill_bucket"]
