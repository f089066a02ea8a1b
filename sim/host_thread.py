"""The real engine's host thread: one Python thread that a step holds while it runs.

On the real backend the scheduler, the store, the client and the copy pollers are
generator processes on one :class:`~openinfer.runtime.wall.WallRuntime`, i.e. on one host
thread, and the CUDA executor holds that thread for the whole step (the timing records
show it: in ``results/gpu/served_fit.jsonl`` no copy completion and no request arrival is
ever observed inside a step). Whatever falls due during a step (an arrival, a copy that
landed, the next hop of a prefix resolve) is handled only after the step ends, in the
order it fell due; and what those handlers schedule in turn waits behind the engine's
next step launch. A prefix resolve is a chain of such hops (query the CPU tier, reserve,
load, land, commit), so it advances a hop or two per step instead of all at once, and a
request reaches its first prefill step several steps after it arrived.

The plain simulator lets every process run during a step (virtual time only moves when
every event of the instant is done), so it admits requests a step or more earlier than
the real engine. :class:`HostClockRuntime` is WallRuntime's scheduling on virtual time:
the clock is ``max(event time, the time the host is busy until)``, and simultaneous events
run in the order they were scheduled (on a wall clock a later schedule is a later time,
so SimPy's "process starts first" priority does not reorder them). :class:`HostHeldExecutor`
is the simulated executor in that world: a step is a process that, once it runs, holds the
host for its modelled time and answers when it ends, as ``CudaExecutor.execute`` does. Neither reads a clock: both are
exact functions of the event sequence and the step model, so a run still replays from
(config, seed).

Two things the real host does around copies, measured on the H200 captures and switched
on by the profile (:meth:`HostHeldExecutor.attach_copies`): submitting a copy costs the
host thread time (0.20-0.25 ms per copy in the gap before the next step, in four
captures), and a step that starts while a D2H copy is in flight holds the host until that
copy has landed before its GPU work starts (its wall time grows by the copy's remaining
time, slope 0.95-1.03, while its CUDA-event time does not; an H2D in flight is overlapped).
"""

from __future__ import annotations

from collections.abc import Generator
from heapq import heappop, heappush
from typing import Any

from simpy.core import EmptySchedule
from simpy.events import NORMAL, Event

from openinfer.runtime.base import OrderedEnvironment, Runtime
from openinfer.runtime.ordering import OrderSpec
from openinfer.runtime.sim import SimRuntime
from sim.gpu_executor import SimExecutor


class HostClockEnvironment(OrderedEnvironment):
    """Virtual time with a host that work can hold: ``now`` never runs behind the time the
    host is busy until, and an event that falls due while the host is held runs when it
    is released. Ties run in scheduling order (SimPy's URGENT start of a process is a
    normal event here, as it is on the wall clock)."""

    def __init__(self, order: Any = None, initial_time: float = 0.0) -> None:
        super().__init__(order, initial_time)
        self.host_free_at = initial_time
        self.held_s = 0.0

    @property
    def now(self) -> float:  # type: ignore[override]
        return self._now if self._now >= self.host_free_at else self.host_free_at

    def hold(self, seconds: float) -> None:
        """The host does ``seconds`` of synchronous work now: nothing else runs meanwhile."""
        start = self.now
        self.host_free_at = start + max(0.0, seconds)
        self.held_s += max(0.0, seconds)

    def schedule(self, event: Event, priority: Any = NORMAL, delay: float = 0) -> None:  # type: ignore[override]
        key = self.order.key(next(self._eid), self.active_process)
        # Only SimPy's resume-after-stop (-1) keeps its rank; every other tie is FIFO.
        heappush(self._queue, (self.now + delay, priority if priority < 0 else NORMAL, key, event))

    def step(self) -> None:
        try:
            due, _, _, event = heappop(self._queue)
        except IndexError:
            raise EmptySchedule from None
        self._now = due if due >= self.host_free_at else self.host_free_at
        self.events_processed += 1
        self._fire(event)


class HostClockRuntime(SimRuntime):
    """A SimRuntime on a :class:`HostClockEnvironment`."""

    def __init__(self, seed: int = 0, order: OrderSpec | None = None) -> None:
        spec = order or OrderSpec()
        Runtime.__init__(self, HostClockEnvironment(spec.build(seed)), seed)
        self.order_spec = spec

    def hold(self, seconds: float) -> None:
        self.env.hold(seconds)


class HostHeldExecutor(SimExecutor):
    """SimExecutor whose step holds the host thread for the modelled step time and answers
    at its end: the engine resumes before anything that fell due during the step is
    handled, as on the real executor. Tokens, EOS control, failures and counters are
    SimExecutor's."""

    def __init__(self, rt: HostClockRuntime, *args: Any, **kwargs: Any) -> None:
        if not isinstance(rt, HostClockRuntime):
            raise TypeError("HostHeldExecutor needs a HostClockRuntime (a step holds its host)")
        super().__init__(rt, *args, **kwargs)
        self._count_links: tuple[Any, ...] = ()
        self._wait_links: tuple[Any, ...] = ()
        self._per_copy_s = 0.0
        self._copies_seen = 0
        self.copy_submit_s = 0.0    # host time charged for copy submissions
        self.copy_wait_s = 0.0      # host time steps spent waiting for copies in flight

    def attach_copies(self, transfer: Any, per_copy_s: float = 0.0, wait_for: tuple[str, ...] = ()) -> None:
        """Charge ``per_copy_s`` of host time for each D2H/H2D copy the transfer queued since
        the previous step, and make a step wait for the copies of ``wait_for`` (``"d2h"``,
        ``"h2d"``) still in flight when it starts. ``transfer``: the world's
        :class:`~sim.copy_queue.QueuedTransfer` (its links know every copy's landing time)."""
        self._count_links = (transfer.d2h_link, transfer.h2d_link)
        self._wait_links = tuple(getattr(transfer, f"{d}_link") for d in wait_for)
        self._per_copy_s = max(0.0, float(per_copy_s))
        self._copies_seen = sum(link.copies for link in self._count_links)

    def _spend(self, seconds: float) -> Generator[Event, Any, None]:
        """Hold the host for the step: what falls due meanwhile runs when the step ends. The
        step is still a process (``execute``), like CudaExecutor's, so what the engine
        scheduled before it (the resolve it just routed, say) runs before it takes the host.
        With copies attached, the host first pays for the copies submitted since the last
        step and waits for the copies it must see land."""
        pre = 0.0
        if self._count_links:
            n = sum(link.copies for link in self._count_links)
            pre = (n - self._copies_seen) * self._per_copy_s
            self._copies_seen = n
            self.copy_submit_s += pre
            if self._wait_links:
                drained = max(link.drained_at() for link in self._wait_links)
                wait = drained - (self.rt.now() + pre)
                if wait > 0:
                    pre += wait
                    self.copy_wait_s += wait
        self.busy_until = self.rt.now() + pre + seconds   # the step runs after the host's share
        self.rt.hold(pre + seconds)  # type: ignore[attr-defined]
        return
        yield  # pragma: no cover - a generator that never waits: the host was held instead
