"""Wall-clock time, for the real GPU backend.

The scheduler and store code is the same generator code as in the simulator; here an
event at time t is processed no earlier than t seconds of real time after start, and
``now()`` is the real elapsed time, so synchronous GPU work done inside a process shows up
as time passing. This is the only module of ``openinfer`` (with the real executor's
device timing) that reads a clock or sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

from simpy.core import EmptySchedule
from simpy.events import Event

from openinfer.runtime.base import OrderedEnvironment, Runtime


_EPSILON_S = 1e-9


class WallEnvironment(OrderedEnvironment):
    """Processes events in real time; virtual time never runs behind the wall clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self._clock = clock
        self._sleep = sleep
        self._start = clock()

    def wall_now(self) -> float:
        return self._clock() - self._start

    @property
    def now(self) -> float:  # type: ignore[override]
        return max(self._now, self.wall_now())

    def schedule(self, event: Event, priority: Any = 1, delay: float = 0) -> None:  # type: ignore[override]
        key = self.order.key(next(self._eid), self.active_process)
        heappush(self._queue, (self.now + delay, priority, key, event))

    def step(self) -> None:
        if not self._queue:
            raise EmptySchedule
        due = self._queue[0][0]
        while (delta := due - self.wall_now()) > _EPSILON_S:  # a float residue is not worth a sleep
            self._sleep(delta)
        entry = heappop(self._queue)
        self._now = max(entry[0], self.wall_now())
        self.events_processed += 1
        event = entry[3]
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:  # type: ignore[union-attr]
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


class WallRuntime(Runtime):
    """Runtime on wall-clock time (FIFO ties: real concurrency supplies the disorder)."""

    def __init__(self, seed: int = 0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(WallEnvironment(clock, sleep), seed)

    def now(self) -> float:
        return self.env.now
