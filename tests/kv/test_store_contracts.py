"""KvStore contracts on simulated time with a gated HostTier (spec §3, §4, §9.1).

Every tier port (query, load, save, flush) holds its operations at a Gate until the test
releases them, so each scenario decides exactly when storage answers.
"""

from __future__ import annotations

import pytest

from kvworld import BS, Cancel, World, prompt
from openinfer.kv import CacheScope, ResolvePolicy, SaveClass, SaveCursor, StoreConfig, salt_hash
from openinfer.kv.request_kv import RequestKv
from openinfer.kv.stats import DegradeReason
from openinfer.variants import variant

FULL_PAGES = ResolvePolicy(full_pages=True)


def resolved(w: World, proc, *, dt: float = 0.001):
    w.advance(dt)
    assert proc.triggered, "resolve did not finish"
    return proc.value


def _gpu_only(w: World, tokens):
    """Register a prompt's complete blocks in the GPU radix and leave them inactive."""
    kv = w.prefill(tokens)
    kv.release()


# -- (a) cancellation ----------------------------------------------------------------------

def test_cancelled_resolve_skips_io_and_leaves_no_state_behind():
    w = World()
    toks = prompt(65)
    w.seed_host(toks)
    avail = w.pool.available_blocks()

    kp = resolved(w, w.resolve(toks, cancel=Cancel(True)))
    assert (kp.hit_tokens, kp.hold, kp.rank) == (0, None, None)
    assert kp.outcome.degraded is DegradeReason.CANCELLED
    st = w.store.stats
    assert (st.degraded_cancelled, st.resolve_degraded, st.resolve_hits) == (1, 1, 0)
    assert w.host.counters["queries"] == 0 and w.host.counters["loads"] == 0
    assert not w.gates["query"].waiting
    assert w.pool.available_blocks() == avail and w.host.open_leases() == 0

    # The next resolve of the same prompt gets the full 4-block host hit.
    proc = w.resolve(toks)
    w.advance()
    assert not proc.triggered and len(w.gates["query"].waiting) == 1
    w.gates["query"].release_all()
    w.advance()
    assert not proc.triggered and len(w.gates["load"].waiting) == 1
    w.gates["load"].release_all()
    kp2 = resolved(w, proc)
    assert kp2.hit_tokens == 64 and kp2.outcome.loaded_blocks == 4 and kp2.held_blocks == 4
    assert kp2.outcome.degraded is None
    assert w.store.stats.resolve_degraded == 1
    kp2.release()
    assert w.quiescent() == []


def test_cancelled_resolve_drops_even_a_gpu_hit():
    w = World()
    toks = prompt(65)
    _gpu_only(w, toks)
    avail = w.pool.available_blocks()
    kp = resolved(w, w.resolve(toks, cancel=Cancel(True)))
    assert kp.hit_tokens == 0 and kp.hold is None
    assert w.pool.available_blocks() == avail  # nothing pinned
    assert w.quiescent() == []


def test_cancel_during_the_query_releases_lease_and_reservation():
    w = World()
    toks = prompt(65)
    w.seed_host(toks)
    cancel = Cancel()
    proc = w.resolve(toks, cancel=cancel)
    w.advance()
    cancel.cancelled = True  # the client goes away while the query is in flight
    w.gates["query"].release_all()
    kp = resolved(w, proc)
    assert kp.hit_tokens == 0 and kp.hold is None
    assert kp.outcome.degraded is DegradeReason.CANCELLED
    assert w.host.counters["loads"] == 0 and w.host.open_leases() == 0
    assert w.quiescent() == []


# -- (b)/(c) pool pressure -------------------------------------------------------------------

def _pressure_world(config=None):
    w = World(num_blocks=10, config=config)  # 9 usable
    toks = prompt(81)  # 5 full blocks + 1
    w.seed_host(toks)
    assert w.pool.available_blocks() == 9
    squat = w.pool.allocate(5)  # one block short of the 5-block host hit
    assert w.pool.available_blocks() == 4
    w.gates["query"].open_gate()
    w.gates["load"].open_gate()
    return w, toks, squat


