"""The step readback kernel: tokens and logprobs stored straight into host memory."""

from __future__ import annotations

import pytest
import torch

from openinfer.models.qwen3.kernels._interpret import interpreting

INTERPRET = interpreting()   # set by tests/conftest.py on a machine without a GPU


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


class _Event:
    """Stands in for a CUDA event: fired when the test says so."""

    def __init__(self) -> None:
        self.fired = False

    def query(self) -> bool:
        return self.fired


def test_a_dropped_readback_buffer_is_kept_until_its_event_has_fired():
    """A served step abandoned mid-wait, or a warm-up that ignores its results, drops
    ``to_host``'s tensors while the kernel that writes them is still queued; the keeper
    must hold them until then, and let go once it has run (no unbounded growth)."""
    import weakref

    from openinfer.backend.readback import InFlightBuffers
    keeper = InFlightBuffers()
    first, second = _Event(), _Event()
    a, b, c = torch.zeros(4), torch.zeros(4), torch.zeros(2)
    refs = [weakref.ref(t) for t in (a, b, c)]
    keeper.keep(first, a, b)
    keeper.keep(second, c)
    del a, b, c
    keeper.release_finished()
    assert all(r() is not None for r in refs) and len(keeper) == 2
    second.fired = True            # out of stream order: kept until the older one fires too
    keeper.release_finished()
    assert all(r() is not None for r in refs)
    first.fired = True
    keeper.release_finished()
    assert all(r() is None for r in refs) and len(keeper) == 0


GPU_ONLY = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                              reason="needs a CUDA GPU (the caching host allocator)")


def _readback_while_the_gpu_is_busy(launch) -> tuple[int, list[torch.Tensor]]:
    """Queue a readback of [100..103] behind ~0.1 s of GPU work, drop its host tensors,
    then take every free pinned block of that size as a step's upload of [7, 7, 7, 7]
    would. Returns the dropped buffer's address and the uploads, after the GPU is done."""
    from openinfer.backend import readback
    from openinfer.models.qwen3.batch import pinned
    tokens = torch.arange(100, 104, device="cuda")
    logprobs = torch.zeros(4, device="cuda")
    readback.to_host(tokens, logprobs)                 # compiled outside the busy window
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)                     # the readback below stays queued
    tok, lp = launch(tokens, logprobs)
    dropped = tok.data_ptr()
    del tok, lp
    uploads = [pinned([7, 7, 7, 7], torch.int64) for _ in range(64)]
    torch.cuda.synchronize()
    return dropped, uploads


@GPU_ONLY
def test_a_buffer_dropped_before_its_readback_kernel_ran_can_overwrite_the_next_upload():
    """The hazard ``to_host`` guards against, with the bare kernel: the caching host
    allocator does not see the kernel's writes, so the dropped buffer goes straight back
    to the pool, the next upload of that size gets it, and the queued kernel writes over
    the upload."""
    from openinfer.backend import readback

    def bare_kernel(tokens, logprobs):
        tok = torch.empty(4, dtype=torch.int64, pin_memory=True)
        lp = torch.empty(4, dtype=torch.float32, pin_memory=True)
        readback._to_host_kernel[(1,)](tokens, logprobs, tok, lp, 4, BLOCK=256)
        return tok, lp

    dropped, uploads = _readback_while_the_gpu_is_busy(bare_kernel)
    hit = [u for u in uploads if u.data_ptr() == dropped]
    assert len(hit) == 1 and hit[0].tolist() == [100, 101, 102, 103]


@GPU_ONLY
def test_to_host_keeps_its_buffers_from_the_next_upload_until_its_kernel_has_run():
    from openinfer.backend import readback
    dropped, uploads = _readback_while_the_gpu_is_busy(readback.to_host)
    assert all(u.data_ptr() != dropped for u in uploads)
    assert all(u.tolist() == [7, 7, 7, 7] for u in uploads)
    readback.IN_FLIGHT.release_finished()
    assert len(readback.IN_FLIGHT) == 0
