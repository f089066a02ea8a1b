"""The tier protocol: what a deeper KV tier (host RAM, a peer over RDMA) answers.

Futures observe already-submitted work: dropping one (a resolve that stops waiting)
detaches only the observer, never the DMA or RPC behind it. Outcomes are values, not
exceptions, so every asynchronous operation reports exactly one terminal outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from simpy.events import Event, Process

from openinfer.kv.hashing import BlockHash
from openinfer.kv.pool import PageRefs
from openinfer.kv.ports import Ports


class QueryKind(Enum):
    MISS = "miss"
    HIT = "hit"
    LOADING = "loading"
    FAILED = "failed"


@dataclass
class Lease:
    """Pins ``hashes`` in a tier until it is loaded, released, or its TTL runs out."""

    lease_id: int
    hashes: list[BlockHash]
    slots: list[int]
    expires_at: float
    state: str = "open"  # open -> loaded | released | expired

    def __len__(self) -> int:
        return len(self.hashes)


@dataclass
class QueryResult:
    kind: QueryKind
    lease: Lease | None = None
    error: str | None = None

    @property
    def blocks(self) -> int:
        return len(self.lease) if self.lease is not None else 0


@dataclass
class OpResult:
    ok: bool
    error: str | None = None


OK = OpResult(True)


@dataclass(slots=True)
class SaveRecord:
    """One save submitted to a tier; ``done`` fires when its D2H landed and it is visible.
    Slotted: every sealed block of a simulation makes one."""

    hashes: list[BlockHash]
    done: Process
    submitted_at: float
    visible_at: float | None = None
    registered_at: float | None = None
    # why a peer tier's registration of it failed ("dropped" or the metaserver's error): a
    # field, not a dict of extras, which was one dict made per save and read by nobody else
    registration_error: str | None = None

    @property
    def failed(self) -> bool:
        """Ended in a reported failure (copy error, tier full, registration failed or
        dropped): no barrier can make it visible; the request that sealed it answers for
        it (its Finished is marked degraded)."""
        return (self.done.triggered and not self.done.value.ok) or self.registration_error is not None


class Tier(Protocol):
    ports: Ports

    def query(self, req_id: str, hashes: list[BlockHash], wait_full: bool) -> Event: ...
    def load(self, lease: Lease, dst_pages: list[int]) -> Event: ...
    def release(self, lease: Lease) -> None: ...
    def save(self, pages: list[int], hashes: list[BlockHash], guards: PageRefs) -> Process: ...
    def flush(self) -> Event: ...
    def open_leases(self) -> int: ...