def test_pool_pressure_waits_then_completes():
    w, toks, squat = _pressure_world()

    def clear_pressure():
        yield w.rt.sleep(0.015)
        w.pool.release(squat.pop())
    w.rt.spawn(clear_pressure())

    proc = w.resolve(toks)
    w.run_until(0.1)
    kp = proc.value
    assert kp.hit_tokens == 80 and kp.outcome.loaded_blocks == 5
    assert kp.outcome.degraded is None and w.store.stats.resolve_degraded == 0
    assert kp.outcome.queries > 1  # it waited and re-queried
    assert 0.015 <= kp.outcome.finished_at - kp.outcome.started_at < 0.03
    assert w.host.open_leases() == 0  # every declined hit released its lease
    kp.release()
    w.pool.release_all(squat)
    assert w.quiescent() == []


def test_pool_pressure_degrades_at_the_deadline():
    w, toks, squat = _pressure_world(StoreConfig(resolve_deadline_s=0.03))
    proc = w.resolve(toks)
    w.run_until(0.5)
    kp = proc.value
    assert kp.hit_tokens == 0 and kp.hold is None
    assert w.store.stats.resolve_degraded == 1
    assert w.host.counters["loads"] == 0 and w.store.stats.loads_abandoned == 0
    assert kp.outcome.finished_at - kp.outcome.started_at == pytest.approx(0.03, abs=0.006)
    assert w.host.open_leases() == 0
    assert w.pool.available_blocks() == 4
    w.pool.release_all(squat)
    assert w.quiescent() == []


# Regression (found by this test): a pool-pressure timeout was reported as DEADLINE_EXCEEDED,
# because one more query went out after the last requery sleep reached the deadline.
def test_pool_pressure_deadline_is_reported_as_pool_pressure():
    w, toks, squat = _pressure_world(StoreConfig(resolve_deadline_s=0.03))
    proc = w.resolve(toks)
    w.run_until(0.5)
    kp = proc.value
    assert kp.outcome.degraded is DegradeReason.POOL_PRESSURE
    assert w.store.stats.degraded_pool_pressure == 1
    assert w.store.stats.degraded_deadline_exceeded == 0
    assert w.store.stats.late_leases_released == 0  # no query is issued past the deadline


# -- (d) stalled query ---------------------------------------------------------------------------

def _stalled_query_world(config):
    w = World(config=config)
    toks = prompt(65)
    w.seed_host(toks)
    _gpu_only(w, prompt(33))  # the first 2 blocks are also in the GPU radix
    proc = w.resolve(toks)
    w.run_until(0.2)
    return w, proc.value


def test_stalled_query_degrades_at_deadline_to_the_gpu_hit_and_releases_the_late_lease():
    w, kp = _stalled_query_world(StoreConfig(resolve_deadline_s=0.05))
    assert kp.hit_tokens == 32 and kp.outcome.gpu_blocks == 2 and kp.outcome.loaded_blocks == 0
    assert kp.outcome.degraded is DegradeReason.DEADLINE_EXCEEDED
    assert kp.outcome.finished_at - kp.outcome.started_at == pytest.approx(0.05)
    assert w.store.stats.degraded_deadline_exceeded == 1
    assert len(w.gates["query"].waiting) == 1  # the query itself is still in flight

    w.gates["query"].release_all()  # it finally answers: a Hit with a lease nobody reads
    w.advance()
    assert w.host.open_leases() == 0
    assert w.store.stats.late_leases_released == 1 and w.store.stats.late_leases_leaked == 0
    kp.release()
    assert w.quiescent() == []


def test_pr829_leaks_the_late_lease_until_its_ttl():
    w, kp = _stalled_query_world(variant("pr829").store_config(resolve_deadline_s=0.05))
    assert kp.hit_tokens == 32 and kp.outcome.degraded is DegradeReason.DEADLINE_EXCEEDED
    w.gates["query"].release_all()
    w.advance()
    assert w.store.stats.late_leases_leaked == 1 and w.store.stats.late_leases_released == 0
    assert w.host.open_leases() == 1
    kp.release()
    assert any("open_leases" in issue for issue in w.quiescent())
    w.run_until(599.0)
    assert w.host.open_leases() == 1  # pinned in host memory...
    w.run_until(601.0)
    assert w.host.open_leases() == 0  # ...until the 600 s TTL
    assert w.host.counters["leases_expired"] == 1


