"""The peer (P2P) tier: a host tier that advertises its blocks and pulls others' blocks.

Producer side: once a save is visible locally its hashes go on a bounded registration
queue (dropped, and counted, when the queue is full); one worker delivers them to the
MetaServer. ``flush`` waits for the queue to drain, so on return every save it covers is
registered — the KV-ready promise a prefill server makes when it answers.

Consumer side: a local miss answers ``Loading`` while a remote fetch runs (MetaServer
lookup → transfer lock at the owner → RDMA read into local host slots); the resolve
re-queries, and once the fetch settles the query answers from local memory. Fetch state
is keyed by the resolve's ``req_id``, which must be unique per concurrent resolve.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from simpy.events import Event, Process

from openinfer.backend.transfer import TransferEngine
from openinfer.errors import require
from openinfer.kv.hashing import BlockHash
from openinfer.kv.host_tier import HostTier
from openinfer.kv.metaserver import MetaServer, PeerDirectory
from openinfer.kv.ports import Ports
from openinfer.kv.tier import QueryKind, QueryResult, SaveRecord
from openinfer.runtime import Runtime


GC_EVERY_S = 60.0        # pegaflow's GC period (spec 4.4)
STALE_FETCH_S = 300.0    # fetch state older than this is abandoned


@dataclass
class _Fetch:
    process: Process
    started_at: float


class PeerTier(HostTier):
    """Host tier + MetaServer registration + remote fetch from peers."""

    def __init__(self, rt: Runtime, capacity_pages: int, transfer: TransferEngine, *,
                 name: str, namespace: str, metaserver: MetaServer, directory: PeerDirectory,
                 registration_queue: int = 1024, lease_ttl_s: float = 600.0,
                 transfer_lock_ttl_s: float = 60.0, ports: Ports | None = None, inline_saves: bool = False) -> None:
        super().__init__(rt, capacity_pages, transfer, lease_ttl_s=lease_ttl_s, name=name, ports=ports,
                         inline_saves=inline_saves)
        require(registration_queue >= 1, "peer_tier.registration_queue", registration_queue, "an int >= 1")
        self.namespace = namespace
        self.metaserver = metaserver
        self.directory = directory
        self.transfer_lock_ttl_s = transfer_lock_ttl_s
        self._queue: deque[SaveRecord] = deque()
        self._queue_cap = registration_queue
        self._wake: Event | None = None
        # Registrations are numbered as they are queued; a drain waits for the ones queued
        # before it (delivered or dropped), not for a queue that later saves keep filling.
        self._queued = 0
        self._settled = 0
        self._drain_waiters: list[tuple[int, Event]] = []
        self._fetches: dict[str, _Fetch] = {}
        self._next_gc = GC_EVERY_S   # pegaflow's GC pass, run lazily by the next query
        # stale_lookups_*: the MetaServer named an owner that does not hold the first block
        # asked for (this instance itself, or a peer that has evicted it). The MetaServer is
        # last-writer-wins and nothing withdraws an owner, so such answers are the model's,
        # not a fault's; counted so that a run says how often they come (each re-query of a
        # waiting resolve is a fetch of its own, so one request can count many times).
        self.counters.update(registrations=0, registrations_dropped=0, registration_errors=0,
                             remote_fetches=0, remote_blocks=0, remote_failures=0,
                             stale_lookups_self=0, stale_lookups_evicted=0)
        directory.add(name, self)
        rt.spawn(self._registration_worker())

    # -- producer: registration -------------------------------------------------------
    def on_visible(self, rec: SaveRecord) -> None:
        if len(self._queue) >= self._queue_cap:
            self.counters["registrations_dropped"] += 1
            rec.registration_error = "dropped"
            return
        self._queue.append(rec)
        self._queued += 1
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _registration_worker(self) -> Generator[Event, Any, None]:
        while True:
            if not self._queue:
                self._wake = self.rt.event()
                yield self._wake
                continue
            rec = self._queue[0]
            err = yield self.metaserver.register(self.name, self.namespace, rec.hashes)
            self._queue.popleft()
            if err is None:
                rec.registered_at = self.rt.now()
                self.counters["registrations"] += 1
            else:
                rec.registration_error = err
                self.counters["registration_errors"] += 1
            self._settled += 1
            self._wake_drains()

    def _wake_drains(self) -> None:
        due = [ev for n, ev in self._drain_waiters if n <= self._settled]
        if due:
            self._drain_waiters = [(n, ev) for n, ev in self._drain_waiters if n > self._settled]
            for ev in due:
                ev.succeed()

    def drain_registrations(self) -> Generator[Event, Any, str | None]:
        """Best effort, as pegaflow's: every registration queued before this call has been
        delivered or dropped. Later ones are not waited for: under a save rate above the
        MetaServer's, an empty queue may never come."""
        if self._settled < self._queued:
            ev = self.rt.event()
            self._drain_waiters.append((self._queued, ev))
            yield ev
        return None

    # -- consumer: remote fetch -------------------------------------------------------
    def answer(self, req_id: str, hashes: list[BlockHash],
               wait_full: bool) -> Generator[Event, Any, QueryResult]:
        if self.rt.now() >= self._next_gc:
            self.stale_fetches()
            self._next_gc = self.rt.now() + GC_EVERY_S
        k = self.resident_prefix(hashes)
        fetch = self._fetches.get(req_id)
        if k < len(hashes):
            if fetch is None:
                proc = self.rt.spawn(self._fetch(hashes[k:]))
                self._fetches[req_id] = _Fetch(proc, self.rt.now())
                self.counters["remote_fetches"] += 1
                return QueryResult(QueryKind.LOADING)
            if not fetch.process.triggered:
                return QueryResult(QueryKind.LOADING)
        if fetch is not None and fetch.process.triggered:
            del self._fetches[req_id]  # settled: the next miss may ask the MetaServer again
        return self.local_answer(hashes, wait_full)
        yield  # pragma: no cover

    def _fetch(self, hashes: list[BlockHash]) -> Generator[Event, Any, int]:
        owner, n, err = yield self.metaserver.lookup(self.namespace, hashes)
        peer = self.directory.get(owner) if owner is not None else None
        if err is not None or peer is None or peer is self or n == 0:
            if err is not None:
                self.counters["remote_failures"] += 1
            elif peer is self and not self.contains(hashes[0]):   # (a save may have landed
                self.counters["stale_lookups_self"] += 1            # during the lookup)
            return 0
        lock = peer.lock_for_transfer(hashes[:n])
        if lock is None:
            self.counters["stale_lookups_evicted"] += 1
            return 0
        dst = self.take_slots(len(lock))
        if dst is None:
            peer.release(lock)
            self.counters["remote_failures"] += 1
            return 0
        yield self.transfer.peer_read(peer.name, lock.slots, dst)
        if lock.state != "open":
            # The owner's lock ran out during the read (the owner cannot see a one-sided
            # read): it may have evicted those blocks and landed others in their slots, so
            # what arrived is not known to be them. Drop it rather than serve it.
            self._free_slots.extend(dst)
            self.counters["remote_failures"] += 1
            return 0
        peer.release(lock)
        self.insert_fetched(lock.hashes, dst)
        self.counters["remote_blocks"] += len(lock)
        return len(lock)

    def lock_for_transfer(self, hashes: list[BlockHash]):  # type: ignore[no-untyped-def]
        """Owner side: pin the resident prefix for a peer's read (expires if the peer dies)."""
        k = self.resident_prefix(hashes)
        if k == 0:
            return None
        return self.grant_lease(hashes[:k], ttl_s=self.transfer_lock_ttl_s)

    def stale_fetches(self, older_than_s: float = STALE_FETCH_S) -> int:
        """GC of abandoned fetch state (pegaflow: > 5 min): a resolve that gave up at its
        deadline while its fetch ran never asks again, so its entry would stay forever. Only
        settled fetches go: one still waiting on its MetaServer lookup keeps its entry."""
        now = self.rt.now()
        stale = [k for k, f in self._fetches.items()
                 if f.process.triggered and now - f.started_at > older_than_s]
        for k in stale:
            del self._fetches[k]
        return len(stale)
