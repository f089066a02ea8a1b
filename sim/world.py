"""One simulated serving instance, built from a small config, run to completion.

Wiring (the same objects the real backend uses, except the executor and the copies):
BlockPool (sized from HBM by spec §1.2 unless ``num_blocks`` is given) → HostTier on a
QueuedTransfer (or ModeledTransfer) (the CPU tier; ``host_tier_gib=0`` turns it off) → KvStore with the
variant's store config → SimExecutor timed by the roofline (or any step model) → Engine
with the variant's scheduler switches. ``run_world`` drives a workload through a Client
until the client's ``all_done`` event (or a hang guard on simulated time) and returns a
JSON-ready report; the same config and seed give a byte-identical report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from openinfer.errors import require
from openinfer.kv import BlockPool, HostTier, KvStore, MetaServer, PeerDirectory, PeerTier, Rank
from openinfer.kv.config import StoreConfig
from openinfer.kv.pool import check_block_size
from openinfer.runtime import OrderSpec, SimRuntime
from openinfer.scheduler import Engine, Role, SchedulerConfig, SchedulerSwitches
from openinfer.variants import variant as get_variant
from sim.client import AbortSpec, Client, check_output_mode
from sim.copy_engine import LinkSpec, ModeledTransfer
from sim.copy_ledger import CopyLedger
from sim.copy_queue import QueuedTransfer
from sim.gpu_executor import SimExecutor
from sim.host_thread import HostClockRuntime, HostHeldExecutor
from sim.gc_tuning import relaxed_gc
from sim.hardware import GiB, HardwareSpec, preset as hardware_preset
from sim.metrics import cache_summary, first_messages, status_counts, summarize
from sim.model_geometry import ModelGeometry, preset as model_preset
from sim.monitors import InvariantViolation, Monitor, MonitorConfig, engines_drained, timeline_tail
from sim.step_model import RooflineStepModel, StepModel
from sim.timeline import TimelineSampler
from sim.workloads import Workload

TRANSFERS = ("queued", "modeled")
HOSTS = ("free", "held")
MIN_BLOCKS = 64  # spec §1.2: num_blocks = max(64, budget / bytes_per_block)


@dataclass(frozen=True)
class WorldConfig:
    variant: str = "fixed"
    model: str = "qwen3-4b"
    hardware: str = "h200"
    block_size: int = 16
    num_blocks: int | None = None        # None: sized from hardware memory (spec §1.2)
    host_tier_gib: float = 8.0           # 0: no CPU tier
    prefix_cache: bool = True
    max_prefill_tokens: int = 1024
    max_decode_batch: int = 256
    max_context_tokens: int = 40960
    decode_full_hit: bool = False        # a decode instance's resolve waits for the full hit (SchedulerConfig)
    resolve_deadline_s: float = 15.0     # how long a resolve may wait before it degrades (StoreConfig)
    seed: int = 0
    order: str = "fifo"                  # tie-break among simultaneous events: fifo / random / pct
    output_mode: str = "max_tokens"      # max_tokens (+ignore_eos) or eos (EOS at output_len)
    max_tokens_cap: int = 4096           # eos mode: the max_tokens sent
    abort_probability: float = 0.0
    abort_after_s: float = 1.0
    timeline_every: int = 16
    timeline_max_rows: int = 256
    max_sim_s: float = 24 * 3600.0       # hang guard on simulated time
    transfer: str = "queued"             # queued (one event per copy) or modeled (a process per copy)
    monitors: bool = True                # safety/liveness invariants on every scheduler pass
    monitor_pool_every: int = 4096       # full pool.check() every N passes (O(pages)); an O(changes) audit runs every pass
    host: str = "free"                   # held: a step holds the engine's host thread, as the real
                                         # CUDA executor does (sim/host_thread.py); needs transfer=queued
    copies_after_step: bool = False      # a D2H/H2D submitted mid-step starts when that step ends,
                                         # as the CUDA executor orders its copy streams (sim/copy_engine.py)

    def __post_init__(self) -> None:
        require(self.num_blocks is None or (isinstance(self.num_blocks, int) and self.num_blocks >= 2),
                "world.num_blocks", self.num_blocks, "null (size from memory) or an int >= 2")
        require(isinstance(self.host_tier_gib, (int, float)) and self.host_tier_gib >= 0, "world.host_tier_gib",
                self.host_tier_gib, "a number >= 0 (0 = no CPU tier)")
        require(self.max_sim_s > 0, "world.max_sim_s", self.max_sim_s, "a number > 0 (seconds)")
        require(self.transfer in TRANSFERS, "world.transfer", self.transfer, f"one of {', '.join(TRANSFERS)}")
        require(isinstance(self.timeline_every, int) and self.timeline_every >= 1, "world.timeline_every",
                self.timeline_every, "an int >= 1")
        require(self.host in HOSTS, "world.host", self.host, f"one of {', '.join(HOSTS)}")
        require(self.host == "free" or self.transfer == "queued", "world.transfer", self.transfer,
                "queued when world.host=held (the real DMA starts when the copy is submitted)")
        require(isinstance(self.timeline_max_rows, int) and self.timeline_max_rows >= 2,
                "world.timeline_max_rows", self.timeline_max_rows, "an int >= 2 (the first and last sample)")
        # Rules owned by the objects build_world makes from these fields: making them here
        # checks a config when it is written, not when a run builds its world.
        check_output_mode(self.output_mode, "world.output_mode")
        check_block_size(self.block_size, "world.block_size")
        OrderSpec(self.order)
        self.scheduler_config()
        StoreConfig(resolve_deadline_s=self.resolve_deadline_s)
        AbortSpec(self.abort_probability, self.abort_after_s)
        MonitorConfig(check_pool_every=self.monitor_pool_every)

    def host_pages(self, geo: ModelGeometry | None = None) -> int:
        """Pages of the CPU tier (0: none): ``host_tier_gib`` over one block's KV bytes."""
        geo = geo or model_preset(self.model)
        return int(self.host_tier_gib * GiB // geo.kv_bytes_per_block(self.block_size))

    def scheduler_config(self, role: Role = Role.MIXED, switches: SchedulerSwitches | None = None
                         ) -> SchedulerConfig:
        return SchedulerConfig(max_prefill_tokens=self.max_prefill_tokens, max_decode_batch=self.max_decode_batch,
                               max_context_tokens=self.max_context_tokens, prefix_cache=self.prefix_cache,
                               role=role, decode_full_hit=self.decode_full_hit,
                               switches=switches or SchedulerSwitches())


@dataclass
class World:
    config: WorldConfig
    rt: SimRuntime
    hardware: HardwareSpec
    model: ModelGeometry
    step_model: StepModel
    pool: BlockPool
    transfer: ModeledTransfer | QueuedTransfer
    host: HostTier | None
    store: KvStore
    executor: SimExecutor
    engine: Engine
    timeline: TimelineSampler
    sizing: dict[str, Any] = field(default_factory=dict)


def size_pool(hw: HardwareSpec, model: ModelGeometry, block_size: int, max_prefill_tokens: int) -> dict[str, Any]:
    """Spec §1.2: KV budget after weights, the profiled dummy unified step (one prefill row
    of max_prefill_tokens + 255 decode rows) and the margin; at least 64 blocks."""
    per_block = model.kv_bytes_per_block(block_size)
    budget = hw.kv_budget_bytes(model.weight_bytes, max_prefill_tokens + 255)
    return dict(kv_budget_bytes=budget, bytes_per_block=per_block,
                num_blocks=max(MIN_BLOCKS, budget // per_block), sized_from="hardware.memory_gib")


@dataclass
class PeerLink:
    """What an instance of a P/D cluster shares with the others: MetaServer and directory."""

    metaserver: MetaServer
    directory: PeerDirectory
    namespace: str = "qwen3"


def build_world(cfg: WorldConfig, *, hardware: HardwareSpec | None = None, model: ModelGeometry | None = None,
                step_model: StepModel | None = None, rt: SimRuntime | None = None, name: str = "sim0",
                role: Role = Role.MIXED, peer: PeerLink | None = None) -> World:
    """One serving instance. Several built on one runtime with a shared PeerLink form a
    cluster (``sim.cluster``); the scheduler and store code are the same either way."""
    v = get_variant(cfg.variant)
    hw = hardware or hardware_preset(cfg.hardware)
    geo = model or model_preset(cfg.model)
    held = cfg.host == "held"
    rt = rt or (HostClockRuntime if held else SimRuntime)(cfg.seed, OrderSpec(cfg.order))
    require(not held or isinstance(rt, HostClockRuntime), "world.host", cfg.host,
            "free, or a HostClockRuntime passed as rt (a held step holds its runtime's host)")
    if cfg.num_blocks is None:
        sizing = size_pool(hw, geo, cfg.block_size, cfg.max_prefill_tokens)
    else:
        sizing = dict(num_blocks=cfg.num_blocks, bytes_per_block=geo.kv_bytes_per_block(cfg.block_size),
                      sized_from="world.num_blocks")
    pool = BlockPool(cfg.block_size, int(sizing["num_blocks"]), entitlement=v.pool_entitlement)
    page_bytes = geo.kv_bytes_per_block(cfg.block_size)
    transfer_cls = QueuedTransfer if cfg.transfer == "queued" else ModeledTransfer
    transfer = transfer_cls(
        rt, page_bytes,
        d2h=LinkSpec(hw.d2h_gib_s, hw.copy_latency_s, hw.copy_engines),
        h2d=LinkSpec(hw.h2d_gib_s, hw.copy_latency_s, hw.copy_engines),
        peer=LinkSpec(hw.peer_gib_s, hw.peer_latency_s), connect_s=hw.peer_connect_s)
    if cfg.monitors:
        transfer.ledger = CopyLedger(rt, name)
    host_pages = cfg.host_pages(geo)
    host: HostTier | None = None
    if peer is not None:   # ClusterConfig asks for >= 1 page: the P/D handoff goes through it
        host = PeerTier(rt, host_pages, transfer, name=name, namespace=peer.namespace,
                        metaserver=peer.metaserver, directory=peer.directory, inline_saves=not held)
    elif host_pages > 0:
        host = HostTier(rt, host_pages, transfer, inline_saves=not held)  # held: saves start as the real ones do
    sizing["host_pages"] = host_pages
    store = KvStore(rt, [Rank(pool, host)], v.store_config(resolve_deadline_s=cfg.resolve_deadline_s))
    sm = step_model or RooflineStepModel(geo, hw)
    executor = (HostHeldExecutor if held else SimExecutor)(rt, sm, vocab_size=geo.vocab_size, seed=cfg.seed)
    sched = cfg.scheduler_config(role, v.scheduler_switches())
    if cfg.copies_after_step:
        transfer.after_compute = executor.compute_free_at
    engine = Engine(rt, store, executor, sched, name=name)
    timeline = TimelineSampler(engine, store, every=cfg.timeline_every, max_rows=cfg.timeline_max_rows)
    return World(cfg, rt, hw, geo, sm, pool, transfer, host, store, executor, engine, timeline, sizing)


def make_client(w: World) -> Client:
    cfg = w.config
    return Client(w.rt, w.engine.submit, output_mode=cfg.output_mode,
                  stop_after=w.executor.stop_after if cfg.output_mode == "eos" else None,
                  max_tokens_cap=cfg.max_tokens_cap,
                  abort=AbortSpec(cfg.abort_probability, cfg.abort_after_s))


def run_world(w: World, workload: Workload, client: Client | None = None) -> dict[str, Any]:
    """Run ``workload`` until every request it sent has ended; the report dict."""
    client = client or make_client(w)
    rt = w.rt
    rt.spawn(workload.run(rt, client))
    guard = rt.sleep(w.config.max_sim_s)
    monitor = Monitor(w.engine, w.store, heal_s=0.0, timeline=timeline_tail(),
                      config=MonitorConfig(check_pool_every=w.config.monitor_pool_every)) \
        if w.config.monitors else None
    violation = None
    try:
        with relaxed_gc():
            rt.run(until=rt.any_of([client.all_done, guard]))
        if monitor is not None and client.all_done.triggered:
            # The last request's Finished can precede its last save's D2H: let the copies
            # land (a flush barrier) before quiescence is judged, or every run whose final
            # step sealed a block would report pinned pages that are merely in flight.
            drained = engines_drained(rt, [w.engine])   # aborts the engine has yet to see
            if drained is not None:
                rt.run(until=rt.any_of([drained, guard]))
            rt.run(until=rt.any_of([w.store.settle(0), guard]))
            monitor.check_end(rt.now())
    except InvariantViolation as err:
        violation = dict(invariant=err.name, time_s=err.time, detail=err.detail)
    out = report(w, workload, client, timed_out=not client.all_done.triggered)
    out["violation"] = violation
    return out


def _round(x: float, nd: int = 6) -> float:
    return round(x, nd)


def report(w: World, workload: Workload, client: Client, *, timed_out: bool) -> dict[str, Any]:
    records = sorted(client.records, key=lambda r: r.req_id)
    duration = client.last_end_s  # the run starts at t=0 with the first send
    host = w.host
    links = {name: dict(bytes=link.bytes_moved, copies=link.copies, busy_s=_round(link.busy_s))
             for name, link in (("d2h", w.transfer.d2h_link), ("h2d", w.transfer.h2d_link))}
    ex = w.executor
    end = w.rt.now()
    return {
        "config": asdict(w.config),
        "hardware": w.hardware.to_dict(),
        "model": w.model.to_dict(),
        "sizing": w.sizing,
        "workload": workload.describe(),
        "metrics": summarize(records, client.itl, duration),
        "outcomes": status_counts(records),
        "first_unfinished": first_messages(records),
        "sent": client.sent,
        "cache": cache_summary(records).as_dict(),
        "store": w.store.stats.as_dict(),
        "host_tier": dict(host.counters, resident_blocks=host.resident_blocks(), capacity=host.capacity)
        if host is not None else None,
        "pool": dict(asdict(w.pool.counters), total_blocks=w.pool.total_blocks(),
                     available_at_end=w.pool.available_blocks()),
        "transfer": links,
        "engine": dict(steps=w.engine.steps, ticks=w.engine.ticks,
                       steps_by_kind=ex.steps_by_kind,
                       busy_s=_round(ex.busy_s),
                       busy_by_kind={k: _round(v) for k, v in ex.busy_by_kind.items()},
                       busy_fraction=_round(ex.busy_s / duration) if duration > 0 else 0.0),
        "timeline": w.timeline.as_dict(),
        "sim": dict(end_s=_round(end), events_processed=w.rt.env.events_processed, all_done=not timed_out,
                    timed_out=timed_out, quiescent_issues=w.store.quiescent(0)),
    }
