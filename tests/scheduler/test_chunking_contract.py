"""Chunked prefill contract tests (spec §5.5, §9.2) with max_prefill_tokens = 32."""

from __future__ import annotations

from sched_helpers import make_engine, only_terminal, prompt, sink
from openinfer.runtime import SimRuntime
from openinfer.scheduler import EventKind, GenerateRequest
from openinfer.scheduler.chunking import take_prefill_chunks
from openinfer.scheduler.records import PendingRequest

B = 32


def rec(rt: SimRuntime, rid: int, n: int, pos: int = 0, echo: bool = False) -> PendingRequest:
    p = PendingRequest(rid, GenerateRequest(prompt(n, 1000 * rid), 4, echo=echo), sink(rt, rid), 0.0, hashes=[])
    p.prefill_pos = pos
    return p


def taken(chunks: list[PendingRequest]) -> list[tuple[int, int]]:
    return [(p.id, p.step_chunk) for p in chunks]


# -- prefill_chunking_caps_step_tokens_and_keeps_fifo_progress -----------------------------
def test_prefill_chunking_caps_step_tokens_and_keeps_fifo_progress_direct() -> None:
    rt = SimRuntime()
    # head gets the whole budget, followers wait
    assert taken(take_prefill_chunks([rec(rt, 1, 80), rec(rt, 2, 16)], B)) == [(1, 32)]
    # packing 16 + 16
    assert taken(take_prefill_chunks([rec(rt, 1, 16), rec(rt, 2, 16), rec(rt, 3, 16)], B)) == [(1, 16), (2, 16)]
    # a partially prefilled head takes only its remainder; the next one gets the rest
    assert taken(take_prefill_chunks([rec(rt, 1, 80, pos=64), rec(rt, 2, 40)], B)) == [(1, 16), (2, 16)]
    # taken requests come back in id order
    assert taken(take_prefill_chunks([rec(rt, 5, 8), rec(rt, 2, 8)], B)) == [(2, 8), (5, 8)]


def test_prefill_chunking_caps_step_tokens_and_keeps_fifo_progress_engine() -> None:
    rig = make_engine(max_prefill_tokens=B, prefix_cache=False)
    hs = [rig.submit(prompt(n, 1000 * (i + 1)), 2) for i, n in enumerate([80, 40, 16, 24])]
    rig.run()
    assert all(only_terminal(h).kind is EventKind.FINISHED for h in hs)
    assert max(rig.step_prefill_tokens) <= B
    # FIFO progress: a request's prefill finishes (Scheduled order, first Token order)
    # in arrival order, and every step but a request's last chunk is budget-full.
    first_token_time = [next(e.time for e in h.events if e.kind is EventKind.TOKEN) for h in hs]
    assert first_token_time == sorted(first_token_time)
    assert rig.chunks[hs[0].req_id][0] == 32          # the head takes the whole first budget
    assert [sum(rig.chunks[h.req_id]) for h in hs] == [80, 40, 16, 24]
    # total 160 prompt tokens at 32 per step -> exactly 5 steps carry prefill
    assert sum(1 for t in rig.step_prefill_tokens if t) == 5
    assert rig.at_rest()


# -- request_local_chunks_are_independent_of_earlier_requests ------------------------------
def test_request_local_chunks_are_32_32_16_for_80_tokens() -> None:
    rt = SimRuntime()
    a, b = rec(rt, 1, 20), rec(rt, 2, 80)
    assert taken(take_prefill_chunks([a, b], B, request_local=True)) == [(1, 20)]  # 32 > 12 left: skip

    def chunks_of_b(local: bool) -> list[int]:
        rig = make_engine(max_prefill_tokens=B, prefix_cache=False, request_local_chunks=local)
        h0 = rig.submit(prompt(20, 1), 2)
        h = rig.submit(prompt(80, 500), 2)
        rig.run()
        assert only_terminal(h0).kind is EventKind.FINISHED
        assert only_terminal(h).kind is EventKind.FINISHED
        assert max(rig.step_prefill_tokens) <= B
        return rig.chunks[h.req_id]

    assert chunks_of_b(True) == [32, 32, 16]
    shared = chunks_of_b(False)
    assert shared == [12, 32, 32, 4] and shared != [32, 32, 16]

    # alone in the queue, request-local chunks are the same
    rig = make_engine(max_prefill_tokens=B, prefix_cache=False, request_local_chunks=True)
    h = rig.submit(prompt(80, 500), 1)
    rig.run()
    assert rig.chunks[h.req_id] == [32, 32, 16]


# -- echo_requests_run_only_when_their_prompt_fits_the_prefill_bound -----------------------
def test_echo_runs_only_when_it_fits_direct() -> None:
    rt = SimRuntime()
    # an echo that does not fit the remaining budget is skipped; later requests use it
    q = [rec(rt, 1, 20), rec(rt, 2, 20, echo=True), rec(rt, 3, 10)]
    assert taken(take_prefill_chunks(q, B)) == [(1, 20), (3, 10)]
    # an echo is taken whole when it fits, never split
    assert taken(take_prefill_chunks([rec(rt, 2, 20, echo=True), rec(rt, 3, 40)], B)) == [(2, 20), (3, 12)]


def test_echo_is_never_split_engine() -> None:
    rig = make_engine(max_prefill_tokens=B)
    a = rig.submit(prompt(20, 1), 2)
    e = rig.submit(prompt(30, 500), 1, echo=True)
    c = rig.submit(prompt(10, 900), 2)
    rig.run()
    for h in (a, e, c):
        assert only_terminal(h).kind is EventKind.FINISHED
    assert rig.chunks[e.req_id] == [30]
    assert rig.chunks[c.req_id] == [10]
    ks = [ev.kind for ev in e.events]
    assert ks == [EventKind.SCHEDULED, EventKind.PROMPT_TOKENS, EventKind.TOKEN, EventKind.FINISHED]
    # c overtook the echo in the first step; the echo ran whole in a later one
    assert (rig.chunks[a.req_id], rig.step_prefill_tokens[0]) == ([20], 30)
    assert rig.at_rest()
