"""The write path's per-request records: how far a request has been sealed, and how."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from simpy.events import Process

from openinfer.kv.hashing import BlockHash
from openinfer.kv.tier import SaveRecord


class SaveClass(Enum):
    """Cacheable: a later request may find it. Handoff: a peer is waiting for it, so the
    request's pages stay parked until the save has settled."""

    CACHEABLE = "cacheable"
    HANDOFF = "handoff"


@dataclass
class SaveCursor:
    """Owned by the scheduler, one per request: blocks already sealed, Handoff saves pending."""

    saved_blocks: int = 0
    pending: list[Process] = field(default_factory=list)
    records: list[SaveRecord] = field(default_factory=list)
    # the saves of the prompt's prefix it matched instead of computing, still in flight or
    # failed when it first sealed: a peer finds its whole prompt only once those land too
    inherited: list[SaveRecord] = field(default_factory=list)


class _HoldsBlocks(Protocol):
    def contains(self, block_hash: BlockHash) -> bool: ...


@dataclass
class LatestSaves:
    """The latest save of each block one rank sealed, kept while it can still let down a
    request that reuses the block as its prefix: in flight, or failed while the GPU radix
    still holds the block (a later request may match it, and no save of it is coming).
    Registered saves are pruned when the index doubles, so it holds about what is in
    flight and what failed, not every block a run ever saved."""

    latest: dict[BlockHash, SaveRecord] = field(default_factory=dict)
    prune_at: int = 4096

    def add(self, rec: SaveRecord, radix: _HoldsBlocks) -> None:
        latest = self.latest
        for h in rec.hashes:
            latest[h] = rec
        if len(latest) >= self.prune_at:
            self.latest = {h: r for h, r in latest.items() if r.registered_at is None
                           and (not r.failed or radix.contains(h))}
            self.prune_at = max(self.prune_at, 2 * len(self.latest))

    def unsettled(self, hashes: Sequence[BlockHash]) -> list[SaveRecord]:
        """The distinct saves of ``hashes`` not yet registered (in flight or failed)."""
        latest = self.latest
        found: dict[int, SaveRecord] = {}
        for h in hashes:
            rec = latest.get(h)
            if rec is not None and rec.registered_at is None:
                found[id(rec)] = rec
        return list(found.values())
