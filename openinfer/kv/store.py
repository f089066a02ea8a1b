"""The KvStore: resolve a prompt's prefix across tiers, seal and retire pages into them,
and the flush barriers that say saved KV is visible to peers.

One implementation; the PR's behaviours are switches of :class:`StoreConfig`. Every
method that waits is a generator process on the runtime, so the same code runs on
simulated and on wall-clock time, and every wait on storage is bounded by a deadline
except where the switch under study removes the bound.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from simpy.events import Event, Process

from openinfer.errors import ConfigError
from openinfer.kv.config import StoreConfig
from openinfer.kv.flush import FlushBarriers, FlushOutcome
from openinfer.kv.hashing import BlockHash, block_hashes, salt_hash
from openinfer.kv.pool import BlockPool, PageRefs
from openinfer.kv.prefix import CacheScope, CancelProbe, KvPrefix, ResolveOutcome, ResolvePolicy
from openinfer.kv.probe import PrefixProbe, Reservation, commit_loaded_blocks, probe_prefix, \
    reserve_loaded_blocks
from openinfer.kv.request_kv import RequestKv
from openinfer.kv.saves import LatestSaves, SaveClass, SaveCursor
from openinfer.kv.stats import DegradeReason, StoreStats
from openinfer.kv.tier import QueryKind, QueryResult, Tier
from openinfer.runtime import Runtime

_HANDOFF = SaveClass.HANDOFF  # read per seal: a plain name, not an Enum class attribute


@dataclass
class Rank:
    """One GPU's pool and (optionally) its deeper tier."""

    pool: BlockPool
    tier: Tier | None = None
    pinned: int = 0
    loads: list[Process] = field(default_factory=list)
    loads_closed: bool = False    # a teardown barrier began: no restore may start after it
    saves: LatestSaves = field(default_factory=LatestSaves)  # judged for the prefixes reused


@dataclass(frozen=True)
class TeardownOutcome:
    loads_drained: bool   # every restore DMA landed (and none may start): the arena is safe from H2D
    saves_drained: bool   # every save landed and is visible: no D2H still reads the arena

    @property
    def arena_free(self) -> bool:
        return self.loads_drained and self.saves_drained


