"""Run a workload through a cluster's router, with faults at named ports and the monitors on.

``sim.world.run_world`` drives one instance; a P/D cluster needs the same loop over the
router, a monitor per instance (each watches its own engine and store rank) and faults
placed on a port of one instance, of all of them, or of the shared MetaServer. A monitor
violation stops the run where it happened; the report then carries it as a finding next to
what had finished by then, because "pr829 deadlocks after 37 requests" is a result, not a
crash.

The run advances in chunks of simulated time (``chunk_s``) whether or not anyone watches,
so a progress callback (a bar in the entry point) cannot change the schedule: the same
config and seed give the same report with or without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from openinfer.errors import require
from sim.gc_tuning import relaxed_gc
from sim.client import AbortSpec, Client
from sim.cluster import Cluster
from sim.faults import METASERVER_PORTS, FaultHook, FaultSpec, last_heal
from sim.metrics import cache_summary, first_messages, status_counts, summarize
from sim.monitors import InvariantViolation, Monitor, MonitorConfig, Timeline, engines_drained, timeline_tail
from sim.workloads import Workload

Progress = Callable[[float, int, int], None]  # (simulated s, requests ended, requests sent)


@dataclass(frozen=True)
class PlacedFault:
    """A fault and where it goes: an instance name (``prefill0``, ``decode0``) or ``all``.
    Registration and MetaServer ports live on the shared MetaServer whatever the target."""

    spec: FaultSpec
    target: str = "all"


def install_faults(cluster: Cluster, faults: Sequence[PlacedFault]) -> list[FaultHook]:
    names = [w.engine.name for w in cluster.instances]
    hooks: list[FaultHook] = []
    for i, pf in enumerate(faults):
        require(pf.target == "all" or pf.target in names, "faults.target", pf.target,
                f"all or one of {', '.join(names)}")
        hook = FaultHook(cluster.rt, pf.spec, f"fault{i}")
        hooks.append(hook)
        port = pf.spec.port
        if port in METASERVER_PORTS:
            require(cluster.metaserver is not None, "faults.port", port,
                    "a port of an instance (the cluster has no MetaServer without P/D)")
            assert cluster.metaserver is not None
            cluster.metaserver.ports.install(port, hook)
            continue
        installed = False
        for w in cluster.instances:
            if pf.target not in ("all", w.engine.name):
                continue
            if port == "step":
                w.executor.step_failure = hook.step_failure
                installed = True
            elif w.host is not None:
                w.host.ports.install(port, hook)
                installed = True
        # A fault the run would never see is an error, not a quiet no-op.
        require(installed, "faults.port", port,
                "step, or a CPU tier for the fault's instances (world.host_tier_gib > 0)")
    return hooks


class NamedMonitor(Monitor):
    """A Monitor whose violations say which instance of the cluster broke the invariant."""

    def fail(self, name: str, detail: str) -> None:
        err = InvariantViolation(name, self.rt.now(), detail)
        err.instance = self.engine.name  # type: ignore[attr-defined]
        raise err


def _last_instance(timeline: Timeline, cluster: Cluster) -> str | None:
    """Checks that raise outside ``Monitor.fail`` leave no name: take the latest timeline entry's."""
    names = {w.engine.name for w in cluster.instances}
    for _, text in reversed(timeline):
        head = text.split(":", 1)[0]
        if head in names:
            return head
    return None


