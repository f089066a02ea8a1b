"""The CUDA-graph decode batch buckets, one tuple for the simulator and the real executor.

Spec §1.4 (``batch_decode_buffers.rs``): 1, 2, 4, 8, 16, 20, 24, 32, 40, ... (step 8) ...,
256; a pure decode step of ``n`` rows replays the graph of the next bucket up.
"""

from __future__ import annotations

GRAPH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 20, 24) + tuple(range(32, 257, 8))


def buckets_up_to(n: int) -> tuple[int, ...]:
    """The buckets below ``n``, then ``n`` itself: what an engine capped at ``n`` rows captures."""
    if n < 1:
        raise ValueError(f"buckets_up_to: n={n}, expected an int >= 1")
    return tuple(b for b in GRAPH_BUCKETS if b < n) + (n,)


__all__ = ["GRAPH_BUCKETS", "buckets_up_to"]
