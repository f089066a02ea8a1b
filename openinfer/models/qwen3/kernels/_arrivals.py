"""Arrival counters: how the last program of a grid to finish learns that it is the last.

A kernel that ends with work needing every program's output (the split merge of decode
attention, the residual add + RMSNorm after a decode GEMM) lets each program store its
share, then add one to a counter (acq_rel, GPU scope); the program that sees ``count - 1``
acquires everyone's stores, does the tail and resets the counter to zero. That saves the
launch of a second kernel. Counters live in one zeroed int32 buffer per (device, user),
never freed: a captured CUDA graph keeps the address it was captured with.
"""

from __future__ import annotations

import torch

# Each user's kernels, and the setting that turns their fused tail off.
USERS = {"attention": "OPENINFER_DECODE_FUSED_REDUCE_SPLITS=0",
         "norm": "OPENINFER_SKINNY_FUSED_NORM_ROWS=0"}
_ARRIVALS: dict[tuple[torch.device, str], list[torch.Tensor]] = {}
_MIN_ARRIVALS = 1 << 14


def arrival_counters(device: torch.device, count: int, user: str = "attention") -> torch.Tensor:
    """Zeroed int32 counters, at least ``count``, for ``user``'s kernels on ``device``. A
    larger buffer is made outside graph capture only (its memory would belong to the
    graph's pool); the older ones stay alive for the graphs that use them. The launches of
    one user on one device share it, so they must run in stream order."""
    assert user in USERS, user
    if device.type == "cuda" and device.index is None:    # "cuda" and "cuda:0": one buffer
        device = torch.device("cuda", torch.cuda.current_device())
    held = _ARRIVALS.setdefault((device, user), [])
    if not held or held[-1].numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{user} kernels need {count} arrival counters on this device, and they can"
                " only be made outside a CUDA-graph capture: run one eager decode step of"
                f" the largest batch that uses them first, or set {USERS[user]}")
        held.append(torch.zeros(max(count, _MIN_ARRIVALS), dtype=torch.int32, device=device))
    return held[-1]
