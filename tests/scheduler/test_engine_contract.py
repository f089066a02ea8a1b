"""Engine contract tests (spec §5.1, §5.3, §5.7, §5.8, §9.2): events, resolves, failures,
retirement, stop tokens, bad input, client cancel, load snapshot. bs 16, decode cap 64."""

from __future__ import annotations

import pytest

from sched_helpers import BS, at, kinds, make_engine, only_terminal, prompt, run_until, terminals
from openinfer.kv import Gate, block_hashes
from openinfer.scheduler import EventKind, FinishReason, Role, SamplingParams

EOS = 151645


def assert_serves(rig, base: int = 77000) -> None:  # type: ignore[no-untyped-def]
    """The engine still serves a good request to Finished."""
    h = rig.submit(prompt(20, base), 3)
    rig.run()
    t = only_terminal(h)
    assert t.kind is EventKind.FINISHED and t.reason is FinishReason.LENGTH and len(h.tokens()) == 3


# -- events ----------------------------------------------------------------------------------
def test_event_stream_shape_and_length_finish() -> None:
    rig = make_engine()
    h = rig.submit(prompt(40, 1), 5)
    rig.run()
    assert kinds(h) == [EventKind.SCHEDULED] + [EventKind.TOKEN] * 5 + [EventKind.FINISHED]
    t = only_terminal(h)
    assert t.reason is FinishReason.LENGTH and t.completion_tokens == 5
    assert EOS not in h.tokens()
    assert rig.at_rest()


def test_max_tokens_one_emits_and_finishes_at_prefill() -> None:
    rig = make_engine()
    h = rig.submit(prompt(40, 1), 1)
    rig.run()
    assert kinds(h) == [EventKind.SCHEDULED, EventKind.TOKEN, EventKind.FINISHED]
    assert only_terminal(h).completion_tokens == 1
    assert rig.at_rest()


# -- echo_requests_are_never_resolved_against_the_store ------------------------------------
def test_echo_requests_are_never_resolved_against_the_store() -> None:
    rig = make_engine()
    before = rig.store.stats.resolves
    e = rig.submit(prompt(40, 1), 2, echo=True)
    assert rig.eng.snapshot().resolving == 0
    rig.run()
    assert rig.store.stats.resolves == before
    assert only_terminal(e).kind is EventKind.FINISHED and EventKind.PROMPT_TOKENS in kinds(e)
    sched = next(ev for ev in e.events if ev.kind is EventKind.SCHEDULED)
    assert sched.cached_tokens == 0

    # a plain request is resolved (in flight 1, then back with a 0-token hold: cold radix)
    p = rig.submit(prompt(40, 5000), 2)
    rig.run(until=rig.rt.now() + 1e-9)
    assert rig.store.stats.resolves == before + 1
    rig.run()
    assert only_terminal(p).kind is EventKind.FINISHED
    assert rig.store.stats.resolve_hits == 0

    # the same echo prompt again: still no resolve, and no prefix match (cached 0)
    e2 = rig.submit(prompt(40, 1), 2, echo=True)
    rig.run()
    assert rig.store.stats.resolves == before + 1
    assert next(ev for ev in e2.events if ev.kind is EventKind.SCHEDULED).cached_tokens == 0
    assert rig.at_rest()


def test_plain_request_resolve_is_in_flight_then_settles_with_empty_hold() -> None:
    rig = make_engine()
    p = rig.submit(prompt(40, 5000), 2)
    for _ in range(1000):                        # step event by event to catch the resolve
        if rig.eng.hub.in_flight():
            break
        rig.rt.env.step()
    assert rig.eng.hub.in_flight() == 1
    assert rig.eng.snapshot().waiting == 1
    rig.run()
    assert rig.store.stats.resolves == 1 and rig.store.stats.resolve_hits == 0
    assert next(e for e in p.events if e.kind is EventKind.SCHEDULED).cached_tokens == 0
    assert only_terminal(p).kind is EventKind.FINISHED


# -- unknown_lora_request_is_rejected_without_blocking_base_request -------------------------
def test_unknown_lora_request_is_rejected_without_blocking_base_request() -> None:
    rig = make_engine()
    bad = rig.submit(prompt(40, 1), 4, lora="X")
    base = rig.submit(prompt(40, 1), 4)
    rig.run()
    t = only_terminal(bad)
    assert t.kind is EventKind.REJECTED and t.message == "LoRA adapter is not loaded: X"
    assert EventKind.SCHEDULED not in kinds(bad)
    assert only_terminal(base).kind is EventKind.FINISHED
    assert rig.at_rest()


