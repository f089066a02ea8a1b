"""Spec examples for the block pool and RequestKv (spec §2)."""

from __future__ import annotations

import re

import pytest

from openinfer.errors import AccountingError, ConfigError
from openinfer.kv import HostTier, Ports, StoreConfig
from openinfer.kv.hashing import BASE_SALT, block_hashes, salt_hash
from openinfer.kv.pool import BlockPool, PageRefs
from openinfer.kv.prefix import KvPrefix
from openinfer.kv.probe import commit_loaded_blocks, probe_prefix, reserve_loaded_blocks
from openinfer.kv.request_kv import PrefillOverrun, RequestKv, ceil_div
from openinfer.runtime import SimRuntime
from openinfer.variants import variant

BS = 16


def toks(n, family=0):
    return [1 + family * 10_000 + i for i in range(n)]


def run_prefill(pool, tokens, max_tokens=1, salt=BASE_SALT, match=False):
    kv = RequestKv(pool, tokens, max_tokens, salt)
    if match:
        kv.match_and_add_prefix()
    assert kv.schedule_prefill(len(tokens) - kv.prefill_position)
    kv.apply_prefill(next_token=0)
    return kv


# -- construction ---------------------------------------------------------------------

def test_construction_reserves_one_padding_page():
    pool = BlockPool(BS, 10)
    assert pool.total_blocks() == 10
    assert pool.available_blocks() == 9 == pool.max_request_blocks()
    assert pool.refcount(pool.padding_page) == 1
    assert pool.block_hash(pool.padding_page) == BASE_SALT
    pool.check()


@pytest.mark.parametrize("bs", [0, 3, 12, 2048, -16, 16.0])
def test_block_size_must_be_a_power_of_two_at_most_1024(bs):
    with pytest.raises(ConfigError) as exc:
        BlockPool(bs, 8)
    assert exc.value.field == "block_size"
    assert "block_size" in str(exc.value)


@pytest.mark.parametrize("n", [1, 0, -3, 2.0])
def test_num_blocks_must_be_at_least_two(n):
    with pytest.raises(ConfigError) as exc:
        BlockPool(BS, n)
    assert exc.value.field == "num_blocks"
    assert "num_blocks" in str(exc.value)


def test_smallest_legal_pool():
    pool = BlockPool(1024, 2)
    assert pool.available_blocks() == 1


@pytest.mark.parametrize("kwargs,field", [
    (dict(requery_interval_s=0), "store.requery_interval_s"),
    (dict(resolve_deadline_s=-1.0), "store.resolve_deadline_s"),
    (dict(flush_deadline_s=0), "store.flush_deadline_s"),
])
def test_store_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as exc:
        StoreConfig(**kwargs)
    assert exc.value.field == field and field in str(exc.value)
    with pytest.raises(ConfigError, match=field):
        variant("pr829").store_config(**kwargs)


def test_tier_and_port_config_errors_name_the_field():
    rt = SimRuntime()
    with pytest.raises(ConfigError, match="host_tier.capacity_pages"):
        HostTier(rt, -1, None)
    with pytest.raises(ConfigError, match="host_tier.lease_ttl_s"):
        HostTier(rt, 4, None, lease_ttl_s=0)
    with pytest.raises(ConfigError, match="port"):
        Ports().install("dma", object())


def test_pr829_store_turns_off_every_store_fix_the_pr_lacked():
    cfg = variant("pr829").store_config()
    assert (cfg.flush_deadline_s, cfg.chain_flushes, cfg.release_late_leases,
            cfg.truncate_holds, cfg.track_loads, cfg.probe_respects_floor,
            cfg.commit_dedupes) == (None, False, False, False, False, False, False)
    assert cfg.observe_cancel  # G9 is a later bug, not one of the PR's
    d = StoreConfig()
    assert d == variant("fixed").store_config()
    assert (d.flush_deadline_s, d.chain_flushes, d.release_late_leases, d.truncate_holds,
            d.track_loads, d.probe_respects_floor, d.commit_dedupes,
            d.observe_cancel) == (5.0, True, True, True, True, True, True, True)
    assert d.resolve_deadline_s == 15.0 and d.requery_interval_s == 0.005


