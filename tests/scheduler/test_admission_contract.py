"""Admission contract tests (spec §5.4, §9.2): lifetime pages, budget, slots, rejections.

bs 16, decode cap 64. ``admit()`` is exercised directly on constructed records and the
same rules are checked end to end through the engine.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sched_helpers import BS, make_engine, only_terminal, prompt, sink
from openinfer.kv import BlockPool, RequestKv, SaveCursor, probe_prefix, salt_hash
from openinfer.kv.prefix import KvPrefix
from openinfer.kv.request_kv import ceil_div
from openinfer.runtime import SimRuntime
from openinfer.scheduler import EventKind, FinishReason, GenerateRequest, SchedulerConfig
from openinfer.scheduler.admission import AdmissionResult, RejectReason, admit, future_draws, lifetime_blocks
from openinfer.scheduler.config import SchedulerSwitches
from openinfer.scheduler.records import ActiveRequest, PendingRequest


def pending(rt: SimRuntime, rid: int, n: int, m: int, **kw) -> PendingRequest:  # type: ignore[no-untyped-def]
    return PendingRequest(rid, GenerateRequest(prompt(n, base=1000 * rid), m, **kw), sink(rt, rid), 0.0, hashes=[])


def active_with_page(rt: SimRuntime, pool: BlockPool, rid: int, n: int, m: int, generated: int) -> ActiveRequest:
    """An active record whose prompt pages are really drawn from ``pool``."""
    req = GenerateRequest(prompt(n, base=1000 * rid), m)
    kv = RequestKv(pool, req.prompt, m, salt_hash())
    assert kv.schedule_prefill(n)
    kv.apply_prefill(next_token=7)
    return ActiveRequest(rid, req, sink(rt, rid), kv, SaveCursor(), 7, generated, 0.0)


# -- kv_budget_distinguishes_written_tokens_from_lifetime_blocks ---------------------------
def test_kv_budget_distinguishes_written_tokens_from_lifetime_blocks() -> None:
    # (16, 1): 16 KV tokens written, 1 block for life.
    assert lifetime_blocks(16, 1, BS) == 1
    # (16, 17): at most 16 + 17 - 1 = 32 KV tokens written, but the lifetime is 3 blocks
    # (kvbm provisions a page for the final dangling token).
    assert lifetime_blocks(16, 17, BS) == 3
    assert ceil_div(16 + 17 - 1, BS) == 2

    rig = make_engine(num_blocks=64, prefix_cache=False)
    h1 = rig.submit(prompt(16, 1), 1)
    h2 = rig.submit(prompt(16, 500), 17)
    rig.run()
    assert only_terminal(h1).kind is EventKind.FINISHED
    assert only_terminal(h2).kind is EventKind.FINISHED
    assert rig.kv_written[h1.req_id] == 16 and rig.peaks[h1.req_id] == 1
    assert rig.kv_written[h2.req_id] == 32 and rig.peaks[h2.req_id] == 3

    # Active current tokens = prompt + generated - 1; the future draw is lifetime minus that.
    rt = SimRuntime()
    pool = BlockPool(BS, 20)
    a = active_with_page(rt, pool, 1, 16, 17, generated=1)
    assert future_draws([a], [], BS) == 3 - ceil_div(16 + 1 - 1, BS) == 2
    a.generated = 2  # 17 tokens of KV: second page now counted as written
    assert future_draws([a], [], BS) == 3 - ceil_div(17, BS) == 1
    a.kv.release()


# -- admission_splits_deferred_into_pending_deferred_and_rejected --------------------------
def test_admit_splits_deferred_into_admitted_deferred_and_rejected_direct() -> None:
    rt = SimRuntime()
    pool = BlockPool(BS, 6)                       # 5 usable pages (one is padding)
    a = active_with_page(rt, pool, 9, 16, 17, generated=1)  # holds 1 page, 2 more to come
    assert pool.available_blocks() == 4
    q = [pending(rt, 1, 16, 1), pending(rt, 2, 16, 1), pending(rt, 3, 16, 1),
         pending(rt, 4, 96, 1),                   # lifetime 6 > 5: can never fit
         pending(rt, 5, 8, 1)]
    res = admit(q, [a], [], pool, 0, SchedulerConfig(max_decode_batch=64))
    # budget = 4 available - 2 reserved for the active request's growth = 2
    assert [p.id for p in res.admitted] == [1, 2]
    assert [p.id for p in res.deferred] == [3, 5]
    assert [(p.id, r) for p, r, _ in res.rejected] == [(4, RejectReason.KV_BUDGET)]
    assert "6" in res.rejected[0][2] and "5" in res.rejected[0][2]
    a.kv.release()


def test_admit_is_fcfs_with_skipping() -> None:
    """A large request that does not fit does not block smaller ones behind it."""
    rt = SimRuntime()
    pool = BlockPool(BS, 6)
    a = active_with_page(rt, pool, 9, 16, 17, generated=1)
    q = [pending(rt, 1, 40, 1), pending(rt, 2, 16, 1), pending(rt, 3, 16, 1)]  # 3, 1, 1 pages
    res = admit(q, [a], [], pool, 0, SchedulerConfig(max_decode_batch=64))
    assert [p.id for p in res.admitted] == [2, 3]
    assert [p.id for p in res.deferred] == [1]
    assert not res.rejected
    a.kv.release()


def test_admit_counts_prefilling_future_and_credits_own_hold() -> None:
    rt = SimRuntime()
    pool = BlockPool(BS, 10)                       # 9 usable
    # Put 2 blocks of a prompt in the GPU radix, then pin them with a probe (a resolve hold).
    p_tokens = prompt(40, base=7000)
    kv = RequestKv(pool, p_tokens, 1, salt_hash())
    assert kv.schedule_prefill(40)
    kv.apply_prefill(next_token=1)
    kv.release()                                    # 2 registered blocks -> inactive
    req = GenerateRequest(p_tokens, 40)             # lifetime ceil(80/16) = 5
    held = PendingRequest(1, req, sink(rt, 1), 0.0, hashes=kv.hashes[:2])
    probe = probe_prefix(pool, held.hashes, 40)
    held.kv_prefix = KvPrefix(2 * BS, probe, 0)
    assert pool.available_blocks() == 7             # 9 - 2 pinned by the hold
    # A prefilling request with 1 of its 4 lifetime pages written: 3 still to draw.
    pf = pending(rt, 2, 48, 16)
    pf.prefill_pos = 16
    assert future_draws([], [pf], BS) == 4 - 1
    # budget = 7 - 3 = 4; fresh = 5 - 2 (its own hold's credit) = 3 fits, leaving 1 for `other`.
    other = pending(rt, 3, 16, 1)                    # 1 page
    cfg = SchedulerConfig(max_decode_batch=64)
    res = admit([held, other], [], [pf], pool, 0, cfg)
    assert [p.id for p in res.admitted] == [1, 3]
    # The credit is the request's OWN hold: the same request without it needs 5 > 4.
    uncredited = PendingRequest(4, req, sink(rt, 4), 0.0, hashes=[])
    res2 = admit([uncredited, pending(rt, 5, 16, 1)], [], [pf], pool, 0, cfg)
    assert [p.id for p in res2.deferred] == [4]
    assert [p.id for p in res2.admitted] == [5]
    held.kv_prefix.release()
    assert pool.available_blocks() == 9


def test_admission_splits_via_engine() -> None:
    """End to end: a 5-usable-page pool with a growing active request admits, defers, rejects."""
    rig = make_engine(num_blocks=6, prefix_cache=False)
    a = rig.submit(prompt(16, 1), 17)                # lifetime 3
    rig.run(until=0.001)                             # a is prefilling
    small = [rig.submit(prompt(16, 100 * (i + 1)), 1) for i in range(3)]  # 1 page each
    big = rig.submit(prompt(96, 900), 1)              # lifetime 6 > 5
    admitted_at: dict[int, int] = {}

    def obs(kind, data):  # type: ignore[no-untyped-def]
        if kind == "admission":
            for p in data["result"].admitted:
                admitted_at.setdefault(p.id, rig.eng.ticks)
    rig.eng.observers.append(obs)
    rig.run()
    assert only_terminal(big).kind is EventKind.REJECTED
    assert "pool can never hold" in (only_terminal(big).message or "")
    for h in [a, *small]:
        assert only_terminal(h).kind is EventKind.FINISHED
    # With a's 2 future pages reserved only 2 of the 3 small ones fit alongside it at first.
    first_tick = min(admitted_at[h.req_id] for h in small)
    assert sorted(admitted_at[h.req_id] == first_tick for h in small) == [False, True, True]
    assert rig.at_rest()


# -- requests_exceeding_context_window_are_rejected ----------------------------------------
@pytest.mark.parametrize("n,m,ok", [(16, 16, True), (16, 17, False), (40, 1, False)])
def test_requests_exceeding_context_window_are_rejected(n: int, m: int, ok: bool) -> None:
    rig = make_engine(max_context_tokens=32)
    h = rig.submit(prompt(n, 1), m)
    good = rig.submit(prompt(8, 500), 2)
    rig.run()
    t = only_terminal(h)
    if ok:
        assert t.kind is EventKind.FINISHED and t.reason is FinishReason.LENGTH
        assert len(h.tokens()) == m
    else:
        assert t.kind is EventKind.REJECTED
        assert EventKind.SCHEDULED not in [e.kind for e in h.events]
        assert "max_context_tokens" in (t.message or "")
    assert only_terminal(good).kind is EventKind.FINISHED
    assert rig.at_rest()


def test_context_window_rejection_direct() -> None:
    rt = SimRuntime()
    pool = BlockPool(BS, 50)
    cfg = SchedulerConfig(max_decode_batch=64, max_context_tokens=32)
    res = admit([pending(rt, 1, 16, 16), pending(rt, 2, 16, 17), pending(rt, 3, 40, 1)], [], [], pool, 0, cfg)
    assert [p.id for p in res.admitted] == [1]
    assert [(p.id, r) for p, r, _ in res.rejected] == [(2, RejectReason.CONTEXT_LENGTH),
                                                       (3, RejectReason.CONTEXT_LENGTH)]


# -- admission_respects_decode_batch_capacity ----------------------------------------------
def test_admission_respects_decode_batch_capacity_direct() -> None:
    rt = SimRuntime()
    pool = BlockPool(BS, 400)
    actives = [ActiveRequest(i, GenerateRequest([1] * 4, 8), sink(rt, i), None, SaveCursor(), 1, 1, 0.0)  # type: ignore[arg-type]
               for i in range(64)]
    res = admit([pending(rt, 100, 4, 1)], actives, [], pool, 0, SchedulerConfig(max_decode_batch=64))
    assert [p.id for p in res.deferred] == [100] and not res.admitted and not res.rejected
    res = admit([pending(rt, 100, 4, 1)], actives[:63], [], pool, 0, SchedulerConfig(max_decode_batch=64))
    assert [p.id for p in res.admitted] == [100]


def test_admission_respects_decode_batch_capacity_engine() -> None:
    rig = make_engine(num_blocks=800, prefix_cache=False)
    hs = [rig.submit(prompt(4, 10 * i + 1), 30) for i in range(64)]
    rig.run(until=0.02)
    assert len(rig.eng.active) == 64
    extra = rig.submit(prompt(4, 9000), 2)
    rig.run(until=rig.rt.now() + 0.02)
    assert [p.id for p in rig.eng.deferred] == [extra.req_id]   # deferred, not rejected
    assert extra.events == []
    assert max(n for _, _, _, n in rig.ex.log) == 64            # never more than the cap
    rig.run()
    assert only_terminal(extra).kind is EventKind.FINISHED
    assert all(only_terminal(h).kind is EventKind.FINISHED for h in hs)
    assert max(n for _, _, _, n in rig.ex.log) <= 64
    assert rig.at_rest()


# -- oversized_echo_request_is_rejected_at_admission ---------------------------------------
def test_oversized_echo_request_is_rejected_at_admission() -> None:
    rig = make_engine(max_prefill_tokens=32)
    echo = rig.submit(prompt(33, 1), 1, echo=True)
    plain = rig.submit(prompt(64, 500), 2)
    small_echo = rig.submit(prompt(32, 900), 1, echo=True)
    rig.run()
    t = only_terminal(echo)
    assert t.kind is EventKind.REJECTED and "max_prefill_tokens" in (t.message or "")
    assert only_terminal(plain).kind is EventKind.FINISHED
    assert only_terminal(small_echo).kind is EventKind.FINISHED
    assert EventKind.PROMPT_TOKENS in [e.kind for e in small_echo.events]
    assert rig.at_rest()

    rt = SimRuntime()
    res = admit([pending(rt, 1, 33, 1, echo=True), pending(rt, 2, 64, 1)], [], [], BlockPool(BS, 50), 0,
                SchedulerConfig(max_decode_batch=64, max_prefill_tokens=32))
    assert [(p.id, r) for p, r, _ in res.rejected] == [(1, RejectReason.ECHO_PREFILL_TOKENS)]
    assert [p.id for p in res.admitted] == [2]


# -- page_boundary_lifetime_blocks_gate_admission ------------------------------------------
@pytest.mark.parametrize("num_blocks,admitted", [(3, False), (4, True)])
def test_page_boundary_lifetime_blocks_gate_admission(num_blocks: int, admitted: bool) -> None:
    """(16, 17) needs 3 pages: a 3-page pool (2 usable) rejects it, a 4-page pool runs it."""
    rig = make_engine(num_blocks=num_blocks)
    h = rig.submit(prompt(16, 1), 17)
    rig.run()
    t = only_terminal(h)
    if admitted:
        assert t.kind is EventKind.FINISHED and len(h.tokens()) == 17
        assert rig.peaks[h.req_id] == 3
    else:
        assert t.kind is EventKind.REJECTED
        assert "3" in (t.message or "") and "2" in (t.message or "")
    assert rig.at_rest()


# -- lifetime_blocks_match_kvbm_peak_draw ---------------------------------------------------
@pytest.mark.parametrize("n,m", [(16, 17), (1, 16), (17, 16), (33, 100)])
def test_lifetime_blocks_match_real_peak_draw_at_issue_boundaries(n: int, m: int) -> None:
    rig = make_engine(num_blocks=64)
    h = rig.submit(prompt(n, 1), m)
    rig.run()
    assert only_terminal(h).kind is EventKind.FINISHED
    assert rig.peaks[h.req_id] == lifetime_blocks(n, m, BS)
    # the old prompt + max - 1 arithmetic (#335) is one page short when the final dangling
    # token opens a page ((16,17), (1,16), (17,16)); elsewhere the two agree
    old = ceil_div(n + m - 1, BS)
    assert old == rig.peaks[h.req_id] - (1 if (n + m) % BS == 1 else 0)


def test_lifetime_blocks_never_under_reserve_real_peak_draw() -> None:
    """prompt, max in 1..64 through the engine, one big tier-less pool, all concurrently."""
    rig = make_engine(num_blocks=20000, decode_cap=256)
    hs = {}
    for n in range(1, 65):
        for m in range(1, 65):
            # a unique first token per request: no two requests share a block
            toks = [n * 100 + m] + [7] * (n - 1)
            hs[(n, m)] = rig.submit(toks, m)
    rig.run()
    under = []
    for (n, m), h in hs.items():
        assert only_terminal(h).kind is EventKind.FINISHED, (n, m)
        peak = rig.peaks[h.req_id]
        if peak > lifetime_blocks(n, m, BS):
            under.append((n, m, peak, lifetime_blocks(n, m, BS)))
    assert under == []
    assert rig.at_rest()


def test_rejected_request_drops_its_prefix_hold() -> None:
    """A request rejected at admission (context window) after its resolve pinned a GPU hit
    must release that hold: the pool returns to every usable page (H16)."""
    rig = make_engine(num_blocks=40, max_context_tokens=64)
    warm = rig.submit(prompt(49, 1), 2)               # registers 3 blocks of the prompt
    rig.run()
    assert only_terminal(warm).kind is EventKind.FINISHED
    hits_before = rig.store.stats.resolve_hits
    too_long = rig.submit(prompt(49, 1), 20)          # 49 + 20 > 64: rejected, but resolved first
    rig.run()
    assert rig.store.stats.resolve_hits == hits_before + 1   # it did hold the cached prefix
    t = only_terminal(too_long)
    assert t.kind is EventKind.REJECTED and "max_context_tokens" in (t.message or "")
    assert rig.at_rest()
    again = rig.submit(prompt(49, 1), 2)              # and the prefix is still matchable
    rig.run()
    assert next(e for e in again.events if e.kind is EventKind.SCHEDULED).cached_tokens == 48


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 5000), m=st.integers(1, 5000), gen=st.integers(0, 5000),
       bs=st.sampled_from([1, 2, 16, 64, 128]))
def test_future_draws_of_a_running_row_is_its_lifetime_less_its_written_pages(n: int, m: int, gen: int,
                                                                                bs: int) -> None:
    """future_draws writes the two formulas out for speed: it must stay equal to them."""
    row = SimpleNamespace(req=SimpleNamespace(prompt=[0] * n, max_tokens=m), generated=gen)
    assert future_draws([row, row], [], bs) == 2 * (lifetime_blocks(n, m, bs) - ceil_div(n + gen - 1, bs))


# -- a vetted request is not checked again ---------------------------------------------------
def _queue(rt: SimRuntime, shapes: list[tuple[int, int, int, bool]]) -> list[PendingRequest]:
    """Fresh records of (prompt, max_tokens, hit blocks, echo); a hit is a hold of no real
    pages (only its credit and its release matter to admission)."""
    out = []
    for rid, (n, m, hit, echo) in enumerate(shapes, start=1):
        p = pending(rt, rid, n, m, echo=echo)
        if hit:
            p.kv_prefix = KvPrefix(min(hit * BS, n), None, 0)
        out.append(p)
    return out


def _outcome(res: AdmissionResult, queue: list[PendingRequest]) -> tuple[object, ...]:
    """Everything a pass decides, by request id: the queue it leaves (``requeue`` applied
    to a copy of the queue it was given, its first admission put back in front as the
    engine does with one that lost a race), what it admitted, rejected and shed, and
    which holds it dropped."""
    def ids(ps: list[PendingRequest]) -> list[int]:
        return [p.id for p in ps]
    left = list(queue)
    res.requeue(left, res.admitted[:1])
    return (ids(left), ids(res.admitted), [(p.id, r, msg) for p, r, msg in res.rejected],
            ids(res.shed), ids(res.budget_deferred), [p.kv_prefix.released for p in queue])


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids admission asks its static checks (``_rejection``) about, in order."""
    import openinfer.scheduler.admission as admission
    asked: list[int] = []
    real = admission._rejection

    def counted(p: PendingRequest, *args: Any) -> tuple[RejectReason, str] | None:
        asked.append(p.id)
        return real(p, *args)
    monkeypatch.setattr(admission, "_rejection", counted)
    return asked


