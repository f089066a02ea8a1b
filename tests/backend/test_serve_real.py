"""experiments.serve_real end to end on the CPU: the function the GPU validation calls."""

from __future__ import annotations

import json

import pytest

from experiments.serve_real import make_workload, run_served
from openinfer.errors import ConfigError


def test_run_served_hits_gpu_then_cpu_tier_and_writes_records(tiny_ckpt, tiny_model, tmp_path):
    wl = dict(kind="random", num_requests=4, input_len=40, output_len=4, prefix_len=16)
    rep = run_served(tiny_ckpt, "cpu", wl, out_dir=tmp_path, model=tiny_model,
                     instance_cfg=dict(block_size=8, num_blocks=128, host_slots=128))
    assert rep["ok"] and rep["all_finished"] and rep["quiescent"] == []
    ph = rep["phases"]
    assert [ph[p]["outcomes"]["finished"] for p in ("cold", "gpu", "cpu")] == [4, 4, 4]
    assert ph["gpu"]["cache"]["gpu_blocks"] > 0 and ph["gpu"]["cache"]["cpu_blocks"] == 0
    assert ph["cpu"]["cache"]["cpu_blocks"] == ph["gpu"]["cache"]["gpu_blocks"]
    assert ph["cpu"]["cache"]["gpu_blocks"] == 0
    assert rep["copies"]["h2d"]["pages"] == ph["cpu"]["cache"]["cpu_blocks"]
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    copies = [json.loads(x) for x in (tmp_path / "copies.jsonl").read_text().splitlines()]
    assert len(steps) == sum(k["steps"] for k in rep["steps"].values())
    assert {c["dir"] for c in copies} == {"d2h", "h2d"}
    served = json.loads((tmp_path / "served.json").read_text())
    assert served["workload"]["arrival"]["rate"] == "inf"     # strict JSON, no Infinity


def test_the_command_line_says_what_is_wrong_before_serving(tmp_path, capsys):
    from experiments.serve_real import main
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")   # only the checks below run: nothing is served
    assert main(["--help"]) == 0 and "run_served(" in capsys.readouterr().out
    for argv, says in (([], "1 to 3 arguments"), ([str(tmp_path)], "no config.json"),
                       ([str(ckpt), "gpu"], "cpu or cuda"),
                       ([str(ckpt), "cpu", str(tmp_path), "requests=5"], "1 to 3 arguments")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and "usage:" in err, err


def test_make_workload_chat_and_errors():
    w = make_workload(dict(kind="chat", num_sessions=2, turns=2, rate=5))
    assert w.describe()["kind"] == "chat"
    with pytest.raises(ConfigError, match="workload.kind"):
        make_workload(dict(kind="nope"))


def test_host_timing_says_how_long_each_step_kept_the_host_thread(tiny_ckpt, tiny_model, tmp_path):
    """host_timing=True: one launch time per executed step, never more than the step's own
    wall time (the rest is polling, when the host is free), and host snapshots around each
    phase, for telling a slow host from a slow GPU in a served run."""
    wl = dict(kind="random", num_requests=3, input_len=24, output_len=3, prefix_len=8)
    rep = run_served(tiny_ckpt, "cpu", wl, out_dir=tmp_path, model=tiny_model, host_timing=True,
                     instance_cfg=dict(block_size=8, num_blocks=128, host_slots=128))
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    launch = rep["host_timing"]["launch_s"]
    assert len(launch) == len(steps) > 0
    assert all(0 < t <= s["wall_s"] + 1e-6 for t, s in zip(launch, steps))
    phases = rep["host_timing"]["phases"]
    assert list(phases) == ["cold", "gpu", "cpu"]
    for p in phases.values():
        assert p["end"]["t"] >= p["start"]["t"] and p["end"]["cpu_user_s"] >= p["start"]["cpu_user_s"]
    assert "host_timing" not in run_served(tiny_ckpt, "cpu", wl, model=tiny_model,
                                           instance_cfg=dict(block_size=8, num_blocks=128, host_slots=128))
