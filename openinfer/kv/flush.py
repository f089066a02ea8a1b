"""Flush barriers: "every save submitted before this call is visible and registered".

One implementation with two switches (spec §4.2, §4.5, findings F2/F3):

- ``chain_flushes``: barrier k waits for barrier k-1 before it waits for its own saves.
  A tier's flush *takes* the unfinished save handles it finds; without the chain, a save
  taken by an earlier barrier is invisible to a later one, which can then complete while
  that save is still in flight (the PR's flush-chain gap).
- ``flush_deadline_s``: the whole barrier (predecessor wait included) is bounded; at the
  deadline the callback still runs, the timeout is counted, and completion is signalled
  so later barriers do not queue behind a stall. ``None`` is the PR's unbounded barrier.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from simpy.events import Event, Process

from openinfer.kv.config import StoreConfig
from openinfer.kv.saves import SaveCursor
from openinfer.kv.stats import StoreStats
from openinfer.kv.tier import SaveRecord, Tier
from openinfer.runtime import Runtime


@dataclass
class FlushOutcome:
    ok: bool
    timed_out: bool = False
    error: str | None = None
    started_at: float = 0.0
    finished_at: float = 0.0


def kv_ready(cursor: SaveCursor) -> bool:
    """Whether a peer can find a finished request's KV once its barrier ended (spec H9):
    every save of its own visible and registered, and every save of the prefix it
    inherited too (``SaveCursor.inherited``: one still in flight, or one that failed, which
    no barrier covers any more). Judged per request, not by the barrier's ``ok``: a barrier
    vouches for every earlier save on the tier, so one stuck save of an unrelated request
    would otherwise mark every later Finished degraded."""
    return all(r.registered_at is not None for r in cursor.records) \
        and all(r.registered_at is not None for r in cursor.inherited)


class FlushBarriers:
    """Starts barriers on a tier; remembers the last one per tier for chaining."""

    def __init__(self, rt: Runtime, config: StoreConfig, stats: StoreStats) -> None:
        self.rt = rt
        self.config = config
        self.stats = stats
        # keyed by the tier itself (it lives as long as the store): an id() could be reused
        self._last: dict[Tier, Event] = {}
        self._covered: dict[Tier, list[SaveRecord]] = {}
        self.observers: list[Callable[[str, dict[str, Any]], None]] = []
        self.open_barriers = 0

    def start(self, tier: Tier | None, then: Callable[[FlushOutcome], None] | None) -> Process:
        self.stats.flushes += 1
        started = self.rt.now()
        if tier is None:
            return self.rt.spawn(self._noop(started, then))
        # Taken synchronously, as the Rust barrier takes pending_saves at call time.
        flush = tier.flush()
        covered: list[SaveRecord] = list(getattr(flush, "taken", []))
        prev = None
        done = self.rt.event()
        if self.config.chain_flushes:
            prev = self._last.get(tier)
            self._last[tier] = done
            # A save a predecessor drained is this barrier's to vouch for too, until it lands;
            # one that failed was the predecessor's to report (carried on, one failure would
            # fail every later barrier on the tier).
            covered += [r for r in self._covered.get(tier, []) if r.registered_at is None and not r.failed]
            self._covered[tier] = covered
        self.open_barriers += 1
        return self.rt.spawn(self._barrier(flush, prev, done, started, then, covered))

    def _barrier(self, flush: Event, prev: Event | None, done: Event, started: float,
                 then: Callable[[FlushOutcome], None] | None,
                 covered: list[SaveRecord]) -> Generator[Event, Any, FlushOutcome]:
        rt = self.rt
        limit = self.config.flush_deadline_s
        deadline = None if limit is None else started + limit
        ok = True
        if prev is not None:
            ok = yield from rt.wait(prev, deadline)
        if ok:
            ok = yield from rt.wait(flush, deadline)
        pending = [r for r in covered if r.registered_at is None]
        if ok:
            result = flush.value
            outcome = FlushOutcome(result.ok, error=result.error, started_at=started,
                                   finished_at=rt.now())
            if pending and outcome.ok:
                # A covered save failed, lost its registration, or was drained by a predecessor
                # that gave up on it: the barrier cannot vouch for it.
                outcome = FlushOutcome(False, timed_out=prev is not None and prev.value.timed_out,
                                       error=f"{len(pending)} covered save(s) are not visible and registered",
                                       started_at=started, finished_at=rt.now())
        else:
            self.stats.flush_timeouts += 1
            outcome = FlushOutcome(False, timed_out=True, error="flush deadline exceeded",
                                   started_at=started, finished_at=rt.now())
        self.open_barriers -= 1
        for obs in self.observers:
            obs("barrier_done", dict(outcome=outcome))
        done.succeed(outcome)
        if then is not None:
            then(outcome)
        return outcome

    def _noop(self, started: float, then: Callable[[FlushOutcome], None] | None
              ) -> Generator[Event, Any, FlushOutcome]:
        outcome = FlushOutcome(True, started_at=started, finished_at=started)
        if then is not None:
            then(outcome)
        return outcome
        yield  # pragma: no cover