@settings(max_examples=300, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 64), st.integers(1, 40), st.integers(0, 4), st.booleans()),
                       max_size=14),
       running=st.integers(0, 4), cap=st.integers(1, 10), num_blocks=st.integers(4, 24),
       shed=st.booleans(), drop=st.booleans(), cut=st.integers(0, 14))
def test_admit_with_a_vetted_head_decides_as_without(shapes: list[tuple[int, int, int, bool]], running: int,
                                                     cap: int, num_blocks: int, shed: bool, drop: bool,
                                                     cut: int) -> None:
    """``vetted`` only saves work: for any head of requests that pass the static checks,
    admission admits, defers, rejects and sheds exactly as when it checks everything."""
    rt = SimRuntime()
    pool = BlockPool(BS, num_blocks)
    row = SimpleNamespace(req=SimpleNamespace(prompt=[0] * 8, max_tokens=40), generated=1)  # 2 pages to come
    rows = [row] * running
    cfg = SchedulerConfig(max_decode_batch=cap, max_context_tokens=96, max_prefill_tokens=48,
                          switches=SchedulerSwitches(shed_holds_on_defer=shed, reject_drops_hold=drop))
    probe = admit(_queue(rt, shapes), rows, [], pool, 0, cfg)
    rejected = {p.id for p, _r, _m in probe.rejected}
    passing_head = next((i for i, _ in enumerate(shapes) if i + 1 in rejected), len(shapes))
    vetted = min(cut, passing_head)
    plain_q, vetted_q = _queue(rt, shapes), _queue(rt, shapes)
    plain = admit(plain_q, rows, [], pool, 0, cfg)
    fast = admit(vetted_q, rows, [], pool, 0, cfg, vetted=vetted)
    assert set(fast.kept) <= set(range(vetted))
    decided = {p.id for p in fast.admitted} | {p.id for p, _r, _m in fast.rejected}
    left = list(vetted_q)
    fast.requeue(left, fast.admitted[:1])  # the queue less what was decided, in its order
    assert [p.id for p in left] == [p.id for p in fast.admitted[:1]] + [p.id for p in vetted_q if p.id not in decided]
    assert [p.id for p in fast.considered] == [p.id for i, p in enumerate(vetted_q) if i not in fast.kept]
    assert _outcome(fast, vetted_q) == _outcome(plain, plain_q)


