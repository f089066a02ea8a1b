"""Races between copies, leases and barriers in the CPU and peer tiers (found in review,
2026-12-05); each test failed on the code before its fix."""

from __future__ import annotations

from simpy.events import Event

from kvworld import BS, World, block_hash, prompt
from openinfer.backend.transfer import InstantTransfer
from openinfer.kv import HostTier, MetaServer, PeerDirectory, PeerTier, SaveClass, SaveCursor
from openinfer.kv.pool import BlockPool, PageRefs
from openinfer.runtime import SimRuntime


def _save(rt: SimRuntime, tier: HostTier, pool: BlockPool, hashes: list[bytes]):
    pages = pool.allocate(len(hashes))
    rec = tier.save(pages, hashes, PageRefs.guard(pool, pages))
    rt.run(until=rt.now() + 0.001)
    pool.release_all(pages)
    return rec


class SlowPeerReads(InstantTransfer):
    """A reader's transfer whose peer reads take ``read_s``; at landing it records which
    block each of the owner's source slots holds then (what a one-sided read gets)."""

    def __init__(self, rt: SimRuntime, directory: PeerDirectory, read_s: float) -> None:
        super().__init__(rt)
        self.directory, self.read_s = directory, read_s
        self.read: list[list[bytes | None]] = []

    def peer_read(self, peer: str, src_slots: list[int], dst_slots: list[int]) -> Event:
        done = self.rt.event()
        owner = self.directory.get(peer)

        def land(_: Event) -> None:
            holder = {slot: h for h, slot in owner._slot_of.items()}
            self.read.append([holder.get(s) for s in src_slots])
            done.succeed()

        self.rt.sleep(self.read_s).callbacks.append(land)
        return done


def test_a_peer_read_that_outlives_the_owners_lock_is_dropped_not_served():
    """The owner cannot see a one-sided read: once its transfer lock runs out it may evict
    the block and land another in that slot. The reader used to make the block visible
    with whatever arrived (here the other block's bytes)."""
    rt = SimRuntime(seed=0)
    ms, directory = MetaServer(rt), PeerDirectory()
    pool = BlockPool(BS, 8)
    owner = PeerTier(rt, 1, InstantTransfer(rt), name="prefill", namespace="ns", metaserver=ms,
                     directory=directory, transfer_lock_ttl_s=1.0)
    reads = SlowPeerReads(rt, directory, read_s=3.0)
    reader = PeerTier(rt, 4, reads, name="decode", namespace="ns", metaserver=ms, directory=directory)
    a, b = block_hash(1), block_hash(2)
    _save(rt, owner, pool, [a])
    rt.run(until=rt.now() + 0.01)
    reader.query("r1", [a], wait_full=True)            # a miss: the fetch from the owner starts
    rt.run(until=rt.now() + 2.0)                        # the lock has run out, the read goes on
    assert _save(rt, owner, pool, [b]).done.value.ok    # evicts a: b lands in its slot
    rt.run(until=rt.now() + 2.0)
    assert reads.read == [[b]]                          # what the read brought over
    assert not reader.contains(a)
    assert reader.counters["remote_failures"] == 1 and len(reader._free_slots) == 4


def test_one_failed_save_fails_its_own_barrier_only():
    """A barrier inherits the saves its predecessor drained, until they land. A save that
    failed was carried on for ever (it never registers), so every later barrier on the
    tier failed and every later prefill Finished was marked degraded."""
    w = World(gated=("save",))
    kv = w.prefill(prompt(17, family=1))
    w.store.retire(0, kv, SaveCursor(), SaveClass.CACHEABLE)
    w.advance()
    first = w.store.flush_saves(0)                      # takes the held save
    w.gates["save"].release_all(error="copy failed")
    w.advance()
    assert not first.value.ok
    w.gates["save"].open_gate()
    later = []
    for family in (2, 3, 4):
        kv = w.prefill(prompt(17, family=family))
        w.store.retire(0, kv, SaveCursor(), SaveClass.CACHEABLE)
        w.advance()
        flush = w.store.flush_saves(0)
        w.advance()
        later.append(flush.value.ok)
    assert later == [True, True, True]


def test_a_save_never_evicts_a_block_it_counts_as_already_saved():
    """A save of [a, b] with a resident skips a, then had to make room for b: a, the least
    recently used, was the victim, yet the save reported both visible. Now a is pinned
    while the save takes its slots, and with no other room the save fails honestly."""
    rt = SimRuntime(seed=0)
    pool = BlockPool(BS, 8)
    tier = HostTier(rt, 1, InstantTransfer(rt))
    a, b = block_hash(1), block_hash(2)
    _save(rt, tier, pool, [a])
    rec = _save(rt, tier, pool, [a, b])
    assert tier.contains(a)
    assert not rec.done.value.ok and "full" in rec.done.value.error


class SlowSaves(InstantTransfer):
    def d2h(self, pages: list[int], slots: list[int]) -> Event:
        return self.rt.sleep(1.0)


def test_another_save_cannot_evict_a_block_a_save_in_flight_counts_as_saved():
    """The blocks a save found resident stay pinned until it lands: another save taking
    slots meanwhile could evict one, and the first would still report it visible."""
    rt = SimRuntime(seed=0)
    pool = BlockPool(BS, 8)
    tier = HostTier(rt, 2, SlowSaves(rt))
    a, b, c = block_hash(1), block_hash(2), block_hash(3)
    rt.run(until=_save(rt, tier, pool, [a]).done)
    first = _save(rt, tier, pool, [a, b])          # a resident; b's copy takes 1 s
    second = _save(rt, tier, pool, [c])            # no free slot: only a could make room
    rt.run(until=first.done)
    assert first.done.value.ok and tier.contains(a) and tier.contains(b)
    rt.run(until=second.done)
    assert not second.done.value.ok


def test_settled_fetch_state_a_resolve_abandoned_is_collected_after_five_minutes():
    """Regression (review, 2026-12-06): stale_fetches existed but nothing called it, so the
    fetch entry of a resolve that gave up at its deadline (and never asks again) stayed for
    the life of the tier. pegaflow's GC runs every 60 s; here the next query runs it."""
    from openinfer.backend.transfer import InstantTransfer
    from openinfer.kv import MetaServer, PeerDirectory, PeerTier
    from openinfer.kv.hashing import block_hashes
    from openinfer.kv import salt_hash
    from openinfer.kv.peer_tier import STALE_FETCH_S
    from openinfer.runtime import SimRuntime
    rt = SimRuntime(0)
    meta = MetaServer(rt)
    tier = PeerTier(rt, 64, InstantTransfer(rt), name="d0", namespace="ns", metaserver=meta,
                    directory=PeerDirectory())
    hashes = block_hashes(list(range(64)), 16, salt_hash())
    rt.run(until=tier.query("abandoned", hashes, False))    # a miss: a fetch starts, then settles
    rt.run(until=1.0)
    assert "abandoned" in tier._fetches                     # nobody asks for it again
    rt.run(until=STALE_FETCH_S + 61.0)
    rt.run(until=tier.query("other", hashes[:1], False))
    assert "abandoned" not in tier._fetches
