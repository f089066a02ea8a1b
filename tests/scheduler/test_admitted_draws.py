"""Hazard H1 (spec §7, §8 #17): a resolve's host-hit reservation must not take pages that an
admitted request will still draw, or that request's page-crossing decode fails."""

from __future__ import annotations

from sched_helpers import kinds, make_engine, only_terminal, prompt, run_until, wait
from openinfer.kv import RequestKv, SaveClass, SaveCursor, salt_hash
from openinfer.scheduler import EventKind


def seed_host_tier(rig, tokens: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Put the full blocks of ``tokens`` into the host tier and nowhere else."""
    kv = RequestKv(rig.pool, tokens, 1, salt_hash())
    assert kv.schedule_prefill(len(tokens))
    kv.apply_prefill(next_token=0)
    rig.store.seal(0, kv, SaveCursor(), SaveClass.CACHEABLE)
    kv.release()
    rig.rt.run_process(wait(rig.store.flush_saves(0)))
    rig.pool.evict_inactive()


def run_h1_scenario(variant: str):  # type: ignore[no-untyped-def]
    rig = make_engine(num_blocks=11, tier=True, variant=variant)   # U = 10
    b_prompt = prompt(129, 5000)                      # 8 full blocks + 1 token
    seed_host_tier(rig, b_prompt)
    assert rig.host.resident_blocks() == 8 and rig.pool.available_blocks() == 10  # type: ignore[union-attr]
    a = rig.submit(prompt(16, 1), 64)                 # lifetime 5: 3 more pages still to draw
    run_until(rig, lambda: len(a.tokens()) >= 2)
    b = rig.submit(b_prompt, 1)                        # its resolve finds a host hit of 8 pages
    rig.run()
    return rig, a, b


def test_resolve_reservation_never_starves_an_admitted_draw() -> None:
    """Variant fixed (pool entitlement floor on): the restore waits or degrades, A finishes."""
    rig, a, b = run_h1_scenario("fixed")
    ta = only_terminal(a)
    assert ta.kind is EventKind.FINISHED and len(a.tokens()) == 64, (kinds(a)[-1], ta.message)
    assert only_terminal(b).kind is EventKind.FINISHED
    assert rig.at_rest()


def test_h1_canary_without_the_floor_the_admitted_request_errors() -> None:
    """Same scenario with H1 planted: the reservation takes A's next page, A's decode fails."""
    rig, a, b = run_h1_scenario("fixed+H1")
    ta = only_terminal(a)
    assert ta.kind is EventKind.ERROR and "KV allocation failed" in (ta.message or "")
    assert len(a.tokens()) < 64
    assert only_terminal(b).kind is EventKind.FINISHED
    assert rig.at_rest()


def test_admitted_draws_succeed_without_concurrent_reservations() -> None:
    """Control for the test above: the same workload with no host hit runs clean."""
    rig = make_engine(num_blocks=11, tier=True)
    a = rig.submit(prompt(16, 1), 64)
    run_until(rig, lambda: len(a.tokens()) >= 2)
    b = rig.submit(prompt(129, 5000), 1)               # lifetime 9 > what is left: waits for a
    rig.run()
    assert only_terminal(a).kind is EventKind.FINISHED and len(a.tokens()) == 64
    assert only_terminal(b).kind is EventKind.FINISHED
    assert rig.pool.counters.allocation_failures == 0
    assert rig.at_rest()