def test_loaded_lora_request_runs() -> None:
    rig = make_engine()
    assert rig.ex.load_adapter("A") is None
    h = rig.submit(prompt(40, 1), 4, lora="A")
    rig.run()
    assert only_terminal(h).kind is EventKind.FINISHED


# -- decode_error_drops_request_state_and_scheduler_recovers -------------------------------
def test_decode_error_drops_request_state_and_scheduler_recovers() -> None:
    rig = make_engine(num_blocks=40)
    rig.ex.fail_steps = {2}                  # step 1 = prefill, step 2 = first decode
    h = rig.submit(prompt(40, 1), 10)
    rig.run()
    t = only_terminal(h)
    assert t.kind is EventKind.ERROR and t.completion_tokens == 1 and t.message
    assert kinds(h) == [EventKind.SCHEDULED, EventKind.TOKEN, EventKind.ERROR]
    assert rig.eng.active == [] and rig.eng.prefilling == []
    assert rig.pool.available_blocks() == rig.pool.max_request_blocks()
    assert rig.at_rest()
    assert_serves(rig)
    assert rig.at_rest()


def test_prefill_error_fails_its_pending_and_recovers() -> None:
    rig = make_engine(num_blocks=40)
    rig.ex.fail_steps = {1}
    h = rig.submit(prompt(40, 1), 10)
    rig.run()
    assert kinds(h) == [EventKind.ERROR]
    assert rig.at_rest()
    assert_serves(rig)


def test_decode_error_fails_every_active_request() -> None:
    rig = make_engine(num_blocks=80)
    hs = [rig.submit(prompt(20, 1000 * (i + 1)), 10) for i in range(3)]
    rig.ex.fail_steps = {3}
    rig.run()
    assert [only_terminal(h).kind for h in hs] == [EventKind.ERROR] * 3
    assert rig.at_rest()
    assert_serves(rig)


# Regression (bug S1, found by this test): the Rust loop cleared `active` after any failed
# step, so a forced prefill-only step's failure dropped decodes that were not in it.
def test_failed_forced_prefill_step_does_not_lose_active_requests() -> None:
    """An echo+logprobs request forces a Prefill-only plan while another request decodes;
    if that step fails, the decoding request must still reach exactly one terminal event
    (it was not part of the step: it should keep decoding) and the pool must return."""
    rig = make_engine(num_blocks=40)
    a = rig.submit(prompt(39, 1), 20)
    run_until(rig, lambda: len(rig.eng.active) == 1)
    rig.ex.step_failure = lambda plan: "boom" if any(r.all_logits for r in plan.prefill) else None
    b = rig.submit(prompt(20, 500), 3, echo=True, logprobs=True)
    rig.run()
    assert kinds(b) == [EventKind.ERROR]
    assert len(terminals(a)) == 1
    assert rig.at_rest()


# -- retiring_multiple_active_requests_tolerates_unsorted_indices --------------------------
def test_retiring_multiple_requests_finishing_in_the_same_step() -> None:
    rig = make_engine(num_blocks=80)
    maxes = [5, 10, 5, 10, 5]
    hs = [rig.submit(prompt(20, 1000 * (i + 1)), m) for i, m in enumerate(maxes)]
    rig.ex.stop_after[hs[3].req_id] = 4      # a STOP in the same step as three LENGTH finishes
    finish_steps: dict[int, int] = {}
    rig.eng.observers.append(
        lambda k, d: finish_steps.setdefault(d["event"].req_id, rig.eng.steps) if k == "terminal" else None)
    rig.run()
    for h, m in zip(hs, maxes):
        t = only_terminal(h)
        assert t.kind is EventKind.FINISHED
    assert {finish_steps[hs[i].req_id] for i in (0, 2, 4, 3)} == {finish_steps[hs[0].req_id]}
    assert only_terminal(hs[3]).reason is FinishReason.STOP
    assert [len(h.tokens()) for h in hs] == [5, 10, 5, 4, 5]
    assert only_terminal(hs[1]).reason is FinishReason.LENGTH
    assert rig.at_rest()


