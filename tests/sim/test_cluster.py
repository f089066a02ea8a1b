"""Cluster: P/D handoff through the peer tier, and routing among replicas."""

from __future__ import annotations

import pytest

from openinfer.scheduler import EventKind, GenerateRequest
from sim.cluster import ClusterConfig, build_cluster
from sim.monitors import Monitor
from sim.world import WorldConfig

BS = 16


def _prompt(i: int, n: int) -> list[int]:
    return [(i * 7919 + k * 31) % 150000 for k in range(n)]


@pytest.mark.parametrize("full_hit", [False, True], ids=["plain", "full_hit"])
def test_pd_decode_hit_equals_the_prefix_the_prefill_instance_saved(full_hit: bool) -> None:
    """Under either decode policy (the PR's plain one, HEAD glm52's full-hit wait): the
    router forwards after P's KV-ready Finished, so D finds every block P sealed."""
    c = build_cluster(ClusterConfig(world=WorldConfig(num_blocks=2000, block_size=BS, decode_full_hit=full_hit),
                                    mixed=0, prefill=1, decode=1))
    assert c.instances[1].engine.hub.policy.wait_for_full_hit is full_hit
    monitors = [Monitor(w.engine, w.store, heal_s=0.0) for w in c.instances]
    lengths = [100, 257, 640, 1500]
    handles = [c.router.submit(GenerateRequest(_prompt(i, n), 8)) for i, n in enumerate(lengths)]
    c.rt.run(until=c.rt.any_of([c.rt.all_of(h.done for h in handles), c.rt.sleep(60)]))
    p, d = c.instances
    for h, n in zip(handles, lengths):
        assert h.terminal_event().kind is EventKind.FINISHED
        scheduled = next(e for e in h.events if e.kind is EventKind.SCHEDULED)
        assert scheduled.cached_tokens == ((n - 1) // BS) * BS, "D restores every block P sealed, up to the cap"
        assert len(h.tokens()) == 8
    assert d.store.stats.resolve_loaded_blocks == sum((n - 1) // BS for n in lengths)
    assert p.host.counters["registrations"] >= len(lengths)
    assert d.host.counters["remote_blocks"] >= sum((n - 1) // BS for n in lengths)
    c.rt.run(until=c.rt.now() + 10)
    for m in monitors:
        m.check_end(c.rt.now())


def test_round_robin_spreads_and_prefix_affinity_keeps_shared_prefixes_together() -> None:
    c = build_cluster(ClusterConfig(world=WorldConfig(num_blocks=2000), mixed=3, policy="round_robin"))
    hs = [c.router.submit(GenerateRequest(_prompt(i, 64), 4)) for i in range(9)]
    c.rt.run(until=c.rt.all_of(h.done for h in hs))
    assert sorted(c.router.placements.values()) == [3, 3, 3]

    c = build_cluster(ClusterConfig(world=WorldConfig(num_blocks=2000), mixed=3, policy="prefix_affinity"))
    shared = _prompt(99, 64)
    cached = []
    for i in range(4):  # one after another: each later one can hit what the first computed
        h = c.router.submit(GenerateRequest(shared + [i + 1], 4))
        c.rt.run(until=h.done)
        cached.append(h.events[0].cached_tokens)
    assert len(c.router.placements) == 1 and sum(c.router.placements.values()) == 4
    assert cached == [0, 64, 64, 64]


def test_perfetto_trace_has_every_step_and_request(tmp_path) -> None:
    import json

    from experiments.simulate import SimulateConfig, simulate

    path = tmp_path / "trace.json"
    report = simulate(SimulateConfig(num_requests=12, perfetto=str(path)))
    events = json.loads(path.read_text())["traceEvents"]
    steps = [e for e in events if e["ph"] == "X"]
    assert len(steps) == report["engine"]["steps"]
    assert abs(sum(e["dur"] for e in steps) / 1e6 - report["engine"]["busy_s"]) < 1e-3
    assert sum(e["ph"] == "b" for e in events) == sum(e["ph"] == "e" for e in events) == 12


def test_run_cluster_ends_once_the_stores_settle_not_after_a_fixed_wait() -> None:
    """run_cluster waits for KvStore.settle on every instance (settle_s only caps it): the
    end checks pass and the run ends long before last answer + settle_s."""
    from sim.arrivals import ArrivalSpec
    from sim.cluster_run import run_cluster
    from sim.workloads import RandomWorkload
    c = build_cluster(ClusterConfig(world=WorldConfig(num_blocks=2000, block_size=BS), mixed=0, prefill=1, decode=1))
    rep = run_cluster(c, RandomWorkload(8, 300, 8, prefix_len=64, arrival=ArrivalSpec(20.0)), settle_s=1000.0)
    assert rep["violation"] is None and rep["outcomes"]["finished"] == 8
    assert all(w.store.quiescent(0) == [] for w in c.instances)
    assert rep["sim"]["end_s"] < 100.0
