"""Per-step samples of the engine's state, kept cheap and bounded.

An engine observer samples every ``every``-th step (pages used, save-pinned pages, queue
lengths, the step's size). When ``max_rows`` is reached, every other row is dropped and
the stride doubles, so a run of any length ends with between max_rows/2 and max_rows
evenly spaced rows, and sampling cost falls as the run grows.
"""

from __future__ import annotations

from typing import Any

from openinfer.kv.store import KvStore
from openinfer.scheduler.engine import Engine

COLUMNS = ("t", "step", "used_pages", "pinned_pages", "deferred", "resolving", "prefilling", "active",
           "prefill_tokens", "decode_rows")


class TimelineSampler:
    def __init__(self, engine: Engine, store: KvStore, *, every: int = 16, max_rows: int = 512) -> None:
        self.engine = engine
        self.store = store
        self.every = max(1, every)
        self.max_rows = max(2, max_rows)
        self.rows: list[tuple[float | int, ...]] = []
        self._n = 0
        self.peak_used_pages = 0
        self.peak_pinned_pages = 0
        engine.observers.append(self._observe)

    def _observe(self, kind: str, data: dict[str, Any]) -> None:
        if kind != "step_start":
            return
        self._n += 1
        eng = self.engine
        pool = eng.pool
        used = pool.num_blocks - pool.available_blocks()
        pinned = self.store.pinned_blocks(eng.rank)
        if used > self.peak_used_pages:
            self.peak_used_pages = used
        if pinned > self.peak_pinned_pages:
            self.peak_pinned_pages = pinned
        if self._n % self.every:
            return
        plan = data["plan"]
        self.rows.append((eng.rt.now(), self._n, used, pinned, len(eng.deferred), eng.hub.in_flight(),
                          len(eng.prefilling), len(eng.active), plan.prefill_tokens, len(plan.decode)))
        if len(self.rows) >= self.max_rows:
            self.rows = self.rows[1::2]
            self.every *= 2

    def as_dict(self) -> dict[str, Any]:
        return dict(columns=list(COLUMNS), every=self.every, rows=[list(r) for r in self.rows],
                    peak_used_pages=self.peak_used_pages, peak_pinned_pages=self.peak_pinned_pages)
