"""End to end: a world builds from its config, serves a workload to completion, and the
same seed gives a byte-identical report."""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import pytest

from experiments.simulate import SimulateConfig, simulate
from openinfer.errors import ConfigError
from sim.arrivals import ArrivalSpec
from sim.lengths import LengthDist
from sim.workloads import ChatWorkload, RandomWorkload
from sim.world import WorldConfig, build_world, run_world, size_pool
from sim.hardware import HardwareSpec, preset as hw_preset
from sim.model_geometry import preset as model_preset


def _chat(n: int = 24) -> ChatWorkload:
    return ChatWorkload(num_sessions=8, turns=LengthDist.fixed(3), system_prompt_len=256,
                        user_len=LengthDist.lognormal(60, 0.5), output_len=LengthDist.lognormal(30, 0.5),
                        think_time_s=0.5, arrival=ArrivalSpec(rate=4.0), max_requests=n)


def _report(seed: int, **kw: object) -> str:
    w = build_world(WorldConfig(seed=seed, num_blocks=400, abort_probability=0.1, abort_after_s=0.05, **kw))
    return json.dumps(run_world(w, _chat()), sort_keys=True)


def test_same_seed_gives_byte_identical_report() -> None:
    a, b = _report(3), _report(3)
    assert a == b
    assert _report(4) != a
    assert _report(3, order="random") == _report(3, order="random")


def test_small_simulate_run_completes_every_request() -> None:
    r = simulate(SimulateConfig(workload="random", num_requests=30, qps=30.0, input_len=300, output_len=20,
                                range_ratio=0.3, timeline=False))
    assert r["sim"]["all_done"] and not r["sim"]["timed_out"]
    assert r["metrics"]["completed"] == 30 == r["sent"]
    assert r["outcomes"] == {"finished": 30, "rejected": 0, "error": 0, "aborted": 0}
    assert r["metrics"]["mean_ttft_ms"] > 0 and r["metrics"]["mean_tpot_ms"] > 0


def test_output_lengths_are_honoured_in_both_modes() -> None:
    for mode in ("max_tokens", "eos"):
        w = build_world(WorldConfig(num_blocks=600, output_mode=mode, max_tokens_cap=200))
        wl = RandomWorkload(num_requests=12, input_len=64, output_len=17, arrival=ArrivalSpec(rate=40.0))
        rep = run_world(w, wl)
        assert rep["metrics"]["completed"] == 12
        assert rep["metrics"]["total_output_tokens"] == 12 * 17, mode


def test_chat_reuses_its_prefix_and_the_cpu_tier_restores_it() -> None:
    w = build_world(WorldConfig(num_blocks=64, host_tier_gib=1.0))  # GPU pool too small to keep them all
    rep = run_world(w, ChatWorkload(num_sessions=12, turns=LengthDist.fixed(3), system_prompt_len=256,
                                    user_len=LengthDist.fixed(40), output_len=LengthDist.fixed(24), think_time_s=1.0,
                                    arrival=ArrivalSpec(rate=6.0)))
    assert rep["metrics"]["completed"] == 36
    assert rep["cache"]["hit_rate"] > 0.5
    assert rep["host_tier"]["hit_blocks"] > 0 and rep["transfer"]["h2d"]["copies"] > 0


def test_pool_is_sized_from_memory_per_spec() -> None:
    sizing = size_pool(hw_preset("h200"), model_preset("qwen3-4b"), 16, 1024)
    assert 45_000 < sizing["num_blocks"] < 56_000  # ~118 GiB of 2.25 MiB pages
    tiny = size_pool(HardwareSpec(memory_gib=9.0), model_preset("qwen3-4b"), 16, 1024)
    assert tiny["num_blocks"] == 64  # spec §1.2 floor


def test_world_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="world.transfer"):
        WorldConfig(transfer="rdma")
    with pytest.raises(ConfigError, match="world.num_blocks"):
        WorldConfig(num_blocks=1)
    with pytest.raises(ConfigError, match="variant"):
        build_world(WorldConfig(variant="pr900"))


@pytest.mark.parametrize("field, value, named", [
    ("block_size", 0, "world.block_size"), ("order", "lifo", "order.policy"),
    ("max_decode_batch", 0, "scheduler.max_decode_batch"), ("abort_probability", 1.5, "abort.probability"),
    ("monitor_pool_every", 0, "monitor.check_pool_every"), ("timeline_max_rows", 1, "world.timeline_max_rows"),
    ("output_mode", "eof", "world.output_mode"),
])
def test_every_field_a_run_would_refuse_is_refused_when_the_config_is_made(field, value, named) -> None:
    """A config that passes must not fail later, inside build_world or the run: each rule
    that the pool, runtime order, scheduler, client or monitor applies is applied here."""
    with pytest.raises(ConfigError, match=named):
        WorldConfig(**{field: value})


