"""CudaTransfer: bytes, coalescing, accounting, ordering and the page-lifetime checks.

On the CPU the copies are synchronous (``cpu_delay_s=0``) or complete ``cpu_delay_s``
later with the bytes moving at completion, which makes the in-flight window observable.
The last test checks stream ordering on a real GPU and is skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch

from openinfer.backend.cuda_transfer import CudaTransfer, PageInFlight, PinnedHostArena, coalesce
from openinfer.errors import AccountingError
from openinfer.kv import BlockPool, HostTier, salt_hash
from openinfer.kv.hashing import block_hashes
from openinfer.kv.pool import PageRefs
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.runtime import SimRuntime

DELAY = 0.01


def _arena(pages: int = 12, device: str = "cpu") -> KVArena:
    arena = KVArena.allocate(pages, 2, 4, 2, 8, torch.float32, device)
    g = torch.Generator(device=device).manual_seed(0)
    arena.data.copy_(torch.randn(arena.data.shape, generator=g, device=device))
    return arena


def _transfer(delay: float = 0.0, pool: BlockPool | None = None, slots: int = 8):
    rt = SimRuntime(0)
    arena = _arena()
    host = PinnedHostArena.like(arena, slots, pin=False)
    return rt, arena, host, CudaTransfer(rt, arena, host, pool=pool, cpu_delay_s=delay)


def test_coalesce_joins_only_runs_that_advance_together():
    assert coalesce([3, 4, 5, 9], [0, 1, 2, 3]) == [(3, 0, 3), (9, 3, 1)]
    assert coalesce([3, 4], [1, 0]) == [(3, 1, 1), (4, 0, 1)]
    assert coalesce([], []) == []


def test_d2h_then_h2d_moves_exact_bytes_and_counts_them():
    rt, arena, host, tr = _transfer()
    pages, slots = [5, 6, 7, 2], [1, 2, 3, 6]
    rt.run(until=tr.d2h(pages, slots))
    for p, s in zip(pages, slots):
        assert torch.equal(host.slot(s), arena.page(p))
    before = [arena.page(p).clone() for p in pages]
    arena.data[[9, 10, 11, 1]] = 0.0
    rt.run(until=tr.h2d(slots, [9, 10, 11, 1]))
    for b, p in zip(before, [9, 10, 11, 1]):
        assert torch.equal(arena.page(p), b)
    assert [(r.dir, r.pages, r.runs, r.bytes) for r in tr.records] == [
        ("d2h", 4, 2, 4 * arena.bytes_per_page), ("h2d", 4, 2, 4 * arena.bytes_per_page)]
    s = tr.summary()
    assert s["d2h"]["copies"] == 1 and s["d2h"]["bytes"] == 4 * arena.bytes_per_page
    assert s["h2d"]["pages"] == 4 and s["peer"]["copies"] == 0


def test_async_cpu_copy_moves_bytes_at_completion_and_guards_its_pages():
    rt, arena, host, tr = _transfer(DELAY)
    done = tr.d2h([3, 4], [0, 1])
    assert not done.triggered and tr.pages_in_flight() == 2
    with pytest.raises(PageInFlight):
        tr.check_step(read_pages=[], write_pages=[4])      # a step overwriting a page being saved
    tr.check_step(read_pages=[3, 4], write_pages=[5])      # reading it is fine
    with pytest.raises(PageInFlight):
        tr.h2d([2], [3])                                   # restoring into a page being saved
    rt.run(until=done)
    assert rt.now() == pytest.approx(DELAY)
    assert torch.equal(host.slot(1), arena.page(4)) and tr.pages_in_flight() == 0
    tr.check_step(read_pages=[], write_pages=[4])          # free again once landed
    load = tr.h2d([0], [8])
    with pytest.raises(PageInFlight):
        tr.check_step(read_pages=[8], write_pages=[])      # reading a page still being written
    with pytest.raises(PageInFlight):
        tr.d2h([8], [5])                                   # saving a page still being written
    rt.run(until=load)
    assert torch.equal(arena.page(8), arena.page(3))
    assert tr.records[-1].wall_s == pytest.approx(DELAY)


def test_a_host_slot_is_never_written_while_a_copy_reads_or_writes_it():
    """The slot half of the rule: a tier handing a slot to a new save while a load still
    reads it would restore the wrong bytes, and the GPU would not say so."""
    rt, arena, host, tr = _transfer(DELAY)
    load = tr.h2d([3], [7])
    with pytest.raises(PageInFlight, match="a D2H save writes slot 3 while 1 copy in flight reads it"):
        tr.d2h([9], [3])
    tr.h2d([3], [8])                                       # two loads may read one slot
    save = tr.d2h([5], [4])
    with pytest.raises(PageInFlight, match="an H2D load reads slot 4 while 1 copy in flight writes it"):
        tr.h2d([4], [2])
    tr.peers["p1"] = PinnedHostArena.like(arena, 4, pin=False)
    with pytest.raises(PageInFlight, match="a peer read writes slot 3"):
        tr.peer_read("p1", [0], [3])
    rt.run(until=rt.all_of([load, save]))
    tr.d2h([9], [3])                                       # free again once both landed


def test_pool_checks_catch_a_copy_of_an_unreferenced_page():
    pool = BlockPool(4, 12)
    rt, arena, host, tr = _transfer(DELAY, pool=pool)
    with pytest.raises(PageInFlight):
        tr.d2h([5], [0])                                   # page 5 is free: it could be reused
    pages = pool.allocate(2)
    ev = tr.d2h(pages, [0, 1])
    pool.release_all(pages)                                # released while the DMA still reads
    with pytest.raises(PageInFlight):
        rt.run(until=ev)


def test_host_tier_keeps_the_guard_until_the_copy_has_landed():
    """The store's contract, observed through the real transfer: a sealed page stays
    referenced (so unallocatable) for exactly the copy's duration."""
    pool = BlockPool(4, 12)
    rt, arena, host, tr = _transfer(DELAY, pool=pool)
    tier = HostTier(rt, 8, tr)
    pages = pool.allocate(3)
    hashes = block_hashes(list(range(12)), 4, salt_hash())
    for p, h in zip(pages, hashes):
        pool.register(p, h)
    rec = tier.save(pages, hashes, PageRefs.guard(pool, pages))
    pool.release_all(pages)                                # the request retires at once
    grabbed = pool.allocate(pool.available_blocks())       # take every page that is free
    assert not set(grabbed) & set(pages)                   # none that a copy still reads
    pool.release_all(grabbed)
    assert not tier.contains(hashes[0])
    rt.run(until=rec.done)
    assert rec.done.value.ok and all(tier.contains(h) for h in hashes)
    assert all(pool.refcount(p) == 0 for p in pages)       # guard released after landing
    for h, p in zip(hashes, pages):
        assert torch.equal(host.slot(tier._slot_of[h]), arena.page(p))


