"""A cluster: several instances on one simulated clock, and the router in front of them.

Mixed replicas are picked by a routing policy (round robin, least loaded by each
engine's load snapshot, or prefix affinity with a least-loaded fallback). With prefill
and decode instances the router does what pegaflow-router does (spec §4.4): send the
prefill instance a copy with ``max_tokens = 1``, wait for its full answer — the KV-ready
signal — then send the original request to a decode instance, whose resolve pulls the
prefix over the peer tier. The client sees one stream per request, measured from its
arrival at the router.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any

from simpy.events import Event

from openinfer.errors import require
from openinfer.kv import MetaServer, PeerDirectory, block_hashes, salt_hash
from openinfer.runtime import OrderSpec, SimRuntime
from openinfer.scheduler import EventKind, GenerateRequest, RequestEvent, RequestHandle, Role
from openinfer.scheduler.request import TokenSink
from sim.world import PeerLink, World, WorldConfig, build_world

POLICIES = ("round_robin", "least_loaded", "prefix_affinity")


@dataclass(frozen=True)
class ClusterConfig:
    world: WorldConfig = field(default_factory=WorldConfig)
    mixed: int = 1
    prefill: int = 0
    decode: int = 0
    policy: str = "least_loaded"
    metaserver_rpc_s: float = 0.002

    def __post_init__(self) -> None:
        require(self.policy in POLICIES, "cluster.policy", self.policy, f"one of {', '.join(POLICIES)}")
        require(min(self.mixed, self.prefill, self.decode) >= 0, "cluster.mixed", self.mixed,
                "non-negative instance counts")
        require((self.prefill == 0) == (self.decode == 0), "cluster.prefill", self.prefill,
                "prefill and decode both > 0 (P/D) or both 0")
        require(self.mixed + self.prefill > 0, "cluster.mixed", self.mixed, "at least one instance")
        require(self.mixed == 0 or self.prefill == 0, "cluster.mixed", self.mixed,
                "0 when prefill/decode instances are set (the router sends every request through "
                "P/D, so mixed instances would get none)")
        require(isinstance(self.metaserver_rpc_s, (int, float)) and self.metaserver_rpc_s >= 0,
                "cluster.metaserver_rpc_s", self.metaserver_rpc_s, "a number >= 0 (seconds)")
        require(self.prefill == 0 or self.world.host_pages() >= 1, "world.host_tier_gib",
                self.world.host_tier_gib, "room for at least one page under P/D: a prefill "
                "instance hands its KV to the decode instance through its CPU tier (0 = no tier)")

    @property
    def has_host_tier(self) -> bool:
        """Whether the instances have a CPU tier, and so its ports (query, load, save, flush);
        under P/D the rule above makes sure they do."""
        return self.world.host_pages() >= 1


class Router:
    """Places requests on instances; runs the P/D two-phase protocol when configured."""

    def __init__(self, rt: SimRuntime, mixed: list[World], prefill: list[World], decode: list[World],
                 policy: str) -> None:
        self.rt = rt
        self.mixed, self.prefill, self.decode = mixed, prefill, decode
        self.policy = policy
        self._rr = 0
        self._next_id = 1
        self.placements: dict[str, int] = {}
        self.prompt_tokens: dict[str, int] = {}  # prompt tokens routed to each instance (tier hit rates)

    def submit(self, req: GenerateRequest, on_event: Callable[[RequestEvent], None] | None = None) -> RequestHandle:
        rid = self._next_id
        self._next_id += 1
        sink = TokenSink(rid, self.rt, on_event)
        handle = RequestHandle(rid, sink, req, submitted_at=self.rt.now())
        if self.prefill:
            self.rt.spawn(self._two_phase(req, sink))
        else:
            self._attach(self._place(self.mixed, req), req, sink)
        return handle

    def _two_phase(self, req: GenerateRequest, sink: TokenSink) -> Generator[Event, Any, None]:
        p = self._place(self.prefill, req)
        first = p.engine.submit(replace(req, max_tokens=1))
        term: RequestEvent = yield first.done
        if sink.is_closed():
            return
        if term.kind is not EventKind.FINISHED:
            sink.send(replace(term, req_id=sink.req_id))
            return
        self._attach(self._place(self.decode, req), req, sink)

    def _attach(self, w: World, req: GenerateRequest, sink: TokenSink) -> RequestHandle:
        """Submit to an instance and relay its stream to the client's sink."""
        box: list[RequestHandle] = []

        def forward(ev: RequestEvent) -> None:
            # a token (most of a stream) travels as (time, token): no event copy to keep
            sent = sink.send_token(ev.time, ev.token) if ev.kind is EventKind.TOKEN and ev.token is not None \
                else sink.send(replace(ev, req_id=sink.req_id))
            if not sent and box:
                box[0].cancel()  # the client is gone: stop the instance's work too
        inner = w.engine.submit(req, on_event=forward)
        box.append(inner)
        return inner

    def _place(self, pool: list[World], req: GenerateRequest) -> World:
        if self.policy == "round_robin":
            w = pool[self._rr % len(pool)]
            self._rr += 1
        elif self.policy == "prefix_affinity" and len(pool) > 1:
            bs = pool[0].pool.block_size
            first = block_hashes(req.prompt[:bs], bs, salt_hash(req.cache_salt, req.lora))
            w = pool[int.from_bytes(first[0][:8], "big") % len(pool)] if first else self._least(pool)
            if _load(w) > 2 * _load(self._least(pool)) + 4:
                w = self._least(pool)  # affinity gives way to a hot spot
        else:
            w = self._least(pool)
        self.placements[w.engine.name] = self.placements.get(w.engine.name, 0) + 1
        self.prompt_tokens[w.engine.name] = self.prompt_tokens.get(w.engine.name, 0) + len(req.prompt)
        return w

    @staticmethod
    def _least(pool: list[World]) -> World:
        return min(pool, key=_load)


def _load(w: World) -> int:
    snap = w.engine.snapshot()
    return snap.running + snap.waiting


@dataclass
class Cluster:
    config: ClusterConfig
    rt: SimRuntime
    instances: list[World]
    router: Router
    metaserver: MetaServer | None


def build_cluster(cfg: ClusterConfig) -> Cluster:
    wc = cfg.world
    rt = SimRuntime(wc.seed, OrderSpec(wc.order))
    meta = None
    peer = None
    if cfg.prefill:
        meta = MetaServer(rt, rpc_latency_s=cfg.metaserver_rpc_s)
        peer = PeerLink(meta, PeerDirectory())
    mixed = [build_world(wc, rt=rt, name=f"mixed{i}") for i in range(cfg.mixed)]
    prefill = [build_world(wc, rt=rt, name=f"prefill{i}", role=Role.PREFILL, peer=peer) for i in range(cfg.prefill)]
    decode = [build_world(wc, rt=rt, name=f"decode{i}", role=Role.DECODE, peer=peer) for i in range(cfg.decode)]
    router = Router(rt, mixed, prefill, decode, cfg.policy)
    return Cluster(cfg, rt, mixed + prefill + decode, router, meta)
