"""Fault injection at named ports: stall, black hole, delay or error, each with a window.

A fault is active in ``[start_s, heal_s)``. ``stall`` holds an operation that enters the
window until the heal; ``blackhole`` loses it (an RPC on a dead connection: it never
answers, even after the heal — only a deadline gets its caller out); ``delay`` adds
``delay_s``; ``error`` fails it. ``probability`` thins each kind per operation with the
run's seeded RNG. Port ``step`` fails engine steps instead of a storage operation.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from simpy.events import Event

from openinfer.errors import require
from openinfer.kv.ports import PORT_NAMES
from openinfer.runtime import Runtime

FAULT_KINDS = ("stall", "blackhole", "delay", "error")
FAULT_PORTS = (*PORT_NAMES, "step")
METASERVER_PORTS = ("registration", "metaserver")   # the shared MetaServer's, not an instance's
TIER_PORTS = tuple(p for p in PORT_NAMES if p not in METASERVER_PORTS)   # an instance's CPU tier's


@dataclass(frozen=True)
class FaultSpec:
    port: str
    kind: str
    start_s: float = 0.0
    heal_s: float = math.inf
    probability: float = 1.0
    delay_s: float = 0.05
    match: str = ""  # only operations whose description contains this (a step kind, a hash prefix)

    def __post_init__(self) -> None:
        require(self.port in FAULT_PORTS, "fault.port", self.port, f"one of {', '.join(FAULT_PORTS)}")
        require(self.kind in FAULT_KINDS, "fault.kind", self.kind, f"one of {', '.join(FAULT_KINDS)}")
        require(self.start_s >= 0 and self.heal_s >= self.start_s, "fault.heal_s", self.heal_s,
                "a time >= fault.start_s")
        require(0.0 < self.probability <= 1.0, "fault.probability", self.probability, "a number in (0, 1]")
        require(self.delay_s >= 0, "fault.delay_s", self.delay_s, "a number >= 0")
        require(self.port != "step" or self.kind == "error", "fault.kind", self.kind, "error for port step")

    def active(self, now: float) -> bool:
        return self.start_s <= now < self.heal_s

    def describe(self) -> str:
        heal = "never" if math.isinf(self.heal_s) else f"{self.heal_s:.3f}s"
        p = "" if self.probability >= 1 else f" p={self.probability:.2f}"
        only = f" only {self.match!r}" if self.match else ""
        return f"{self.kind} {self.port}{only} [{self.start_s:.3f}s, {heal}){p}"


class FaultHook:
    """A PortHook that applies one FaultSpec."""

    def __init__(self, rt: Runtime, spec: FaultSpec, stream: str) -> None:
        self.rt = rt
        self.spec = spec
        self.rng = rt.rng(stream)
        self.hits = 0

    def enter(self, port: str, what: str) -> Generator[Event, Any, str | None]:
        spec = self.spec
        now = self.rt.now()
        if not spec.active(now) or spec.match not in what or (
                spec.probability < 1.0 and self.rng.random() >= spec.probability):
            return None
        self.hits += 1
        if spec.kind == "error":
            return f"injected {port} error"
        if spec.kind == "delay":
            yield self.rt.sleep(spec.delay_s)
        elif spec.kind == "blackhole" or math.isinf(spec.heal_s):
            yield self.rt.event()  # never answers
        else:
            yield self.rt.sleep(spec.heal_s - now)
        return None

    def step_failure(self, plan: object) -> str | None:
        now = self.rt.now()
        kind = getattr(getattr(plan, "kind", None), "value", "")
        if self.spec.kind == "error" and self.spec.active(now) and self.spec.match in kind and (
                self.spec.probability >= 1.0 or self.rng.random() < self.spec.probability):
            self.hits += 1
            return "injected step error"
        return None


def last_heal(specs: list[FaultSpec]) -> float:
    """When every fault has healed (0 with none; inf if one never heals)."""
    return max((s.heal_s for s in specs), default=0.0)
