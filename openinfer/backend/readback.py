"""A step's sampled tokens back to the host without the copy engines.

The KV saves of the CPU tier are D2H copies too, and copies in one direction share the
copy engine in order: a token readback queued behind a prefill's saves (64 pages are
~150 MB, ~3 ms) delays the step's result by the rest of those saves although the GPU is
done. A captured served run showed exactly that (the next step's wall time grew by the
save's remaining time, slope ~1). Instead a tiny kernel stores the tokens and logprobs
straight into pinned host memory (mapped into the device's address space), so the
readback waits for nothing but the step's own kernels.

Off the GPU (tests, the reference backend) the tensors are already on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _to_host_kernel(tok_ptr, lp_ptr, tok_out, lp_out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(tok_out + offs, tl.load(tok_ptr + offs, mask=mask), mask=mask)
    tl.store(lp_out + offs, tl.load(lp_ptr + offs, mask=mask), mask=mask)


def to_host(tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Host tensors that hold ``tokens`` (int64) and ``logprobs`` (fp32) once the work
    queued so far on the current stream is done (record an event after this call and wait
    for it before reading them). Keep both until then: the caching host allocator does not
    see a kernel's writes, so a tensor dropped earlier frees its pinned block at once, and
    the next pinned allocation of that size (a step's upload) can get it and be
    overwritten by the queued kernel."""
    if tokens.device.type != "cuda":
        return tokens, logprobs.float()
    n = tokens.numel()
    tok_host = torch.empty(n, dtype=torch.int64, pin_memory=True)
    lp_host = torch.empty(n, dtype=torch.float32, pin_memory=True)
    if n:
        block = 256
        _to_host_kernel[(triton.cdiv(n, block),)](tokens.reshape(-1).to(torch.int64),
                                                  logprobs.reshape(-1).float(), tok_host,
                                                  lp_host, n, BLOCK=block)
    return tok_host, lp_host