def test_query_error_degrades_to_the_gpu_hit():
    w = World()
    toks = prompt(65)
    w.seed_host(toks)
    _gpu_only(w, prompt(17))
    proc = w.resolve(toks)
    w.advance()
    w.gates["query"].release_all(error="rpc reset")
    kp = resolved(w, proc)
    assert kp.hit_tokens == 16 and kp.outcome.degraded is DegradeReason.TIER_ERROR
    assert w.store.stats.degraded_tier_error == 1
    kp.release()
    assert w.quiescent() == []


def test_load_error_returns_the_reservation_and_consumes_the_lease():
    w = World()
    toks = prompt(65)
    w.seed_host(toks)
    proc = w.resolve(toks)
    w.gates["query"].open_gate()
    w.advance()
    assert w.pool.available_blocks() == w.pool.max_request_blocks() - 4  # reserved
    w.gates["load"].release_all(error="dma fault")
    kp = resolved(w, proc)
    assert kp.hit_tokens == 0 and kp.outcome.degraded is DegradeReason.TIER_ERROR
    assert w.host.open_leases() == 0 and w.host.counters["loads_failed"] == 1
    assert not any(w.pool.contains(h) for h in w.store.prompt_hashes(0, toks, CacheScope()))
    assert w.quiescent() == []


# -- (e) stalled load ------------------------------------------------------------------------------

def _stalled_load(config):
    w = World(config=config)
    toks = prompt(65)
    w.seed_host(toks)
    w.gates["query"].open_gate()
    proc = w.resolve(toks)
    w.run_until(0.2)
    return w, proc.value


def test_stalled_load_is_abandoned_at_deadline_and_flush_loads_drains_it():
    w, kp = _stalled_load(StoreConfig(resolve_deadline_s=0.05))
    assert kp.hit_tokens == 0 and kp.outcome.loaded_blocks == 0
    assert kp.outcome.degraded is DegradeReason.DEADLINE_EXCEEDED
    assert w.store.stats.loads_abandoned == 1 and w.store.stats.resolve_loaded_blocks == 0
    # the DMA still owns its destination pages
    assert w.pool.available_blocks() == w.pool.max_request_blocks() - 4
    assert "loads in flight" in w.quiescent()

    drain = w.store.flush_loads(0)
    w.advance(1.0)
    assert not drain.triggered  # teardown must wait for the abandoned DMA

    w.gates["load"].release_all()
    w.advance()
    assert drain.triggered and drain.value == 1
    assert w.pool.available_blocks() == w.pool.max_request_blocks()  # reservation returned
    assert w.host.open_leases() == 0 and w.host.loads_in_flight == 0
    assert w.quiescent() == []


def test_pr829_flush_loads_does_not_wait_for_the_abandoned_dma():
    w, kp = _stalled_load(variant("pr829").store_config(resolve_deadline_s=0.05))
    assert w.store.stats.loads_abandoned == 1
    drain = w.store.flush_loads(0)
    w.advance()
    assert drain.triggered and drain.value == 0
    assert w.host.loads_in_flight == 1  # the arena would be freed under a live DMA (H4)
    w.gates["load"].release_all()
    w.advance()
    assert w.pool.available_blocks() == w.pool.max_request_blocks()


# -- (f) seal skips prefix-hit blocks ---------------------------------------------------------------

def test_seal_skips_prefix_hit_blocks():
    w = World()
    first = prompt(49)  # 3 full blocks + 1
    w.seed_host(first)
    assert w.store.stats.saves_submitted == 1

    second = prompt(97)  # extends the same 3 blocks to 6
    assert second[:49] == first
    for g in ("query", "load", "save", "flush"):
        w.gates[g].open_gate()
    kp = resolved(w, w.resolve(second))
    assert kp.hit_tokens == 48 and kp.outcome.loaded_blocks == 3

    kv = RequestKv(w.pool, second, 1, salt_hash())
    assert kv.match_and_add_prefix() == 48
    kp.release()
    assert kv.schedule_prefill(len(second) - 48)
    kv.apply_prefill(next_token=0)
    assert kv.registered == 6

    cursor = SaveCursor()
    assert w.store.seal(0, kv, cursor, SaveClass.CACHEABLE) == 3
    assert w.store.stats.saves_submitted == 2
    assert cursor.records[-1].hashes == kv.hashes[3:6]
    w.advance()
    assert w.transfer.pages_d2h == 6  # 3 + 3: the restored blocks were not saved again
    assert w.store.seal(0, kv, cursor, SaveClass.CACHEABLE) == 0  # nothing new
    w.store.retire(0, kv, cursor, SaveClass.CACHEABLE)
    flush = w.store.flush_saves(0)
    w.advance()
    assert flush.value.ok
    w.pool.evict_inactive()

    kp2 = resolved(w, w.resolve(prompt(113)))
    assert kp2.hit_tokens == 96 and kp2.outcome.loaded_blocks == 6
    kp2.release()
    assert w.quiescent() == []


