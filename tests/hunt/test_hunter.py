"""The hunter itself: regression seeds of bugs found in our own fixed variant, the
determinism gate, a clean fixed sweep, and the report/replay contract."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from experiments.hunt import HuntConfig, hunt, scenario_seed
from sim.hunt.runner import run_scenario
from sim.hunt.scenario import Scenario, random_scenario

REGRESSIONS = sorted(Path(__file__).parent.joinpath("regressions").glob("*.json"))


def _load(path: Path) -> tuple[dict, Scenario]:
    seed = json.loads(path.read_text())
    return seed, Scenario.from_dict(seed["scenario"])


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_regression_seed_is_clean_under_fixed_and_caught_with_its_bug(path: Path) -> None:
    """C1, P1, D1 and H9_reused_prefix were found by hunting `fixed` itself, S1 by a
    contract test; each seed is the shrunk scenario. Fixed must pass it; the bug planted
    back must be caught on it (H9_reused_prefix: a request that reused the prefix of a
    failed save, judged KV-ready until 2026-12-08; H9 stops judging at all)."""
    seed, sc = _load(path)
    assert run_scenario(sc).violation is None
    buggy = run_scenario(replace(sc, variant=f"fixed+{seed['bug']}"))
    assert buggy.invariant == seed["invariant"]


def test_same_scenario_twice_gives_identical_traces() -> None:
    rng = random.Random(7)
    for i in range(40):
        sc = random_scenario(rng, scenario_seed(7, i), "pr829" if i % 2 else "fixed")
        a, b = run_scenario(sc), run_scenario(sc)
        assert a.timeline == b.timeline and a.sim_events == b.sim_events
        assert a.invariant == b.invariant


def test_fixed_variant_is_clean_over_a_sweep() -> None:
    report = hunt(HuntConfig(variant="fixed", budget_s=600, max_runs=600, seed=11, quiet=True))
    assert report["runs"] == 600
    assert report["violations"] == {}, {k: v["detail"] for k, v in report["violations"].items()}


def test_report_groups_by_invariant_and_replay_reproduces(tmp_path: Path) -> None:
    out = tmp_path / "hunt.json"
    report = hunt(HuntConfig(variant="pr829", budget_s=600, max_runs=60, seed=0, quiet=True,
                             report=str(out), shrink_attempts=50))
    assert report["violations"], "pr829 shows violations within 60 runs"
    for name, entry in report["violations"].items():
        assert entry["count"] >= 1 and entry["events"] <= entry["first_events"]
        assert entry["timeline"][-1].startswith(f"VIOLATION {name}")
        scenario = Path(entry["scenario_file"])
        done = subprocess.run([sys.executable, "-m", "experiments.replay", f"scenario={scenario}"],
                              capture_output=True, text=True, cwd=Path(__file__).parents[2])
        assert done.returncode == 1 and f"VIOLATION {name}" in done.stdout
        fixed = subprocess.run([sys.executable, "-m", "experiments.replay", f"scenario={scenario}",
                                "variant=fixed"], capture_output=True, text=True, cwd=Path(__file__).parents[2])
        assert fixed.returncode == 0, fixed.stdout[-2000:]
        break  # one replay round trip is enough for the contract


def test_bad_hunt_config_names_the_field() -> None:
    done = subprocess.run([sys.executable, "-m", "experiments.hunt", "variant=fixed+F9"],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert done.returncode == 2 and "bug" in done.stderr


def test_replay_of_a_file_that_is_not_a_scenario_is_a_config_error(tmp_path: Path) -> None:
    """Exit 1 is replay's "an invariant was violated"; a hunt report given by mistake (or
    any other JSON) must not read as a finding."""
    report = tmp_path / "hunt.json"
    report.write_text('{"budget_s": 60, "violations": {}}')
    done = subprocess.run([sys.executable, "-m", "experiments.replay", f"scenario={report}"],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert done.returncode == 2 and "scenarios_dir" in done.stderr


@pytest.mark.parametrize("field, value", [("fixed_runs", 0), ("budget_s", 0), ("variant", "fixd")])
def test_hunt_bench_checks_its_keys_before_hunting(field, value) -> None:
    from experiments.hunt_bench import HuntBenchConfig
    from openinfer.errors import ConfigError
    with pytest.raises(ConfigError, match=field):
        HuntBenchConfig(**{field: value})


def test_watchdog_flags_scheduler_passes_that_do_not_advance_time() -> None:
    from sim.hunt.runner import build_world
    from sim.monitors import InvariantViolation, Monitor, MonitorConfig

    w = build_world(Scenario(seed=0))
    mon = Monitor(w.engine, w.store, heal_s=0.0, config=MonitorConfig(max_passes_per_instant=50))
    with pytest.raises(InvariantViolation) as err:
        for _ in range(60):  # what a loop that spins without yielding time would emit
            mon.on_engine("tick", {})
    assert err.value.name == "progress_at_one_instant"
