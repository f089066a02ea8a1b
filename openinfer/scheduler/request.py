"""What a user submits and what comes back: requests, sampling parameters, the event
stream of one request, and the sink/handle pair that carries it.

Per request the stream is Scheduled → PromptTokens? → Token* → exactly one of
Finished / Error / Rejected (Rejected comes without Scheduled, as in qwen3). A request
whose client has gone away gets no terminal event: nobody is left to read it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from simpy.events import Event

from openinfer.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0          # 0 = off
    top_p: float = 1.0
    ignore_eos: bool = False
    seed: int | None = None

    def problems(self) -> str | None:
        """The first out-of-range field, as a message naming it."""
        if not (0.0 <= self.temperature <= 100.0):
            return str(ConfigError("temperature", self.temperature, "a number in [0, 100]"))
        if self.top_k < 0:
            return str(ConfigError("top_k", self.top_k, "an int >= 0 (0 = off)"))
        if not (0.0 < self.top_p <= 1.0):
            return str(ConfigError("top_p", self.top_p, "a number in (0, 1]"))
        return None


@dataclass(frozen=True)
class GenerateRequest:
    # token ids: a list of ints, or the compact int32 array a simulated workload sends
    # (4 bytes a token against a list's ~36; see kv.hashing.compact_tokens)
    prompt: Sequence[int]
    max_tokens: int
    params: SamplingParams = SamplingParams()
    lora: str | None = None
    echo: bool = False
    logprobs: bool = False
    cache_salt: str | None = None


class EventKind(Enum):
    SCHEDULED = "scheduled"
    PROMPT_TOKENS = "prompt_tokens"
    TOKEN = "token"
    FINISHED = "finished"
    ERROR = "error"
    REJECTED = "rejected"


TERMINAL = (EventKind.FINISHED, EventKind.ERROR, EventKind.REJECTED)


class FinishReason(Enum):
    LENGTH = "length"
    STOP = "stop"


@dataclass(slots=True)
class RequestEvent:
    """One event of a stream. Slotted: a long simulation makes one per generated token,
    and the stream keeps them until the request ends."""

    kind: EventKind
    req_id: int
    time: float
    token: int | None = None
    reason: FinishReason | None = None
    message: str | None = None
    cached_tokens: int = 0
    completion_tokens: int = 0
    queued_at: float = 0.0
    kv_degraded: bool = False  # prefill role: KV-ready promised without full registration


class AbortState(Enum):
    NONE = "none"
    CANCELLED = "cancelled"
    DISCONNECTED = "disconnected"


_NOT_ABORTED = AbortState.NONE  # read per token: a plain name, not an Enum attribute lookup


class AbortCell:
    """A request's abort state, apart from its sink: an observer that must know, long after
    the request ended, whether its client went away can keep this (a few bytes) instead of
    the sink and its whole event stream."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = AbortState.NONE

    def is_closed(self) -> bool:
        return self.state is not _NOT_ABORTED


