"""Arrival counters: which program of a group finishes last, so it can finish the group.

A kernel whose programs split one result (split-K partial sums, split-KV attention
partials) normally leaves the merge to a second kernel. Instead each program of a group
adds one to the group's counter after writing its part; the one that sees ``parts - 1``
arrived last, merges every part in a fixed order (so the result does not depend on which
program that was) and resets the counter to zero for the next launch. One launch less per
merge; decode steps are made of launches a few microseconds long, so that pays.

The counters are one zeroed int32 buffer per device shared by every such kernel: kernels
of a step run one after another on one stream and each leaves them zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_COUNTERS: dict[torch.device, torch.Tensor] = {}
_MIN_COUNTERS = 4096


@triton.jit
def arrive(cnt_ptr, num_parts):
    """True in the program that arrives last of ``num_parts`` at ``cnt_ptr`` (it has reset
    the counter). Call after this program's part is stored: the barrier makes every
    thread's stores precede the release; the last program then reads the other parts
    through L2 (``cache_modifier=".cg"``)."""
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == num_parts - 1
    if last:
        tl.store(cnt_ptr, 0)
    return last


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` zeroed counters on ``device``. Allocated on the first (eager,
    warm-up) call, so a CUDA graph captures no memset; growing them during capture is
    refused."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{n} arrival counters needed during CUDA-graph capture: run "
                               "one eager step of this batch size first")
        have = torch.zeros(max(n, _MIN_COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[device] = have
    return have