# -- (g) handoff parking -------------------------------------------------------------------------------

def test_handoff_retire_parks_until_the_save_settles():
    w = World(num_blocks=16)
    kv = w.prefill(prompt(65))  # 5 pages, 4 registered
    assert w.pool.available_blocks() == 10
    cursor = SaveCursor()
    w.store.retire(0, kv, cursor, SaveClass.HANDOFF)
    assert w.store.stats.retires_parked == 1
    assert w.store.pinned_blocks(0) == 4
    w.advance(1.0)
    assert w.pool.available_blocks() == 10  # pages stay out of the pool while pinned
    assert len(w.gates["save"].waiting) == 1

    w.gates["save"].release_all()
    w.advance()
    assert w.pool.available_blocks() == 15
    assert w.store.pinned_blocks(0) == 0
    assert w.store.stats.handoff_failed == 0 and w.store.stats.saves_failed == 0
    assert all(w.host.contains(h) for h in kv.hashes[:4])
    assert w.quiescent() == []


def test_failed_handoff_save_is_counted_and_still_releases():
    w = World(num_blocks=16)
    kv = w.prefill(prompt(65))
    cursor = SaveCursor()
    w.store.retire(0, kv, cursor, SaveClass.HANDOFF)
    w.advance()
    w.gates["save"].release_all(error="d2h failed")
    w.advance()
    assert w.store.stats.handoff_failed == 1 and w.store.stats.saves_failed == 1
    assert w.pool.available_blocks() == 15
    assert not w.host.contains(kv.hashes[0])
    assert w.quiescent() == []


def test_cacheable_retire_releases_at_once_while_guards_pin_the_saved_pages():
    w = World(num_blocks=16)
    kv = w.prefill(prompt(65))
    cursor = SaveCursor()
    w.store.retire(0, kv, cursor, SaveClass.CACHEABLE)
    assert w.store.stats.retires_parked == 0
    w.advance()
    # the tail page went back; the 4 saved pages are guarded, hence not available
    assert w.pool.available_blocks() == 11 and w.store.pinned_blocks(0) == 4
    w.gates["save"].release_all()
    w.advance()
    assert w.pool.available_blocks() == 15 and w.store.pinned_blocks(0) == 0
    assert w.quiescent() == []


# -- (h) the two-act round trip ----------------------------------------------------------------------------

def test_seal_flush_evict_resolve_round_trip():
    w = World()
    toks = prompt(65)
    kv = w.prefill(toks)
    hashes = [h for _, h in kv.registered_blocks()]
    cursor = SaveCursor()
    assert w.store.seal(0, kv, cursor, SaveClass.CACHEABLE) == 4
    kv.release()
    flush = w.store.flush_saves(0)
    w.advance()
    assert not flush.triggered  # the save is still at its gate
    w.gates["save"].release_all()
    w.advance()
    assert not flush.triggered  # the tier's flush is at its gate
    w.gates["flush"].release_all()
    w.advance()
    assert flush.triggered and flush.value.ok and not flush.value.timed_out
    assert all(w.host.contains(h) for h in hashes)

    assert w.pool.evict_inactive() == 4
    assert not any(w.pool.contains(h) for h in hashes)
    proc = w.resolve(toks)
    w.advance()
    w.gates["query"].release_all()
    w.advance()
    w.gates["load"].release_all()
    kp = resolved(w, proc)
    assert kp.hit_tokens == 64 and kp.outcome.loaded_blocks == 4 and kp.outcome.gpu_blocks == 0

    kv2 = RequestKv(w.pool, toks, 8, salt_hash())
    assert kv2.match_and_add_prefix() == 64
    assert kv2.pages == kp.hold.held.pages  # exactly the restored pages
    assert [w.pool.block_hash(p) for p in kv2.pages] == hashes
    kp.release()
    assert kv2.schedule_prefill(1)
    kv2.apply_prefill(next_token=0)
    kv2.release()
    assert w.store.stats.resolve_loaded_blocks == 4
    assert w.quiescent() == []


