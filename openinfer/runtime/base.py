"""The Runtime seam: the only source of time, sleep, tasks, events and randomness.

Core code (``openinfer.kv``, ``openinfer.scheduler``) is written as SimPy-style generator
processes that yield the events this class hands out. Whether those events complete in
virtual time (:class:`~openinfer.runtime.sim.SimRuntime`) or in wall-clock time, with
device completions polled from CUDA events (:class:`~openinfer.runtime.wall.WallRuntime`),
is invisible to the core. That is what makes "the same code in two worlds" true, and what
lets every simulated run replay exactly from (config, seed).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Generator, Iterable
from functools import partial
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import BoundClass, EmptySchedule, StopSimulation
from simpy.events import NORMAL, PENDING, Event, Process

from openinfer.runtime.ordering import EventOrder, FifoOrder

ProcessGen = Generator[Event, Any, Any]


class OrderedEnvironment(simpy.Environment):
    """A SimPy environment whose ties between simultaneous events follow an EventOrder."""

    def __init__(self, order: EventOrder | None = None, initial_time: float = 0.0) -> None:
        super().__init__(initial_time)
        self.order: EventOrder = order or FifoOrder()
        self.events_processed = 0
        self._bind_event_classes()

    def _bind_event_classes(self) -> None:
        """Bind ``timeout``, ``event``, ``process``, ... to this instance, as SimPy's
        ``BoundClass.bind_early`` does for a plain Environment: it only looks at the
        instance's own class, so on a subclass every ``env.timeout(...)`` paid a descriptor
        call building a bound method (one per event a run creates)."""
        for name, obj in vars(simpy.Environment).items():
            if type(obj) is BoundClass:
                setattr(self, name, getattr(self, name))

    def schedule(self, event: Event, priority: Any = 1, delay: float = 0) -> None:  # type: ignore[override]
        """Queue ``event`` under its order's tie-break key. Every event of a run comes
        through here, so FIFO (whose key is the event id itself) skips the policy call."""
        order = self.order
        eid = next(self._eid)
        key = eid if type(order) is FifoOrder else order.key(eid, self._active_proc)
        heappush(self._queue, (self._now + delay, priority, key, event))

    def step(self) -> None:
        """SimPy's ``Environment.step``, counted (no ``super()`` call: a long run processes
        millions of events)."""
        self.events_processed += 1
        try:
            self._now, _, _, event = heappop(self._queue)
        except IndexError:
            raise EmptySchedule from None
        self._fire(event)

    def _fire(self, event: Event) -> None:
        """The second half of SimPy 4.1's ``step``: run ``event``'s callbacks; a failed
        event that nobody defused crashes the run. A subclass that moves the clock its own
        way (``sim.host_thread``) pops the event and calls this."""
        callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
        try:
            for callback in callbacks:  # type: ignore[union-attr]
                callback(event)
        except StopSimulation:
            # as SimPy: the remaining callbacks run when the simulation resumes
            event.callbacks = callbacks[callbacks.index(callback) + 1:]  # type: ignore[union-attr]
            self.schedule(event, simpy.events.EventPriority(-1))
            raise
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


class Timer(Event):
    """A timed event that stays pending until it fires and may carry an answer computed
    then: "the copy lands at t, and what landing means is decided at t". A SimPy
    ``Timeout`` is triggered from the moment it is made, so an operation whose outcome is
    known only when its time is up needed a timeout plus a second event to answer; with a
    Timer it is one event (``Runtime.later``, ``Runtime.then``). Every sealed block of a
    long simulation is one such copy, so the event saved per copy shows in the run time."""

    def __init__(self, env: simpy.Environment, delay: float, compute: Callable[[], Any] | None = None) -> None:
        self.env = env
        self.callbacks = [self._land]
        self._value = PENDING
        self._ok = True
        self.compute = compute
        env.schedule(self, NORMAL, delay)

    def _land(self, _: Event) -> None:
        compute, self.compute = self.compute, None  # what it captured is not kept
        self._value = compute() if compute is not None else None


def _clamp(seconds: float) -> float:
    """``max(0.0, seconds)``, the same value (0.0 for a negative, zero or NaN delay), as
    a comparison: CPython 3.11's ``max`` parses its arguments by keyword machinery,
    several times the cost of the comparison, and every sleep, copy and step passes here."""
    return seconds if seconds > 0.0 else 0.0


class Runtime:
    """Time, sleep, spawn, events, deadlines and seeded randomness for the core."""

    def __init__(self, env: OrderedEnvironment, seed: int) -> None:
        self.env = env
        self.seed = seed
        if type(env).now is simpy.Environment.now:
            # ``now`` is read a few hundred times per simulated request (every event sent,
            # every save, every copy): as a C-level read of ``env._now`` instead of this
            # method calling SimPy's property (two Python frames). An environment that
            # moves its clock its own way (a ``now`` of its own) keeps the method.
            self.now = partial(getattr, env, "_now")  # type: ignore[method-assign]

    # -- time -------------------------------------------------------------------------
    def now(self) -> float:
        return self.env.now

    def sleep(self, seconds: float) -> Event:
        return self.env.timeout(_clamp(seconds))

    def timer(self, seconds: float) -> Event:
        """Like ``sleep``, but pending until it fires, so ``then`` can answer through it."""
        return Timer(self.env, _clamp(seconds))

    def later(self, seconds: float, compute: Callable[[], Any]) -> Event:
        """An event that fires ``seconds`` from now with the value ``compute()`` returns
        then (one event, where a sleep and an answer would be two)."""
        return Timer(self.env, _clamp(seconds), compute)

    def then(self, event: Event, compute: Callable[[], Any]) -> Event:
        """An event that fires when ``event`` does, with the value ``compute()`` returns at
        that moment. When ``event`` is a fresh ``timer`` nobody waits on yet, it becomes
        that event itself (one event instead of two); otherwise a second event answers."""
        if type(event) is Timer and event.compute is None and len(event.callbacks) == 1:
            event.compute = compute
            return event
        if event.callbacks is None:  # already processed: answer now
            return self.done(compute())
        answer = self.env.event()
        event.callbacks.append(lambda _: answer.succeed(compute()))  # type: ignore[union-attr]
        return answer

    # -- tasks and events -------------------------------------------------------------
    def event(self) -> Event:
        return self.env.event()

    def spawn(self, gen: ProcessGen) -> Process:
        return self.env.process(gen)

    def any_of(self, events: Iterable[Event]) -> Event:
        return self.env.any_of(list(events))

    def all_of(self, events: Iterable[Event]) -> Event:
        return self.env.all_of(list(events))

    def done(self, value: Any = None) -> Event:
        """An event that has already succeeded: the answer of an operation with no wait."""
        ev = self.env.event()
        ev.succeed(value)
        return ev

    def wait(self, event: Event, deadline: float | None) -> Generator[Event, Any, bool]:
        """Wait for ``event`` until the absolute time ``deadline``; True if it completed.

        The event itself is not cancelled on timeout: whatever it stands for (a DMA, an
        RPC) keeps running, and only this observer stops waiting. Callers that own the
        operation must account for its late completion.
        """
        if event.triggered:
            return True
        if deadline is None:
            yield event
            return True
        remaining = deadline - self.now()
        if remaining <= 0:
            return False
        yield event | self.env.timeout(remaining)
        return event.triggered

    # -- randomness -------------------------------------------------------------------
    def rng(self, stream: str) -> random.Random:
        """A random stream derived from (seed, stream name): independent and replayable."""
        digest = hashlib.blake2b(f"{self.seed}/{stream}".encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(digest, "big"))

    # -- driving ----------------------------------------------------------------------
    def run(self, until: float | Event | None = None) -> Any:
        return self.env.run(until=until)

    def run_process(self, gen: ProcessGen) -> Any:
        """Spawn ``gen``, run the world until it ends, return its value."""
        proc = self.spawn(gen)
        return self.env.run(until=proc)
