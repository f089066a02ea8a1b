"""Issue #8's chain on the CPU: serve on the real executor, calibrate the simulator on one
workload, replay a different one in the simulator and compare. The CPU's timings are too
noisy for the latency targets; what must hold is the twin itself: the same requests finish,
and where timing cannot matter (the cold phase) the hit rates agree exactly."""

from __future__ import annotations

import pytest

from experiments.calibrate import CalibrateConfig, calibrate
from experiments.fidelity import FidelityConfig, fidelity
from experiments.serve_real import run_served

INSTANCE = dict(block_size=8, num_blocks=128, host_slots=128)


def test_calibrate_then_replay_a_held_out_workload(tiny_ckpt, tiny_model, tmp_path) -> None:
    run_served(tiny_ckpt, "cpu", dict(kind="random", num_requests=10, input_len=60, output_len=6, prefix_len=24,
                                      rate=50, seed=1), out_dir=tmp_path / "fit", model=tiny_model,
               instance_cfg=INSTANCE)
    held = run_served(tiny_ckpt, "cpu", dict(kind="chat", num_sessions=3, turns=2, system_prompt_len=32,
                                             user_len=20, output_len=5, rate=20, seed=2),
                      out_dir=tmp_path / "held", model=tiny_model, instance_cfg=INSTANCE)
    assert held["ok"]
    profile = calibrate(CalibrateConfig(steps=str(tmp_path / "fit" / "steps.jsonl"), model="tiny",
                                        gpu="cpu", date="2026-12-03"))
    path = profile.save(tmp_path / "profile.yaml")
    rep = fidelity(FidelityConfig(served=str(tmp_path / "held" / "served.json"), profile=str(path),
                                  model_config=str(tiny_ckpt / "config.json"),
                                  steps=str(tmp_path / "held" / "steps.jsonl")))
    assert set(rep["phases"]) == {"cold", "gpu", "cpu"}
    for p in rep["phases"].values():  # the held-out run's own steps next to the simulated ones
        st = p["steps"]
        real = st["real"]["decode"]["steps"] + st["real"]["eager"]["steps"] + len(st["outliers"])
        assert real > 0 and st["real"]["eager"]["steps"] + len(st["outliers"]) > 0
        assert st["sim"]["decode"]["steps"] + st["sim"]["eager"]["steps"] > 0
        for kind in ("decode", "eager"):
            r = st["real"][kind]
            assert r["steps"] == 0 or (r["model_error"] is not None and r["wall_ms"]["mean"] > 0)
    for ph, p in rep["phases"].items():
        assert p["sim"]["completed"] == p["real"]["completed"] == held["phases"][ph]["metrics"]["completed"]
        assert p["sim"]["ttft"]["mean"] > 0 and p["sim"]["tpot"]["mean"] > 0
    cold = rep["phases"]["cold"]["error"]["hit_rate_points"]
    assert all(abs(v) < 1e-9 for v in cold.values()), cold
    assert rep["phases"]["cpu"]["sim"]["hit_rate"]["cpu"] > 0  # the sim restores from its CPU tier too
    assert rep["sim_wall_s"] > 0
    # the diagnostics on a profile whose steps do not depend on this CPU's timing noise
    from dataclasses import replace
    from sim.calibrated_step_model import CalibratedStepModel
    fixed = replace(profile, step_model=CalibratedStepModel(intercept=2e-3, eager_step=1e-3, prefill_tokens=2e-5,
                                                            decode_rows_padded=1e-4))
    fixed_path = fixed.save(tmp_path / "fixed.yaml")
    pinned = fidelity(FidelityConfig(served=str(tmp_path / "held" / "served.json"), profile=str(fixed_path),
                                     model_config=str(tiny_ckpt / "config.json"), arrivals="real", sensitivity=0.02))
    assert pinned["arrivals"] == "real"
    for ph, p in pinned["phases"].items():
        for q in p["requests"]:   # a session starts when the real one did; no turn goes earlier
            real_ms, sim_ms = q["arrival_ms"]
            assert sim_ms == pytest.approx(real_ms, abs=1e-3) if q["turn"] == 0 else sim_ms >= real_ms - 1e-3
        assert set(pinned["sensitivity"]["phases"][ph]) == {"x0.980", "x1.020"}
    # a sensitivity rerun is the run on the profile with its step model scaled (the host's
    # work as fitted): the same errors as a report on that profile
    longer = replace(fixed, step_model=fixed.step_model.scaled(1.02)).save(tmp_path / "longer.yaml")
    direct = fidelity(FidelityConfig(served=str(tmp_path / "held" / "served.json"), profile=str(longer),
                                     model_config=str(tiny_ckpt / "config.json"), arrivals="real"))
    for ph, p in direct["phases"].items():
        assert pinned["sensitivity"]["phases"][ph]["x1.020"]["error"] == p["error"]
        assert pinned["phases"][ph]["error"] != p["error"]
    from experiments.plots import PHASE_TITLES, fidelity as fidelity_figure
    fig = fidelity_figure(rep, tmp_path / "fidelity.png")   # one TTFT and one E2E panel per phase
    assert len(fig.axes) == 6 and (tmp_path / "fidelity.png").stat().st_size > 10_000
    assert all(len(ax.collections[0].get_offsets()) == p["real"]["completed"]
               for ax, p in zip(fig.axes[:3], (rep["phases"][ph] for ph in PHASE_TITLES)))