# -- allocation and the padding page ----------------------------------------------------

def test_allocation_is_all_or_nothing_and_never_hands_out_padding():
    pool = BlockPool(BS, 6)
    assert pool.allocate(6) is None
    assert pool.available_blocks() == 5
    pages = pool.allocate(5)
    assert pages is not None and len(set(pages)) == 5
    assert pool.padding_page not in pages
    assert pool.allocate(1) is None
    pool.release_all(pages)
    assert pool.available_blocks() == 5
    with pytest.raises(AccountingError):
        pool.allocate(-1)
    pool.check()


def test_padding_page_is_never_freed():
    pool = BlockPool(BS, 4)
    with pytest.raises(AccountingError, match="padding"):
        pool.release(pool.padding_page)
    assert pool.refcount(pool.padding_page) == 1
    assert pool.evict_inactive() == 0
    assert pool.refcount(pool.padding_page) == 1


# -- prefix matching --------------------------------------------------------------------

def test_prompt_48_fully_cached_matches_2_blocks_and_49_matches_3():
    pool = BlockPool(BS, 32)
    producer = run_prefill(pool, toks(48))
    assert producer.registered == 3
    producer.release()

    kv48 = RequestKv(pool, toks(48), 4, BASE_SALT)
    assert kv48.match_and_add_prefix() == 32  # >= 1 prompt token is always forwarded
    assert kv48.prefix_matched_blocks == 2
    assert kv48.kv_position == kv48.prefill_position == 32

    kv49 = RequestKv(pool, toks(48) + [7], 4, BASE_SALT)
    assert kv49.match_and_add_prefix() == 48
    assert kv49.prefix_matched_blocks == 3
    kv48.release()
    kv49.release()
    pool.check()


def test_match_is_a_contiguous_prefix_only():
    pool = BlockPool(BS, 32)
    kv = run_prefill(pool, toks(64))
    hashes = block_hashes(toks(64), BS)
    pages = [p for p, _ in kv.registered_blocks()]
    kv.release()
    pool.mark_reset_on_release([])  # no-op
    # Take block 1 out of the radix: a later match must stop before it (no holes).
    victim = pages[1]
    pool.acquire(victim)
    pool.mark_reset_on_release([victim])
    pool.release(victim)
    assert not pool.contains(hashes[1])
    matched = pool.match(hashes)
    assert matched == [pages[0]]
    pool.release_all(matched)
    assert pool.prefix_length(hashes) == 1


def test_salt_isolates_prefixes():
    pool = BlockPool(BS, 32)
    run_prefill(pool, toks(40), salt=salt_hash("a")).release()
    other = RequestKv(pool, toks(40), 2, salt_hash("b"))
    assert other.match_and_add_prefix() == 0
    same = RequestKv(pool, toks(40), 2, salt_hash("a"))
    assert same.match_and_add_prefix() == 32
    plain = probe_prefix(pool, block_hashes(toks(40), BS), 40)
    assert plain.gpu_hit == 0
    other.release(), same.release(), plain.release()


def test_match_only_on_a_fresh_request():
    pool = BlockPool(BS, 16)
    kv = run_prefill(pool, toks(20), max_tokens=3)
    with pytest.raises(AccountingError):
        kv.match_and_add_prefix()
    kv.release()


# -- lifetime and page indices ------------------------------------------------------------

@pytest.mark.parametrize("p,m,life", [(16, 17, 3), (1, 16, 2), (17, 16, 3), (33, 100, 9), (16, 2, 2),
                                      (1, 1, 1), (15, 1, 1), (16, 1, 1), (17, 1, 2)])
def test_lifetime_blocks(p, m, life):
    """ceil((p + m) / bs), except that a max_tokens = 1 request never decodes and only ever
    draws its prompt's pages (the module's documented formula, shared with admission)."""
    kv = RequestKv(BlockPool(BS, 4), toks(p), m, BASE_SALT)
    assert kv.lifetime_blocks == life
    assert kv.resident_blocks == 0 and kv.remaining_blocks == life


