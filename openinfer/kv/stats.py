"""Counters of the KvStore and the reasons a resolve degrades."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum


class DegradeReason(Enum):
    CANCELLED = "cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    TIER_ERROR = "tier_error"
    POOL_PRESSURE = "pool_pressure"
    CLOSED = "closed"            # the rank's teardown barrier began: no restore may start


@dataclass
class StoreStats:
    resolves: int = 0
    resolve_hits: int = 0
    resolve_gpu_blocks: int = 0
    resolve_loaded_blocks: int = 0
    resolve_degraded: int = 0
    loads_abandoned: int = 0
    late_leases_released: int = 0
    late_leases_leaked: int = 0
    saves_submitted: int = 0
    saves_failed: int = 0
    handoff_failed: int = 0
    retires_parked: int = 0
    flushes: int = 0
    flush_timeouts: int = 0
    degraded_cancelled: int = 0
    degraded_deadline_exceeded: int = 0
    degraded_tier_error: int = 0
    degraded_pool_pressure: int = 0
    degraded_closed: int = 0

    def degrade(self, reason: DegradeReason) -> None:
        self.resolve_degraded += 1
        name = f"degraded_{reason.value}"
        setattr(self, name, getattr(self, name) + 1)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
