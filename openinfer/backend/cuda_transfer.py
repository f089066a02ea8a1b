"""Real page copies: a pinned host arena for the CPU tier and a TransferEngine that moves
bytes between it and the GPU KV arena.

Why it looks like this:

* One arena page (all layers' K and V of one block) is one contiguous slab, and a host
  slot has exactly that shape, so a block offloads as ONE memcpy; runs of consecutive
  pages onto consecutive slots are coalesced into one larger copy.
* D2H saves and H2D restores run on two side streams (one per direction), so they
  overlap the compute stream. Each copy is ordered after the producing step: at
  submission an event is recorded on the compute stream and the side stream waits on it.
* Completion is observed by polling the copy's CUDA event through the runtime
  (``rt.sleep(poll_s)`` between ``event.query()`` calls): the core never reads a clock,
  and on a wall-clock runtime the scheduler keeps running while the DMA is in flight.
* The store, not this class, decides page lifetimes: a save holds a guard reference on
  its pages until the D2H event has fired, a restore writes only into a reservation that
  is released (if abandoned) only once the H2D has finished. This class CHECKS that
  contract cheaply: it tracks the pages and host slots each copy in flight reads or
  writes and raises :class:`PageInFlight` if a copy or a step would touch one in a way
  ``copy_exclusion`` forbids, and, given the pool, that every page stays referenced from
  submission to completion.
* On a machine without CUDA the same class does synchronous torch copies and returns
  ``rt.done()``, so CI runs this code path; ``cpu_delay_s > 0`` instead makes the CPU
  copies asynchronous (the bytes move at completion, ``cpu_delay_s`` later), so tests can
  observe ordering and the in-flight checks without a GPU.

Per-copy records (direction, pages, bytes, device seconds) are kept for calibrating the
simulator's copy-engine model.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from simpy.events import Event

from openinfer.backend.copy_exclusion import PAGE, READS, SLOT, WRITES, InFlightCounts, race_message
from openinfer.backend.jsonl import write_jsonl
from openinfer.errors import AccountingError, require
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.runtime import Runtime

D2H, H2D, PEER = "d2h", "h2d", "peer"


class PageInFlight(AccountingError):
    """A page is read or written while a copy that conflicts with it is still in flight."""


@dataclass
class PinnedHostArena:
    """Host slots shaped like arena pages: ``[slots, layers, 2, block, kv_heads, head_dim]``."""

    data: torch.Tensor
    pinned: bool = False

    @classmethod
    def like(cls, arena: KVArena, num_slots: int, pin: bool | None = None) -> PinnedHostArena:
        """``num_slots`` host slots for pages of ``arena``; pinned by default when CUDA is
        available (pageable memory would make every D2H/H2D a staged, synchronous copy)."""
        require(isinstance(num_slots, int) and num_slots >= 1, "host_arena.num_slots", num_slots,
                "an int >= 1")
        pin = torch.cuda.is_available() if pin is None else pin
        shape = (num_slots, *arena.data.shape[1:])
        data = torch.zeros(shape, dtype=arena.data.dtype, pin_memory=pin)
        return cls(data, pin)

    @property
    def num_slots(self) -> int:
        return self.data.shape[0]

    @property
    def bytes_per_slot(self) -> int:
        return self.data[0].numel() * self.data.element_size()

    def slot(self, i: int) -> torch.Tensor:
        return self.data[i]


@dataclass
class CopyRecord:
    """One submitted copy, for calibration. Times in seconds; ``gpu_s`` is the CUDA-event
    elapsed time of the copies on the side stream (None on CPU), ``wall_s`` the runtime
    time from submission to observed completion (includes the wait for the producing
    step and the polling granularity)."""

    index: int
    dir: str                 # d2h / h2d / peer
    pages: int
    runs: int                # memcpy calls after coalescing consecutive pages
    bytes: int
    submitted_at: float
    wall_s: float = 0.0
    gpu_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DirCounters:
    copies: int = 0
    pages: int = 0
    bytes: int = 0
    gpu_s: float = 0.0


def coalesce(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int]]:
    """(src_start, dst_start, length) runs where both indices advance by one together."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            a, b, n = runs[-1]
            runs[-1] = (a, b, n + 1)
        else:
            runs.append((s, d, 1))
    return runs