def _peak_draw(p, m, chunk):
    pool = BlockPool(BS, 16)
    kv = RequestKv(pool, toks(p), m, BASE_SALT)
    peak = 0
    while not kv.prefill_done:
        n = min(chunk, p - kv.prefill_position)
        assert kv.schedule_prefill(n)
        peak = max(peak, kv.resident_blocks)
        kv.apply_prefill(next_token=1)
    generated = 1
    while generated < m:
        assert kv.schedule_decode()
        peak = max(peak, kv.resident_blocks)
        kv.apply_decode(2)
        generated += 1
    life = kv.lifetime_blocks
    kv.release()
    assert pool.available_blocks() == 15
    return peak, life


def test_lifetime_blocks_never_under_reserve_the_peak_draw():
    for p in range(1, 65):
        for m in range(1, 65):
            chunk = 1 + (p * 7 + m) % 23  # vary chunk boundaries too
            peak, life = _peak_draw(p, m, chunk)
            assert life >= peak, (p, m, chunk, peak, life)


@pytest.mark.parametrize("p,m", [(16, 17), (1, 16), (17, 16), (33, 100)])
def test_lifetime_blocks_equal_the_peak_draw_at_issue_boundaries(p, m):
    for chunk in (1, 5, 16, 1000):
        peak, life = _peak_draw(p, m, chunk)
        assert peak == life


def test_step_page_indices_exact_at_block_boundaries():
    pool = BlockPool(BS, 16)
    kv = RequestKv(pool, toks(15), 40, BASE_SALT)
    assert kv.schedule_prefill(15)
    assert len(kv.step_page_indices(15)) == 1
    kv.apply_prefill(next_token=9)
    saw_eager = False
    for _ in range(39):
        assert kv.schedule_decode()
        rows = kv.step_page_indices(1)
        assert len(rows) == ceil_div(kv.kv_position + 1, BS)
        assert rows == kv.pages[:len(rows)]
        assert len(kv.pages) in (len(rows), len(rows) + 1)  # at most the eager generation page
        saw_eager |= len(kv.pages) == len(rows) + 1
        kv.apply_decode(3)
        assert kv.registered == kv.kv_position // BS
    assert saw_eager
    kv.release()


def test_prefill_overrun_and_decode_protocol_errors():
    pool = BlockPool(BS, 16)
    kv = RequestKv(pool, toks(20), 4, BASE_SALT)
    with pytest.raises(PrefillOverrun):
        kv.schedule_prefill(21)
    with pytest.raises(PrefillOverrun):
        kv.schedule_prefill(0)
    with pytest.raises(AccountingError):
        kv.schedule_decode()  # no dangling token yet
    assert kv.schedule_prefill(20)
    with pytest.raises(AccountingError):
        kv.apply_prefill()  # final chunk needs its first token
    kv.revert_schedule()
    assert kv.resident_blocks == 0 and pool.available_blocks() == 15
    with pytest.raises(AccountingError):
        RequestKv(pool, toks(4), 0, BASE_SALT)
    kv.release()


def test_revert_returns_the_drawn_pages():
    pool = BlockPool(BS, 16)
    kv = RequestKv(pool, toks(16), 10, BASE_SALT)
    kv.schedule_prefill(16)
    kv.apply_prefill(next_token=5)
    before = (list(kv.pages), pool.available_blocks())
    assert kv.schedule_decode()  # draws the eager generation page
    assert len(kv.pages) == 2
    kv.revert_schedule()
    assert (list(kv.pages), pool.available_blocks()) == before
    kv.release()


# -- pools: LRU, duplicates, reset-on-release -----------------------------------------

