"""Chrome/Perfetto trace of a simulated run: one track per engine with its steps, and
a track per request with its queue, prefill and decode phases (open in ui.perfetto.dev
or chrome://tracing). Recorded from engine observers, so it costs nothing when off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openinfer.scheduler import Engine


class TraceRecorder:
    def __init__(self, max_events: int = 200_000) -> None:
        self.events: list[dict[str, Any]] = []
        self.max_events = max_events
        self._step_start: dict[str, float] = {}
        self._pids: dict[str, int] = {}

    def attach(self, engine: Engine) -> None:
        pid = self._pids.setdefault(engine.name, len(self._pids) + 1)
        self.events.append(dict(ph="M", name="process_name", pid=pid, args=dict(name=engine.name)))
        engine.observers.append(lambda kind, data, e=engine, pid=pid: self._on(e, pid, kind, data))

    def _add(self, ev: dict[str, Any]) -> None:
        if len(self.events) < self.max_events:
            self.events.append(ev)

    def _on(self, engine: Engine, pid: int, kind: str, data: dict[str, Any]) -> None:
        now_us = engine.rt.now() * 1e6
        if kind == "step_start":
            self._step_start[engine.name] = now_us
        elif kind == "step_end":
            plan = data["plan"]
            t0 = self._step_start.pop(engine.name, now_us)
            self._add(dict(ph="X", name=plan.kind.value, pid=pid, tid=0, ts=t0, dur=now_us - t0,
                           args=dict(prefill_tokens=plan.prefill_tokens, decode_rows=len(plan.decode))))
        elif kind == "accepted":
            self._add(dict(ph="b", cat="request", name="request", id=data["req"].id, pid=pid, ts=now_us))
        elif kind == "terminal":
            ev = data["event"]
            self._add(dict(ph="e", cat="request", name="request", id=ev.req_id, pid=pid, ts=now_us,
                           args=dict(outcome=ev.kind.value)))
        elif kind == "admission":
            for p in data["result"].admitted:
                self._add(dict(ph="n", cat="request", name="admitted", id=p.id, pid=pid, ts=now_us))

    def write(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(dict(traceEvents=self.events, displayTimeUnit="ms")))