class KvStore:
    """Resolve / seal / retire / flush over a frozen table of ranks."""

    def __init__(self, rt: Runtime, ranks: Sequence[Rank] | dict[int, Rank],
                 config: StoreConfig | None = None) -> None:
        self.rt = rt
        self.config = config or StoreConfig()
        self._ranks: dict[int, Rank] = dict(ranks) if isinstance(ranks, dict) else dict(enumerate(ranks))
        if not self._ranks:
            raise ConfigError("store.ranks", [], "at least one rank")
        self.stats = StoreStats()
        self.resolve_enabled = True
        self.l1_retention_disabled = False
        self.flushes = FlushBarriers(rt, self.config, self.stats)
        self.observers: list[Callable[[str, dict[str, Any]], None]] = []
        self.flushes.observers = self.observers

    # -- ranks and toggles ------------------------------------------------------------
    def rank(self, r: int) -> Rank:
        rank = self._ranks.get(r)
        if rank is None:
            raise ConfigError("rank", r, f"one of {sorted(self._ranks)}")
        return rank

    def pool(self, r: int = 0) -> BlockPool:
        return self.rank(r).pool

    def set_resolve_enabled(self, enabled: bool) -> None:
        """False: every resolve answers ``KvPrefix.none()`` at once (prefix cache off)."""
        self.resolve_enabled = enabled

    def set_l1_retention_disabled(self, disabled: bool) -> None:
        """True: each resolve first evicts the inactive pool, so every hit is a host restore."""
        self.l1_retention_disabled = disabled

    def pinned_blocks(self, r: int = 0) -> int:
        """Pages referenced by in-flight saves. They are active (guarded), so already
        excluded from ``available_blocks()``; subtracting them again double-charges."""
        return self.rank(r).pinned

    def prompt_hashes(self, r: int, tokens: Sequence[int], scope: CacheScope) -> list[BlockHash]:
        return block_hashes(tokens, self.rank(r).pool.block_size, salt_hash(scope.cache_salt, scope.lora))

    # -- resolve ----------------------------------------------------------------------
    def resolve_prefix(self, r: int, req_id: str, tokens: Sequence[int], scope: CacheScope,
                       policy: ResolvePolicy, cancel: CancelProbe,
                       hashes: Sequence[BlockHash] | None = None) -> Process:
        """Spawn a resolve; its process value is the request's :class:`KvPrefix`."""
        rank = self.rank(r)
        return self.rt.spawn(self._resolve(r, rank, req_id, tokens, scope, policy, cancel, hashes))

    def _resolve(self, r: int, rank: Rank, req_id: str, tokens: Sequence[int], scope: CacheScope,
                 policy: ResolvePolicy, cancel: CancelProbe,
                 hashes: Sequence[BlockHash] | None) -> Generator[Event, Any, KvPrefix]:
        rt, cfg, stats, pool = self.rt, self.config, self.stats, rank.pool
        out = ResolveOutcome(started_at=rt.now())
        if not self.resolve_enabled:
            return self._done(KvPrefix.none(out))
        stats.resolves += 1
        if self.l1_retention_disabled:
            pool.evict_inactive()
        if self._cancelled_now(cancel):
            return self._cancelled(out, None)
        if hashes is None:
            hashes = block_hashes(tokens, pool.block_size, salt_hash(scope.cache_salt, scope.lora))
        probe = probe_prefix(pool, hashes, len(tokens), respect_floor=cfg.probe_respects_floor)
        if policy.full_pages:
            probe.include_final_block()
        out.gpu_blocks = min(probe.gpu_hit, probe.cacheable)
        wanted = probe.cpu_query_hashes()
        tier = rank.tier
        if tier is None or not wanted:
            return self._finish(r, probe, out)

        deadline = rt.now() + cfg.resolve_deadline_s
        while True:
            if self._cancelled_now(cancel):
                return self._cancelled(out, probe)
            if rank.loads_closed:   # no restore could start: do not query, lease or wait
                return self._finish(r, probe, out, DegradeReason.CLOSED)
            query = tier.query(req_id, wanted, policy.wait_for_full_hit)
            out.queries += 1
            answered = yield from rt.wait(query, deadline)
            if not answered:
                self._abandon_query(tier, query)
                return self._finish(r, probe, out, DegradeReason.DEADLINE_EXCEEDED)
            res: QueryResult = query.value
            if res.kind is QueryKind.FAILED:
                return self._finish(r, probe, out, DegradeReason.TIER_ERROR)
            if res.kind is QueryKind.HIT:
                assert res.lease is not None
                reservation = reserve_loaded_blocks(pool, res.blocks)
                if reservation is not None:
                    lease = res.lease
                    break
                tier.release(res.lease)  # a lease never rides a pool wait
                reason = DegradeReason.POOL_PRESSURE
            elif res.kind is QueryKind.MISS and not policy.wait_for_full_hit:
                return self._finish(r, probe, out)  # cold cache: not a degrade
            else:
                reason = DegradeReason.DEADLINE_EXCEEDED
            if rt.now() >= deadline:
                return self._finish(r, probe, out, reason)
            yield rt.sleep(min(cfg.requery_interval_s, deadline - rt.now()))
            if rt.now() >= deadline:  # report why we were waiting, not a query sent too late
                return self._finish(r, probe, out, reason)

        if self._cancelled_now(cancel):
            tier.release(lease)
            reservation.release()
            return self._cancelled(out, probe)
        if rank.loads_closed:   # closed while this resolve waited: a DMA now could outlive the arena
            tier.release(lease)
            reservation.release()
            return self._finish(r, probe, out, DegradeReason.CLOSED)
        for obs in self.observers:
            obs("load_started", dict(req_id=req_id, blocks=len(reservation), time=rt.now()))
        load = tier.load(lease, reservation.pages)
        if cfg.track_loads:
            rank.loads = [p for p in rank.loads if not p.triggered]
            rank.loads.append(load)
        landed = yield from rt.wait(load, deadline)  # cancel is not observed: DMA can't stop
        if not landed:
            stats.loads_abandoned += 1
            load.callbacks.append(lambda _ev, res=reservation: res.release())  # task owns it
            return self._finish(r, probe, out, DegradeReason.DEADLINE_EXCEEDED)
        if not load.value.ok:
            reservation.release()  # blocks never named
            return self._finish(r, probe, out, DegradeReason.TIER_ERROR)
        commit_loaded_blocks(probe, reservation, dedupe=cfg.commit_dedupes)
        stats.resolve_loaded_blocks += len(reservation)
        out.loaded_blocks = len(reservation)
        return self._finish(r, probe, out)

    def _cancelled_now(self, cancel: CancelProbe) -> bool:
        return self.config.observe_cancel and cancel.is_cancelled()

    def _abandon_query(self, tier: Tier, query: Event) -> None:
        """The resolve stopped waiting; a Hit that arrives later still holds a lease."""
        def settle(ev: Event) -> None:
            res: QueryResult = ev.value
            if res.kind is not QueryKind.HIT or res.lease is None:
                return
            if self.config.release_late_leases:
                tier.release(res.lease)
                self.stats.late_leases_released += 1
            else:
                self.stats.late_leases_leaked += 1  # pinned in the tier until its TTL
        query.callbacks.append(settle)

    def _finish(self, r: int, probe: PrefixProbe, out: ResolveOutcome,
                reason: DegradeReason | None = None) -> KvPrefix:
        if reason is not None:
            self.stats.degrade(reason)
            out.degraded = reason
        k = min(probe.held_blocks, probe.cacheable)
        if k == 0:
            probe.release()
            return self._done(KvPrefix.none(out))
        if self.config.truncate_holds:
            probe.truncate_held(k)
        self.stats.resolve_hits += 1
        self.stats.resolve_gpu_blocks += out.gpu_blocks
        return self._done(KvPrefix(k * probe.pool.block_size, probe, r, out))

    def _cancelled(self, out: ResolveOutcome, probe: PrefixProbe | None) -> KvPrefix:
        if probe is not None:
            probe.release()
        self.stats.degrade(DegradeReason.CANCELLED)
        out.degraded = DegradeReason.CANCELLED
        return self._done(KvPrefix.none(out))

    def _done(self, prefix: KvPrefix) -> KvPrefix:
        prefix.outcome.finished_at = self.rt.now()
        return prefix

    # -- write path -------------------------------------------------------------------
    def seal(self, r: int, kv: RequestKv, cursor: SaveCursor, cls: SaveClass) -> int:
        """Save every newly registered block of ``kv``; never blocks. Returns blocks sealed.

        Call only after the producing step has synchronised: the save reads the pages.
        Every completed block comes here, so the rank is read from the table at once
        (``rank`` only for the error of an unknown one).
        """
        rank = self._ranks.get(r) or self.rank(r)
        tier = rank.tier
        if tier is None:
            return 0
        if cursor.saved_blocks == 0 and kv.prefix_matched_blocks:
            cursor.saved_blocks = kv.prefix_matched_blocks  # saved by whoever computed them
            cursor.inherited = rank.saves.unsettled(kv.hashes[:kv.prefix_matched_blocks])
        start, end = cursor.saved_blocks, kv.registered
        if end <= start:
            return 0  # the common case on a decode step: no block completed
        cursor.saved_blocks = end
        pages = kv.pages[start:end]
        hashes = kv.hashes[start:end]
        guards = PageRefs.guard(rank.pool, pages)
        count = len(pages)
        rank.pinned += count
        self.stats.saves_submitted += 1
        rec = tier.save(pages, hashes, guards)
        cursor.records.append(rec)
        rank.saves.add(rec, rank.pool)
        for obs in self.observers:  # a literal, not dict(record=...): a keyword call per save
            obs("save_submitted", {"record": rec})
        if cls is _HANDOFF:
            cursor.pending.append(rec.done)
        # a partial, not a closure: a closure's variables would be cells made on every
        # call of seal (most calls return early), and read through them
        rec.done.callbacks.append(partial(self._settled, rank, count))
        return count

    def _settled(self, rank: Rank, count: int, ev: Event) -> None:
        """A save's outcome is in: its pages are no longer pinned by it."""
        rank.pinned -= count
        if not ev.value.ok:
            self.stats.saves_failed += 1

    def retire(self, r: int, kv: RequestKv, cursor: SaveCursor, cls: SaveClass) -> None:
        """Final seal, then release the request's pages — parked until Handoff saves settle."""
        self.seal(r, kv, cursor, cls)
        if not cursor.pending:
            kv.release()
            return
        self.stats.retires_parked += 1
        pending = list(cursor.pending)

        def park() -> Generator[Event, Any, None]:
            yield self.rt.all_of(pending)
            if any(not p.value.ok for p in pending):
                self.stats.handoff_failed += 1
            kv.release()
        self.rt.spawn(park())

    # -- barriers ---------------------------------------------------------------------
    def flush_saves(self, r: int = 0) -> Process:
        """Barrier over every save submitted before the call; value is a FlushOutcome."""
        return self.flushes.start(self.rank(r).tier, None)

    def flush_saves_then(self, r: int, then: Callable[[FlushOutcome], None]) -> None:
        """Run ``then`` once the barrier completes (and, when bounded, at its deadline)."""
        tier = self.rank(r).tier
        if tier is None:
            then(FlushOutcome(ok=True, started_at=self.rt.now(), finished_at=self.rt.now()))
            return
        self.flushes.start(tier, then)

    def flush_loads(self, r: int = 0, close: bool = True) -> Process:
        """Wait for every tracked restore DMA, abandoned ones included: the teardown barrier
        before the arenas are freed. ``close`` (HEAD's): no restore starts after it, since a
        resolve waiting at its query would otherwise start a DMA into memory about to go.
        ``settle`` waits without closing."""
        rank = self.rank(r)
        if close and self.config.track_loads:
            rank.loads_closed = True
        loads = [p for p in rank.loads if not p.triggered]

        def drain() -> Generator[Event, Any, int]:
            if loads:
                yield self.rt.all_of(loads)
            return len(loads)
        return self.rt.spawn(drain())

    def teardown(self, r: int = 0, limit_s: float = 5.0,
                 on_loads: Callable[[bool], None] | None = None) -> Process:
        """HEAD's teardown (spec 3.9): ``flush_loads`` (closing the tracker), then
        ``flush_saves``, each bounded by ``limit_s``. The value says which drained; where one
        did not, a DMA may still touch the arena, and the caller must leak it, not free it.
        ``on_loads`` hears the first phase's answer the moment it is known."""
        def both() -> Generator[Event, Any, TeardownOutcome]:
            loads_drained = yield from self.rt.wait(self.flush_loads(r), self.rt.now() + limit_s)
            if on_loads is not None:
                on_loads(loads_drained)
            saves = self.flush_saves(r)
            landed = yield from self.rt.wait(saves, self.rt.now() + limit_s)
            return TeardownOutcome(loads_drained, landed and saves.value.ok)
        return self.rt.spawn(both())

    def settle(self, r: int = 0) -> Process:
        """Every save submitted so far visible, then every restore landed: what "at rest"
        needs before quiescence is judged or the GPU copy is evicted (a Finished can
        precede its request's last D2H)."""
        def both() -> Generator[Event, Any, None]:
            yield self.flush_saves(r)
            yield self.flush_loads(r, close=False)
        return self.rt.spawn(both())

    # -- quiescence -------------------------------------------------------------------
    def quiescent(self, r: int = 0) -> list[str]:
        """What is still open on a rank (empty when the rank is at rest)."""
        rank = self.rank(r)
        issues = []
        if rank.pinned:
            issues.append(f"pinned={rank.pinned}")
        if any(not p.triggered for p in rank.loads):
            issues.append("loads in flight")
        if rank.tier is not None and rank.tier.open_leases():
            issues.append(f"open_leases={rank.tier.open_leases()}")
        if self.flushes.open_barriers:
            issues.append(f"open_barriers={self.flushes.open_barriers}")
        if rank.pool.available_blocks() != rank.pool.max_request_blocks():
            issues.append(f"available={rank.pool.available_blocks()} of {rank.pool.max_request_blocks()}")
        return issues


__all__ = ["KvStore", "Rank", "Reservation"]
