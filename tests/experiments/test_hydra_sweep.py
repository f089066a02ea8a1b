"""Tiny multiruns through joblib and through submitit's local executor, each collected."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import plots


def _sweep_and_collect(tmp_path: Path, *extra: str) -> list[dict[str, str]]:
    cmd = [sys.executable, "-m", "experiments.sweep", "-m", "workload.qps=4,8", "workload.num_requests=12",
           "experiment.settle_s=1", f"hydra.sweep.dir={tmp_path}", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    out = tmp_path / "table.csv"
    p = subprocess.run([sys.executable, "-m", "experiments.collect", str(tmp_path), f"out={out}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    with open(out, newline="") as f:
        return list(csv.DictReader(f))


def test_joblib_multirun_is_collected(tmp_path: Path) -> None:
    rows = _sweep_and_collect(tmp_path)
    assert sorted(r["workload.qps"] for r in rows) == ["4", "8"]
    assert all(r["variant"] == "fixed" and r["finished"] == r["sent"] for r in rows)
    assert plots.vs_qps(rows, tmp_path / "qps.png") and (tmp_path / "qps.png").stat().st_size > 1000
    under_a_file = tmp_path / "table.csv" / "again.csv"     # one line, not a traceback
    p = subprocess.run([sys.executable, "-m", "experiments.collect", str(tmp_path), f"out={under_a_file}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "cannot be written" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_submitit_local_multirun_is_collected(tmp_path: Path) -> None:
    rows = _sweep_and_collect(tmp_path, "hydra/launcher=local")
    assert sorted(r["workload.qps"] for r in rows) == ["4", "8"]


def test_optuna_study_in_sqlite_resumes(tmp_path: Path) -> None:
    """A study kept in a database (to resume a long search) is created, and a second run
    with another sampler seed adds new points to the first's (with SQLAlchemy 2 under
    optuna 2.10 creation failed)."""
    import optuna

    db = f"sqlite:///{tmp_path / 'study.db'}"
    for seed in (0, 1):
        cmd = [sys.executable, "-m", "experiments.sweep", "-m", "hydra/sweeper=host_tier",
               "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", "workload.num_requests=12",
               "experiment.settle_s=1", f"hydra.sweep.dir={tmp_path / str(seed)}",
               f"hydra.sweeper.storage={db}", f"hydra.sweeper.sampler.seed={seed}"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stderr[-2000:]
    study = optuna.load_study(study_name="host_tier", storage=db)
    assert len(study.trials) == 4
    assert all(t.state == optuna.trial.TrialState.COMPLETE and t.value > 0 for t in study.trials)
    first, second = ({t.params["store.host_tier_gib"] for t in study.trials[i:i + 2]}
                     for i in (0, 2))
    assert not first & second


def test_slurm_launcher_config_composes() -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from experiments.config.preflight import CONF_DIR
    from experiments.config.schema import register

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("sweep", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
        assert "SlurmLauncher" in cfg.hydra.launcher._target_
        cfg = compose("sweep", overrides=["hydra/sweeper=host_tier"], return_hydra_config=True)
        assert "Optuna" in cfg.hydra.sweeper._target_
    GlobalHydra.instance().clear()


def test_plots_of_a_missing_table_says_what_it_expected(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        plots.main([str(tmp_path / "nope.csv")])
    assert stop.value.code == 2
    assert "experiments.collect" in capsys.readouterr().err
    flat = tmp_path / "flat.csv"     # a table with nothing swept: no figure to draw, said so
    flat.write_text("variant,workload.qps\nfixed,4\npr829,4\n")
    with pytest.raises(SystemExit) as stop:
        plots.main([str(flat)])
    assert stop.value.code == 2 and "no column that varies" in capsys.readouterr().err