# -- (i) tier-less rank ---------------------------------------------------------------------------------------

def test_tierless_rank_resolves_the_gpu_radix_only_and_the_hold_survives_eviction():
    w = World(tier=False)
    toks = prompt(65)
    _gpu_only(w, toks)
    _gpu_only(w, prompt(48, family=1))  # unrelated inactive blocks
    kp = resolved(w, w.resolve(toks))
    assert kp.hit_tokens == 64 and kp.outcome.gpu_blocks == 4 and kp.outcome.queries == 0
    assert w.pool.evict_inactive() == 3  # only the unrelated blocks go
    kv = RequestKv(w.pool, toks, 4, salt_hash())
    assert kv.match_and_add_prefix() == 64
    kp.release()
    assert w.store.seal(0, kv, SaveCursor(), SaveClass.CACHEABLE) == 0  # no tier: no-op
    kv.release()
    done = []
    w.store.flush_saves_then(0, done.append)
    assert done and done[0].ok
    assert w.quiescent() == []


# -- (j) full_pages policy ------------------------------------------------------------------------------------------

def test_full_pages_resolves_the_page_aligned_boundary_block():
    w = World()
    toks = prompt(64)  # exactly 4 blocks
    w.seed_host(toks)
    w.gates["query"].open_gate()
    w.gates["load"].open_gate()
    kp = resolved(w, w.resolve(toks))
    assert kp.hit_tokens == 48 and kp.outcome.loaded_blocks == 3
    kp.release()
    w.pool.evict_inactive()
    kp = resolved(w, w.resolve(toks, policy=FULL_PAGES))
    assert kp.hit_tokens == 64 and kp.outcome.loaded_blocks == 4
    kp.release()
    assert w.quiescent() == []


# -- (k) hold truncation ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config,pinned", [(StoreConfig(), 3),
                                           (variant("fixed").store_config(), 3),
                                           (variant("fixed+HC").store_config(), 4),
                                           (variant("pr829").store_config(), 4)],
                         ids=["default", "fixed", "fixed+HC", "pr829"])
def test_hold_pins_exactly_the_credited_blocks(config, pinned):
    w = World(config=config)
    toks = prompt(64)
    _gpu_only(w, toks)  # page-aligned and fully cached
    kp = resolved(w, w.resolve(toks))
    assert kp.hit_tokens == 48
    assert kp.held_blocks == pinned
    assert w.pool.active_blocks() == 1 + pinned  # padding + the hold
    assert w.host.counters["queries"] == 0  # nothing left to ask the tier for
    if config.truncate_holds:
        assert kp.held_blocks == kp.hit_tokens // BS == kp.credit_blocks(BS)
    kp.release()
    assert w.quiescent() == []


# -- (l) runtime toggles ------------------------------------------------------------------------------------------------

def test_resolve_disabled_answers_none_without_touching_anything():
    w = World()
    toks = prompt(65)
    _gpu_only(w, toks)
    w.store.set_resolve_enabled(False)
    kp = resolved(w, w.resolve(toks))
    assert kp.hit_tokens == 0 and kp.hold is None
    assert w.store.stats.resolves == 0 and w.pool.inactive_blocks() == 4
    w.store.set_resolve_enabled(True)
    kp = resolved(w, w.resolve(toks))
    assert kp.hit_tokens == 64 and w.store.stats.resolves == 1
    kp.release()
    assert w.quiescent() == []


