"""Run one hunt scenario under the monitors: build, drive the workload, settle, check.

The run stops at the first violated invariant (the monitors raise from inside the event
that broke it). Otherwise it runs until every request has an answer or was cancelled and
the engine is idle, then settles for a while (saves, barriers, parked retires), tears the
store down (``flush_loads``, bounded) and runs the end-of-run checks.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any

from openinfer.backend.copy_exclusion import PAGE, READS
from openinfer.backend.fake_executor import FakeExecutor
from openinfer.kv import (BlockPool, HostTier, KvStore, MetaServer, PeerDirectory, PeerTier, Rank,
                          RequestKv, SaveClass, SaveCursor, salt_hash)
from openinfer.runtime import OrderSpec, SimRuntime
from openinfer.scheduler import (ControlCommand, Engine, GenerateRequest, RequestHandle, Role,
                                 SchedulerConfig)
from openinfer.variants import variant
from sim.copy_engine import LinkSpec, ModeledTransfer
from sim.copy_ledger import CopyLedger
from sim.faults import METASERVER_PORTS, FaultHook, last_heal
from sim.hunt.scenario import Scenario
from sim.monitors import InvariantViolation, Monitor, MonitorConfig

PAGE_BYTES = 147_456 * 16  # a Qwen3-4B page of 16 tokens: copies take realistic time
SETTLE_S = 8.0
TEARDOWN_S = 5.0


@dataclass
class RunResult:
    scenario: Scenario
    violation: InvariantViolation | None
    timeline: list[tuple[float, str]] = field(default_factory=list)
    sim_events: int = 0
    end_s: float = 0.0
    fault_hits: list[int] = field(default_factory=list)  # operations each fault touched

    @property
    def invariant(self) -> str | None:
        return self.violation.name if self.violation else None

    @property
    def events(self) -> int:
        """Readable timeline entries (arrivals, admissions, steps, terminals, faults...)."""
        return len(self.timeline)


@dataclass
class _World:
    rt: SimRuntime
    pool: BlockPool
    tier: HostTier
    store: KvStore
    engine: Engine
    executor: FakeExecutor
    metaserver: MetaServer | None


def build_world(sc: Scenario) -> _World:
    v = replace(variant(sc.variant), flush_deadline_s=sc.flush_deadline_s)
    rt = SimRuntime(sc.seed, OrderSpec(sc.order))
    pool = BlockPool(sc.block_size, sc.num_blocks, entitlement=v.pool_entitlement)
    link = LinkSpec(bandwidth_gib_s=20.0, latency_s=20e-6)
    transfer = ModeledTransfer(rt, PAGE_BYTES, d2h=link, h2d=link, peer=LinkSpec(21.7, 3e-3), connect_s=0.05)
    transfer.ledger = CopyLedger(rt)
    meta = None
    if sc.peer:
        meta = MetaServer(rt, rpc_latency_s=0.002)
        tier: HostTier = PeerTier(rt, sc.host_blocks, transfer, name="p0", namespace="qwen3",
                                  metaserver=meta, directory=PeerDirectory())
    else:
        tier = HostTier(rt, sc.host_blocks, transfer)
    store = KvStore(rt, [Rank(pool, tier)], v.store_config(resolve_deadline_s=sc.resolve_deadline_s))
    ex = FakeExecutor(rt, vocab_size=1000, eos_token=999, seed=sc.seed, max_loras=2)
    for name in sc.adapters:
        ex.load_adapter(name)
    cfg = SchedulerConfig(max_prefill_tokens=sc.max_prefill_tokens, max_context_tokens=sc.max_context_tokens,
                          role=Role(sc.role), lora_control=sc.lora_control, idle_tick_s=0.002,
                          switches=v.scheduler_switches())
    engine = Engine(rt, store, ex, cfg, name="e0")
    return _World(rt, pool, tier, store, engine, ex, meta)


def _seed_host(w: _World, prefixes: list[list[int]]) -> None:
    """Prefixes already in the CPU tier (saved earlier, evicted from the GPU since)."""
    for prefix in prefixes:
        kv = RequestKv(w.pool, prefix, 1, salt_hash())
        if not kv.schedule_prefill(len(prefix)):
            kv.release()
            continue
        kv.apply_prefill(next_token=0)
        w.store.seal(0, kv, SaveCursor(), SaveClass.CACHEABLE)
        kv.release()
    if prefixes:
        w.rt.run_process(_wait(w.store.flush_saves(0)))
        w.pool.evict_inactive()


def _wait(ev: Any) -> Generator[Any, Any, Any]:
    result = yield ev
    return result


def _install_faults(w: _World, sc: Scenario, mon: Monitor) -> list[FaultHook]:
    hooks = []
    for i, spec in enumerate(sc.faults):
        hook = FaultHook(w.rt, spec, f"fault{i}")
        hooks.append(hook)
        if spec.port == "step":
            w.executor.step_failure = hook.step_failure
        elif spec.port in METASERVER_PORTS:
            if w.metaserver is not None:
                w.metaserver.ports.install(spec.port, hook)
        else:
            w.tier.ports.install(spec.port, hook)
        mon.note(f"fault {spec.describe()}")
    return hooks


def _workload(w: _World, sc: Scenario, handles: list[RequestHandle]) -> Generator[Any, Any, None]:
    items = [(r.t, 0, i) for i, r in enumerate(sc.requests)] + [(c.t, 1, i) for i, c in enumerate(sc.controls)]
    for t, kind, i in sorted(items):
        if t > w.rt.now():
            yield w.rt.sleep(t - w.rt.now())
        if kind == 0:
            r = sc.requests[i]
            h = w.engine.submit(GenerateRequest(list(r.prompt), r.max_tokens, lora=r.lora, echo=r.echo,
                                                logprobs=r.logprobs))
            handles.append(h)
            if r.cancel_at is not None:
                w.rt.spawn(_cancel_at(w, h, r.cancel_at))
        else:
            c = sc.controls[i]
            w.engine.control(ControlCommand(c.op, c.adapter))


def _cancel_at(w: _World, h: RequestHandle, t: float) -> Generator[Any, Any, None]:
    if t > w.rt.now():
        yield w.rt.sleep(t - w.rt.now())
    if h.terminal_event() is None:
        h.cancel()


def run_scenario(sc: Scenario, monitor_config: MonitorConfig | None = None) -> RunResult:
    w = build_world(sc)
    heal = last_heal(sc.faults)
    timeline: list[tuple[float, str]] = []
    mcfg = monitor_config or MonitorConfig(terminal_bound_s=sc.resolve_deadline_s + sc.flush_deadline_s + 10.0)
    mon = Monitor(w.engine, w.store, heal, mcfg, timeline)
    result = RunResult(sc, None, timeline)
    hooks: list[FaultHook] = []
    try:
        _seed_host(w, sc.seeded_prefixes)
        hooks = _install_faults(w, sc, mon)
        handles: list[RequestHandle] = []
        n_total = len(sc.requests)
        w.rt.spawn(_workload(w, sc, handles))
        if sc.teardown_at is not None:
            w.rt.spawn(_teardown_at(w, mon, sc.teardown_at))
        last_arrival = max((r.t for r in sc.requests), default=0.0)
        horizon = max(last_arrival, heal if heal != float("inf") else last_arrival) + mon.cfg.terminal_bound_s + 1
        while w.rt.now() < horizon:
            w.rt.run(until=w.rt.now() + 0.25)
            answered = all(h.terminal_event() is not None or h.sink.is_closed() for h in handles)
            if len(handles) == n_total and answered and not w.engine.has_work() and w.rt.now() >= heal:
                break
        w.rt.run(until=w.rt.now() + SETTLE_S)
        mon.check_end(w.rt.now())
        w.rt.run_process(_teardown(w, mon))
    except InvariantViolation as v:
        result.violation = v
    result.sim_events = w.rt.env.events_processed
    result.fault_hits = [h.hits for h in hooks]
    result.end_s = w.rt.now()
    return result


def _teardown(w: _World, mon: Monitor) -> Generator[Any, Any, None]:
    """HEAD's bounded teardown (loads, then saves): what it says drained must have landed."""
    loads = mon.loads_now()
    ledger = getattr(w.tier.transfer, "ledger", None)
    saves = ledger.in_flight(PAGE, READS) if ledger is not None else set()

    def loads_phase(drained: bool) -> None:
        mon.note(f"teardown: flush_loads drained={drained}")
        if drained:
            mon.check_teardown(loads)

    out = yield w.store.teardown(0, TEARDOWN_S, on_loads=loads_phase)
    mon.note(f"teardown: flush_saves drained={out.saves_drained}")
    if out.saves_drained and ledger is not None:
        mon.check_teardown_saves(ledger.still_in_flight(saves))


def _teardown_at(w: _World, mon: Monitor, t: float) -> Generator[Any, Any, None]:
    if t > w.rt.now():
        yield w.rt.sleep(t - w.rt.now())
    yield from _teardown(w, mon)