# -- stop tokens -------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 7])
def test_stop_token_mid_stream_finishes_with_stop_and_eos_not_emitted(k: int) -> None:
    rig = make_engine()
    h = rig.submit(prompt(40, 1), 20)
    rig.ex.stop_after[h.req_id] = k
    rig.run()
    t = only_terminal(h)
    assert t.kind is EventKind.FINISHED and t.reason is FinishReason.STOP
    assert len(h.tokens()) == k and EOS not in h.tokens()
    assert t.completion_tokens == k + 1          # completion = generated + 1 (the EOS row)
    assert rig.at_rest()


def test_stop_token_as_first_token_finishes_at_prefill() -> None:
    rig = make_engine()
    h = rig.submit(prompt(40, 1), 20)
    rig.ex.stop_after[h.req_id] = 0
    rig.run()
    assert kinds(h) == [EventKind.SCHEDULED, EventKind.FINISHED]
    t = only_terminal(h)
    assert t.reason is FinishReason.STOP and t.completion_tokens == 0
    assert rig.at_rest()


def test_ignore_eos_keeps_going_to_length() -> None:
    rig = make_engine()
    h = rig.submit(prompt(40, 1), 10, params=SamplingParams(ignore_eos=True))
    rig.ex.stop_after[h.req_id] = 3
    rig.run()
    t = only_terminal(h)
    assert t.reason is FinishReason.LENGTH and len(h.tokens()) == 10
    assert h.tokens()[3] == EOS                  # the stop token is kept as an ordinary token
    assert rig.at_rest()


# -- bad input --------------------------------------------------------------------------------
BAD = [
    (dict(prompt=[], max_tokens=4), "prompt"),
    (dict(prompt=prompt(8), max_tokens=0), "max_tokens"),
    (dict(prompt=prompt(8), max_tokens=-3), "max_tokens"),
    (dict(prompt=[1, 2, 3, 151936, 5], max_tokens=4), "prompt[3]"),
    (dict(prompt=[1, 2, -1], max_tokens=4), "prompt[2]"),
    (dict(prompt=prompt(8), max_tokens=4, params=SamplingParams(temperature=-1.0)), "temperature"),
    (dict(prompt=prompt(8), max_tokens=4, params=SamplingParams(top_p=0.0)), "top_p"),
    (dict(prompt=prompt(8), max_tokens=4, params=SamplingParams(top_k=-1)), "top_k"),
]


