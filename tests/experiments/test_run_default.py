"""The default experiment end to end on a short budget: comparison printed, plots written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_default_experiment_smoke(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "experiments.run", "experiment=smoke", f"hydra.run.dir={tmp_path}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "requests finished" in p.stdout and "TTFT mean/p99" in p.stdout
    rows = json.loads((tmp_path / "result.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == ["pr829", "fixed"]
    assert rows[1]["finding"] == "" and rows[1]["finished"] == rows[1]["sent"]
    for name in ("latency_cdf.png", "timeline_pr829.png", "timeline_fixed.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_a_run_whose_requests_are_rejected_says_why(tmp_path: Path) -> None:
    """Prompts longer than the pool can ever hold are rejected at admission; the table
    must say so and quote the engine's reason, not just print fewer finished. (Limits that
    reject even the smallest request are refused at start-up: the second command.)"""
    common = [sys.executable, "-m", "experiments.run", "experiment=smoke", "variant=fixed",
              "experiment.plots=false", "workload=random", "workload.num_requests=8"]
    p = subprocess.run([*common, "workload.input_len=4000", "workload.range_ratio=0.9",
                        f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads((tmp_path / "result.json").read_text())["rows"]
    assert 0 < row["rejected"] < 8 and row["finished"] == 8 - row["rejected"]
    assert f"fixed: {row['rejected']} of 8 requests rejected, the first: needs" in p.stdout, p.stdout
    assert "the pool can never hold" in row["first_rejected"]
    every = subprocess.run([*common, "workload.input_len=100", "workload.prefix_len=5000",
                            f"hydra.run.dir={tmp_path / 'all'}"], capture_output=True, text=True, timeout=120)
    assert every.returncode == 2 and "store.num_blocks" in every.stderr and "smallest request" in every.stderr
