"""Copy engines: D2H, H2D and peer reads with bandwidth, per-operation latency and a queue.

A copy takes ``latency + bytes / bandwidth`` once it reaches the head of its engine's
queue; by default there is one engine each way, as on a GPU with one copy engine per
direction. Nothing moves: the simulator only needs to know when the copy lands.

``after_compute`` (set by the world when ``copies_after_step`` is on) is the time the step
in flight ends: the CUDA executor orders each copy stream after every step launched so far
(a D2H must not read KV a step is still writing), so a copy submitted mid-step starts at
the earliest when that step ends, and the copies queued behind it wait with it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy
from simpy.events import Event

from openinfer.errors import require
from openinfer.runtime import Runtime
from sim.copy_ledger import CopyLedger

GiB = 1024 ** 3


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_gib_s: float
    latency_s: float = 10e-6
    engines: int = 1

    def __post_init__(self) -> None:
        require(self.bandwidth_gib_s > 0, "link.bandwidth_gib_s", self.bandwidth_gib_s, "a number > 0")
        require(self.latency_s >= 0, "link.latency_s", self.latency_s, "a number >= 0")
        require(self.engines >= 1, "link.engines", self.engines, "an int >= 1")

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / (self.bandwidth_gib_s * GiB)


class Link:
    """One direction of copies: a FIFO queue in front of ``engines`` copy engines."""

    def __init__(self, rt: Runtime, spec: LinkSpec) -> None:
        self.rt = rt
        self.spec = spec
        self._engines = simpy.Resource(rt.env, capacity=spec.engines)
        self.bytes_moved = 0
        self.busy_s = 0.0
        self.copies = 0

    def copy(self, nbytes: int, not_before: float = 0.0) -> Event:
        return self.rt.spawn(self._copy(nbytes, not_before))

    def _copy(self, nbytes: int, not_before: float) -> Generator[Event, Any, None]:
        with self._engines.request() as slot:
            yield slot
            wait = not_before - self.rt.now()
            if wait > 0:        # at the head of the stream, waiting for the step it follows
                yield self.rt.sleep(wait)
            dt = self.spec.seconds(nbytes)
            yield self.rt.sleep(dt)
        self.bytes_moved += nbytes
        self.busy_s += dt
        self.copies += 1


class ModeledTransfer:
    """A TransferEngine whose copies take modelled time on D2H, H2D and peer links.

    ``link_class`` is how one direction queues its copies: :class:`Link` runs a SimPy
    process per copy; ``sim.copy_queue.QueuedLink`` computes the landing time directly.
    """

    link_class: type = Link

    def __init__(self, rt: Runtime, page_bytes: int, d2h: LinkSpec, h2d: LinkSpec,
                 peer: LinkSpec | None = None, connect_s: float = 0.0) -> None:
        require(page_bytes > 0, "transfer.page_bytes", page_bytes, "an int > 0")
        self.rt = rt
        self.page_bytes = page_bytes
        self.d2h_link = self.link_class(rt, d2h)
        self.h2d_link = self.link_class(rt, h2d)
        self.peer_link = self.link_class(rt, peer or h2d)
        self.connect_s = connect_s
        self._connected: set[str] = set()
        self.after_compute: Callable[[], float] | None = None   # see the module docstring
        self.ledger: CopyLedger | None = None   # set: copies must not overlap (sim/copy_ledger.py)

    def d2h(self, pages: list[int], slots: list[int]) -> Event:
        lands = self.d2h_link.copy(len(pages) * self.page_bytes, self._not_before())
        if self.ledger is not None:
            self.ledger.submit("D2H save", "page", pages, "slot", slots, lands)
        return lands

    def h2d(self, slots: list[int], pages: list[int]) -> Event:
        lands = self.h2d_link.copy(len(pages) * self.page_bytes, self._not_before())
        if self.ledger is not None:
            self.ledger.submit("H2D load", "slot", slots, "page", pages, lands)
        return lands

    def _not_before(self) -> float:
        """The earliest start of a D2H/H2D submitted now: the end of the step in flight
        when copies are ordered after steps, else no bound."""
        after = self.after_compute
        return after() if after is not None else 0.0

    def peer_read(self, peer: str, src_slots: list[int], dst_slots: list[int]) -> Event:
        nbytes = len(src_slots) * self.page_bytes
        lands = self.peer_link.copy(nbytes) if peer in self._connected \
            else self.rt.spawn(self._first_read(peer, nbytes))
        if self.ledger is not None:
            self.ledger.submit("peer read", "slot", [], "slot", dst_slots, lands)
        return lands

    def _first_read(self, peer: str, nbytes: int) -> Generator[Event, Any, None]:
        yield self.rt.sleep(self.connect_s)  # first contact pays the connection set-up
        self._connected.add(peer)
        yield self.peer_link.copy(nbytes)