@pytest.mark.parametrize("argv, named", [
    (["host_gib=-1"], "host_gib="), (["abort_prob=5"], "abort_prob="), (["block_size=0"], "block_size="),
    (["workload=random", "turns=7"], "turns="), (["workload=chat", "prefix_len=5"], "prefix_len="),
    (["workload=mooncake", "trace=t.jsonl", "qps=3"], "qps="),
    (["cv=4"], "cv="),                                    # Poisson arrivals have no cv
    (["profile=p.yaml", "hardware=rtx5090"], "hardware="),   # the profile is its own card
])
def test_simulate_names_its_own_keys_and_refuses_keys_its_workload_never_reads(argv, named) -> None:
    from experiments.cli import parse_overrides
    with pytest.raises(ConfigError) as err:
        parse_overrides(SimulateConfig, argv)
    assert str(err.value).startswith(named), str(err.value)


def test_help_lists_every_key_with_its_default_and_runs_nothing(capsys) -> None:
    from experiments.cli import parse_overrides
    with pytest.raises(SystemExit) as stop:
        parse_overrides(SimulateConfig, ["qps=3", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert all(f"  {f.name} " in out for f in dataclasses.fields(SimulateConfig))
    assert "default 'chat'" in out          # the workload key's default


def test_a_held_host_replays_exactly_and_delays_first_tokens() -> None:
    """world.host=held: each step holds the engine's host thread (the real CUDA executor's
    behaviour), so work that falls due mid-step waits for the step's end; still exact."""
    from sim.host_thread import HostClockRuntime, HostHeldExecutor
    w = build_world(WorldConfig(seed=3, num_blocks=400, host="held"))
    assert isinstance(w.rt, HostClockRuntime) and isinstance(w.executor, HostHeldExecutor)
    held = json.loads(_report(3, host="held"))
    assert _report(3, host="held") == json.dumps(held, sort_keys=True)
    free = json.loads(_report(3))
    assert held["metrics"]["mean_ttft_ms"] > free["metrics"]["mean_ttft_ms"]
    with pytest.raises(ConfigError, match="world.transfer"):
        WorldConfig(host="held", transfer="modeled")
    with pytest.raises(ConfigError, match="world.host"):
        WorldConfig(host="busy")


PROFILE = str(Path(__file__).resolve().parents[2] / "conf/profiles/h200_qwen3-4b.yaml")


def test_simulate_runs_on_a_fitted_profile() -> None:
    r = simulate(SimulateConfig(workload="random", num_requests=20, qps=20.0, input_len=200, output_len=10,
                                profile=PROFILE, timeline=False, hardware="rtx5090"))
    assert r["metrics"]["completed"] == 20 and r["config"]["host"] in ("free", "held")
    assert r["config"]["hardware"] == "h200"     # the profile's base preset ran, not rtx5090
    with pytest.raises(ConfigError, match="calibration"):
        SimulateConfig(profile=PROFILE, calibration="x.json")


def test_a_run_relaxes_the_garbage_collector_and_restores_it() -> None:
    import gc

    from sim.gc_tuning import RUN_THRESHOLDS, relaxed_gc
    before = gc.get_threshold()
    with relaxed_gc():
        assert all(t >= r for t, r in zip(gc.get_threshold(), RUN_THRESHOLDS))
    assert gc.get_threshold() == before
    _report(1)
    assert gc.get_threshold() == before


@pytest.mark.parametrize("seed", [0, 3])
def test_requests_aborted_at_the_end_are_drained_before_quiescence_is_judged(seed: int) -> None:
    """Regression seeds (found 2026-12-03): the client counts an aborted request as ended at
    once, but the engine sees the abort at its next pass (seed 3: a cancelled row still
    running), and a request whose prefix had just resolved sat in the resolve hub with its
    25-page hold (seed 0). Judged at the client's last end, both runs reported a
    quiescence violation under variant=fixed; the run now drains the engine first."""
    workload = ChatWorkload(num_sessions=20, turns=LengthDist.fixed(3), system_prompt_len=256,
                            user_len=LengthDist.lognormal(60, 0.5), output_len=LengthDist.lognormal(30, 0.5),
                            think_time_s=0.5, arrival=ArrivalSpec(rate=8.0), max_requests=60)
    w = build_world(WorldConfig(seed=seed, num_blocks=400, abort_probability=0.2, abort_after_s=0.05))
    rep = run_world(w, workload)
    assert rep["violation"] is None
    assert rep["sim"]["quiescent_issues"] == []
    assert rep["outcomes"]["aborted"] > 0
    assert not w.engine.has_work() and w.pool.available_blocks() == w.pool.max_request_blocks()