def run_cluster(cluster: Cluster, workload: Workload, faults: Sequence[PlacedFault] = (), *,
                abort: AbortSpec | None = None, monitors: bool = True,
                monitor_config: MonitorConfig | None = None, chunk_s: float = 1.0,
                settle_s: float = 10.0, on_progress: Progress | None = None) -> dict[str, Any]:
    """Drive ``workload`` through the router until every request ended (or a monitor fired,
    or the world's ``max_sim_s`` hang guard passed); the JSON-ready report."""
    require(chunk_s > 0, "chunk_s", chunk_s, "a number > 0 (simulated seconds)")
    rt = cluster.rt
    wc = cluster.config.world
    specs = [pf.spec for pf in faults]
    heal = last_heal(specs)
    client = Client(rt, cluster.router.submit, abort=abort or AbortSpec(wc.abort_probability, wc.abort_after_s))
    timeline = timeline_tail()
    mons = [NamedMonitor(w.engine, w.store, heal_s=heal, config=monitor_config or MonitorConfig(
        check_pool_every=wc.monitor_pool_every), timeline=timeline) for w in cluster.instances] if monitors else []
    hooks = install_faults(cluster, faults)
    for s in specs:
        timeline.append((0.0, f"fault {s.describe()}"))
    rt.spawn(workload.run(rt, client))
    violation: dict[str, Any] | None = None
    try:
        with relaxed_gc():
            while not client.all_done.triggered and rt.now() < wc.max_sim_s:
                rt.run(until=rt.any_of([client.all_done, rt.sleep(min(chunk_s, wc.max_sim_s - rt.now()))]))
                if on_progress is not None:
                    on_progress(rt.now(), len(client.records), client.sent)
        if client.all_done.triggered:
            # A Finished can precede its last save's D2H and registration: let every store
            # settle (as run_world does), for at most settle_s, before quiescence is judged.
            drained = engines_drained(rt, [w.engine for w in cluster.instances])
            if drained is not None:   # aborts the engines have yet to see
                rt.run(until=rt.any_of([drained, rt.sleep(settle_s)]))
            settled = rt.all_of([w.store.settle(0) for w in cluster.instances])
            rt.run(until=rt.any_of([settled, rt.sleep(settle_s)]))
            for m in mons:
                m.check_end(rt.now())
    except InvariantViolation as err:
        violation = dict(invariant=err.name, time_s=err.time, detail=err.detail,
                         instance=getattr(err, "instance", None) or _last_instance(timeline, cluster),
                         timeline_tail=[[round(t, 6), text] for t, text in list(timeline)[-12:]])
    return cluster_report(cluster, workload, client, hooks, violation)


def _tier_hits(w: Any, prompt_tokens: int) -> dict[str, Any]:
    """Where an instance's prompt tokens came from: its GPU radix, its own CPU tier, a peer."""
    bs = w.pool.block_size
    st = w.store.stats
    remote = (w.host.counters.get("remote_blocks", 0) if w.host is not None else 0)
    loaded = st.resolve_loaded_blocks
    tokens = dict(gpu=st.resolve_gpu_blocks * bs, host=max(0, loaded - remote) * bs, peer=min(remote, loaded) * bs)
    rates = {k: (v / prompt_tokens if prompt_tokens else 0.0) for k, v in tokens.items()}
    return dict(prompt_tokens=prompt_tokens, hit_tokens=tokens, hit_rate=rates)


def cluster_report(cluster: Cluster, workload: Workload, client: Client, hooks: list[FaultHook],
                   violation: dict[str, Any] | None) -> dict[str, Any]:
    records = sorted(client.records, key=lambda r: r.req_id)
    routed = cluster.router.prompt_tokens
    instances = {}
    for w in cluster.instances:
        name = w.engine.name
        instances[name] = dict(
            role=w.engine.cfg.role.value, total_blocks=w.pool.total_blocks(),
            steps=w.engine.steps, busy_s=round(w.executor.busy_s, 6),
            store=w.store.stats.as_dict(), tiers=_tier_hits(w, routed.get(name, 0)),
            host_tier=dict(w.host.counters, capacity=w.host.capacity) if w.host is not None else None,
            timeline=w.timeline.as_dict())
    return {
        "cluster": dict(mixed=cluster.config.mixed, prefill=cluster.config.prefill, decode=cluster.config.decode,
                        policy=cluster.config.policy, placements=dict(cluster.router.placements)),
        "config": asdict(cluster.config.world),
        "workload": workload.describe(),
        "metrics": summarize(records, client.itl, client.last_end_s),
        "outcomes": status_counts(records),
        "first_unfinished": first_messages(records),
        "sent": client.sent,
        "cache": cache_summary(records).as_dict(),
        "samples": dict(ttft_s=[round(r.ttft, 6) for r in records if r.status == "finished" and r.ttft is not None],
                        tpot_s=[round(t, 6) for r in records if r.status == "finished" and (t := r.tpot) is not None]),
        "instances": instances,
        "faults": [dict(fault=h.spec.describe(), hits=h.hits) for h in hooks],
        "violation": violation,
        "sim": dict(end_s=round(cluster.rt.now(), 6), events_processed=cluster.rt.env.events_processed,
                    all_done=client.all_done.triggered,
                    timed_out=not client.all_done.triggered and violation is None),
    }


def finite_or_none(x: float) -> float | None:
    """JSON has no infinity: a fault that never heals is written as null."""
    return None if math.isinf(x) else x