def test_fidelity_options_are_checked_before_anything_runs() -> None:
    from experiments.fidelity import pinned_workloads
    from openinfer.errors import ConfigError
    from sim.workloads import RandomWorkload
    with pytest.raises(ConfigError, match="arrivals"):
        FidelityConfig(served="s.json", profile="p.yaml", arrivals="replay")
    with pytest.raises(ConfigError, match="sensitivity"):
        FidelityConfig(served="s.json", profile="p.yaml", sensitivity=0.5)
    with pytest.raises(ConfigError, match="figure"):
        FidelityConfig(served="s.json", profile="p.yaml", figure="x.txt")
    with pytest.raises(ConfigError, match="arrivals.*chat workload"):
        pinned_workloads(dict(workload=RandomWorkload().describe(), phases={}))


def test_a_validate_report_yields_the_same_served_run(tiny_ckpt, tiny_model, tmp_path) -> None:
    """validate embeds run_served's report per workload with the requests of every phase
    in one list; load_served puts them back where a served.json has them."""
    import json

    from experiments.fidelity import load_served
    held = run_served(tiny_ckpt, "cpu", dict(kind="random", num_requests=3, input_len=20, output_len=3, seed=4),
                      model=tiny_model, instance_cfg=INSTANCE)
    detail = [dict(phase=ph, **r) for ph, p in held["phases"].items() for r in p["requests"]]
    wrapped = dict(served=dict(workloads=dict(heldout=dict(
        held, phases={ph: {k: v for k, v in p.items() if k != "requests"} for ph, p in held["phases"].items()},
        requests_detail=detail))))
    path = tmp_path / "validate.json"
    path.write_text(json.dumps(wrapped))
    assert load_served(str(path))["phases"] == json.loads(json.dumps(held))["phases"]
    assert load_served(str(path), "heldout")["phases"] == load_served(str(path))["phases"]
    served = tmp_path / "served.json"
    served.write_text(json.dumps(held))
    assert load_served(str(served))["phases"] == json.loads(json.dumps(held))["phases"]
    from openinfer.errors import ConfigError
    with pytest.raises(ConfigError, match="workload"):      # one run: nothing to pick
        load_served(str(served), "fit")
    # a repeat capture may be one run beside a validate report's workload=fit pick
    assert load_served(str(served), "fit", key="repeat")["phases"] == load_served(str(served))["phases"]
    with pytest.raises(ConfigError, match="repeat"):        # named by the key that gave it
        load_served(str(tmp_path / "missing.json"), key="repeat")


def test_the_replay_serves_the_phases_in_the_real_order_whatever_order_a_report_lists() -> None:
    """A JSON report sorts its phases (cold, cpu, gpu); served that way the "gpu" phase would
    follow the eviction and the "cpu" phase would restore what "gpu" never put in the radix.
    serve_phases (the real run's and the replay's) always runs cold, gpu, then cpu."""
    from experiments.serve_real import make_workload, serve_phases
    from sim.world import WorldConfig, build_world
    world = build_world(WorldConfig(model="qwen3-0.6b", num_blocks=512, host_tier_gib=1.0, monitors=False))
    wl = make_workload(dict(kind="chat", num_sessions=2, turns=2, system_prompt_len=64, user_len=32, output_len=4,
                            rate=50))
    phases, evicted = serve_phases(world, wl, ["cold", "cpu", "gpu"], max_wall_s=60.0)
    assert list(phases) == ["cold", "gpu", "cpu"] and set(evicted) == {"cpu"}
    assert phases["gpu"]["cache"]["gpu_blocks"] > 0 and phases["gpu"]["cache"]["cpu_blocks"] == 0
    assert phases["cpu"]["cache"]["cpu_blocks"] > 0