def test_peer_read_copies_between_host_arenas_in_one_process():
    rt, arena, host, tr = _transfer()
    other = PinnedHostArena.like(arena, 4, pin=False)
    other.data.normal_(generator=torch.Generator().manual_seed(3))
    tr.peers["p0"] = other
    rt.run(until=tr.peer_read("p0", [0, 1, 3], [5, 6, 2]))
    for s, d in zip([0, 1, 3], [5, 6, 2]):
        assert torch.equal(host.slot(d), other.slot(s))
    assert tr.counters["peer"].pages == 3
    with pytest.raises(AccountingError):
        tr.peer_read("nobody", [0], [0])
    with pytest.raises(AccountingError):
        tr.d2h([1, 2], [0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="stream ordering needs a CUDA GPU")
def test_d2h_is_ordered_after_the_producing_step_on_the_gpu():
    """A page written by slow work on the compute stream is saved with the NEW bytes even
    though the copy is submitted before that work has finished."""
    rt = SimRuntime(0)
    arena = KVArena.allocate(num_pages=8, num_layers=4, block_size=16, num_kv_heads=8,
                             head_dim=128, dtype=torch.bfloat16, device="cuda")
    host = PinnedHostArena.like(arena, 4)
    tr = CudaTransfer(rt, arena, host)
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):                                    # keep the compute stream busy
        x = x @ x / 64
    arena.data[3].fill_(7.0)                               # the "producing step"
    ev = tr.d2h([3], [1])
    rt.run(until=ev)
    assert torch.all(host.slot(1) == 7.0)
    assert tr.records[0].gpu_s is not None and tr.records[0].gpu_s > 0
    host.slot(2).fill_(5.0)
    rt.run(until=tr.h2d([2], [4]))
    assert torch.all(arena.page(4) == 5.0)
