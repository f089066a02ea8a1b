"""experiments.bench at CI speed: tiny sizes, every case, a baseline; the report's shape and
sane numbers (the speed figures themselves are machine-dependent and not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import bench, bench_sim
from experiments.bench import BenchConfig
from experiments.bench_paired import usable_cpus
from experiments.cli import parse_overrides
from openinfer.errors import ConfigError

RUN_KEYS = ("wall_s", "cpu_s", "requests_per_s", "steps_per_s", "sim_to_wall", "peak_rss_mb", "steps", "sim_s")


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "experiments.bench", *args, f"report={report}"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return p, json.loads(report.read_text())


def test_all_cases_with_baseline(tmp_path: Path) -> None:
    p, rep = _run(tmp_path, "cases=chat,pd,offline", "sizes=50", "repeats=1", "baseline=monitors=false")
    out = p.stdout
    assert "ours/base" in out and "base req/s" in out and "targets (issue #4" in out
    assert "estimated" in p.stderr and "bench [6/6]" in p.stderr
    assert set(rep["cases"]) == {"chat", "pd", "offline"}  # the JSON is written with sorted keys
    assert rep["baseline_world"] == "monitors=false" and rep["all_completed"] is True
    for case, c in rep["cases"].items():
        row = c["sizes"]["50"]
        for side in (row, row["baseline"]):
            med = side["median"]
            assert med["runs"] == 1 and med["completed"] == 50 and med["all_completed"]
            assert all(med[k] > 0 for k in RUN_KEYS), (case, med)
            (run,) = side["runs"]
            assert run["case"] == case and run["requests"] == run["completed"] == run["sent"] == 50
            assert run["peak_rss_mb"] >= run["rss_before_run_mb"] > 0
        assert row["baseline"]["runs"][0]["world"] == "monitors=false" and row["runs"][0]["world"] == ""
        assert row["speed_ratio"] > 0
        assert "scaling" not in c  # one size: no ratio
        if case != "offline":
            assert c["rates"]["qps"] > 0 and row["runs"][0]["qps"] == row["baseline"]["runs"][0]["qps"]
    checks = {c["target"]: c for c in rep["checks"]}
    assert checks["chat 10k >= 1,000 req/s"]["passed"] is None  # 10k was not run: n/a, not a pass
    assert [c["passed"] for t, c in checks.items() if "peak RSS" in t] == [True, True, True]
    assert "n/a" in out and "PASS" in out


def test_two_sizes_scaling_and_no_ratio_without_baseline(tmp_path: Path) -> None:
    p, rep = _run(tmp_path, "cases=chat", "sizes=40,20", "repeats=2", "big_repeats=1", "scaling=sequential")
    assert "ours/base" not in p.stdout and "scaling, per-request wall cost" in p.stdout
    c = rep["cases"]["chat"]
    assert set(c["sizes"]) == {"20", "40"}
    assert c["sizes"]["20"]["median"]["runs"] == 2 and c["sizes"]["40"]["median"]["runs"] == 1
    assert "baseline" not in c["sizes"]["20"] and rep["baseline_world"] is None
    s = c["scaling"]
    assert (s["small"], s["big"]) == (20, 40) and s["ratio"] > 0 and s["cpu_ratio"] > 0 and "baseline_ratio" not in s
    assert s["method"] == "sequential" and "side by side" not in p.stdout


@pytest.mark.skipif(len(usable_cpus()) < 2, reason="pairing needs two CPUs")
def test_paired_scaling_runs_the_small_size_beside_the_big_one(tmp_path: Path) -> None:
    p, rep = _run(tmp_path, "cases=chat", "sizes=20,3000", "repeats=1", "scaling=paired")
    s = rep["cases"]["chat"]["scaling"]
    assert s["method"] == "paired" and len(s["pairs"]) == 1
    (pair,) = s["pairs"]
    assert pair["companions"], "a 20-request run fits inside a 3000-request one"
    assert all(x["completed"] == 20 for x in pair["companions"])
    small_per_req = sorted(x["wall_s"] for x in pair["companions"])[(len(pair["companions"]) - 1) // 2] / 20
    assert s["ratio"] > 0 and s["cpu_ratio"] > 0 and pair["big_wall_s"] == rep["cases"]["chat"]["sizes"]["3000"][
        "runs"][0]["wall_s"]
    if len(pair["companions"]) % 2:  # an odd count: the median is one of them
        assert s["ratio"] == pytest.approx(pair["big_wall_s"] / 3000 / small_per_req)
    assert "side by side" in p.stdout and "beside" in p.stderr


@pytest.mark.parametrize("arg, field", [
    ("cases=chat,foo", "cases"), ("sizes=10k", "sizes"), ("sizes=100,100", "sizes"), ("repeats=0", "repeats"),
    ("big_repeats=0", "big_repeats"), ("load=3", "load"), ("pd_sizes=0", "pd_sizes"),
    ("baseline=nonsense", "baseline"), ("baseline=no_such_field=1", "baseline.no_such_field"),
    ("baseline=monitors=maybe", "baseline.monitors"), ("baseline=num_blocks=1", "baseline.num_blocks"),
    ("baseline=variant=bogus", "baseline.variant"), ("world=transfer=x", "world.transfer"),
    ("scaling=both", "scaling"),
    ("frobnicate=1", "frobnicate"),
    # accepted before, then never read: refused
    ("cases=offline load=0.1", "load"), ("cases=chat pd_sizes=5", "pd_sizes"),
    ("sizes=1000 big_repeats=5", "big_repeats"), ("sizes=1000 scaling=sequential", "scaling"),
    # what every run would refuse, refused before the first one
    ("world=seed=3", "world.seed"), ("baseline=seed=3", "baseline.seed"),
    ("cases=pd world=host_tier_gib=0", "world.host_tier_gib"),
])
def test_bad_input_names_the_field(arg: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_overrides(BenchConfig, arg.split())
    assert err.value.field == field and err.value.accepted


def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["bench", "baseline=fast_deco=false"])
    with pytest.raises(SystemExit) as ex:
        bench.main()
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: baseline.fast_deco=") and "a WorldConfig field" in err and "\n" not in err


def test_plan_defaults_and_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = BenchConfig()
    assert cfg.sizes_for("chat") == [10_000, 100_000] and cfg.sizes_for("offline") == [1000, 10_000]
    # sizes= given is every case's, the offline batch's too, even when it equals the default
    assert BenchConfig(sizes="10000,100000").sizes_for("offline") == [10_000, 100_000]
    assert cfg.repeats_for("chat", 10_000) == 3 and cfg.repeats_for("chat", 100_000) == 1
    jobs, rates = bench.plan(BenchConfig(baseline="monitors=false"))
    assert len(jobs) == 24 and [j.side for j in jobs[:2]] == ["ours", "baseline"]
    assert rates["chat"]["qps"] > 0 and jobs[0].qps == jobs[1].qps
    assert BenchConfig(sizes="50").sizes_for("offline") == [50]  # an explicit sizes= covers every case
    bench.cli(["dry_run=true"])
    assert "estimated" in capsys.readouterr().out


def test_bench_sim_is_an_alias() -> None:
    assert bench_sim.translate([]) == ["cases=chat", "sizes=1000,10000"]
    t = bench_sim.translate(["requests=200", "small=20", "model=qwen3-8b", "repeats=2"])
    assert sorted(t) == ["cases=chat", "repeats=2", "sizes=20,200", "world=model=qwen3-8b"]
    parse_overrides(BenchConfig, t)


def test_a_waiting_offline_request_holds_a_compact_prompt() -> None:
    """The offline batch holds every prompt from t=0, so what one waiting request costs is
    what the 100k batch peaks at. Measured with tracemalloc once the whole batch has been
    accepted (t=0 plus a few steps), per prompt token of the waiting requests (the ~250
    admitted ones and the world add a fixed part): 27.0 bytes with list-of-ints prompts
    (~36 for each unique id, 8 for each shared-prefix pointer), 17.7 with int64 arrays,
    13.4 with the int32 arrays of ``compact_tokens``."""
    import tracemalloc

    from experiments.bench_one import offline_workload, world_config
    from openinfer.kv.hashing import is_compact
    from sim.world import build_world, make_client

    n = 3000
    w = build_world(world_config({}, 0))
    client = make_client(w)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        w.rt.spawn(offline_workload(n).run(w.rt, client))
        w.rt.run(until=w.rt.sleep(0.05))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    waiting = list(w.engine.deferred)
    assert len(waiting) > 0.8 * n and all(is_compact(p.req.prompt) for p in waiting)
    prompt_tokens = sum(p.prompt_len for p in waiting)
    assert held / prompt_tokens < 16, f"{held / prompt_tokens:.1f} bytes per waiting prompt token"


@pytest.mark.parametrize("argv, field", [
    (["case=offline", "qps=5"], "qps"), (["case=offline", "load=0.1"], "load"),
    (["qps=5", "load=0.3"], "load"), (["world=seed=1"], "world.seed"),
])
def test_bench_one_refuses_keys_its_run_would_not_read(argv, field) -> None:
    from experiments.bench_one import BenchOneConfig
    with pytest.raises(ConfigError) as err:
        parse_overrides(BenchOneConfig, argv)
    assert err.value.field == field
