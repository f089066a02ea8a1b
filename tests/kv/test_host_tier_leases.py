"""A restore's source slots stay the lease's blocks for as long as its copy reads them.

The lease's pins are what keep eviction away from the slots an H2D load reads. A TTL that
ran out during the load used to drop them anyway: a save could then evict the leased
block and land a different block in its slot while the copy read it (the restored page
gets another block's KV), or a load stalled at its port past the TTL copied slots that no
longer held its blocks.
"""

from __future__ import annotations

from simpy.events import Event

from openinfer.kv import Gate, HostTier, Ports
from openinfer.kv.hashing import BASE_SALT, block_hashes
from openinfer.kv.pool import BlockPool, PageRefs
from openinfer.runtime import SimRuntime

BS = 16
TTL_S = 1.0


class SlowLoads:
    """H2D copies take ``h2d_s``; at the moment each lands it records which block each
    source slot holds then (what the copy read, if the slot was reused under it)."""

    def __init__(self, rt: SimRuntime, tier_of: list[HostTier], h2d_s: float) -> None:
        self.rt, self.tier_of, self.h2d_s = rt, tier_of, h2d_s
        self.landed: list[list[bytes | None]] = []

    def d2h(self, pages: list[int], slots: list[int]) -> Event:
        return self.rt.done()

    def h2d(self, slots: list[int], pages: list[int]) -> Event:
        done = self.rt.event()

        def land(_: Event) -> None:
            holder = {slot: h for h, slot in self.tier_of[0]._slot_of.items()}
            self.landed.append([holder.get(s) for s in slots])
            done.succeed()

        self.rt.sleep(self.h2d_s).callbacks.append(land)
        return done

    def peer_read(self, peer: str, src_slots: list[int], dst_slots: list[int]) -> Event:
        return self.rt.done()


def _tier(h2d_s: float, rt: SimRuntime | None = None, ports: Ports | None = None
          ) -> tuple[SimRuntime, HostTier, BlockPool, SlowLoads]:
    rt = rt or SimRuntime(seed=0)
    holder: list[HostTier] = []
    transfer = SlowLoads(rt, holder, h2d_s)
    tier = HostTier(rt, 1, transfer, lease_ttl_s=TTL_S, ports=ports)   # one slot: any save evicts
    holder.append(tier)
    return rt, tier, BlockPool(BS, 8), transfer


def _save(rt: SimRuntime, tier: HostTier, pool: BlockPool, family: int) -> bytes:
    (h,) = block_hashes([family * 1000 + i for i in range(BS)], BS, BASE_SALT)
    page = pool.allocate(1)[0]
    rec = tier.save([page], [h], PageRefs.guard(pool, [page]))
    rt.run(until=rt.now() + 0.001)
    assert rec.done.triggered
    pool.release_all([page])
    return h


def test_a_lease_outlives_its_ttl_while_its_copy_reads_the_slots():
    rt, tier, pool, transfer = _tier(h2d_s=3 * TTL_S)
    a = _save(rt, tier, pool, 1)
    lease = tier.local_answer([a], wait_full=True).lease
    load = tier.load(lease, [5])
    rt.run(until=rt.now() + 2 * TTL_S)        # TTL over, copy still reading
    (b,) = block_hashes([2000 + i for i in range(BS)], BS, BASE_SALT)
    page = pool.allocate(1)[0]
    rec = tier.save([page], [b], PageRefs.guard(pool, [page]))   # wants a's only slot
    rt.run(until=load)
    rt.run(until=rt.now() + 0.001)
    assert load.value.ok and transfer.landed == [[a]]   # the copy read a, not b
    assert not rec.done.value.ok and "pinned" in rec.done.value.error
    assert lease.state == "loaded" and tier.open_leases() == 0


def test_a_load_held_at_its_port_past_the_ttl_fails_instead_of_copying_reused_slots():
    rt, ports = SimRuntime(seed=0), Ports()
    gate = ports.install("load", Gate(rt))
    rt, tier, pool, transfer = _tier(0.01, rt, ports)
    a = _save(rt, tier, pool, 1)
    lease = tier.local_answer([a], wait_full=True).lease
    load = tier.load(lease, [5])
    rt.run(until=rt.now() + 2 * TTL_S)        # held at the port until the lease expired
    b = _save(rt, tier, pool, 2)               # evicts a: the slot now holds b
    gate.release_all()
    rt.run(until=load)
    assert not load.value.ok and "expired" in load.value.error
    assert transfer.landed == []               # nothing was copied from b's slot
    assert tier.contains(b) and not tier.contains(a)
