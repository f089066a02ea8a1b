"""Shared scaffolding for the kv tests: a simulated rank with a gated host tier."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from openinfer.backend.transfer import InstantTransfer
from openinfer.kv import (CacheScope, Gate, HostTier, KvStore, NeverCancelled, Ports, Rank, RequestKv,
                          ResolvePolicy, SaveClass, SaveCursor, StoreConfig, salt_hash)
from openinfer.kv.hashing import BASE_SALT, block_hashes
from openinfer.kv.pool import BlockPool
from openinfer.runtime import SimRuntime

BS = 16
TIER_PORTS = ("query", "load", "save", "flush")


def prompt(n_tokens: int, family: int = 0) -> list[int]:
    """Deterministic tokens; different families share no block."""
    return [1 + family * 100_000 + i for i in range(n_tokens)]


def block_hash(family: int) -> bytes:
    """The hash of one full block of tokens that no other family's block shares."""
    (h,) = block_hashes([family * 1000 + i for i in range(BS)], BS, BASE_SALT)
    return h


class Cancel:
    """A CancelProbe the test flips."""

    def __init__(self, cancelled: bool = False) -> None:
        self.cancelled = cancelled

    def is_cancelled(self) -> bool:
        return self.cancelled


class World:
    """One rank: a BlockPool, an optional HostTier whose ports are gated, and a KvStore."""

    def __init__(self, num_blocks: int = 32, *, config: StoreConfig | None = None, tier: bool = True,
                 host_pages: int = 256, lease_ttl_s: float = 600.0, seed: int = 0,
                 gated: Sequence[str] = TIER_PORTS) -> None:
        self.rt = SimRuntime(seed=seed)
        self.pool = BlockPool(BS, num_blocks)
        self.ports = Ports()
        self.gates: dict[str, Gate] = {p: self.ports.install(p, Gate(self.rt)) for p in gated}
        self.transfer = InstantTransfer(self.rt)
        self.host = HostTier(self.rt, host_pages, self.transfer, lease_ttl_s=lease_ttl_s,
                             ports=self.ports) if tier else None
        self.store = KvStore(self.rt, [Rank(self.pool, self.host)], config or StoreConfig())
        self._req = 0

    # -- time -------------------------------------------------------------------------
    def advance(self, dt: float = 0.001) -> None:
        self.rt.run(until=self.rt.now() + dt)

    def run_until(self, t: float) -> None:
        if t > self.rt.now():
            self.rt.run(until=t)

    @contextmanager
    def gates_open(self, *names: str) -> Iterator[None]:
        names = names or tuple(self.gates)
        before = {n: self.gates[n].open for n in names}
        for n in names:
            self.gates[n].open_gate()
        try:
            yield
        finally:
            for n in names:
                self.gates[n].open = before[n]

    # -- requests ---------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int], max_tokens: int = 1, *, match: bool = False,
                scope: CacheScope = CacheScope()) -> RequestKv:
        kv = RequestKv(self.pool, tokens, max_tokens, salt_hash(scope.cache_salt, scope.lora))
        if match:
            kv.match_and_add_prefix()
        left = len(tokens) - kv.prefill_position
        assert kv.schedule_prefill(left), "pool too small for the test prompt"
        kv.apply_prefill(next_token=0)
        return kv

    def seed_host(self, tokens: Sequence[int], *, evict: bool = True) -> list[bytes]:
        """Act 1: prefill, seal, retire and flush a producer; its blocks end up in the host tier."""
        kv = self.prefill(tokens)
        hashes = [h for _, h in kv.registered_blocks()]
        with self.gates_open("save", "flush"):
            cursor = SaveCursor()
            self.store.seal(0, kv, cursor, SaveClass.CACHEABLE)
            self.store.retire(0, kv, cursor, SaveClass.CACHEABLE)
            flush = self.store.flush_saves(0)
            self.advance()
            assert flush.triggered and flush.value.ok
        assert all(self.host.contains(h) for h in hashes)
        if evict:
            self.pool.evict_inactive()
        return hashes

    def resolve(self, tokens: Sequence[int], *, policy: ResolvePolicy = ResolvePolicy(),
                cancel=None, scope: CacheScope = CacheScope()):
        self._req += 1
        return self.store.resolve_prefix(0, f"req-{self._req}", tokens, scope, policy,
                                         cancel or NeverCancelled())

    def quiescent(self) -> list[str]:
        return self.store.quiescent(0)
