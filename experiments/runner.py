"""Run a validated Experiment: each variant on a fresh cluster, summaries, result files.

Shared by ``experiments.run`` (the comparison) and ``experiments.sweep`` (one job of a
grid): both write ``result.json`` (one summary row per variant, what ``experiments.collect``
reads) and ``report_<variant>.json`` (the full cluster report, timelines included) into the
job's output folder. A monitor violation ends that variant's run and is written as a
finding with what had finished by then, next to the command that replays it.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from experiments.config.build import Experiment
from sim.cluster import build_cluster
from sim.cluster_run import run_cluster

VARIANT_OPTIONS = {"pr829": "pr829", "fixed": "fixed", "fixed+F2": "fixed_F2"}


def progress_enabled(setting: bool | None) -> bool:
    """A bar when asked, or (null) when stderr is a terminal: never noise in logs or tests."""
    return bool(setting) if setting is not None else sys.stderr.isatty()


def run_variant(exp: Experiment, name: str) -> tuple[dict[str, Any], float]:
    """One variant's cluster report and the wall seconds it took."""
    t0 = time.perf_counter()
    cluster = build_cluster(exp.clusters[name])
    total = getattr(exp.workload, "max_requests", None) or getattr(exp.workload, "num_requests", None)
    with tqdm(total=total, unit="req", desc=f"{name:>9}", file=sys.stderr, leave=False,
              disable=not progress_enabled(exp.progress), dynamic_ncols=True) as bar:
        def on_progress(now: float, ended: int, sent: int) -> None:
            bar.n = ended
            bar.set_postfix_str(f"sim {now:6.1f}s sent {sent}", refresh=True)
        report = run_cluster(cluster, exp.workload, exp.faults, monitors=exp.monitors, chunk_s=exp.chunk_s,
                             settle_s=exp.settle_s, on_progress=on_progress)
    return report, time.perf_counter() - t0


def tier_rates(report: dict[str, Any]) -> dict[str, float]:
    """Cluster-wide share of routed prompt tokens served by each tier."""
    prompt = sum(i["tiers"]["prompt_tokens"] for i in report["instances"].values())
    out = {}
    for tier in ("gpu", "host", "peer"):
        hit = sum(i["tiers"]["hit_tokens"][tier] for i in report["instances"].values())
        out[f"{tier}_hit_rate"] = round(hit / prompt, 6) if prompt else 0.0
    return out


def replay_command(name: str, overrides: list[str], entry: str = "experiments.run") -> str:
    keep = [o for o in overrides if not o.startswith(("variant=", "variant.", "hydra"))]
    sel = f"variant={VARIANT_OPTIONS[name]}" if name in VARIANT_OPTIONS else f"variant.names=[{name}]"
    return " ".join(["python", "-m", entry, *map(shlex.quote, [sel, *keep])])


def summary(name: str, report: dict[str, Any], wall_s: float, overrides: list[str]) -> dict[str, Any]:
    """One flat row: what a table of many jobs needs to compare them."""
    m, v = report["metrics"], report["violation"]
    peaks = [i["timeline"] for i in report["instances"].values()]
    row: dict[str, Any] = dict(
        variant=name, sent=report["sent"], finished=report["outcomes"]["finished"],
        rejected=report["outcomes"]["rejected"], errors=report["outcomes"]["error"],
        first_rejected=report["first_unfinished"].get("rejected", ""),
        first_error=report["first_unfinished"].get("error", ""),
        finding=v["invariant"] if v else ("hang_guard" if report["sim"]["timed_out"] else ""),
        finding_time_s=round(v["time_s"], 6) if v else None, finding_instance=v["instance"] if v else None,
        timed_out=report["sim"]["timed_out"], sim_end_s=report["sim"]["end_s"],
        hit_rate=round(report["cache"]["hit_rate"], 6), **tier_rates(report),
        peak_used_pages=max((p["peak_used_pages"] for p in peaks), default=0),
        peak_pinned_pages=max((p["peak_pinned_pages"] for p in peaks), default=0),
        fault_hits=sum(f["hits"] for f in report["faults"]), wall_s=round(wall_s, 3))
    row.update({k: m[k] for k in ("completed", "duration", "request_throughput", "output_throughput",
                                  "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                                  "median_tpot_ms", "p99_tpot_ms", "mean_e2el_ms", "p99_e2el_ms")})
    row["replay"] = replay_command(name, overrides)
    return row


def run_experiment(exp: Experiment, out_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """Every variant; writes result.json and report_<variant>.json under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, reports = [], {}
    for name in exp.variants:
        report, wall = run_variant(exp, name)
        reports[name] = report
        rows.append(summary(name, report, wall, overrides))
        (out_dir / f"report_{safe(name)}.json").write_text(json.dumps(report, sort_keys=True) + "\n")
    result = dict(overrides=overrides, config=exp.config, rows=rows)
    (out_dir / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return dict(result=result, reports=reports)


def safe(name: str) -> str:
    return name.replace("+", "_")