class CudaTransfer:
    """TransferEngine over a KVArena and a PinnedHostArena (and, for a single-process P/D
    demo, other instances' host arenas by name for ``peer_read``)."""

    def __init__(self, rt: Runtime, arena: KVArena, host: PinnedHostArena, *,
                 peers: dict[str, PinnedHostArena] | None = None, pool: Any = None,
                 poll_s: float = 5e-5, cpu_delay_s: float = 0.0,
                 compute_stream: Any = None) -> None:
        require(tuple(host.data.shape[1:]) == tuple(arena.data.shape[1:])
                and host.data.dtype == arena.data.dtype, "host_arena",
                (tuple(host.data.shape), host.data.dtype),
                f"slots shaped like arena pages {tuple(arena.data.shape[1:])}, {arena.data.dtype}")
        require(poll_s > 0, "transfer.poll_s", poll_s, "a number > 0 (seconds)")
        require(cpu_delay_s >= 0, "transfer.cpu_delay_s", cpu_delay_s, "a number >= 0 (seconds)")
        self.rt = rt
        self.arena = arena
        self.host = host
        self.peers: dict[str, PinnedHostArena] = peers if peers is not None else {}
        self.pool = pool  # optional BlockPool: pages must stay referenced while copied
        self.poll_s = poll_s
        self.cpu_delay_s = cpu_delay_s
        self.on_cuda = arena.data.device.type == "cuda"
        if self.on_cuda:
            dev = arena.data.device
            self.compute_stream = compute_stream or torch.cuda.current_stream(dev)
            self.streams = {D2H: torch.cuda.Stream(dev), H2D: torch.cuda.Stream(dev)}
        self.bytes_per_page = arena.bytes_per_page
        self.inflight = InFlightCounts()
        self.records: list[CopyRecord] = []
        self.counters: dict[str, DirCounters] = {D2H: DirCounters(), H2D: DirCounters(),
                                                 PEER: DirCounters()}

    # -- the TransferEngine protocol ---------------------------------------------------
    def d2h(self, pages: list[int], slots: list[int]) -> Event:
        self._check_lengths(pages, slots, "d2h")
        self._check_submit(D2H, pages, slots)
        return self._submit(D2H, pages, slots)

    def h2d(self, slots: list[int], pages: list[int]) -> Event:
        self._check_lengths(slots, pages, "h2d")
        self._check_submit(H2D, pages, slots)
        return self._submit(H2D, slots, pages)

    def peer_read(self, peer: str, src_slots: list[int], dst_slots: list[int]) -> Event:
        """Host-to-host copy from another instance's arena in this process: the
        single-GPU stand-in for an RDMA read (synchronous; pinned memcpy)."""
        self._check_lengths(src_slots, dst_slots, "peer_read")
        src = self.peers.get(peer)
        if src is None:
            raise AccountingError(f"peer_read: unknown peer {peer!r} (known: {sorted(self.peers)})")
        self._refuse_race("peer read", SLOT, dst_slots, WRITES)
        runs = coalesce(src_slots, dst_slots)
        self._record(PEER, len(src_slots), runs)
        for s, d, n in runs:
            self.host.data[d:d + n].copy_(src.data[s:s + n])
        return self.rt.done()

    # -- checks (the page-lifetime contract) --------------------------------------------
    def check_step(self, read_pages: Sequence[int], write_pages: Sequence[int]) -> None:
        """Called by the executor before a step: the step must not write a page that a
        copy in flight reads or writes, nor read a page an H2D is still writing."""
        self._refuse_race("step", PAGE, write_pages, WRITES)
        self._refuse_race("step", PAGE, read_pages, READS)

    def pages_in_flight(self) -> int:
        return self.inflight.busy(PAGE)

    def _refuse_race(self, what: str, kind: str, ids: Sequence[int], verb: str) -> None:
        race = self.inflight.race(kind, ids, verb)
        if race is not None:
            raise PageInFlight(race_message(what, verb, kind, race))

    def _check_lengths(self, a: Sequence[int], b: Sequence[int], what: str) -> None:
        if len(a) != len(b):
            raise AccountingError(f"{what}: {len(a)} sources for {len(b)} destinations")

    def _check_submit(self, direction: str, pages: Sequence[int], slots: Sequence[int]) -> None:
        """A save reads its pages and writes its slots; a load reads slots, writes pages."""
        page_verb, slot_verb = (READS, WRITES) if direction == D2H else (WRITES, READS)
        what = "D2H save" if direction == D2H else "H2D load"
        self._refuse_race(what, PAGE, pages, page_verb)
        self._refuse_race(what, SLOT, slots, slot_verb)
        self._check_held(direction, pages, "submitted")

    def _check_held(self, direction: str, pages: Sequence[int], when: str) -> None:
        pool = self.pool
        if pool is None:
            return
        for p in pages:
            if pool.refcount(p) < 1:
                raise PageInFlight(f"{direction} {when} with page {p} unreferenced: "
                                   "it could be reallocated while the copy touches it")

    # -- submission and completion -----------------------------------------------------
    def _record(self, direction: str, pages: int, runs: list[tuple[int, int, int]]) -> CopyRecord:
        rec = CopyRecord(len(self.records), direction, pages, len(runs), pages * self.bytes_per_page,
                         self.rt.now())
        self.records.append(rec)
        c = self.counters[direction]
        c.copies += 1
        c.pages += pages
        c.bytes += rec.bytes
        return rec

    def _copy(self, direction: str, runs: list[tuple[int, int, int]], non_blocking: bool) -> None:
        arena, host = self.arena.data, self.host.data
        for s, d, n in runs:
            if direction == D2H:
                host[d:d + n].copy_(arena[s:s + n], non_blocking=non_blocking)
            else:
                arena[d:d + n].copy_(host[s:s + n], non_blocking=non_blocking)

    def _submit(self, direction: str, src: list[int], dst: list[int]) -> Event:
        runs = coalesce(src, dst)             # once: the record counts the copies that run
        rec = self._record(direction, len(src), runs)
        if not src:
            return self.rt.done()
        if self.on_cuda:
            return self._submit_cuda(direction, runs, src, dst, rec)
        if self.cpu_delay_s == 0:
            self._copy(direction, runs, non_blocking=False)
            return self.rt.done()
        self._mark(direction, src, dst, +1)
        return self.rt.spawn(self._cpu_later(direction, runs, src, dst, rec))

    def _mark(self, direction: str, src: Sequence[int], dst: Sequence[int], delta: int) -> None:
        src_kind, dst_kind = (PAGE, SLOT) if direction == D2H else (SLOT, PAGE)
        self.inflight.add(src_kind, src, READS, delta)
        self.inflight.add(dst_kind, dst, WRITES, delta)

    def _cpu_later(self, direction: str, runs: list[tuple[int, int, int]], src: list[int],
                   dst: list[int], rec: CopyRecord) -> Generator[Event, Any, None]:
        yield self.rt.sleep(self.cpu_delay_s)
        self._copy(direction, runs, non_blocking=False)
        self._complete(direction, src, dst, rec)

    def _submit_cuda(self, direction: str, runs: list[tuple[int, int, int]], src: list[int],
                     dst: list[int], rec: CopyRecord) -> Event:
        stream = self.streams[direction]
        ready = torch.cuda.Event()
        ready.record(self.compute_stream)    # after every step launched so far
        stream.wait_event(ready)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            self._copy(direction, runs, non_blocking=True)
            end.record(stream)
        self._mark(direction, src, dst, +1)
        return self.rt.spawn(self._poll(direction, src, dst, rec, start, end))

    def _poll(self, direction: str, src: list[int], dst: list[int], rec: CopyRecord, start: Any,
              end: Any) -> Generator[Event, Any, None]:
        while not end.query():
            yield self.rt.sleep(self.poll_s)
        rec.gpu_s = start.elapsed_time(end) / 1e3
        self.counters[direction].gpu_s += rec.gpu_s
        self._complete(direction, src, dst, rec)

    def _complete(self, direction: str, src: list[int], dst: list[int], rec: CopyRecord) -> None:
        self._check_held(direction, src if direction == D2H else dst, "completed")
        self._mark(direction, src, dst, -1)
        rec.wall_s = self.rt.now() - rec.submitted_at

    # -- reports -------------------------------------------------------------------------
    def summary(self) -> dict[str, dict[str, float | int | None]]:
        """Per direction: copies, pages, bytes, device seconds and the GiB/s they imply."""
        out: dict[str, dict[str, float | int | None]] = {}
        for d, c in self.counters.items():
            gib_s = c.bytes / c.gpu_s / 2**30 if c.gpu_s > 0 else None
            out[d] = dict(copies=c.copies, pages=c.pages, bytes=c.bytes, gpu_s=round(c.gpu_s, 6),
                          gib_s=round(gib_s, 3) if gib_s is not None else None)
        return out

    def write_copies_jsonl(self, path: str | Path) -> Path:
        """One JSON object per copy (``CopyRecord`` fields)."""
        return write_jsonl(path, (rec.as_dict() for rec in self.records))
