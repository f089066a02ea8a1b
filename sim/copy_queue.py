"""Copy engines as arithmetic: the same FIFO queueing as :mod:`sim.copy_engine`, one event per copy.

:class:`~sim.copy_engine.ModeledTransfer` runs each copy as a process holding a
``simpy.Resource`` slot (about five events per copy). Because a copy's duration is known
when it is queued (``latency + bytes/bandwidth``) and engines serve in FIFO order, its
landing time is known too: it starts when the earliest-free engine frees (or now) and
lands ``duration`` later. :class:`QueuedTransfer` computes that and returns a single
timeout, which matters when every sealed block of every request is a D2H copy.
Landing times equal ModeledTransfer's (tests/sim check it); counters are booked when a
copy is queued rather than when it lands.
"""

from __future__ import annotations

import heapq

from simpy.events import Event

from openinfer.runtime import Runtime
from sim.copy_engine import LinkSpec, ModeledTransfer


class QueuedLink:
    """One direction: ``engines`` FIFO servers whose free times are kept in a heap."""

    def __init__(self, rt: Runtime, spec: LinkSpec) -> None:
        self.rt = rt
        self.spec = spec
        self._free_at = [0.0] * spec.engines  # a heap of the times each engine frees
        self._per_byte = 1.0 / (spec.bandwidth_gib_s * 1024 ** 3)
        self.bytes_moved = 0
        self.busy_s = 0.0
        self.copies = 0

    def landing_time(self, nbytes: int, now: float | None = None, not_before: float = 0.0) -> float:
        """Queue a copy; the absolute time it lands (``now``: the caller's reading of it;
        ``not_before``: the end of the step it is ordered after)."""
        if now is None:
            now = self.rt.now()
        dt = self.spec.latency_s + nbytes * self._per_byte
        start = self._free_at[0]
        if start < now:
            start = now
        if start < not_before:
            start = not_before
        end = start + dt
        heapq.heapreplace(self._free_at, end)
        self.bytes_moved += nbytes
        self.busy_s += dt
        self.copies += 1
        return end

    def copy(self, nbytes: int, not_before: float = 0.0) -> Event:
        now = self.rt.now()  # read once: simulated time cannot move inside this call
        return self.rt.timer(self.landing_time(nbytes, now, not_before) - now)

    def drained_at(self) -> float:
        """When the last copy queued so far lands (every engine is free from then on)."""
        return max(self._free_at)

    def queue_delay(self) -> float:
        """How long a copy queued now waits before an engine takes it."""
        return max(0.0, self._free_at[0] - self.rt.now())


class QueuedTransfer(ModeledTransfer):
    """ModeledTransfer over arithmetic links: the same landing times, one event per copy."""

    link_class = QueuedLink