def test_inactive_pool_is_evicted_least_recently_used_first():
    pool = BlockPool(BS, 5)  # 4 usable
    a = run_prefill(pool, toks(16, 1))  # 1 page each (prompt = exactly one block)
    b = run_prefill(pool, toks(16, 2))
    c = run_prefill(pool, toks(16, 3))
    ha, hb, hc = (kv.hashes[0] for kv in (a, b, c))
    a.release()
    b.release()
    c.release()
    assert pool.inactive_blocks() == 3 and pool.reset_blocks() == 1
    # touch A: it becomes the most recently used
    pool.release_all(pool.match([ha]))
    got = pool.allocate(2)  # one from reset, then the LRU inactive block: B
    assert got is not None
    assert not pool.contains(hb)
    assert pool.contains(ha) and pool.contains(hc)
    got += pool.allocate(1)  # next LRU: C
    assert not pool.contains(hc) and pool.contains(ha)
    assert pool.counters.evictions == 2
    pool.release_all(got)
    pool.check()


def test_duplicate_registration_stays_private_and_goes_to_reset():
    pool = BlockPool(BS, 16)
    first = run_prefill(pool, toks(32))
    second = run_prefill(pool, toks(32))  # computed independently, no match
    assert first.hashes == second.hashes
    primary = first.pages[:2]
    dup = second.pages[:2]
    assert set(primary).isdisjoint(dup)
    matched = pool.match(first.hashes)
    assert matched == primary  # the primary is the canonical, matchable one
    pool.release_all(matched)
    reset_before = pool.reset_blocks()
    assert len(second.pages) == 2
    second.release()
    # the duplicates go to reset, not inactive
    assert pool.reset_blocks() == reset_before + len(dup)
    assert all(pool.block_hash(p) is None for p in dup)
    assert pool.contains(first.hashes[0]) and pool.contains(first.hashes[1])
    first.release()
    assert pool.inactive_blocks() == 2
    pool.check()


def test_register_rejects_double_registration_and_unheld_pages():
    pool = BlockPool(BS, 8)
    page = pool.allocate(1)[0]
    assert pool.register(page, b"x" * 16) is True
    with pytest.raises(AccountingError):
        pool.register(page, b"y" * 16)
    free = next(p for p in range(8) if pool.is_free(p))
    with pytest.raises(AccountingError):
        pool.register(free, b"z" * 16)
    pool.release(page)


def test_reset_on_release_sends_the_final_drop_to_reset():
    pool = BlockPool(BS, 16)
    kv = run_prefill(pool, toks(48), max_tokens=1)
    other = RequestKv(pool, toks(48), 1, BASE_SALT)
    assert other.match_and_add_prefix() == 32  # a second sharer
    kv.mark_reset_on_release()
    kv.release()
    # still referenced by the sharer: active, matchable
    assert pool.contains(kv.hashes[0]) and pool.inactive_blocks() == 0
    other.release()
    assert pool.inactive_blocks() == 0
    assert not any(pool.contains(h) for h in kv.hashes)
    assert pool.available_blocks() == 15
    pool.check()


def test_evict_inactive_drains_only_inactive_pages():
    pool = BlockPool(BS, 16)
    a = run_prefill(pool, toks(32, 1))
    b = run_prefill(pool, toks(32, 2))
    a.release()
    held = pool.match(b.hashes)
    b.release()
    assert pool.evict_inactive() == 2
    assert not pool.contains(a.hashes[0])
    assert all(pool.contains(h) for h in b.hashes)
    assert [pool.block_hash(p) for p in held] == b.hashes
    pool.release_all(held)
    pool.check()


# -- misuse -------------------------------------------------------------------------------

def test_double_release_raises_accounting_error():
    pool = BlockPool(BS, 8)
    page = pool.allocate(1)[0]
    pool.release(page)
    with pytest.raises(AccountingError, match="double release"):
        pool.release(page)

    refs = PageRefs(pool, pool.allocate(2))
    refs.release()
    with pytest.raises(AccountingError):
        refs.release()

    kv = RequestKv(pool, toks(3), 1, BASE_SALT)
    kv.release()
    with pytest.raises(AccountingError):
        kv.release()

    prefix = KvPrefix.none()
    prefix.release()
    with pytest.raises(AccountingError):
        prefix.release()
    assert pool.available_blocks() == 7
    pool.check()


def test_acquire_of_a_free_page_raises():
    pool = BlockPool(BS, 8)
    free = next(p for p in range(8) if pool.is_free(p))
    with pytest.raises(AccountingError):
        pool.acquire(free)


