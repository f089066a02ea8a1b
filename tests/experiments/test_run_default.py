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


def test_a_run_whose_requests_are_all_rejected_says_why(tmp_path: Path) -> None:
    """Prompts longer than the pool can ever hold are rejected at admission; the table
    must say so and quote the engine's reason, not just print 0 finished."""
    p = subprocess.run([sys.executable, "-m", "experiments.run", "experiment=smoke", "variant=fixed",
                        "experiment.plots=false", "workload=random", "workload.num_requests=4",
                        "workload.input_len=100", "workload.prefix_len=5000", f"hydra.run.dir={tmp_path}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "fixed: 4 of 4 requests rejected, the first: needs" in p.stdout, p.stdout
    (row,) = json.loads((tmp_path / "result.json").read_text())["rows"]
    assert row["rejected"] == 4 and "the pool can never hold" in row["first_rejected"]
