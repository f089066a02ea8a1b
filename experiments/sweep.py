"""One job of a sweep: a single variant (default ``fixed``), result.json in the job folder,
the objective returned for a sweeper. Local jobs run in parallel through joblib:

    python -m experiments.sweep -m variant=pr829,fixed workload.qps=2,4,8
    python -m experiments.sweep -m hydra/launcher=local ...      # submitit, local executor
    python -m experiments.sweep -m hydra/launcher=slurm ...      # submitit on SLURM
    python -m experiments.sweep -m hydra/sweeper=host_tier       # Optuna over store.host_tier_gib
    python -m experiments.collect multirun/DATE out=table.csv
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.config.build import build
from experiments.config.preflight import guard
from experiments.config.schema import register
from experiments.runner import run_experiment
from openinfer.errors import ConfigError

register()


@hydra.main(version_base="1.3", config_path="../conf", config_name="sweep")
def app(cfg: DictConfig) -> float:
    try:
        exp = build(cfg)
    except ConfigError as err:  # an Optuna trial outside a range: a bad trial, not a crashed study
        print(f"error: {err}", file=sys.stderr)
        return math.inf
    hc = HydraConfig.get()
    res = run_experiment(exp, Path(hc.runtime.output_dir), list(hc.overrides.task))
    row = res["result"]["rows"][0]
    print(f"{' '.join(hc.overrides.task)}: finished {row['finished']}/{row['sent']} finding={row['finding'] or '-'} "
          f"p99 TTFT {row['p99_ttft_ms']:.1f} ms")
    value = float(row[exp.objective]) if exp.objective in row else float(res["reports"][exp.variants[0]]
                                                                         ["metrics"][exp.objective])
    return value


def main() -> None:
    guard(sys.argv[1:], "sweep")
    app()


if __name__ == "__main__":
    main()
