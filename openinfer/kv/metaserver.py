"""The MetaServer: who owns which block, for peers that want to pull it over RDMA.

Registrations arrive asynchronously after a producer's save becomes visible; lookups
answer the owner of the longest registered prefix. A peer directory stands in for the
network addresses, so a decode instance can reach the prefill instance that owns a block.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from simpy.events import Event, Process

from openinfer.errors import require
from openinfer.kv.hashing import BlockHash
from openinfer.kv.ports import Ports
from openinfer.runtime import Runtime


class MetaServer:
    """(namespace, block hash) -> owner, with an RPC latency and a fault port."""

    def __init__(self, rt: Runtime, rpc_latency_s: float = 0.0, ports: Ports | None = None) -> None:
        require(rpc_latency_s >= 0, "metaserver.rpc_latency_s", rpc_latency_s, "a number >= 0")
        self.rt = rt
        self.rpc_latency_s = rpc_latency_s
        self.ports = ports or Ports()
        self._owner: dict[tuple[str, BlockHash], str] = {}
        self.counters = dict(registers=0, registered_blocks=0, lookups=0, lookup_failures=0)

    def register(self, owner: str, namespace: str, hashes: list[BlockHash]) -> Process:
        return self.rt.spawn(self._register(owner, namespace, hashes))

    def _register(self, owner: str, namespace: str,
                  hashes: list[BlockHash]) -> Generator[Event, Any, str | None]:
        err = yield from self._rpc("registration")
        if err is None:
            for h in hashes:
                self._owner[(namespace, h)] = owner
            self.counters["registers"] += 1
            self.counters["registered_blocks"] += len(hashes)
        return err

    def lookup(self, namespace: str, hashes: list[BlockHash]) -> Process:
        """Answer (owner, n): the owner of hashes[0] and how many consecutive blocks it owns."""
        return self.rt.spawn(self._lookup(namespace, hashes))

    def _lookup(self, namespace: str,
                hashes: list[BlockHash]) -> Generator[Event, Any, tuple[str | None, int, str | None]]:
        self.counters["lookups"] += 1
        err = yield from self._rpc("metaserver")
        if err is not None:
            self.counters["lookup_failures"] += 1
            return None, 0, err
        owner = self._owner.get((namespace, hashes[0])) if hashes else None
        n = 0
        if owner is not None:
            for h in hashes:
                if self._owner.get((namespace, h)) != owner:
                    break
                n += 1
        return owner, n, None

    def is_registered(self, namespace: str, block_hash: BlockHash) -> bool:
        return (namespace, block_hash) in self._owner

    def _rpc(self, port: str) -> Generator[Event, Any, str | None]:
        if self.rpc_latency_s:
            yield self.rt.sleep(self.rpc_latency_s)
        if self.ports.active(port):
            err = yield from self.ports.through(port)
            return err
        return None


class PeerDirectory:
    """Name -> peer tier: the addresses a MetaServer answer points at."""

    def __init__(self) -> None:
        self._peers: dict[str, Any] = {}

    def add(self, name: str, tier: Any) -> None:
        require(name not in self._peers, "peer.name", name, "a name no other peer uses")
        self._peers[name] = tier

    def get(self, name: str) -> Any | None:
        return self._peers.get(name)