class TokenSink:
    """The engine's end of a request's stream; also the resolve's cancel probe.

    A long simulation sends one token per row per step, so tokens no ``next_event``
    waiter is waiting on are kept as a compact run of (time, token) instead of one
    :class:`RequestEvent` each (an ``on_event`` callback still gets its event, which is
    then not kept); ``events`` turns the run into events when someone reads it, and
    ``stream`` hands metrics the token times without building them. The order of the
    stream is exactly as sent either way.
    """

    def __init__(self, req_id: int, rt: Any, on_event: Callable[[RequestEvent], None] | None = None) -> None:
        self.req_id = req_id
        self.rt = rt
        self.abort_cell = AbortCell()
        self._events: list[RequestEvent] = []    # the stream up to the compact run
        self._run_times = array("d")             # the run: tokens sent after _events ...
        self._run_tokens: list[int] = []
        self._after_run: list[RequestEvent] = []  # ... and events sent after the run
        self._loose_tokens = 0                   # Token events inside _events
        self.on_event = on_event
        self.terminal: Event = rt.event()
        self._waiters: list[Event] = []
        # Set while the engine's decode cohort holds tokens of this stream it has not yet
        # delivered: called before the stream is read, watched (next_event) or closed
        # (abort), it delivers them and keeps the request on the per-token path from then on.
        self.pending: Callable[[], None] | None = None
        # The engine's note that a request of its queue may have gone (set at intake): a
        # waiter whose client left gives its prefix hold back at the next pass, not only
        # once a batch slot frees and admission reaches it.
        self.on_abort: Callable[[], None] | None = None

    def _deliver_pending(self) -> None:
        pending = self.pending
        if pending is not None:
            self.pending = None
            pending()

    @property
    def abort(self) -> AbortState:
        return self.abort_cell.state

    @abort.setter
    def abort(self, state: AbortState) -> None:
        if self.pending is not None:
            self._deliver_pending()  # tokens generated before the client left were sent
        self.abort_cell.state = state
        if state is not _NOT_ABORTED and self.on_abort is not None:
            self.on_abort()

    @property
    def events(self) -> list[RequestEvent]:
        """The whole stream as events (the compact run is materialized once, here)."""
        if self.pending is not None:
            self._deliver_pending()
        return self._materialize()

    def _materialize(self) -> list[RequestEvent]:
        if self._run_tokens:
            rid, kind = self.req_id, EventKind.TOKEN
            self._events.extend(RequestEvent(kind, rid, t, tok) for t, tok in zip(self._run_times, self._run_tokens))
            self._loose_tokens += len(self._run_tokens)
            self._run_times, self._run_tokens = array("d"), []
        if self._after_run:
            self._events.extend(self._after_run)
            self._after_run = []
        return self._events

    def stream(self) -> tuple[list[RequestEvent], array]:
        """(every non-token event in order, the times of every token in order)."""
        if self.pending is not None:
            self._deliver_pending()
        if self._loose_tokens:
            events = self.events
            return ([e for e in events if e.kind is not EventKind.TOKEN],
                    array("d", [e.time for e in events if e.kind is EventKind.TOKEN]))
        return self._events + self._after_run, self._run_times

    def tokens(self) -> list[int]:
        if self.pending is not None:
            self._deliver_pending()
        if self._loose_tokens:
            return [e.token for e in self.events if e.kind is EventKind.TOKEN and e.token is not None]
        return list(self._run_tokens)

    def is_closed(self) -> bool:
        return self.abort_cell.state is not _NOT_ABORTED

    is_cancelled = is_closed  # the resolve's CancelProbe asks the same question

    def send_token(self, time: float, token: int) -> bool:
        """Deliver one generated token; False once the client has gone."""
        if self.abort_cell.state is not _NOT_ABORTED:
            return False
        if self._waiters:
            return self.send(RequestEvent(EventKind.TOKEN, self.req_id, time, token))
        if self._after_run:
            self.events  # an event came after the run: close it before a new one starts
        self._run_times.append(time)
        self._run_tokens.append(token)
        if self.on_event is not None:
            self.on_event(RequestEvent(EventKind.TOKEN, self.req_id, time, token))
        return True

    def send_tokens(self, times: bytes, tokens: list[int]) -> None:
        """Deliver tokens generated earlier (the decode cohort's catch-up), exactly as the
        same ``send_token`` calls at their times would have: only for a stream that had no
        waiter, no ``on_event`` and was open then (the cohort sends such streams' tokens
        one by one).

        ``times``: the tokens' times as float64 bytes (native order, the layout of the
        ``array('d')`` that keeps them): the cohort's time buffer is a float64 array, and
        copying its bytes costs a fifth of converting every time to a float and back."""
        if self._after_run:
            self._materialize()
        self._run_times.frombytes(times)
        self._run_tokens.extend(tokens)

    def send(self, event: RequestEvent) -> bool:
        """Deliver an event; False once the client has gone (the engine drops the request)."""
        if self.abort_cell.state is not _NOT_ABORTED:
            return False
        if event.kind is EventKind.TOKEN:
            self.events.append(event)  # after the run, in order
            self._loose_tokens += 1
        elif self._run_tokens:
            self._after_run.append(event)
        else:
            self._events.append(event)
        if self.on_event is not None:
            self.on_event(event)
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                w.succeed(event)
        if event.kind in TERMINAL and not self.terminal.triggered:
            self.terminal.succeed(event)
        return True

    def next_event(self) -> Event:
        if self.pending is not None:
            self._deliver_pending()
        ev = self.rt.event()
        self._waiters.append(ev)
        return ev


@dataclass
class RequestHandle:
    """The client's end: read the stream, cancel the request."""

    req_id: int
    sink: TokenSink
    request: GenerateRequest
    submitted_at: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def events(self) -> list[RequestEvent]:
        return self.sink.events

    @property
    def done(self) -> Event:
        """Fires with the terminal event (never fires if the request was cancelled)."""
        return self.sink.terminal

    def next_event(self) -> Event:
        return self.sink.next_event()

    def cancel(self) -> None:
        self.sink.abort = AbortState.CANCELLED

    def tokens(self) -> list[int]:
        return self.sink.tokens()

    def terminal_event(self) -> RequestEvent | None:
        return next((e for e in self.sink.stream()[0] if e.kind in TERMINAL), None)
