"""The main job: a P/D cluster serving multi-turn chat under pr829 and under fixed, with a
MetaServer stall that heals; a printed comparison and PNG plots in Hydra's output folder.

    python -m experiments.run [variant=fixed] [workload.qps=16] [faults=registration_stall]
                              [experiment=smoke] [store.host_tier_gib=4] ...

Overrides are checked before anything runs (``experiments.config.preflight``): a wrong key,
type or range prints one line naming the key and what it accepts, and exits 2. Config
groups live in conf/ (see conf/config.yaml); ``--cfg job`` prints the composed config.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments import plots
from experiments.config.build import Experiment, build
from experiments.config.preflight import guard
from experiments.config.schema import register
from experiments.runner import run_experiment, safe
from openinfer.errors import ConfigError

register()


def _ms(row: dict[str, Any], k: str) -> str:
    return f"{row[f'mean_{k}_ms']:.1f} / {row[f'p99_{k}_ms']:.1f}"


def comparison(exp: Experiment, rows: list[dict[str, Any]]) -> list[str]:
    """The short table the README shows: findings, latencies, hit rates, what finished."""
    c = exp.clusters[exp.variants[0]]
    w = exp.workload.describe()
    shape = f"{c.prefill} prefill + {c.decode} decode" if c.prefill else f"{c.mixed} mixed ({c.policy})"
    faults = "; ".join(f.spec.describe() + (f" on {f.target}" if f.target != "all" else "") for f in exp.faults)
    n = w.get("max_requests") or w.get("num_requests")
    lines = [f"openinfer {exp.config.get('experiment', {}).get('name', '')}: {shape}, {w['kind']} workload, "
             f"{n} requests, pool {c.world.num_blocks or 'sized from HBM'} pages + {c.world.host_tier_gib:g} GiB "
             f"CPU tier, faults: {faults or 'none'} (simulated time)"]
    table = [
        ("requests finished", [f"{r['finished']}/{r['sent']}" for r in rows]),
        ("finding", [r["finding"] or "none" for r in rows]),
        ("  at (sim s)", [f"{r['finding_time_s']:.2f} {r['finding_instance'] or ''}".strip()
                          if r["finding_time_s"] is not None else "-" for r in rows]),
        ("TTFT mean/p99 ms", [_ms(r, "ttft") for r in rows]),
        ("TPOT mean/p99 ms", [_ms(r, "tpot") for r in rows]),
        ("req/s finished", [f"{r['request_throughput']:.2f}" for r in rows]),
        ("hit rate, answer", [f"{r['hit_rate']:.3f}" for r in rows]),
        ("  all gpu/host/peer", [f"{r['gpu_hit_rate']:.2f}/{r['host_hit_rate']:.2f}/{r['peer_hit_rate']:.2f}"
                             for r in rows]),
        ("peak pinned pages", [str(r["peak_pinned_pages"]) for r in rows]),
        ("wall s", [f"{r['wall_s']:.1f}" for r in rows]),
    ]
    width = max(14, *(len(v) + 2 for v in [r["variant"] for r in rows] + [v for _, vals in table for v in vals]))
    lines.append(f"  {'':<18}" + "".join(f"{r['variant']:>{width}}" for r in rows))
    for label, vals in table:
        lines.append(f"  {label:<18}" + "".join(f"{v:>{width}}" for v in vals))
    lines.append("  hit rate, answer: cached share of each prompt where it was answered (the decode side under P/D)")
    lines.append("  all gpu/host/peer: share of every instance's prompt tokens (the prefill copy included) found in")
    lines.append("    its GPU radix / its CPU tier / a peer")
    for r in rows:
        for status, count, first in (("rejected", r["rejected"], r["first_rejected"]),
                                     ("error", r["errors"], r["first_error"])):
            if count:   # e.g. prompts that no pool or context limit can hold
                lines.append(f"  {r['variant']}: {count} of {r['sent']} requests {status}, the first: "
                             f"{first or '(no message)'}")
        if r["finding"]:
            lines.append(f"  {r['variant']}: {r['finding']} stopped the run after {r['finished']} finished; "
                         f"replay: {r['replay']}")
    return lines


def write_plots(out: Path, reports: dict[str, Any]) -> list[Path]:
    paths = [out / "latency_cdf.png"]
    plots.cdfs(reports, paths[0])
    for name, rep in reports.items():
        p = out / f"timeline_{safe(name)}.png"
        plots.timeline(rep, p, title=f"{name}: one run's pool and queues")
        paths.append(p)
    return paths


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def app(cfg: DictConfig) -> None:
    try:
        exp = build(cfg)
    except ConfigError as err:  # a sweeper's trial can still land out of range
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    res = run_experiment(exp, out, list(hc.overrides.task))
    for line in comparison(exp, res["result"]["rows"]):
        print(line)
    if exp.plots:
        written = write_plots(out, res["reports"])
        print(f"  plots: {', '.join(str(p) for p in written)}")
    print(f"  results: {out / 'result.json'}")


def main() -> None:
    guard(sys.argv[1:], "config")
    app()


if __name__ == "__main__":
    main()