@pytest.mark.parametrize("disabled", [False, True])
def test_l1_retention_disabled_restores_from_the_host(disabled):
    w = World()
    toks = prompt(65)
    w.seed_host(toks, evict=False)  # in both the GPU radix (inactive) and the host
    w.gates["query"].open_gate()
    w.gates["load"].open_gate()
    w.store.set_l1_retention_disabled(disabled)
    kp = resolved(w, w.resolve(toks))
    assert kp.hit_tokens == 64
    if disabled:
        assert kp.outcome.gpu_blocks == 0 and kp.outcome.loaded_blocks == 4
    else:
        assert kp.outcome.gpu_blocks == 4 and kp.outcome.loaded_blocks == 0
    kp.release()
    assert w.quiescent() == []


# -- wait_for_full_hit ---------------------------------------------------------------------------------------------------

def test_wait_for_full_hit_degrades_when_cold_then_succeeds_after_the_save():
    w = World(config=StoreConfig(resolve_deadline_s=0.025))
    for g in w.gates.values():
        g.open_gate()
    toks = prompt(65)
    policy = ResolvePolicy(wait_for_full_hit=True)
    kp = resolved(w, w.resolve(toks, policy=policy), dt=0.1)
    assert kp.hit_tokens == 0 and kp.outcome.degraded is DegradeReason.DEADLINE_EXCEEDED
    assert kp.outcome.queries > 1

    w2 = World(config=StoreConfig(resolve_deadline_s=1.0))
    for g in w2.gates.values():
        g.open_gate()
    proc = w2.resolve(toks, policy=policy)
    # the producer saves 40 ms after the consumer started asking
    w2.rt.spawn(_run_later(w2, 0.04, lambda: _seed_now(w2, toks)))
    w2.run_until(0.5)
    kp2 = proc.value
    assert kp2.hit_tokens == 64 and kp2.outcome.degraded is None
    assert kp2.outcome.finished_at >= 0.04
    kp2.release()
    assert w2.quiescent() == []


def _run_later(w, delay, fn):
    yield w.rt.sleep(delay)
    fn()


def _seed_now(w, toks):
    kv = w.prefill(toks)
    cursor = SaveCursor()
    w.store.retire(0, kv, cursor, SaveClass.CACHEABLE)
    w.pool.evict_inactive()


def test_cold_miss_is_not_a_degrade():
    w = World()
    w.gates["query"].open_gate()
    kp = resolved(w, w.resolve(prompt(65, family=3)))
    assert kp.hit_tokens == 0 and kp.outcome.degraded is None
    assert w.store.stats.resolve_degraded == 0 and w.host.counters["misses"] == 1
    assert w.quiescent() == []


# -- hit composition -------------------------------------------------------------------------------

def test_gpu_hit_and_host_hit_combine():
    w = World()
    toks = prompt(65)
    w.seed_host(toks)
    _gpu_only(w, prompt(33))  # blocks 0-1 back in the GPU radix
    w.gates["query"].open_gate()
    w.gates["load"].open_gate()
    kp = resolved(w, w.resolve(toks))
    assert kp.hit_tokens == 64
    assert (kp.outcome.gpu_blocks, kp.outcome.loaded_blocks) == (2, 2)
    assert w.transfer.pages_h2d == 2  # only the blocks the GPU lacked were restored
    kp.release()
    assert w.quiescent() == []


def test_partial_host_hit_is_a_normal_success():
    w = World()
    w.seed_host(prompt(33))  # the host holds only the first 2 of 4 wanted blocks
    w.gates["query"].open_gate()
    w.gates["load"].open_gate()
    kp = resolved(w, w.resolve(prompt(65)))
    assert kp.hit_tokens == 32 and kp.outcome.loaded_blocks == 2
    assert kp.outcome.degraded is None and w.store.stats.resolve_degraded == 0
    kp.release()
    assert w.quiescent() == []


def test_concurrent_restores_of_one_prompt_share_the_primary_blocks():
    w = World()
    toks = prompt(65)
    w.seed_host(toks)
    for g in ("query", "load"):
        w.gates[g].open_gate()
    p1, p2 = w.resolve(toks), w.resolve(toks)
    w.advance()
    k1, k2 = p1.value, p2.value
    assert k1.hit_tokens == k2.hit_tokens == 64
    kv = RequestKv(w.pool, toks, 2, salt_hash())
    assert kv.match_and_add_prefix() == 64
    # the request matches exactly the pages both holds pin: no private duplicates
    assert kv.pages == k1.hold.held.pages == k2.hold.held.pages
    assert w.pool.active_blocks() == 1 + 4
    k1.release()
    k2.release()
    kv.release()
    w.pool.check()
    assert w.quiescent() == []


