"""The step readback kernel: tokens and logprobs stored straight into host memory."""

from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")   # tests/models' conftest


@pytest.mark.skipif(not (INTERPRET or torch.cuda.is_available()),
                    reason="needs the Triton interpreter or a GPU")
@pytest.mark.parametrize("n", [1, 37, 300])
def test_the_readback_kernel_copies_every_token_and_logprob(n):
    from openinfer.backend import readback     # after conftest chose interpreter or GPU
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tokens = torch.randint(0, 151936, (n,), device=dev)
    logprobs = -torch.rand(n, device=dev)
    tok_out = torch.full((n,), -1, dtype=torch.int64, pin_memory=dev == "cuda")
    lp_out = torch.zeros(n, dtype=torch.float32, pin_memory=dev == "cuda")
    readback._to_host_kernel[(-(-n // 256),)](tokens, logprobs, tok_out, lp_out, n, BLOCK=256)
    if dev == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(tok_out, tokens.cpu()) and torch.equal(lp_out, logprobs.cpu())


def test_off_the_gpu_the_tensors_are_already_host_tensors():
    from openinfer.backend import readback
    tokens, logprobs = torch.tensor([3, 4]), torch.tensor([-0.5, -1.0], dtype=torch.float64)
    tok, lp = readback.to_host(tokens, logprobs)
    assert tok is tokens and lp.dtype == torch.float32 and lp.tolist() == [-0.5, -1.0]


@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                    reason="needs a CUDA GPU (the caching host allocator)")
def test_a_readback_dropped_before_its_kernel_ran_can_overwrite_the_next_upload():
    """Why every caller holds ``to_host``'s tensors until its event: the caching host
    allocator does not see the kernel's writes, so a dropped buffer goes straight back to
    the pool, a step's next pinned upload of that size can get it, and the queued kernel
    then writes over the upload. With the GPU held busy, the overwrite is certain."""
    from openinfer.backend import readback
    from openinfer.models.qwen3.batch import pinned
    tokens = torch.arange(100, 104, device="cuda")
    logprobs = torch.zeros(4, device="cuda")
    warm = readback.to_host(tokens, logprobs)         # compiled outside the busy window
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)                    # ~0.1 s: the kernel below stays queued
    tok, lp = readback.to_host(tokens, logprobs)
    dropped = tok.data_ptr()
    del tok, lp
    uploads = [pinned([7, 7, 7, 7], torch.int64) for _ in range(64)]   # every free block
    torch.cuda.synchronize()
    hit = [u for u in uploads if u.data_ptr() == dropped]
    assert len(hit) == 1 and warm[0].tolist() == [100, 101, 102, 103]
    assert hit[0].tolist() == [100, 101, 102, 103]    # the upload, overwritten
