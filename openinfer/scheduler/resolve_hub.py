"""ResolveHub: prefixes resolve at intake, on the store's runtime, while requests queue.

Routing a request spawns ``resolve_prefix`` for it; while that runs the request is owned
by the hub — in none of the scheduler's queues — which is exactly the window in which a
control command can overtake it (F4) and in which several holds can land at once (F1).
Settled requests come back through ``drain`` in completion order.
"""

from __future__ import annotations

from openinfer.kv.prefix import CacheScope, KvPrefix, ResolvePolicy
from openinfer.kv.store import KvStore
from openinfer.runtime import Runtime
from openinfer.scheduler.records import PendingRequest


class ResolveHub:
    def __init__(self, rt: Runtime, store: KvStore, rank: int, policy: ResolvePolicy) -> None:
        self.rt = rt
        self.store = store
        self.rank = rank
        self.policy = policy
        self._in_flight: dict[int, PendingRequest] = {}
        self._ready: list[PendingRequest] = []

    def in_flight(self) -> int:
        return len(self._in_flight)

    def ready_count(self) -> int:
        """Settled, not yet drained into the queue: still waiting, for the load snapshot."""
        return len(self._ready)

    def route(self, p: PendingRequest) -> None:
        scope = CacheScope(p.req.cache_salt, p.req.lora)
        proc = self.store.resolve_prefix(self.rank, str(p.id), p.req.prompt, scope, self.policy,
                                         p.sink, hashes=p.hashes)
        self._in_flight[p.id] = p
        proc.callbacks.append(lambda ev, p=p: self._settled(p, ev.value))

    def _settled(self, p: PendingRequest, prefix: KvPrefix) -> None:
        del self._in_flight[p.id]
        p.kv_prefix = prefix
        self._ready.append(p)

    def drain(self) -> list[PendingRequest]:
        ready, self._ready = self._ready, []
        return ready

    def pending(self) -> list[PendingRequest]:
        return list(self._in_flight.values())