@pytest.mark.parametrize("respect", [True, False])
def test_resolve_probe_does_not_pin_into_the_entitlement_floor(respect):
    from openinfer.kv import Rank
    from openinfer.kv.pool import BlockPool
    from openinfer.kv import KvStore
    from openinfer.runtime import SimRuntime
    rt = SimRuntime()
    pool = BlockPool(BS, 10, entitlement=True)  # 9 available
    store = KvStore(rt, [Rank(pool)], StoreConfig(probe_respects_floor=respect))
    cached = prompt(65)
    producer = RequestKv(pool, cached, 1, salt_hash())
    producer.schedule_prefill(65)
    producer.apply_prefill(next_token=0)
    producer.release()  # 4 blocks inactive
    admitted = RequestKv(pool, prompt(16, family=1), 128, salt_hash())  # lifetime 9
    assert admitted.try_admit() and pool.entitled == 9 == pool.available_blocks()

    proc = store.resolve_prefix(0, "r", cached, CacheScope(), ResolvePolicy(), Cancel())
    rt.run(until=0.01)
    kp = proc.value
    if not respect:  # the unguarded probe pins 4 pages the admitted request will draw
        assert kp.held_blocks == 4 and pool.available_blocks() < pool.entitled
        return
    assert kp.held_blocks == 0 and kp.hit_tokens == 0
    assert pool.available_blocks() >= pool.entitled
    assert admitted.schedule_prefill(16)
    admitted.apply_prefill(next_token=1)
    for _ in range(127):
        assert admitted.schedule_decode(), "admitted draw failed after a resolve"
        admitted.apply_decode(1)
    admitted.release()
    assert pool.entitled == 0


def test_no_restore_starts_after_the_teardown_barrier():
    """Regression (review, 2026-12-06): flush_loads drained the loads it found but did not
    close the tracker, so a resolve waiting at its query started a DMA afterwards, into an
    arena the caller was about to free. HEAD closes it; ``settle`` waits without closing."""
    from openinfer.backend.transfer import InstantTransfer
    from openinfer.kv import BlockPool, Gate, HostTier, KvStore, Rank
    from openinfer.kv.prefix import NeverCancelled
    from openinfer.runtime import SimRuntime
    rt = SimRuntime(0)
    pool = BlockPool(16, 64, entitlement=True)
    host = HostTier(rt, 100, InstantTransfer(rt))
    store = KvStore(rt, [Rank(pool, host)], StoreConfig())
    prompt = list(range(1, 66))
    kv = RequestKv(pool, prompt, 1, salt_hash())
    kv.schedule_prefill(65)
    kv.apply_prefill(next_token=0)
    store.seal(0, kv, SaveCursor(), SaveClass.CACHEABLE)
    kv.release()
    rt.run(until=store.settle(0))
    assert not store.rank(0).loads_closed              # settle is not a teardown
    pool.evict_inactive()
    query = host.ports.install("query", Gate(rt))
    resolve = store.resolve_prefix(0, "r1", prompt, CacheScope(), ResolvePolicy(), NeverCancelled())
    rt.run(until=0.01)
    barrier = store.flush_loads(0)
    rt.run(until=0.02)
    assert barrier.triggered and barrier.value == 0
    query.release_all()                                # the tier answers the waiting query: a hit
    rt.run(until=resolve)
    assert host.loads_in_flight == 0 and store.stats.resolve_loaded_blocks == 0
    assert resolve.value.outcome.degraded is DegradeReason.CLOSED
    assert host.open_leases() == 0 and store.quiescent(0) == []
    later = store.resolve_prefix(0, "r2", prompt, CacheScope(), ResolvePolicy(), NeverCancelled())
    rt.run(until=later)                                # after it: no query at all
    assert later.value.outcome.degraded is DegradeReason.CLOSED and later.value.outcome.queries == 0
    assert store.stats.degraded_closed == 2 and store.stats.degraded_tier_error == 0
