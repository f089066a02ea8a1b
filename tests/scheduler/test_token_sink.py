"""A sink's compact token run is invisible to its readers: whatever mix of token and
other events is sent, with or without waiters and reads in between, ``events`` is the
stream in the order sent and ``stream()``/``tokens()`` agree with it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from openinfer.runtime.sim import SimRuntime
from openinfer.scheduler.request import EventKind, FinishReason, RequestEvent, TokenSink

OPS = st.lists(st.sampled_from(["token", "scheduled", "prompt", "waiter", "read", "stream"]), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, finish=st.booleans())
def test_events_are_the_stream_in_sent_order(ops: list[str], finish: bool) -> None:
    rt = SimRuntime(seed=0)
    sink = TokenSink(7, rt)
    sent: list[tuple[EventKind, float, int | None]] = []
    for i, op in enumerate(ops):
        t = float(i)
        if op == "token":
            assert sink.send_token(t, 100 + i)
            sent.append((EventKind.TOKEN, t, 100 + i))
        elif op in ("scheduled", "prompt"):
            kind = EventKind.SCHEDULED if op == "scheduled" else EventKind.PROMPT_TOKENS
            assert sink.send(RequestEvent(kind, 7, t))
            sent.append((kind, t, None))
        elif op == "waiter":
            sink.next_event()
        elif op == "read":
            assert [(e.kind, e.time, e.token) for e in sink.events] == sent
        else:
            others, times = sink.stream()
            assert [(e.kind, e.time) for e in others] == [(k, t) for k, t, _ in sent if k is not EventKind.TOKEN]
            assert list(times) == [t for k, t, _ in sent if k is EventKind.TOKEN]
    if finish:
        sink.send(RequestEvent(EventKind.FINISHED, 7, 99.0, reason=FinishReason.LENGTH))
        sent.append((EventKind.FINISHED, 99.0, None))
    assert sink.tokens() == [tok for k, _, tok in sent if k is EventKind.TOKEN]
    assert [(e.kind, e.time, e.token) for e in sink.events] == sent
    assert sink.terminal.triggered is finish


def test_closed_sink_refuses_tokens_and_waiters_see_each_token() -> None:
    rt = SimRuntime(seed=0)
    sink = TokenSink(1, rt)
    waiter = sink.next_event()
    assert sink.send_token(0.5, 42)
    assert waiter.triggered and waiter.value.token == 42 and waiter.value.kind is EventKind.TOKEN
    sink.abort_cell.state = type(sink.abort_cell.state).CANCELLED
    assert not sink.send_token(0.6, 43)
    assert sink.tokens() == [42]


@settings(max_examples=100, deadline=None)
@given(ops=OPS)
def test_a_callback_sees_every_event_and_the_kept_stream_is_unchanged(ops: list[str]) -> None:
    """With ``on_event`` set, tokens are still kept as the compact run; the callback gets
    each one as an event, in the order sent, and readers see the same stream as without."""
    rt = SimRuntime(seed=0)
    seen: list[tuple[EventKind, float, int | None]] = []
    sink = TokenSink(7, rt, on_event=lambda e: seen.append((e.kind, e.time, e.token)))
    plain = TokenSink(7, rt)
    for i, op in enumerate(ops):
        for s in (sink, plain):
            if op == "token":
                assert s.send_token(float(i), 100 + i)
            elif op in ("scheduled", "prompt"):
                s.send(RequestEvent(EventKind.SCHEDULED if op == "scheduled" else EventKind.PROMPT_TOKENS, 7, float(i)))
            elif op == "read":
                s.events  # noqa: B018 -- a read in between must not change the stream
    assert [(e.kind, e.time, e.token) for e in sink.events] == seen
    assert [(e.kind, e.time, e.token) for e in plain.events] == seen
    assert sink.tokens() == plain.tokens()