def test_commit_without_a_live_reservation_raises():
    pool = BlockPool(BS, 16)
    hashes = block_hashes(toks(65), BS)
    probe = probe_prefix(pool, hashes, 65)
    r = reserve_loaded_blocks(pool, 2)
    commit_loaded_blocks(probe, r)
    assert r.state == "committed"
    assert [pool.block_hash(p) for p in probe.held.pages] == hashes[:2]
    with pytest.raises(AccountingError, match="committed"):
        commit_loaded_blocks(probe, r)
    with pytest.raises(AccountingError):
        r.release()

    r2 = reserve_loaded_blocks(pool, 1)
    r2.release()
    with pytest.raises(AccountingError, match="released"):
        commit_loaded_blocks(probe, r2)
    with pytest.raises(AccountingError):
        r2.release()

    other_pool = BlockPool(BS, 4)
    with pytest.raises(AccountingError, match="different pools"):
        commit_loaded_blocks(probe, reserve_loaded_blocks(other_pool, 1))
    with pytest.raises(AccountingError):
        commit_loaded_blocks(probe, reserve_loaded_blocks(pool, 5))  # past the prompt's blocks
    with pytest.raises(AccountingError):
        reserve_loaded_blocks(pool, 0)
    probe.release()


# Regression (found by this test): PageRefs.guard kept the references it had already taken
# when a later page could not be acquired.
def test_failed_guard_takes_no_references():
    pool = BlockPool(BS, 4)
    page = pool.allocate(1)[0]
    free = next(p for p in range(4) if pool.is_free(p))
    with pytest.raises(AccountingError):
        PageRefs.guard(pool, [page, free])
    assert pool.refcount(page) == 1


# -- probes --------------------------------------------------------------------------------

def test_probe_pins_gpu_hits_and_may_hold_one_past_the_cap_when_aligned():
    pool = BlockPool(BS, 16)
    run_prefill(pool, toks(64)).release()
    hashes = block_hashes(toks(64), BS)
    probe = probe_prefix(pool, hashes, 64)
    assert (probe.gpu_hit, probe.cacheable, probe.held_blocks) == (4, 3, 4)
    assert probe.cpu_query_hashes() == []
    assert pool.available_blocks() == 15 - 4
    pool.evict_inactive()
    assert all(pool.contains(h) for h in hashes)  # the hold survives eviction
    probe.truncate_held(3)
    assert probe.held_blocks == 3 and pool.inactive_blocks() == 1
    probe.include_final_block()
    assert probe.cacheable == 4
    probe.release()
    assert pool.available_blocks() == 15


def test_cpu_query_hashes_cover_gpu_hit_to_cap():
    pool = BlockPool(BS, 16)
    run_prefill(pool, toks(32)).release()
    hashes = block_hashes(toks(90), BS)
    probe = probe_prefix(pool, hashes, 90)
    assert probe.gpu_hit == 2 and probe.cacheable == 5
    assert probe.cpu_query_hashes() == hashes[2:5]
    probe.release()


# -- entitlement (spec §2.7) -------------------------------------------------------------

def test_reserve_declines_into_the_entitled_floor():
    pool = BlockPool(BS, 8, entitlement=True)  # 7 available
    kv = RequestKv(pool, toks(16), 80, BASE_SALT)  # lifetime 6
    assert kv.try_admit()
    assert pool.entitled == 6
    assert reserve_loaded_blocks(pool, 2) is None
    r = reserve_loaded_blocks(pool, 1)
    assert r is not None
    # ...and the admitted request can still draw its whole lifetime
    kv.schedule_prefill(16)
    kv.apply_prefill(next_token=1)
    for _ in range(79):
        assert kv.schedule_decode()
        kv.apply_decode(1)
    assert kv.resident_blocks == 6 and pool.entitled == 0
    kv.release()
    r.release()
    assert pool.entitled == 0


def test_reserve_ignores_entitlement_when_the_floor_is_off():
    pool = BlockPool(BS, 8)
    kv = RequestKv(pool, toks(16), 80, BASE_SALT)
    assert kv.try_admit()
    assert reserve_loaded_blocks(pool, 7) is not None  # the skeleton's reserve: no floor


