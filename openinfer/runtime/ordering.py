"""Orderings of simultaneous events.

SimPy processes events that share a timestamp in the order they were scheduled. That FIFO
order is one legal interleaving among many; real tasks on a tokio runtime or CUDA streams
have no such guarantee, and races hide behind it. The environment asks an
:class:`EventOrder` for the tie-break key of every event it schedules, so a seeded policy
can explore other interleavings while every run still replays exactly from its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from openinfer.errors import require

ORDER_POLICIES = ("fifo", "random", "pct")

_LOW_BITS = 24
_LOW_MASK = (1 << _LOW_BITS) - 1


class EventOrder(Protocol):
    def key(self, eid: int, process: object | None) -> int:
        """Tie-break key for an event; smaller runs first among equal (time, priority)."""
        ...


class FifoOrder:
    """SimPy's own order: first scheduled, first processed."""

    def key(self, eid: int, process: object | None) -> int:
        return eid


class RandomOrder:
    """Seeded random tie-break among simultaneous events."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def key(self, eid: int, process: object | None) -> int:
        return (self._rng.getrandbits(38) << _LOW_BITS) | (eid & _LOW_MASK)


class PriorityOrder:
    """Probabilistic concurrency testing (PCT) adapted to an event queue.

    Each process gets a random priority when it first schedules an event; events run in
    priority order among equals. At ``depth`` randomly chosen scheduling points the active
    process is demoted below every other, which is what lets PCT reach bugs of depth d
    with probability about 1/(n·k^(d-1)) instead of waiting for a lucky FIFO order.
    """

    def __init__(self, seed: int, depth: int = 3, horizon: int = 10_000) -> None:
        require(depth >= 0, "order.depth", depth, "an integer >= 0")
        require(horizon >= 1, "order.horizon", horizon, "an integer >= 1")
        self._rng = random.Random(seed)
        self._change_points = set(self._rng.sample(range(1, horizon + 1), min(depth, horizon)))
        self._count = 0
        self._next_low = 0

    def key(self, eid: int, process: object | None) -> int:
        self._count += 1
        # The priority lives on the process object itself: a dict keyed by id() would
        # hand a dead process's priority to whichever new one reuses its address.
        prio = getattr(process, "_pct_priority", None)
        if prio is None:
            prio = self._rng.getrandbits(30) + (1 << 31)
            if process is not None:
                process._pct_priority = prio  # type: ignore[attr-defined]
        if self._count in self._change_points:
            self._next_low += 1
            prio = (1 << 32) + self._next_low  # after every undemoted process
            if process is not None:
                process._pct_priority = prio  # type: ignore[attr-defined]
        return (prio << _LOW_BITS) | (eid & _LOW_MASK)


@dataclass(frozen=True)
class OrderSpec:
    """Which ordering to use: ``fifo``, ``random`` or ``pct`` (with its depth)."""

    policy: str = "fifo"
    depth: int = 3

    def __post_init__(self) -> None:
        require(self.policy in ORDER_POLICIES, "order.policy", self.policy, f"one of {', '.join(ORDER_POLICIES)}")
        require(isinstance(self.depth, int) and self.depth >= 1, "order.depth", self.depth, "an int >= 1")

    def build(self, seed: int) -> EventOrder:
        if self.policy == "fifo":
            return FifoOrder()
        if self.policy == "random":
            return RandomOrder(seed)
        if self.policy == "pct":
            return PriorityOrder(seed, depth=self.depth)
        raise AssertionError(self.policy)  # unreachable: __post_init__ checked it
