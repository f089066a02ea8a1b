"""The host (CPU) tier: sealed pages copied into pinned host memory, found again by hash.

Capacity is in pages (host slots). A save becomes visible to queries only after its D2H
copy has landed; until then it is a pending save that ``flush`` waits for. A query hit
returns a lease that pins the blocks until they are loaded, released, or the lease's TTL
runs out (a lease nobody releases pins host memory until then — that is the late-lease
leak the guarded query in the store exists to close); a TTL that runs out while the lease's
own copy reads its slots waits for the copy. Unpinned blocks are evicted LRU.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Generator
from functools import partial
from typing import Any

from simpy.events import Event, Process

from openinfer.backend.transfer import TransferEngine
from openinfer.errors import AccountingError, require
from openinfer.kv.hashing import BlockHash
from openinfer.kv.pool import PageRefs
from openinfer.kv.ports import Ports
from openinfer.kv.tier import OK, Lease, OpResult, QueryKind, QueryResult, SaveRecord
from openinfer.runtime import Runtime

_MIN_PENDING_PRUNE = 64  # pending_saves is pruned when it doubles, and not below this


class HostTier:
    """Host-memory tier with LRU eviction, leases with TTL, and pending saves."""

    def __init__(self, rt: Runtime, capacity_pages: int, transfer: TransferEngine, *,
                 lease_ttl_s: float = 600.0, name: str = "host", ports: Ports | None = None,
                 inline_saves: bool = False) -> None:
        require(isinstance(capacity_pages, int) and capacity_pages >= 0,
                "host_tier.capacity_pages", capacity_pages, "an int >= 0")
        require(lease_ttl_s > 0, "host_tier.lease_ttl_s", lease_ttl_s, "a number > 0 (seconds)")
        self.rt = rt
        self.name = name
        self.capacity = capacity_pages
        self.transfer = transfer
        self.lease_ttl_s = lease_ttl_s
        self.ports = ports or Ports()
        # False: every save is a process that starts after the caller yields (on a wall
        # runtime, after the step that sealed it returns control). True: a save without a
        # fault hook takes its slots and queues its copy inside ``save`` itself; a
        # simulated world whose host is free (virtual time does not move until its
        # caller yields) sees the same slots and landing times, at two events a save.
        self.inline_saves = inline_saves
        self._slot_of: OrderedDict[BlockHash, int] = OrderedDict()  # visible blocks, LRU first
        self._pins: dict[BlockHash, int] = {}
        self._free_slots = list(range(capacity_pages - 1, -1, -1))
        self._leases: dict[int, Lease] = {}
        self._expiry: list[tuple[float, int]] = []
        self._next_lease = 0
        self.pending_saves: list[SaveRecord] = []
        self._prune_at = _MIN_PENDING_PRUNE
        self.counters: dict[str, int] = dict(
            queries=0, hits=0, hit_blocks=0, misses=0, inserts=0, evictions=0,
            saves=0, saves_failed=0, loads=0, loads_failed=0, leases_expired=0)
        self.active_loads: set[int] = set()  # ids of H2D copies still writing GPU pages
        self._copying: set[int] = set()       # leases whose slots an H2D is reading now

    # -- contents ---------------------------------------------------------------------
    def resident_prefix(self, hashes: list[BlockHash]) -> int:
        n = 0
        for h in hashes:
            if h not in self._slot_of:
                break
            n += 1
        return n

    def contains(self, block_hash: BlockHash) -> bool:
        return block_hash in self._slot_of

    def resident_blocks(self) -> int:
        return len(self._slot_of)

    def open_leases(self) -> int:
        self._expire_leases()
        return len(self._leases)

    # -- query / load / release -------------------------------------------------------
    def query(self, req_id: str, hashes: list[BlockHash], wait_full: bool) -> Process:
        return self.rt.spawn(self._query(req_id, hashes, wait_full))

    def _query(self, req_id: str, hashes: list[BlockHash],
               wait_full: bool) -> Generator[Event, Any, QueryResult]:
        self.counters["queries"] += 1
        if self.ports.active("query"):
            err = yield from self.ports.through("query", req_id)
            if err is not None:
                return QueryResult(QueryKind.FAILED, error=err)
        result = yield from self.answer(req_id, hashes, wait_full)
        return result

    def answer(self, req_id: str, hashes: list[BlockHash],
               wait_full: bool) -> Generator[Event, Any, QueryResult]:
        """The local answer; a peer tier extends it with remote fetches."""
        return self.local_answer(hashes, wait_full)
        yield  # pragma: no cover - makes this a generator for subclasses

    def local_answer(self, hashes: list[BlockHash], wait_full: bool) -> QueryResult:
        self._expire_leases()
        k = self.resident_prefix(hashes)
        if k == 0 or (wait_full and k < len(hashes)):
            self.counters["misses"] += 1
            return QueryResult(QueryKind.MISS)
        self.counters["hits"] += 1
        self.counters["hit_blocks"] += k
        return QueryResult(QueryKind.HIT, lease=self.grant_lease(hashes[:k]))

    def grant_lease(self, hashes: list[BlockHash], ttl_s: float | None = None) -> Lease:
        """Pin resident blocks for a consumer (a local load or a peer's transfer lock)."""
        slots = []
        for h in hashes:
            slots.append(self._slot_of[h])
            self._slot_of.move_to_end(h)
        self._pin(hashes)
        self._next_lease += 1
        ttl = self.lease_ttl_s if ttl_s is None else ttl_s
        lease = Lease(self._next_lease, list(hashes), slots, self.rt.now() + ttl)
        self._leases[lease.lease_id] = lease
        heapq.heappush(self._expiry, (lease.expires_at, lease.lease_id))
        return lease

    def release(self, lease: Lease) -> None:
        self._end_lease(lease, "released")

    def load(self, lease: Lease, dst_pages: list[int]) -> Process:
        if lease.state != "open":
            raise AccountingError(f"load of a {lease.state} lease")
        if len(dst_pages) != len(lease):
            raise AccountingError(f"load: {len(dst_pages)} pages for a lease of {len(lease)} blocks")
        return self.rt.spawn(self._load(lease, dst_pages))

    @property
    def loads_in_flight(self) -> int:
        return len(self.active_loads)

    def _load(self, lease: Lease, dst_pages: list[int]) -> Generator[Event, Any, OpResult]:
        self.counters["loads"] += 1
        load_id = self.counters["loads"]
        self.active_loads.add(load_id)
        err = None
        if self.ports.active("load"):
            err = yield from self.ports.through("load", str(lease.lease_id))
        if err is None and lease.state != "open":
            # Expired while the load waited at its port: the pins are gone and the slots may
            # already hold other blocks, so copying them would restore the wrong KV.
            err = f"lease {lease.state} before its copy started"
        if err is None:
            self._copying.add(lease.lease_id)
            yield self.transfer.h2d(lease.slots, dst_pages)
            self._copying.discard(lease.lease_id)
        self.active_loads.discard(load_id)
        if lease.state == "open":
            self._end_lease(lease, "loaded")  # consumed on success and on failure
        if err is not None:
            self.counters["loads_failed"] += 1
            return OpResult(False, err)
        return OK

    def _end_lease(self, lease: Lease, state: str) -> None:
        if lease.state != "open":
            return  # a lease that expired first; its pins are already gone
        lease.state = state
        del self._leases[lease.lease_id]
        self._unpin(lease.hashes)

    def _pin(self, hashes: list[BlockHash]) -> None:
        pins = self._pins
        for h in hashes:
            pins[h] = pins.get(h, 0) + 1

    def _unpin(self, hashes: list[BlockHash]) -> None:
        pins = self._pins
        for h in hashes:
            left = pins[h] - 1
            if left:
                pins[h] = left
            else:
                del pins[h]

    def _expire_leases(self) -> None:
        if not self._expiry:
            return
        now = self.rt.now()
        while self._expiry and self._expiry[0][0] <= now:
            _, lease_id = heapq.heappop(self._expiry)
            lease = self._leases.get(lease_id)
            # A lease whose copy is reading its slots is not leaked: the load ends it when
            # the copy lands (bounded), and expiring it now would let eviction hand those
            # slots to a save while the copy still reads them.
            if lease is not None and lease_id not in self._copying:
                self._end_lease(lease, "expired")
                self.counters["leases_expired"] += 1

    # -- save / flush -----------------------------------------------------------------
    def save(self, pages: list[int], hashes: list[BlockHash], guards: PageRefs) -> SaveRecord:
        """Start saving ``pages`` (named ``hashes``); ``rec.done`` fires with the outcome.

        Every sealed block of every request is a save. With ``inline_saves`` and no fault
        hook on the ``save`` port it is not a process: it takes its slots and queues its
        D2H now, and the copy's landing answers (one event when the transfer's copy is a
        runtime timer, as the simulator's queued copies are; else two).
        Otherwise (a hook may stall it) it runs as a process (``_save``)."""
        if len(self.pending_saves) >= self._prune_at:
            self._prune_pending_saves()
        rec = SaveRecord(list(hashes), None, self.rt.now())  # type: ignore[arg-type]
        if not self.inline_saves or self.ports.active("save"):
            rec.done = self.rt.spawn(self._save(rec, pages, hashes, guards))
        else:
            rec.done = self._save_now(rec, pages, hashes, guards)
        self.pending_saves.append(rec)
        self.counters["saves"] += 1
        return rec

    def _prune_pending_saves(self) -> None:
        """Drop settled saves from ``pending_saves``; ``save`` calls this once the list has
        doubled since the last prune (amortised O(1) a save instead of a pass per save).
        Only memory: ``flush`` takes the unsettled ones and skips the rest either way."""
        self.pending_saves = [s for s in self.pending_saves if not s.done.triggered]
        self._prune_at = max(_MIN_PENDING_PRUNE, 2 * len(self.pending_saves))

    def _save(self, rec: SaveRecord, pages: list[int], hashes: list[BlockHash],
              guards: PageRefs) -> Generator[Event, Any, OpResult]:
        err = yield from self.ports.through("save", hashes[0].hex()[:8] if hashes else "")
        new_pages, new_hashes, slots, resident, err = self._reserve(pages, rec.hashes, err)
        if err is None and new_pages:
            yield self.transfer.d2h(new_pages, slots)
        return self._landed(rec, new_hashes, slots, resident, guards, err)

    def _save_now(self, rec: SaveRecord, pages: list[int], hashes: list[BlockHash], guards: PageRefs) -> Event:
        new_pages, new_hashes, slots, resident, err = self._reserve(pages, rec.hashes, None)
        if err is None and new_pages:
            copy = self.transfer.d2h(new_pages, slots)
            # a partial, not a lambda: the landing calls _landed without a frame between
            return self.rt.then(copy, partial(self._landed, rec, new_hashes, slots, resident, guards, None))
        return self.rt.done(self._landed(rec, new_hashes, slots, resident, guards, err))

    def _reserve(self, pages: list[int], hashes: list[BlockHash], err: str | None
                 ) -> tuple[list[int], list[BlockHash], list[int], list[BlockHash], str | None]:
        """The pages and hashes of the blocks not yet resident, the host slots they will
        land in (none after an error) and the resident blocks it pinned. ``hashes`` is the
        record's own copy, so when every block is new (nearly every save: one block a
        decode step) the lists are returned as they are, with no (page, hash) pair or list
        made per block."""
        slot_of = self._slot_of
        for h in hashes:
            if h in slot_of:
                new_pages, new_hashes = [], []
                for p, h2 in zip(pages, hashes):
                    if h2 not in slot_of:
                        new_pages.append(p)
                        new_hashes.append(h2)
                break
        else:
            new_pages, new_hashes = pages, hashes
        if err is not None or not new_pages:
            return new_pages, new_hashes, [], [], err
        # The blocks it found resident count as saved by it: pinned until it lands, so that
        # neither the slots it takes now nor another save's before it lands evict them (it
        # would report them visible, gone).
        resident = [h for h in hashes if h in slot_of] if new_hashes is not hashes else []
        self._pin(resident)
        slots = self._take_slots(len(new_pages))
        if slots is None:
            self._unpin(resident)
            return new_pages, new_hashes, [], [], "host tier full: every resident block is pinned"
        return new_pages, new_hashes, slots, resident, None

    def _landed(self, rec: SaveRecord, new_hashes: list[BlockHash], slots: list[int],
                resident: list[BlockHash], guards: PageRefs, err: str | None) -> OpResult:
        """The copy is done (or never started): release the GPU pages, make the blocks visible."""
        guards.release()  # the GPU pages may be reused once the D2H has landed
        if resident:
            self._unpin(resident)
        if err is not None:
            self._free_slots.extend(slots)
            self.counters["saves_failed"] += 1
            return OpResult(False, err)
        for h, slot in zip(new_hashes, slots):
            if h in self._slot_of:  # a concurrent save of the same block won the race
                self._free_slots.append(slot)
                continue
            self._slot_of[h] = slot
            self.counters["inserts"] += 1
        rec.visible_at = self.rt.now()
        self.on_visible(rec)
        return OK

    def on_visible(self, rec: SaveRecord) -> None:
        """Hook for a peer tier: advertise the blocks once they are visible locally."""
        rec.registered_at = rec.visible_at

    def _take_slots(self, n: int) -> list[int] | None:
        if self._expiry:  # leases to expire first (every save asks: most find none)
            self._expire_leases()
        if n > self.capacity:
            return None
        free, slot_of, pins = self._free_slots, self._slot_of, self._pins
        while len(free) < n:  # evict the least recently used unpinned block
            if slot_of and not pins:  # none pinned (mostly): the least recently used, at once
                free.append(slot_of.popitem(last=False)[1])
            else:
                for victim in slot_of:
                    if victim not in pins:
                        break
                else:
                    return None  # every resident block is pinned (those evicted so far stay so)
                free.append(slot_of.pop(victim))
            self.counters["evictions"] += 1
        if n == 1:  # a decode step's save: one block
            return [free.pop()]
        return [free.pop() for _ in range(n)]

    def insert_fetched(self, hashes: list[BlockHash], slots: list[int]) -> None:
        """Make blocks fetched from a peer visible locally (slots from ``take_slots``)."""
        for h, slot in zip(hashes, slots):
            if h in self._slot_of:
                self._free_slots.append(slot)
            else:
                self._slot_of[h] = slot
                self.counters["inserts"] += 1

    def take_slots(self, n: int) -> list[int] | None:
        return self._take_slots(n)

    def flush(self) -> Process:
        """Barrier: takes every unfinished save NOW, then waits for them (and registration).

        A save whose handle an earlier flush took is invisible to this one: that is the
        shape of the PR's flush-chain gap, which the store's chained barrier closes.
        """
        taken = [s for s in self.pending_saves if not s.done.triggered]
        self.pending_saves = []
        proc = self.rt.spawn(self._flush(taken))
        proc.taken = taken  # type: ignore[attr-defined]  # what this barrier is answerable for
        return proc

    def _flush(self, taken: list[SaveRecord]) -> Generator[Event, Any, OpResult]:
        if taken:
            yield self.rt.all_of(s.done for s in taken)
        err = None
        if self.ports.active("flush"):
            err = yield from self.ports.through("flush")
        if err is None:
            err = yield from self.drain_registrations()
        return OK if err is None else OpResult(False, err)

    def drain_registrations(self) -> Generator[Event, Any, str | None]:
        """Host-only tier: visibility is the whole barrier."""
        return None
        yield  # pragma: no cover