def test_try_admit_fails_without_side_effect_and_is_idempotent():
    pool = BlockPool(BS, 8, entitlement=True)
    a = RequestKv(pool, toks(16), 64, BASE_SALT)  # lifetime 5
    b = RequestKv(pool, toks(16, 1), 64, BASE_SALT)
    assert a.try_admit() and pool.entitled == 5
    assert a.try_admit() and pool.entitled == 5  # idempotent
    assert not b.try_admit()
    assert pool.entitled == 5 and not b.admitted
    b.release()  # unadmitted release does not move the counter
    assert pool.entitled == 5
    a.release()  # refunds the undrawn remainder
    assert pool.entitled == 0


def test_try_admit_credits_prefix_held_blocks():
    pool = BlockPool(BS, 9, entitlement=True)  # 8 available
    run_prefill(pool, toks(65)).release()  # 4 registered blocks now inactive
    hashes = block_hashes(toks(65), BS)
    probe = probe_prefix(pool, hashes, 65)  # the hold pins the 4 blocks
    assert pool.available_blocks() == 4
    assert pool.entitled == 0  # probes never touch the counter
    kv = RequestKv(pool, toks(65), 63, BASE_SALT)  # lifetime 8
    assert not kv.try_admit(credited=0)
    assert kv.try_admit(credited=4)  # exact capacity with the credit
    assert kv.match_and_add_prefix() == 64
    probe.release()
    assert pool.entitled == 4 == pool.available_blocks()
    kv.schedule_prefill(1)
    kv.apply_prefill(next_token=3)
    for _ in range(62):
        assert kv.schedule_decode()
        kv.apply_decode(3)
    assert pool.entitled == 0 and kv.resident_blocks == 8
    kv.release()
    pool.check()


def test_entitlement_tracks_the_remainder_through_the_lifecycle():
    pool = BlockPool(BS, 16, entitlement=True)
    kv = RequestKv(pool, toks(20), 30, BASE_SALT)  # lifetime ceil(50/16) = 4
    kv.try_admit()
    assert pool.entitled == 4
    kv.schedule_prefill(10)
    assert pool.entitled == 3
    kv.revert_schedule()  # reverts grow it back
    assert pool.entitled == 4
    kv.schedule_prefill(20)
    assert pool.entitled == 2
    kv.apply_prefill(next_token=1)
    assert pool.entitled == 4 - kv.resident_blocks
    kv.release()
    assert pool.entitled == 0


def _pool_with_history() -> tuple[BlockPool, list[int]]:
    """Pages in every place: active registered, inactive (released primaries), reset."""
    pool = BlockPool(BS, 12)
    pages = pool.allocate(6)
    assert pages is not None
    for i, page in enumerate(pages):
        pool.register(page, bytes([i + 1]) * 16)
    pool.release_all(pages[:3])  # inactive, still matchable
    pool.check()
    return pool, pages


@pytest.mark.parametrize("corrupt, message", [
    (lambda pool, pages: pool._reset.append(pool._reset[0]), "in the reset pool twice"),
    (lambda pool, pages: pool._reset.append(pages[0]), "both reset and inactive"),
    (lambda pool, pages: pool._refs.__setitem__(pages[4], -1), "reset + inactive + active != total"),
    (lambda pool, pages: (pool._refs.__setitem__(pages[1], 1), pool._refs.__setitem__(pages[4], 0)),
     "free page {p1} has refcount 1"),
    (lambda pool, pages: pool._primary.__setitem__(bytes([2]) * 16, pages[4]),
     "inactive page {p1} is not a registered primary"),
    (lambda pool, pages: pool._hash.__setitem__(pages[5], bytes([9]) * 16), "radix entry for page {p5} is stale"),
])
def test_full_check_names_the_first_broken_page(corrupt, message):
    """The periodic full check tests in bulk, then names the culprit as a page walk would."""
    pool, pages = _pool_with_history()
    corrupt(pool, pages)
    with pytest.raises(AccountingError, match=re.escape(message.format(p1=pages[1], p5=pages[5]))):
        pool.check()