@pytest.mark.parametrize("kw,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_is_rejected_naming_the_field(kw: dict, field: str) -> None:
    rig = make_engine()
    h = rig.submit(kw.pop("prompt"), kw.pop("max_tokens"), **kw)
    rig.run()
    t = only_terminal(h)
    assert kinds(h) == [EventKind.REJECTED]
    assert field in (t.message or ""), t.message
    assert rig.store.stats.resolves == 0
    assert_serves(rig)
    assert rig.at_rest()


# -- client cancel ------------------------------------------------------------------------
def test_client_cancel_mid_decode() -> None:
    rig = make_engine(num_blocks=40)
    a = rig.submit(prompt(40, 1), 50)
    b = rig.submit(prompt(40, 5000), 12)
    run_until(rig, lambda: len(a.tokens()) >= 3)
    a.cancel()
    rig.run()
    assert terminals(a) == []
    assert 3 <= len(a.tokens()) < 50
    tb = only_terminal(b)
    assert tb.kind is EventKind.FINISHED and len(b.tokens()) == 12
    assert rig.eng.active == [] and not rig.eng.has_work()
    assert rig.at_rest()


def test_client_cancel_mid_chunked_prefill() -> None:
    rig = make_engine(num_blocks=40, max_prefill_tokens=32)
    a = rig.submit(prompt(100, 1), 5)
    b = rig.submit(prompt(20, 5000), 3)
    at(rig.rt, 0.0015, a.cancel)                 # after the first 32-token chunk
    rig.run()
    assert terminals(a) == [] and a.tokens() == []
    assert only_terminal(b).kind is EventKind.FINISHED
    assert rig.at_rest()


def test_client_cancel_before_admission() -> None:
    rig = make_engine(num_blocks=8, prefix_cache=False)
    big = rig.submit(prompt(60, 1), 40)           # lifetime 7 = every usable page
    waiting = rig.submit(prompt(20, 5000), 3)
    run_until(rig, lambda: rig.eng.deferred != [])
    waiting.cancel()
    rig.run()
    assert terminals(waiting) == []
    assert only_terminal(big).kind is EventKind.FINISHED
    assert rig.at_rest()


def test_a_request_cancelled_while_it_waits_is_never_prefilled() -> None:
    """It used to stay queued with its prefix hold, be admitted when a slot freed (a slot
    and budget taken from the others) and have a chunk prefilled for nobody."""
    rig = make_engine(num_blocks=64, decode_cap=1)
    prefilled: list[int] = []
    rig.eng.observers.append(lambda kind, d: prefilled.extend(r.req_id for r in d["plan"].prefill)
                             if kind == "step_start" else None)
    shared = prompt(64, 5000)
    rig.submit(shared + [1], 1)                    # registers 4 blocks of the shared prefix
    rig.run(until=0.2)
    long = rig.submit(prompt(20, 100), 200)        # holds the only batch slot
    rig.run(until=0.25)
    waiting = rig.submit(shared + prompt(16, 9000), 8)
    run_until(rig, lambda: any(p.id == waiting.req_id for p in rig.eng.deferred))
    held = next(p for p in rig.eng.deferred if p.id == waiting.req_id).kv_prefix
    assert held.hit_tokens == 64 and not held.released
    waiting.cancel()
    rig.run()
    assert waiting.req_id not in prefilled and terminals(waiting) == [] and held.released
    assert only_terminal(long).kind is EventKind.FINISHED
    assert rig.at_rest()


def test_a_cancelled_waiters_pages_count_for_the_requests_behind_it_in_the_same_pass() -> None:
    """Its hold is dropped inside the admission pass, so a request behind it that fits
    only with those pages is admitted in that pass (the single-charge monitor checks it)."""
    from sim.monitors import Monitor
    rig = make_engine(num_blocks=32, decode_cap=1)
    Monitor(rig.eng, rig.store, 0.0)
    shared = prompt(64, 5000)
    rig.submit(shared + [1], 1)
    rig.run(until=0.2)
    rig.submit(prompt(20, 100), 200)
    rig.run(until=0.25)
    waiting = rig.submit(shared + prompt(16, 9000), 8)
    run_until(rig, lambda: any(p.id == waiting.req_id for p in rig.eng.deferred))
    big = rig.submit(prompt(29 * 16 - 8, 20000), 4)   # fits only once the hold is gone
    rig.run(until=0.3)
    waiting.cancel()
    rig.run()                                          # a violation would raise here
    assert only_terminal(big).kind is EventKind.FINISHED and rig.at_rest()


def test_after_shutdown_new_work_is_answered_at_once() -> None:
    """The loop ends once idle after ``shutdown``: a request or control queued later would
    wait for ever, its handle never done."""
    from openinfer.scheduler import ControlCommand
    rig = make_engine(num_blocks=64, lora_control=True)
    before = rig.submit(prompt(20, 1), 4)
    rig.eng.shutdown()
    rig.run(until=1.0)
    assert only_terminal(before).kind is EventKind.FINISHED and not rig.eng.process.is_alive
    after = rig.submit(prompt(20, 500), 4)
    control = rig.eng.control(ControlCommand("list"))
    rig.run(until=2.0)
    assert only_terminal(after).kind is EventKind.REJECTED and "shut down" in only_terminal(after).message
    assert control.triggered and not control.value.ok and not rig.eng.has_work()


# -- load snapshot --------------------------------------------------------------------------
def test_load_snapshot_counts_in_flight_resolves_as_waiting() -> None:
    rig = make_engine(tier=True)
    gate = rig.host.ports.install("query", Gate(rig.rt))  # type: ignore[union-attr]
    h1 = rig.submit(prompt(40, 1), 3)              # 2 cacheable blocks: asks the host tier
    h2 = rig.submit(prompt(40, 5000), 3)
    run_until(rig, lambda: len(gate.waiting) == 2)
    rig.run(until=rig.rt.now() + 0.05)
    snap = rig.eng.snapshot()
    assert snap.resolving == 2 and snap.waiting == 2 and snap.running == 0
    assert h1.events == [] and h2.events == []
    gate.open_gate()
    rig.run()
    assert only_terminal(h1).kind is EventKind.FINISHED
    assert only_terminal(h2).kind is EventKind.FINISHED
    snap = rig.eng.snapshot()
    assert (snap.waiting, snap.running, snap.resolving) == (0, 0, 0)
    assert rig.at_rest()


# Regression: a settled-but-undrained resolve was invisible to the load snapshot (H13 shape).
def test_load_snapshot_counts_settled_but_undrained_resolves() -> None:
    rig = make_engine(tier=True)
    gate = rig.host.ports.install("query", Gate(rig.rt))  # type: ignore[union-attr]
    h = rig.submit(prompt(40, 1), 3)
    run_until(rig, lambda: len(gate.waiting) == 1)
    assert rig.eng.snapshot().waiting == 1
    gate.release(1)
    while rig.eng.hub.in_flight():               # the resolve settles; the engine is parked
        rig.rt.env.step()
    snap = rig.eng.snapshot()
    accepted_not_done = 0 if terminals(h) else 1
    assert snap.waiting + snap.running == accepted_not_done == 1
    assert rig.eng.has_work()


def test_load_snapshot_counts_deferred_and_running() -> None:
    rig = make_engine(num_blocks=8, prefix_cache=False)
    rig.submit(prompt(60, 1), 40)                  # takes every usable page for life
    rig.submit(prompt(20, 5000), 3)
    run_until(rig, lambda: rig.eng.deferred != [] and rig.eng.active != [])
    snap = rig.eng.snapshot()
    assert (snap.running, snap.waiting, snap.resolving) == (1, 1, 0)
    assert snap.used_blocks == rig.pool.total_blocks() - rig.pool.available_blocks()
    rig.run()
    assert rig.at_rest()


def test_a_stuck_save_marks_degraded_only_the_requests_whose_kv_it_holds() -> None:
    """Regression (review, 2026-12-07): a prefill server's barrier also vouches for the
    saves an earlier barrier drained, until they land. One save that never landed made
    every later barrier on the tier report not-ok, and every later Finished was marked
    ``kv_degraded`` although its own blocks were all registered (spec H9 is per request).
    A request that reuses the stuck blocks as its prefix is still degraded: a peer cannot
    find its whole prompt."""
    rig = make_engine(tier=True, role=Role.PREFILL)
    stuck = prompt(64, base=3)
    first_block = block_hashes(stuck, BS)[0].hex()[:8]
    rig.host.ports.install("save", Gate(rig.rt, selector=lambda what: what == first_block))
    handles = [rig.submit(stuck, 1)]
    later = [(2.0, stuck + prompt(64, base=50_000)),        # the stuck blocks as its prefix
             (10.0, prompt(64, base=10_000)), (20.0, prompt(64, base=20_000))]
    for t, tokens in later:
        at(rig.rt, t, lambda tokens=tokens: handles.append(rig.submit(tokens, 1)))
    rig.run(until=60.0)
    ends = [only_terminal(h) for h in handles]
    assert [e.kind for e in ends] == [EventKind.FINISHED] * 4
    assert [e.kv_degraded for e in ends] == [True, True, False, False]
    assert ends[0].time == pytest.approx(5.0, abs=0.1)         # its barrier's deadline
    assert ends[1].time == pytest.approx(5.0, abs=0.1)         # chained behind it
    assert [e.time - t for e, (t, _) in zip(ends[2:], later[1:])] == pytest.approx([0, 0], abs=0.1)
    assert rig.store.stats.flush_timeouts == 1


def test_a_request_reusing_blocks_whose_save_failed_is_marked_degraded() -> None:
    """Regression (review, 2026-12-08): a request that matched its prefix in the GPU radix
    inherits those blocks' saves from the request that computed them. When that save had
    failed, no barrier covered it any more, and the later request's Finished said KV-ready
    for a prompt a peer cannot find (spec H9). Its own blocks, saved fine, do not make up
    for the prefix."""
    rig = make_engine(tier=True, role=Role.PREFILL)
    failing = prompt(64, base=3)
    first_block = block_hashes(failing, BS)[0].hex()[:8]
    gate = rig.host.ports.install("save", Gate(rig.rt, selector=lambda what: what == first_block))
    handles = [rig.submit(failing, 1)]
    at(rig.rt, 1.0, lambda: gate.release_all(error="copy engine error"))
    later = [(2.0, failing + prompt(64, base=50_000)),      # the failed blocks as its prefix
             (3.0, prompt(64, base=10_000))]
    for t, tokens in later:
        at(rig.rt, t, lambda tokens=tokens: handles.append(rig.submit(tokens, 1)))
    rig.run(until=30.0)
    ends = [only_terminal(h) for h in handles]
    assert [e.kind for e in ends] == [EventKind.FINISHED] * 3
    assert rig.store.stats.saves_failed == 1
    assert [e.kv_degraded for e in ends] == [True, True, False]
    assert [e.time - t for e, (t, _) in zip(ends[1:], later)] == pytest.approx([0, 0], abs=0.1)
