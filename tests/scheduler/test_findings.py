"""The five review findings on PR #829 (spec §6), each as a deterministic scenario.

Every test runs the scenario twice — under the variant that has the finding and under
``fixed`` — and asserts the symptom in the first and its absence in the second, so a test
that cannot tell the two apart fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from openinfer.backend.fake_executor import FakeExecutor
from openinfer.backend.transfer import InstantTransfer
from openinfer.kv import (BlockPool, Gate, HostTier, KvStore, MetaServer, PeerDirectory, PeerTier, Rank,
                          RequestKv, SaveClass, SaveCursor, block_hashes, salt_hash)
from openinfer.runtime import SimRuntime
from openinfer.scheduler import (ControlCommand, ControlOp, Engine, EventKind, GenerateRequest, Role,
                                 SchedulerConfig)
from openinfer.variants import variant

BS = 16


@dataclass
class World:
    rt: SimRuntime
    pool: BlockPool
    tier: HostTier
    store: KvStore
    engine: Engine
    executor: FakeExecutor
    metaserver: MetaServer | None = None


def build(variant_name: str, num_blocks: int, *, host_blocks: int = 4096, role: Role = Role.MIXED,
          peer: bool = False, lora_control: bool = False, **sched: object) -> World:
    v = variant(variant_name)
    rt = SimRuntime(seed=0)
    pool = BlockPool(BS, num_blocks, entitlement=v.pool_entitlement)   # fixed: no H1 either
    meta = None
    if peer:
        meta = MetaServer(rt)
        tier: HostTier = PeerTier(rt, host_blocks, InstantTransfer(rt), name="p0", namespace="qwen3",
                                  metaserver=meta, directory=PeerDirectory())
    else:
        tier = HostTier(rt, host_blocks, InstantTransfer(rt))
    store = KvStore(rt, [Rank(pool, tier)], v.store_config())
    ex = FakeExecutor(rt)
    cfg = SchedulerConfig(role=role, lora_control=lora_control, switches=v.scheduler_switches(), **sched)
    return World(rt, pool, tier, store, Engine(rt, store, ex, cfg), ex, meta)


def seed_host_tier(w: World, prompt: list[int]) -> None:
    """Put the full blocks of ``prompt`` into the host tier and nowhere else."""
    kv = RequestKv(w.pool, prompt, 1, salt_hash())
    assert kv.schedule_prefill(len(prompt))
    kv.apply_prefill(next_token=0)
    w.store.seal(0, kv, SaveCursor(), SaveClass.CACHEABLE)
    kv.release()
    w.rt.run_process(_wait(w.store.flush_saves(0)))
    w.pool.evict_inactive()


def _wait(ev):  # type: ignore[no-untyped-def]
    yield ev


def kinds(handle) -> list[EventKind]:  # type: ignore[no-untyped-def]
    return [e.kind for e in handle.events]


# -- F1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("buggy", ["pr829", "fixed+F1"])
def test_f1_pinned_holds_starve_admission(buggy: str) -> None:
    """U=100; A and B each hold 40 restored pages and need 80 for life: neither fits 20 free."""
    prompts = [[1000 + i for i in range(641)], [5000 + i for i in range(641)]]

    def scenario(name: str) -> tuple[World, list]:
        w = build(name, 101)
        for p in prompts:
            seed_host_tier(w, p[:640])
        assert w.pool.available_blocks() == 100
        handles = [w.engine.submit(GenerateRequest(p, 639)) for p in prompts]
        return w, handles

    w, handles = scenario(buggy)
    w.rt.run(until=w.rt.now() + 5.0)
    assert all(EventKind.SCHEDULED not in kinds(h) for h in handles), "F1: no request may be scheduled"
    snap = w.engine.snapshot()
    assert snap.used_blocks == 81 and snap.waiting == 2  # 80 held pages + the padding page

    w, handles = scenario("fixed")
    t0 = w.rt.now()
    w.rt.run()
    assert all(h.terminal_event() is not None and h.terminal_event().kind is EventKind.FINISHED
               for h in handles)
    first = min(h.events[0].time for h in handles)
    assert first - t0 < 0.05, "the head request is admitted on the first pass after both holds land"
    assert w.pool.available_blocks() == 100
    assert w.store.quiescent(0) == []


# -- F2 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("buggy", ["pr829", "fixed+F2"])
def test_f2_flush_chain_gap_advertises_kv_early(buggy: str) -> None:
    """S (100) and R chunk 1 (924) share a step; S's barrier drains R's first save h1; R's
    own barrier then completes while h1 is still in flight."""
    s_prompt = [7 + i for i in range(100)]
    r_prompt = [20000 + i for i in range(1948)]
    r_first = block_hashes(r_prompt, BS)[0].hex()[:8]

    def scenario(name: str):  # type: ignore[no-untyped-def]
        w = build(name, 400, role=Role.PREFILL, peer=True)
        gate = w.tier.ports.install("save", Gate(w.rt, selector=lambda what: what == r_first))
        seen: dict[str, bool] = {}

        def on_event(ev) -> None:  # type: ignore[no-untyped-def]
            if ev.kind is EventKind.FINISHED:
                seen["r_block0_registered"] = w.metaserver.is_registered("qwen3", block_hashes(r_prompt, BS)[0])
        hs = w.engine.submit(GenerateRequest(s_prompt, 1))
        hr = w.engine.submit(GenerateRequest(r_prompt, 1), on_event=on_event)
        return w, gate, hs, hr, seen

    w, gate, hs, hr, seen = scenario(buggy)
    w.rt.run(until=1.0)
    assert len(gate.waiting) == 1, "h1 (R's first chunk save) is held"
    assert hr.terminal_event() is not None, "F2: R's Finished leaves while h1 is in flight"
    assert seen["r_block0_registered"] is False, "F2: a peer would see a short hit"

    w, gate, hs, hr, seen = scenario("fixed")
    w.rt.run(until=1.0)
    assert len(gate.waiting) == 1
    assert hs.terminal_event() is None and hr.terminal_event() is None, "both barriers wait for h1"
    gate.release_all()
    w.rt.run(until=2.0)
    assert hr.terminal_event().kind is EventKind.FINISHED
    assert seen["r_block0_registered"] is True
    assert w.store.stats.flush_timeouts == 0


# -- F3 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("buggy", ["pr829", "fixed+F3"])
def test_f3_flush_without_timeout_withholds_finished(buggy: str) -> None:
    """The MetaServer black-holes registrations: Finished must still arrive, bounded."""
    def scenario(name: str):  # type: ignore[no-untyped-def]
        w = build(name, 200, role=Role.PREFILL, peer=True)
        w.metaserver.ports.install("registration", Gate(w.rt))  # never released
        first = w.engine.submit(GenerateRequest([3 + i for i in range(64)], 1))
        return w, first

    w, first = scenario(buggy)
    w.rt.run(until=60.0)
    assert first.terminal_event() is None, "F3: Finished is withheld forever"

    w, first = scenario("fixed")
    second_box = []
    w.rt.env.process(_submit_at(w, 1.0, [900 + i for i in range(64)], second_box))
    w.rt.run(until=60.0)
    t1 = first.terminal_event().time
    t2 = second_box[0].terminal_event().time
    assert first.terminal_event().kind is EventKind.FINISHED
    assert 5.0 <= t1 <= 5.1, f"first Finished at the 5 s deadline, got {t1}"
    assert 6.0 <= t2 <= 6.1, f"second Finished one deadline after its own start, got {t2}"
    assert w.store.stats.flush_timeouts == 2


def _submit_at(w: World, t: float, prompt: list[int], box: list):  # type: ignore[no-untyped-def]
    yield w.rt.sleep(t - w.rt.now())
    box.append(w.engine.submit(GenerateRequest(prompt, 1)))


# -- F4 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("buggy", ["pr829", "fixed+F4"])
def test_f4_control_overtakes_resolving_generate(buggy: str) -> None:
    def scenario(name: str):  # type: ignore[no-untyped-def]
        w = build(name, 200, lora_control=True)
        assert w.executor.load_adapter("A") is None
        gate = w.tier.ports.install("query", Gate(w.rt))
        seed_host_tier(w, [11 + i for i in range(64)])  # the query has something to look up
        g = w.engine.submit(GenerateRequest([11 + i for i in range(80)], 4, lora="A"))
        w.rt.run(until=w.rt.now() + 0.001)
        unload = w.engine.control(ControlCommand(ControlOp.UNLOAD, "A"))
        return w, gate, g, unload

    w, gate, g, unload = scenario(buggy)
    w.rt.run(until=w.rt.now() + 0.05)
    assert unload.triggered and unload.value.ok, "F4: Unload applied while G is resolving"
    gate.release_all()
    w.rt.run()
    assert g.terminal_event().kind is EventKind.REJECTED
    assert "LoRA adapter is not loaded: A" in g.terminal_event().message

    w, gate, g, unload = scenario("fixed")
    w.rt.run(until=w.rt.now() + 0.05)
    assert not unload.triggered, "Unload waits for the earlier generate"
    gate.release_all()
    w.rt.run()
    assert g.terminal_event().kind is EventKind.FINISHED
    assert unload.value.ok and unload.value.applied_at >= g.terminal_event().time


# -- F5 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("buggy", ["pr829", "fixed+F5"])
def test_f5_save_pinned_pages_are_charged_twice(buggy: str) -> None:
    """U=9: X's 4 sealed pages are pinned by a stalled save; Y needs 5 of the 5 free."""
    def scenario(name: str):  # type: ignore[no-untyped-def]
        w = build(name, 10)
        gate = w.tier.ports.install("save", Gate(w.rt))
        x = w.engine.submit(GenerateRequest([40 + i for i in range(64)], 1))
        w.rt.run(until=0.5)
        assert x.terminal_event().kind is EventKind.FINISHED
        assert w.store.pinned_blocks(0) == 4 and w.pool.available_blocks() == 5
        y = w.engine.submit(GenerateRequest([400 + i for i in range(65)], 15))
        return w, gate, y

    w, gate, y = scenario(buggy)
    w.rt.run(until=3.0)
    assert EventKind.SCHEDULED not in kinds(y), "F5: Y deferred although 5 pages are free"
    gate.release_all()
    w.rt.run()
    assert y.terminal_event().kind is EventKind.FINISHED

    w, gate, y = scenario("fixed")
    t0 = w.rt.now()
    w.rt.run(until=3.0)
    assert EventKind.SCHEDULED in kinds(y) and y.events[0].time - t0 < 0.05
    x_first = block_hashes([40 + i for i in range(64)], BS)[0].hex()[:8]
    assert gate.waiting[0].what == x_first, "X's save is still in flight when Y is admitted"
    gate.release_all()
    w.rt.run()
    assert y.terminal_event().kind is EventKind.FINISHED
    assert w.store.quiescent(0) == []
