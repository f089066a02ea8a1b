"""The simulated client: submits requests, gives up on some, and knows when it is done.

A workload decides *what* to send and *when*; the client turns each :class:`RequestSpec`
into a ``GenerateRequest`` (honouring the wanted output length either through
``max_tokens`` + ``ignore_eos``, as ``vllm bench serve --ignore-eos`` does, or through an
EOS at that completion index via the executor's ``stop_after``), schedules its abort if
the abort policy picks it, records its metrics when it ends and then lets go of the
handle, so memory stays proportional to requests in flight.

``all_done`` fires once the workload has closed the client and every request it sent has
ended (terminal event, or abort). World runs stop on that event, never on the event queue
draining: stray deadline timers stay in the queue long after the last request.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from simpy.events import Event

from openinfer.errors import require
from openinfer.runtime import Runtime
from openinfer.scheduler.request import GenerateRequest, RequestEvent, RequestHandle, SamplingParams
from sim.metrics import RequestRecord, request_record

Submit = Callable[[GenerateRequest, Callable[[RequestEvent], None] | None], RequestHandle]
OUTPUT_MODES = ("max_tokens", "eos")


def check_output_mode(mode: str, field: str = "client.output_mode") -> None:
    """The client's rule, callable before a client exists so a config is checked when made."""
    require(mode in OUTPUT_MODES, field, mode, f"one of {', '.join(OUTPUT_MODES)}")


ABORT_DELAYS = ("fixed", "exponential", "uniform")


@dataclass(frozen=True)
class AbortSpec:
    """Each request is abandoned with ``probability``, some seconds after its submit:
    exactly ``after_s`` (fixed), exponential with mean ``after_s``, or uniform in
    [0, 2·after_s]. A request that ended before its abort time is left alone."""

    probability: float = 0.0
    after_s: float = 1.0
    delay: str = "exponential"

    def __post_init__(self) -> None:
        require(isinstance(self.probability, (int, float)) and 0.0 <= self.probability <= 1.0,
                "abort.probability", self.probability, "a number in [0, 1]")
        require(isinstance(self.after_s, (int, float)) and self.after_s >= 0, "abort.after_s", self.after_s,
                "a number >= 0 (seconds)")
        require(self.delay in ABORT_DELAYS, "abort.delay", self.delay, f"one of {', '.join(ABORT_DELAYS)}")

    def draw_delay(self, rng: random.Random) -> float:
        if self.delay == "fixed" or self.after_s == 0:
            return float(self.after_s)
        if self.delay == "exponential":
            return rng.expovariate(1.0 / self.after_s)
        return rng.uniform(0.0, 2.0 * self.after_s)


@dataclass(slots=True)
class RequestSpec:
    prompt: Sequence[int]  # compact_tokens (sim.tokens), but a trace's explicit prompts are lists
    output_len: int
    session: int | None = None
    turn: int = 0


@dataclass(slots=True)
class Outcome:
    record: RequestRecord
    tokens: list[int] | None  # the answer, when the sender asked to keep it


class Ticket:
    """One sent request: ``done`` fires with its :class:`Outcome`."""

    __slots__ = ("spec", "handle", "done", "keep_tokens", "aborted")

    def __init__(self, spec: RequestSpec, handle: RequestHandle, done: Event, keep_tokens: bool) -> None:
        self.spec = spec
        self.handle: RequestHandle | None = handle
        self.done = done
        self.keep_tokens = keep_tokens
        self.aborted = False


class Client:
    def __init__(self, rt: Runtime, submit: Submit, *, output_mode: str = "max_tokens",
                 stop_after: dict[int, int] | None = None, max_tokens_cap: int = 4096,
                 abort: AbortSpec | None = None) -> None:
        check_output_mode(output_mode)
        require(output_mode != "eos" or stop_after is not None, "client.output_mode", output_mode,
                "max_tokens, unless the executor's stop_after table is given (EOS mode)")
        self.rt = rt
        self._submit = submit
        self.output_mode = output_mode
        self.stop_after = stop_after
        self.max_tokens_cap = max_tokens_cap
        self.abort = abort or AbortSpec()
        self._abort_rng = rt.rng("client/abort")
        self.records: list[RequestRecord] = []
        self.itl = array("d")
        self.sent = 0
        self.outstanding = 0
        self.closed = False
        self.all_done: Event = rt.event()
        self.last_end_s = 0.0
        self._params = SamplingParams(ignore_eos=True)

    def send(self, spec: RequestSpec, keep_tokens: bool = False) -> Ticket:
        require(spec.output_len >= 1, "request.output_len", spec.output_len, "an int >= 1")
        if self.output_mode == "max_tokens":
            req = GenerateRequest(spec.prompt, spec.output_len, self._params)
        else:
            req = GenerateRequest(spec.prompt, max(spec.output_len, self.max_tokens_cap))
        handle = self._submit(req, None)
        if self.output_mode == "eos":
            assert self.stop_after is not None
            self.stop_after[handle.req_id] = spec.output_len
        ticket = Ticket(spec, handle, self.rt.event(), keep_tokens)
        self.sent += 1
        self.outstanding += 1
        handle.done.callbacks.append(lambda ev, t=ticket: self._ended(t, None))
        if self.abort.probability > 0 and self._abort_rng.random() < self.abort.probability:
            self.rt.spawn(self._abort_later(ticket, self.abort.draw_delay(self._abort_rng)))
        return ticket

    def close(self) -> None:
        """No more sends: ``all_done`` fires when the last outstanding request ends."""
        self.closed = True
        self._maybe_done()

    def _abort_later(self, ticket: Ticket, delay: float) -> Generator[Event, Any, None]:
        yield self.rt.sleep(delay)
        h = ticket.handle
        if h is not None and not h.done.triggered:
            ticket.aborted = True
            h.cancel()
            self._ended(ticket, self.rt.now())

    def _ended(self, ticket: Ticket, aborted_at: float | None) -> None:
        h = ticket.handle
        if h is None:  # already ended (aborted before the terminal event arrived)
            return
        ticket.handle = None
        spec = ticket.spec
        others, token_times = h.sink.stream()
        rec = request_record(h.req_id, h.submitted_at, len(spec.prompt), others, token_times=token_times,
                             aborted_at=aborted_at, itl_out=self.itl)
        rec.session, rec.turn = spec.session, spec.turn
        self.records.append(rec)
        if self.stop_after is not None:
            self.stop_after.pop(h.req_id, None)
        if rec.ended_at is not None and rec.ended_at > self.last_end_s:
            self.last_end_s = rec.ended_at
        tokens = h.tokens() if ticket.keep_tokens else None
        self.outstanding -= 1
        ticket.done.succeed(Outcome(rec, tokens))
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.closed and self.outstanding == 0 and not self.all_done.triggered:
            self.all_done.succeed(self.sent)
