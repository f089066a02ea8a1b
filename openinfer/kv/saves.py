"""The write path's per-request records: how far a request has been sealed, and how."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

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
    # the prompt's prefix it matched instead of computing: sealed (or still being sealed) by
    # whichever request computed it, so a barrier judges those blocks by that request's saves
    inherited: list[BlockHash] = field(default_factory=list)
