"""A step's sampled tokens back to the host without the copy engines.

The KV saves of the CPU tier are D2H copies too, and copies in one direction share the
copy engine in order: a token readback queued behind a prefill's saves (64 pages are
~150 MB, ~3 ms) delays the step's result by the rest of those saves although the GPU is
done. A captured served run showed exactly that (the next step's wall time grew by the
save's remaining time, slope ~1). Instead a tiny kernel stores the tokens and logprobs
straight into pinned host memory (mapped into the device's address space), so the
readback waits for nothing but the step's own kernels.

The caching host allocator does not see a kernel's writes (it tracks only the copies it
is told about), so a buffer whose tensor is dropped goes back to its pool at once, while
the queued kernel will still write it: the next pinned allocation of that size (a step's
upload of page tables and slots) could get it and be overwritten before its copy reads
it. ``to_host`` therefore keeps its buffers itself until an event recorded after the
kernel has fired, whatever the caller does with them (an abandoned step, a warm-up that
ignores its results).

Off the GPU (tests, the reference backend) the tensors are already on the host.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import torch
import triton
import triton.language as tl


class _Completion(Protocol):
    def query(self) -> bool: ...


class InFlightBuffers:
    """Host buffers that a queued kernel will still write, each kept until its event has
    fired. One per process (the pinned pool is the process's): a per-executor list would
    let an executor that is dropped free buffers its last kernel still writes."""

    def __init__(self) -> None:
        self._pending: deque[tuple[_Completion, tuple[torch.Tensor, ...]]] = deque()

    def keep(self, done: _Completion, *buffers: torch.Tensor) -> None:
        self._pending.append((done, buffers))

    def release_finished(self) -> None:
        """Drop every entry whose event has fired. Events of one stream fire in order, so
        the scan stops at the first pending one."""
        while self._pending and self._pending[0][0].query():
            self._pending.popleft()

    def __len__(self) -> int:
        return len(self._pending)


IN_FLIGHT = InFlightBuffers()


@triton.jit
def _to_host_kernel(tok_ptr, lp_ptr, tok_out, lp_out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(tok_out + offs, tl.load(tok_ptr + offs, mask=mask), mask=mask)
    tl.store(lp_out + offs, tl.load(lp_ptr + offs, mask=mask), mask=mask)


def to_host(tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Host tensors that hold ``tokens`` (int64) and ``logprobs`` (fp32) once the work
    queued so far on the current stream is done (record an event after this call and wait
    for it before reading them). The buffers stay reserved until then even if the caller
    drops them (``IN_FLIGHT``)."""
    if tokens.device.type != "cuda":
        return tokens, logprobs.float()
    IN_FLIGHT.release_finished()
    n = tokens.numel()
    tok_host = torch.empty(n, dtype=torch.int64, pin_memory=True)
    lp_host = torch.empty(n, dtype=torch.float32, pin_memory=True)
    if n:
        block = 256
        _to_host_kernel[(triton.cdiv(n, block),)](tokens.reshape(-1).to(torch.int64),
                                                  logprobs.reshape(-1).float(), tok_host,
                                                  lp_host, n, BLOCK=block)
        written = torch.cuda.Event()
        written.record()
        IN_FLIGHT.keep(written, tok_host, lp_host)
    return tok_host, lp_host