def test_a_pass_with_no_free_slot_checks_only_the_unvetted_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every batch slot taken, the vetted head stays deferred where it stands (kept,
    not looked at): the static checks run for the arrivals behind it only, and still
    reject those that fail."""
    asked = _count_checks(monkeypatch)
    rt = SimRuntime()
    pool = BlockPool(BS, 400)
    rows = [SimpleNamespace(req=SimpleNamespace(prompt=[0] * 4, max_tokens=8), generated=1)] * 2
    q = [pending(rt, i, 16, 4) for i in range(1, 6)] + [pending(rt, 6, 16, 50_000)]  # 6: too long
    res = admit(q, rows, [], pool, 0, SchedulerConfig(max_decode_batch=2), vetted=4)
    assert asked == [5, 6]
    assert res.kept == range(0, 4)
    assert [p.id for p in res.considered] == [5, 6] and [p.id for p in res.deferred] == [5]
    assert [(p.id, r) for p, r, _ in res.rejected] == [(6, RejectReason.CONTEXT_LENGTH)]
    assert not res.admitted and not res.budget_deferred
    res.requeue(q)
    assert [p.id for p in q] == [1, 2, 3, 4, 5]


def test_requeue_puts_back_front_deferred_kept_and_arrivals_in_queue_order() -> None:
    """A pass that defers one request for pages, admits the next into the last slot, keeps
    the vetted rest and looks at two arrivals: the queue it leaves is the admission put
    back in front (as a lost race is), then every request it did not admit or reject, in
    queue order."""
    rt = SimRuntime()
    pool = BlockPool(BS, 6)                          # 5 usable pages
    row = SimpleNamespace(req=SimpleNamespace(prompt=[0] * 16, max_tokens=17), generated=1)  # 2 to come
    q = [pending(rt, 1, 64, 1),                       # 4 pages > 3 free: deferred for pages
         pending(rt, 2, 16, 1),                       # 1 page: takes the one slot
         pending(rt, 3, 16, 1), pending(rt, 4, 16, 1),  # vetted, no slot: kept
         pending(rt, 5, 16, 1), pending(rt, 6, 16, 50_000)]  # arrivals: deferred, rejected
    res = admit(q, [row], [], pool, 0, SchedulerConfig(max_decode_batch=2), vetted=4)
    assert [p.id for p in res.admitted] == [2] and [p.id for p in res.budget_deferred] == [1]
    assert res.kept == range(2, 4) and [p.id for p in res.deferred] == [1, 5]
    assert [p.id for p in res.considered] == [1, 2, 5, 6]
    res.requeue(q, res.admitted)
    assert [p.id for p in q] == [2, 1, 3, 4, 5]


def test_engine_checks_each_request_once_while_it_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the engine, a request waiting many passes for a slot is checked by
    admission once, on the pass after it arrives; every request still runs."""
    asked = _count_checks(monkeypatch)
    rig = make_engine(num_blocks=400, decode_cap=4, prefix_cache=False)
    hs = [rig.submit(prompt(16, 100 * (i + 1)), 6) for i in range(30)]
    rig.run(until=0.01)
    late = [rig.submit(prompt(16, 9000 + 100 * i), 3) for i in range(5)]
    rig.run()
    assert all(only_terminal(h).kind is EventKind.FINISHED for h in hs + late)
    assert sorted(asked) == sorted(h.req_id for h in hs + late)
    assert rig.at_rest()


def test_waiting_requests_are_rechecked_when_their_adapter_goes() -> None:
    """Requests that passed the adapter check are not asked again while the loaded set
    stays; when it changes under them, every waiting request is checked again."""
    rig = make_engine(num_blocks=400, decode_cap=2, prefix_cache=False)
    assert rig.ex.load_adapter("A") is None
    hs = [rig.submit(prompt(16, 100 * (i + 1)), 20, lora="A") for i in range(8)]
    rig.run(until=0.005)
    waiting = [h for h in hs if not h.events]
    assert waiting and len(rig.eng.deferred) == len(waiting)
    assert rig.ex.unload_adapter("A") is None
    rig.run()
    for h in hs:
        t = only_terminal(h)
        if h in waiting:
            assert t.kind is EventKind.REJECTED and t.message == "LoRA adapter is not loaded: A"
        else:
            assert t.kind is EventKind.FINISHED
    assert rig.at_rest()
