"""What a peer tier's remote fetch does with the MetaServer's answer (spec §4.4).

The MetaServer is last-writer-wins and nothing withdraws an owner when it evicts a block,
so an answer can name the asker itself or a peer that no longer holds the block. Such a
fetch finds nothing; these tests pin that down and check that each run counts it
(``stale_lookups_self`` / ``stale_lookups_evicted`` in the tier's counters, which a run
writes to its ``report_<variant>.json``): it is a lost hit wherever another peer holds the
block.
"""

from __future__ import annotations

from kvworld import BS, block_hash
from openinfer.backend.transfer import InstantTransfer
from openinfer.kv import MetaServer, PeerDirectory, PeerTier
from openinfer.kv.pool import BlockPool, PageRefs
from openinfer.kv.tier import QueryKind
from openinfer.runtime import SimRuntime


class Peers:
    """Instances sharing one MetaServer and directory, each a peer tier of ``capacity``."""

    def __init__(self) -> None:
        self.rt = SimRuntime(seed=0)
        self.meta, self.directory = MetaServer(self.rt), PeerDirectory()
        self.pool = BlockPool(BS, 8)
        self.resolves = 0

    def tier(self, name: str, capacity: int) -> PeerTier:
        return PeerTier(self.rt, capacity, InstantTransfer(self.rt), name=name, namespace="ns",
                        metaserver=self.meta, directory=self.directory)

    def save(self, tier: PeerTier, block: bytes) -> None:
        pages = self.pool.allocate(1)
        rec = tier.save(pages, [block], PageRefs.guard(self.pool, pages))
        self.settle()
        self.pool.release_all(pages)
        assert rec.done.value.ok and rec.registered_at is not None

    def hits(self, tier: PeerTier, block: bytes) -> int:
        """Query until the answer is no longer Loading, as a resolve re-queries (one
        req_id for the whole resolve: a tier keys its fetch state by it)."""
        self.resolves += 1
        for _ in range(10):
            q = tier.query(f"r{self.resolves}", [block], wait_full=False)
            self.settle()
            answer = q.value
            if answer.kind is not QueryKind.LOADING:
                if answer.lease is not None:
                    tier.release(answer.lease)
                return answer.blocks
        raise AssertionError("still Loading after 10 queries")

    def settle(self) -> None:
        self.rt.run(until=self.rt.now() + 0.01)


def test_a_fetch_pulls_from_the_registered_owner():
    w = Peers()
    owner, reader = w.tier("prefill", 4), w.tier("decode", 4)
    a = block_hash(1)
    w.save(owner, a)
    assert w.hits(reader, a) == 1 and reader.contains(a)
    assert reader.counters["remote_blocks"] == 1
    assert reader.counters["stale_lookups_self"] == reader.counters["stale_lookups_evicted"] == 0


def test_stale_owners_are_misses_and_are_counted():
    """d computes a, p pulls it from d, then d evicts it: the MetaServer still names d. d
    asking again is told "d"; a third instance is sent to d, which no longer holds a,
    while p does. Both are misses; both are counted. (Today's model: the third instance's
    miss is a lost hit, and this test changes once owners are withdrawn.)"""
    w = Peers()
    d, p, q = w.tier("decode", 1), w.tier("prefill", 4), w.tier("other", 4)
    a, b = block_hash(1), block_hash(2)
    w.save(d, a)
    assert w.hits(p, a) == 1
    w.save(d, b)                                     # d's one slot: a is evicted
    assert not d.contains(a) and p.contains(a) and w.meta.is_registered("ns", a)

    assert w.hits(d, a) == 0
    assert d.counters["stale_lookups_self"] == 1 and d.counters["stale_lookups_evicted"] == 0
    assert w.hits(q, a) == 0                         # a lost hit: p holds a
    assert q.counters["stale_lookups_evicted"] == 1 and q.counters["stale_lookups_self"] == 0
    assert d.counters["remote_failures"] == q.counters["remote_failures"] == 0
