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
