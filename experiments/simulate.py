"""One simulation: a workload against one simulated instance; metrics JSON.

    python -m experiments.simulate [variant=fixed] [workload=chat|random|mooncake] \
        [num_requests=200] [qps=10] [seed=0] [report=PATH] [key=value ...]

Metric names follow ``vllm bench serve``. ``workload=random`` is its random dataset
(``input_len``, ``output_len``, ``range_ratio``, ``prefix_len``); ``chat`` is multi-turn
sessions behind a shared system prompt (``turns``, ``system_prompt_len``, ``user_len``,
``output_len``, ``think_time_s``; ``qps`` is the request rate, sessions arrive at
qps/turns); ``mooncake`` replays ``trace=PATH`` (Mooncake JSONL, ``speedup``), or without a
path a synthetic trace in that format (the report says so). ``calibration=PATH`` runs on a
fitted step model (JSON of CalibratedStepModel coefficients) instead of the roofline;
``profile=PATH`` runs on a fitted hardware profile (``experiments.calibrate``'s YAML: step
model, copy links and, when it was measured so, a host thread that each step holds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.cli import main_guard, parse_overrides, write_report
from openinfer.errors import ConfigError, require
from sim.arrivals import ArrivalSpec
from sim.calibrated_step_model import CalibratedStepModel
from sim.lengths import LengthDist
from sim.perfetto import TraceRecorder
from sim.profile import FittedProfile
from sim.step_model import StepModel
from sim.traces import load_trace, parse_lines, synthetic_mooncake_lines
from sim.workloads import ChatWorkload, RandomWorkload, TraceWorkload, Workload
from sim.workload_spec import KIND_ONLY_KEYS
from sim.world import WorldConfig, build_world, run_world

WORKLOADS = ("chat", "random", "mooncake")
# keys that only some workloads read (make_workload); a mooncake trace file brings its own
# arrival times, so qps is read only by the synthetic trace
READ_BY = {**{k: (kind,) for kind, keys in KIND_ONLY_KEYS.items() for k in keys},
           "output_len": ("random", "chat"), "arrival": ("random", "chat"), "cv": ("random", "chat"),
           "trace": ("mooncake",), "speedup": ("mooncake",)}
# WorldConfig's names (and those of the objects it checks with) -> this command's keys
_WORLD_NAMES = {"world.block_size": "block_size", "world.num_blocks": "num_blocks",
                "world.host_tier_gib": "host_gib", "world.host": "host", "order.policy": "order",
                "scheduler.max_prefill_tokens": "max_prefill_tokens",
                "scheduler.max_decode_batch": "max_decode_batch", "abort.probability": "abort_prob",
                "abort.after_s": "abort_after_s", "world.output_mode": "output_mode",
                "arrival.rate": "qps", "arrival.process": "arrival", "arrival.cv": "cv"}


@dataclass
class SimulateConfig:
    variant: str = "fixed"
    workload: str = "chat"
    num_requests: int = 200
    qps: float = 10.0
    seed: int = 0
    report: str | None = None
    # instance
    hardware: str = "h200"
    model: str = "qwen3-4b"
    block_size: int = 16
    num_blocks: int | None = None
    host_gib: float = 8.0
    prefix_cache: bool = True
    max_prefill_tokens: int = 1024
    max_decode_batch: int = 256
    order: str = "fifo"
    calibration: str | None = None
    profile: str | None = None    # a fitted hardware profile (experiments.calibrate's YAML)
    host: str = "free"            # held: a step holds the engine's host thread (as the real engine)
    # arrivals and client
    arrival: str = "poisson"
    cv: float = 1.0
    output_mode: str = "max_tokens"
    abort_prob: float = 0.0
    abort_after_s: float = 1.0
    # random
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    prefix_len: int = 0
    # chat
    turns: int = 4
    system_prompt_len: int = 512
    user_len: int = 150
    think_time_s: float = 5.0
    # mooncake
    trace: str | None = None
    speedup: float = 1.0
    timeline: bool = True
    perfetto: str | None = None   # write a Chrome/Perfetto trace of the simulated timeline here

    def __post_init__(self) -> None:
        require(self.workload in WORKLOADS, "workload", self.workload, f"one of {', '.join(WORKLOADS)}")
        require(self.num_requests >= 1, "num_requests", self.num_requests, "an int >= 1")
        require(self.qps > 0, "qps", self.qps, "a number > 0 (requests per second; inf = all at once)")
        require(self.turns >= 1, "turns", self.turns, "an int >= 1")
        require(not (self.profile and self.calibration), "calibration", self.calibration,
                "unset when profile= is given (the profile carries its own step model)")
        try:
            self.world_config()
            ArrivalSpec(self.qps, self.arrival, self.cv)
        except ConfigError as err:
            raise ConfigError(_WORLD_NAMES.get(err.field, err.field), err.value, err.accepted) from None

    def world_config(self) -> WorldConfig:
        return WorldConfig(variant=self.variant, model=self.model, hardware=self.hardware,
                           block_size=self.block_size, num_blocks=self.num_blocks, host_tier_gib=self.host_gib,
                           prefix_cache=self.prefix_cache, max_prefill_tokens=self.max_prefill_tokens,
                           max_decode_batch=self.max_decode_batch, seed=self.seed, order=self.order,
                           output_mode=self.output_mode, abort_probability=self.abort_prob,
                           abort_after_s=self.abort_after_s, host=self.host)

    def check_keys_read(self, given: set[str]) -> None:
        for key in sorted(given):
            readers = READ_BY.get(key, WORKLOADS)
            require(self.workload in readers, key, getattr(self, key),
                    f"unset: only workload={' or '.join(readers)} reads it (this run is workload={self.workload})")
        require(not ("qps" in given and self.workload == "mooncake" and self.trace is not None), "qps",
                self.qps, "unset with trace= (the trace's own arrival times are replayed; speedup= scales them)")
        require(not ("hardware" in given and self.profile), "hardware", self.hardware,
                "unset with profile= (the profile is fitted on its own card: its base preset and "
                "measured links are what runs)")


def make_workload(cfg: SimulateConfig) -> Workload:
    if cfg.workload == "random":
        return RandomWorkload(cfg.num_requests, cfg.input_len, cfg.output_len, cfg.range_ratio, cfg.prefix_len,
                              ArrivalSpec(cfg.qps, cfg.arrival, cfg.cv))
    if cfg.workload == "chat":
        return ChatWorkload(num_sessions=-(-cfg.num_requests // cfg.turns), turns=LengthDist.fixed(cfg.turns),
                            system_prompt_len=cfg.system_prompt_len,
                            user_len=LengthDist.lognormal(cfg.user_len, 0.5, max=8 * cfg.user_len),
                            output_len=LengthDist.lognormal(cfg.output_len, 0.5, max=8 * cfg.output_len),
                            think_time_s=cfg.think_time_s,
                            arrival=ArrivalSpec(cfg.qps / cfg.turns, cfg.arrival, cfg.cv),
                            max_requests=cfg.num_requests)
    if cfg.trace is not None:
        records = load_trace(cfg.trace)
        source = Path(cfg.trace).name
    else:
        records = parse_lines(synthetic_mooncake_lines(cfg.num_requests, cfg.seed, rate=cfg.qps), "synthetic")
        source = "synthetic-mooncake-format"
    return TraceWorkload(records, speedup=cfg.speedup, limit=cfg.num_requests, source=source)


def load_calibration(path: str) -> StepModel:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError("calibration", path, f"a readable JSON file of coefficients ({err})") from None
    return CalibratedStepModel.from_dict(data.get("coefficients", data))


def simulate(cfg: SimulateConfig) -> dict[str, Any]:
    world_cfg = cfg.world_config()
    if cfg.profile:
        profile = FittedProfile.load(cfg.profile)
        profile.check_model(cfg.model)
        world_cfg = replace(world_cfg, hardware=profile.base_hardware)   # what the report says ran
        world = profile.world(world_cfg)
    else:
        step_model = load_calibration(cfg.calibration) if cfg.calibration else None
        world = build_world(world_cfg, step_model=step_model)
    recorder = None
    if cfg.perfetto:
        recorder = TraceRecorder()
        recorder.attach(world.engine)
    report = run_world(world, make_workload(cfg))
    if recorder is not None:
        recorder.write(cfg.perfetto)
    report["simulate"] = {k: v for k, v in cfg.__dict__.items() if k != "report"}  # where it goes is not what ran
    if not cfg.timeline:
        report.pop("timeline")
    return report


def print_summary(r: dict[str, Any]) -> None:
    m, c = r["metrics"], r["config"]
    print(f"simulate: variant={c['variant']} workload={r['workload']['kind']} {r['model']['name']} on "
          f"{r['hardware']['name']} ({r['pool']['total_blocks']} GPU pages, "
          f"{(r['host_tier'] or {}).get('capacity', 0)} host pages), seed={c['seed']}")
    o = r["outcomes"]
    print(f"  requests   sent {r['sent']}  finished {o['finished']}  aborted {o['aborted']}  "
          f"rejected {o['rejected']}  error {o['error']}  {'(HANG GUARD HIT)' if r['sim']['timed_out'] else ''}")
    print(f"  duration   {m['duration']:.2f} s   req/s {m['request_throughput']:.2f}   "
          f"out tok/s {m['output_throughput']:.0f}   total tok/s {m['total_token_throughput']:.0f}")
    print(f"  {'metric':<6} {'mean':>10} {'median':>10} {'p99':>10}   (ms)")
    for k in ("ttft", "tpot", "itl", "e2el"):
        print(f"  {k:<6} {m[f'mean_{k}_ms']:10.2f} {m[f'median_{k}_ms']:10.2f} {m[f'p99_{k}_ms']:10.2f}")
    e = r["engine"]
    print(f"  cache hit {r['cache']['hit_rate']:.3f}   steps {e['steps']} {e['steps_by_kind']}   "
          f"busy {e['busy_fraction']:.3f}   host hit blocks {(r['host_tier'] or {}).get('hit_blocks', 0)}")


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(SimulateConfig, argv)
    report = simulate(cfg)
    print_summary(report)
    write_report(cfg.report, report)
    v = report.get("violation")
    if v is not None:
        print(f"VIOLATION {v['invariant']} at t={v['time_s']:.6f}s: {v['detail']}\n"
              f"  seed={report['config']['seed']}; replay: python -m experiments.simulate {' '.join(argv)}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
