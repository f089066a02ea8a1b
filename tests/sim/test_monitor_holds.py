"""held_page_integrity, the monitor's check of queued prefix holds: it looks only at the
requests that joined the queue with a live hold, and still names a broken one in the queue
while leaving alone one that has left it (as the walk of the whole queue every pass did)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from openinfer.backend.fake_executor import FakeExecutor
from openinfer.kv import BlockPool, KvStore, Rank
from openinfer.runtime import SimRuntime
from openinfer.scheduler import Engine, EventKind, GenerateRequest, RequestHandle, SchedulerConfig
from openinfer.scheduler.records import PendingRequest
from openinfer.variants import variant
from sim.monitors import InvariantViolation, Monitor

BS = 16
PREFIX = list(range(1, 49))  # three blocks, which a longer prompt starting with them holds


@dataclass
class Rig:
    rt: SimRuntime
    pool: BlockPool
    engine: Engine
    monitor: Monitor
    seen: list[PendingRequest]  # every request that joined the waiting queue

    def submit(self, prompt: list[int], max_tokens: int) -> RequestHandle:
        return self.engine.submit(GenerateRequest(prompt, max_tokens))

    def queued(self, h: RequestHandle) -> PendingRequest | None:
        return next((p for p in self.engine.deferred if p.id == h.req_id), None)


def _rig(variant_name: str = "fixed", **sched: object) -> Rig:
    """One decode slot, so a request behind a long one waits in the queue with its hold."""
    v = variant(variant_name)
    rt = SimRuntime(seed=0)
    pool = BlockPool(BS, 64, entitlement=v.pool_entitlement)
    store = KvStore(rt, [Rank(pool)], v.store_config())
    ex = FakeExecutor(rt, vocab_size=1000, eos_token=999)
    eng = Engine(rt, store, ex, SchedulerConfig(max_decode_batch=1, switches=v.scheduler_switches(), **sched))
    rig = Rig(rt, pool, eng, Monitor(eng, store, heal_s=0.0), [])
    eng.observers.append(lambda kind, d: rig.seen.extend(d["reqs"]) if kind == "queued" else None)
    return rig


def _warm(rig: Rig) -> None:
    warm = rig.submit(PREFIX, 1)
    rig.rt.run()
    assert warm.events[-1].kind is EventKind.FINISHED


def _break_hold(rig: Rig, p: PendingRequest) -> list[int]:
    """Drop the pins of p's hold behind its back: its pages are free to be evicted."""
    hold = p.kv_prefix.hold
    assert hold is not None and not p.kv_prefix.released and hold.held.pages
    pages = list(hold.held.pages)
    rig.pool.release_all(pages)
    return pages


def test_a_broken_hold_of_a_waiting_request_is_named() -> None:
    rig = _rig()
    _warm(rig)
    rig.submit([500 + i for i in range(20)], 400)          # takes the one slot for a while
    waiter = rig.submit(PREFIX + [900, 901], 2)
    rig.rt.run(until=rig.rt.now() + 0.05)
    p = rig.queued(waiter)
    assert p is not None and p.kv_prefix.hit_tokens == 3 * BS
    pages = _break_hold(rig, p)
    with pytest.raises(InvariantViolation) as err:
        rig.rt.run()
    assert err.value.name == "held_page_integrity"
    assert err.value.detail == f"r{p.id}'s held page {pages[0]} (block 0) was evicted or reused"


def test_a_broken_hold_of_a_request_that_left_the_queue_is_not_a_violation() -> None:
    """H16 leaks a rejected request's hold: once rejected it is in no queue, so its hold
    breaking is not this invariant's business (the whole-queue walk never saw it)."""
    rig = _rig("fixed+H16", max_context_tokens=64)
    _warm(rig)
    too_long = rig.submit(PREFIX + [900, 901], 40)          # 50 + 40 > 64: rejected, hold kept
    rig.rt.run(until=rig.rt.now() + 0.05)
    assert too_long.events[-1].kind is EventKind.REJECTED
    assert not rig.engine.deferred and not rig.engine.prefilling
    leaked = next(p for p in rig.seen if p.id == too_long.req_id)
    assert leaked.kv_prefix.hit_tokens == 3 * BS
    assert too_long.req_id not in rig.monitor._holders     # forgotten, not kept for every pass
    _break_hold(rig, leaked)
    later = rig.submit([700 + i for i in range(40)], 3)     # passes run on; nothing to report
    rig.rt.run()
    assert later.events[-1].kind is EventKind.FINISHED


def test_a_waiter_whose_client_left_gives_its_hold_back_while_the_batch_is_full() -> None:
    """Admission drops a cancelled waiter only as far as it walks the queue, and with no
    free batch slot it walks none of it: the waiter's hold pinned its pages until the long
    request ended. The client's leaving now reaches the engine's next pass."""
    rig = _rig()
    _warm(rig)
    long = rig.submit([500 + i for i in range(20)], 400)   # the one slot, for a while
    waiter = rig.submit(PREFIX + [900, 901], 2)
    rig.rt.run(until=rig.rt.now() + 0.05)
    p = rig.queued(waiter)
    assert p is not None and p.kv_prefix.hit_tokens == 3 * BS and not p.kv_prefix.released
    waiter.cancel()
    rig.rt.run(until=rig.rt.now() + 0.05)
    assert rig.queued(waiter) is None and p.kv_prefix.released
    assert long.terminal_event() is None                    # the batch was full all along
    rig.rt.run()
    assert long.events[-1].kind is EventKind.FINISHED and waiter.terminal_event() is None
