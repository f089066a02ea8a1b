"""Simulator speed: how fast the SimPy world serves a chat-like workload.

    python -m experiments.bench_sim [requests=10000] [small=1000] [repeats=3] [load=0.7] [report=PATH]

A chat workload of ~1,000-token prompts (shared system prompt, three turns) and ~200-token
answers, Poisson arrivals at ``load`` × the instance's estimated saturation rate, prefix
caching and the CPU tier on, Qwen3-4B on an H200. For the small and the full size it prints
the median over ``repeats`` of wall seconds, simulated requests per wall second, engine
steps per wall second, simulated-to-wall time ratio, and peak RSS; then the scaling ratio
(per-request wall cost at the full size over the small size: 1.0 is linear).
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from experiments.cli import main_guard, parse_overrides, write_report
from openinfer.errors import require
from sim.arrivals import ArrivalSpec
from sim.capacity import chat_shape, saturation_qps
from sim.hardware import preset as hardware_preset
from sim.lengths import LengthDist
from sim.model_geometry import preset as model_preset
from sim.step_model import RooflineStepModel
from sim.workloads import ChatWorkload
from sim.world import WorldConfig, build_world, run_world


@dataclass
class BenchSimConfig:
    requests: int = 10_000
    small: int = 1_000
    repeats: int = 3
    load: float = 0.7
    seed: int = 0
    hardware: str = "h200"
    model: str = "qwen3-4b"
    report: str | None = None

    def __post_init__(self) -> None:
        require(self.requests >= 10, "requests", self.requests, "an int >= 10")
        require(1 <= self.small <= self.requests, "small", self.small, f"an int in [1, requests={self.requests}]")
        require(self.repeats >= 1, "repeats", self.repeats, "an int >= 1")
        require(0 < self.load <= 2, "load", self.load, "a number in (0, 2]")


TURNS = 3


def chat_workload(n_requests: int, qps: float) -> ChatWorkload:
    """Three turns behind a 600-token system prompt: prompts of ~700/1000/1300 tokens."""
    return ChatWorkload(num_sessions=-(-n_requests // TURNS), turns=LengthDist.fixed(TURNS),
                        system_prompt_len=600, user_len=LengthDist.lognormal(100, 0.4, max=1000),
                        output_len=LengthDist.lognormal(200, 0.4, max=1000), think_time_s=3.0,
                        arrival=ArrivalSpec(rate=qps / TURNS), max_requests=n_requests)


def peak_rss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 1024


def one_run(cfg: BenchSimConfig, n: int, qps: float) -> dict[str, Any]:
    world_cfg = WorldConfig(model=cfg.model, hardware=cfg.hardware, seed=cfg.seed, host_tier_gib=8.0,
                            prefix_cache=True)
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    w = build_world(world_cfg)
    rep = run_world(w, chat_workload(n, qps))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    sim_s = rep["sim"]["end_s"]
    return dict(wall_s=wall, cpu_s=cpu, requests_per_s=n / wall, requests_per_cpu_s=n / cpu, steps_per_s=rep["engine"]["steps"] / wall,
                sim_to_wall=sim_s / wall, sim_s=sim_s, steps=rep["engine"]["steps"],
                completed=rep["metrics"]["completed"], hit_rate=rep["cache"]["hit_rate"],
                mean_decode_batch=_mean_batch(rep), busy_fraction=rep["engine"]["busy_fraction"],
                host_hits=(rep["host_tier"] or {}).get("hit_blocks", 0),
                mean_ttft_ms=rep["metrics"]["mean_ttft_ms"], mean_tpot_ms=rep["metrics"]["mean_tpot_ms"],
                peak_rss_mib=peak_rss_mib())


def _mean_batch(rep: dict[str, Any]) -> float:
    rows = rep["timeline"]["rows"]
    i = rep["timeline"]["columns"].index("decode_rows")
    vals = [r[i] for r in rows if r[i]]
    return round(sum(vals) / len(vals), 1) if vals else 0.0


def bench(cfg: BenchSimConfig) -> dict[str, Any]:
    w = chat_workload(cfg.requests, 1.0)
    sat = saturation_qps(RooflineStepModel(model_preset(cfg.model), hardware_preset(cfg.hardware)), chat_shape(w))
    qps = cfg.load * sat
    out: dict[str, Any] = dict(config=dict(cfg.__dict__), saturation_qps=round(sat, 2), qps=round(qps, 2),
                               sizes={})
    for n in sorted({cfg.small, cfg.requests}):
        runs = [one_run(cfg, n, qps) for _ in range(cfg.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        med["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
        out["sizes"][str(n)] = med
    small, full = out["sizes"][str(cfg.small)], out["sizes"][str(cfg.requests)]
    out["scaling_ratio"] = (full["wall_s"] / cfg.requests) / (small["wall_s"] / cfg.small)
    return out


def print_bench(out: dict[str, Any]) -> None:
    print(f"bench_sim: chat workload, {out['config']['model']} on {out['config']['hardware']}, "
          f"saturation ≈ {out['saturation_qps']} req/s, Poisson at {out['qps']} req/s "
          f"(load {out['config']['load']}), prefix cache + CPU tier on, median of {out['config']['repeats']}")
    head = (f"{'requests':>9} {'wall_s':>8} {'cpu_s':>8} {'req/s':>8} {'steps/s':>8} {'sim/wall':>8} {'sim_s':>8} "
            f"{'steps':>7} {'batch':>6} {'hit':>5} {'rss_MiB':>8}")
    print(head)
    for n, r in out["sizes"].items():
        print(f"{n:>9} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} {r['requests_per_s']:8.0f} {r['steps_per_s']:8.0f} "
              f"{r['sim_to_wall']:8.2f} {r['sim_s']:8.1f} {r['steps']:7.0f} {r['mean_decode_batch']:6.1f} "
              f"{r['hit_rate']:5.2f} {r['peak_rss_mib']:8.0f}")
    print("(req/s, steps/s and sim/wall are per wall second; cpu_s is this process's CPU time)")
    print(f"scaling ratio (per-request wall cost, full / small): {out['scaling_ratio']:.2f}  (1.00 = linear)")


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(BenchSimConfig, argv)
    out = bench(cfg)
    print_bench(out)
    write_report(cfg.report, out)


if __name__ == "__main__":
    main()
