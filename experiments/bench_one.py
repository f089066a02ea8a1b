"""One benchmark run of the simulator, in this process: the unit ``experiments.bench`` repeats.

    python -m experiments.bench_one case=chat|pd|offline requests=N [qps=R | load=0.7]
                                    [world=key=value,key=value] [seed=0]

prints one JSON line on stdout: wall and CPU seconds, requests and engine steps per wall
second, the simulated-to-wall ratio, what completed, and this process's peak RSS
(``ru_maxrss``). ``experiments.bench`` runs every repeat as a fresh ``python -m
experiments.bench_one`` so that one run's peak memory cannot leak into the next.

Cases (Qwen3-4B on an H200 unless ``world=`` says otherwise; prefix cache and an 8 GiB
CPU tier on, monitors on, the pool sized from HBM):

* ``chat`` — one mixed instance; sessions of three turns behind a 600-token system prompt
  (prompts of ~700/1000/1300 tokens, ~1,000 on average), ~200-token answers (lognormal),
  Poisson session arrivals at ``load`` × the instance's estimated saturation rate.
* ``pd`` — the same workload through the two-phase router of a P/D pair (1 prefill + 1
  decode instance, the peer tier between them, a MetaServer); ``load`` is relative to the
  pair's estimated saturation (the slower of its prefill side and its decode side).
* ``offline`` — a saturated batch: every request arrives at t=0; single-turn prompts of
  the same shape (the 600-token shared prefix + ~400 unique tokens, lognormal), ~200-token
  answers. ``load`` and ``qps`` do not apply.

Wall time covers building the world and running it to the last request's end (and, for
P/D, the settle period that lets the last saves land); timing is read here, in the
experiments layer, never in the simulator.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any, get_type_hints

from experiments.cli import _coerce, main_guard, parse_overrides
from openinfer.errors import ConfigError, require
from openinfer.variants import variant as get_variant
from sim.arrivals import ArrivalSpec
from sim.capacity import RequestShape, chat_shape, saturation_qps
from sim.hardware import preset as hardware_preset
from sim.lengths import LengthDist
from sim.model_geometry import preset as model_preset
from sim.step_model import RooflineStepModel
from sim.workloads import ChatWorkload, SyntheticWorkload, Workload
from sim.world import WorldConfig

CASES = ("chat", "pd", "offline")
TURNS = 3
SYSTEM_PROMPT = 600
PD_SETTLE_S = 10.0  # simulated seconds after the last request for saves and registrations


# ---------------------------------------------------------------- world overrides

def parse_world_overrides(text: str | None, key: str) -> dict[str, Any]:
    """``a=1,b=false`` → {a: 1, b: False}, each key a WorldConfig field with its type;
    checked by building a WorldConfig so a value out of range is caught before any run."""
    if text is None or not text.strip():
        return {}
    fields = {f.name for f in dataclasses.fields(WorldConfig)}
    hints = get_type_hints(WorldConfig)
    out: dict[str, Any] = {}
    for item in text.split(","):
        name, sep, raw = item.strip().partition("=")
        if not sep or not name:
            raise ConfigError(key, text, "a comma list of key=value WorldConfig overrides, "
                                         "e.g. fast_decode=false or monitors=false,transfer=modeled")
        if name not in fields:
            raise ConfigError(f"{key}.{name}", raw, f"a WorldConfig field: one of {', '.join(sorted(fields))}")
        try:
            out[name] = _coerce(f"{key}.{name}", raw, hints[name])
        except ConfigError as err:
            raise ConfigError(err.field, err.value, err.accepted) from None
    try:
        wc = WorldConfig(**out)
        get_variant(wc.variant)
        model_preset(wc.model)
        hardware_preset(wc.hardware)
    except ConfigError as err:
        raise _as_override(err, key) from None
    return out


def _as_override(err: ConfigError, key: str) -> ConfigError:
    """``err`` of a WorldConfig field, named as the ``key=field=value`` override that set it."""
    return ConfigError(f"{key}.{err.field.removeprefix('world.')}", err.value, err.accepted)


def format_world_overrides(overrides: dict[str, Any]) -> str:
    return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items())


def check_run_overrides(overrides: dict[str, Any], key: str, cases: list[str]) -> None:
    """What a run of each case would refuse, refused when the command starts (bench checks
    its whole plan here, before the first of many runs)."""
    require("seed" not in overrides, f"{key}.seed", overrides.get("seed"),
            "unset: seed= is the run's seed (and the report's)")
    if "pd" in cases:
        from sim.cluster import ClusterConfig
        try:
            ClusterConfig(world=world_config(overrides), mixed=0, prefill=1, decode=1)
        except ConfigError as err:
            raise _as_override(err, key) from None


def world_config(overrides: dict[str, Any], seed: int = 0) -> WorldConfig:
    base: dict[str, Any] = dict(seed=seed, host_tier_gib=8.0, prefix_cache=True, num_blocks=None)
    base.update(overrides)
    return WorldConfig(**base)


# ---------------------------------------------------------------- workloads

def chat_workload(n: int, qps: float) -> ChatWorkload:
    """Three turns behind a 600-token system prompt: prompts of ~700/1000/1300 tokens."""
    return ChatWorkload(num_sessions=-(-n // TURNS), turns=LengthDist.fixed(TURNS),
                        system_prompt_len=SYSTEM_PROMPT, user_len=LengthDist.lognormal(100, 0.4, max=1000),
                        output_len=LengthDist.lognormal(200, 0.4, max=1000), think_time_s=3.0,
                        arrival=ArrivalSpec(rate=qps / TURNS), max_requests=n)


def offline_workload(n: int) -> SyntheticWorkload:
    """All at t=0: the shared 600-token prefix + ~400 unique tokens, ~200-token answers."""
    return SyntheticWorkload(num_requests=n, input=LengthDist.lognormal(400, 0.4, max=4000),
                             output=LengthDist.lognormal(200, 0.4, max=1000), shared_prefix_len=SYSTEM_PROMPT,
                             arrival=ArrivalSpec(rate=math.inf))


def saturation(case: str, wc: WorldConfig) -> dict[str, float]:
    """Estimated saturation request rate (sim.capacity) of the case's serving setup."""
    sm = RooflineStepModel(model_preset(wc.model), hardware_preset(wc.hardware))
    shape = chat_shape(chat_workload(TURNS, 1.0))
    kw = dict(max_batch=wc.max_decode_batch, chunk_tokens=wc.max_prefill_tokens)
    mixed = saturation_qps(sm, shape, **kw)
    if case != "pd":
        return dict(saturation_qps=mixed)
    # P/D: the decode instance only decodes (the prompt arrives over the peer tier), the
    # prefill instance only prefills; the pair saturates at the slower of the two.
    decode_only = saturation_qps(sm, RequestShape(shape.prompt_tokens, shape.prompt_tokens, shape.output_tokens), **kw)
    prefill_s = max(1e-12, 1.0 / mixed - 1.0 / decode_only)
    return dict(saturation_qps=min(decode_only, 1.0 / prefill_s), decode_saturation_qps=decode_only,
                prefill_saturation_qps=1.0 / prefill_s, mixed_saturation_qps=mixed)


# ---------------------------------------------------------------- one run

def peak_rss_mb() -> float:
    """This process's peak resident set, in MB (10^6 bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1e6 if sys.platform == "darwin" else rss * 1024 / 1e6


@dataclass
class BenchOneConfig:
    case: str = "chat"
    requests: int = 1000
    qps: float | None = None      # None: load × the case's estimated saturation
    load: float = 0.7
    seed: int = 0
    world: str | None = None      # WorldConfig overrides: key=value,key=value

    def __post_init__(self) -> None:
        require(self.case in CASES, "case", self.case, f"one of {', '.join(CASES)}")
        require(isinstance(self.requests, int) and self.requests >= 1, "requests", self.requests, "an int >= 1")
        require(self.qps is None or self.qps > 0, "qps", self.qps, "null (from load) or a number > 0")
        require(0 < self.load <= 2, "load", self.load, "a number in (0, 2]")
        self.overrides = parse_world_overrides(self.world, "world")
        check_run_overrides(self.overrides, "world", [self.case])

    def check_keys_read(self, given: set[str]) -> None:
        """Keys this case never reads: refused, not dropped."""
        for key in ("qps", "load"):
            require(key not in given or self.case != "offline", key, getattr(self, key),
                    "unset with case=offline: every request of the batch arrives at t=0")
        require(not {"qps", "load"} <= given, "load", self.load, "unset when qps= is given (it sets the rate)")


def run_one(cfg: BenchOneConfig) -> dict[str, Any]:
    wc = world_config(cfg.overrides, cfg.seed)
    sat = saturation(cfg.case, wc)
    qps = math.inf if cfg.case == "offline" else (cfg.qps if cfg.qps is not None else cfg.load * sat["saturation_qps"])
    n = cfg.requests
    workload: Workload = offline_workload(n) if cfg.case == "offline" else chat_workload(n, qps)
    rss0 = peak_rss_mb()
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    if cfg.case == "pd":
        from sim.cluster import ClusterConfig, build_cluster
        from sim.cluster_run import run_cluster
        cluster = build_cluster(ClusterConfig(world=wc, mixed=0, prefill=1, decode=1))
        rep = run_cluster(cluster, workload, monitors=wc.monitors, settle_s=PD_SETTLE_S)
        steps = sum(i["steps"] for i in rep["instances"].values())
        hit_rate = rep["cache"]["hit_rate"]
    else:
        from sim.world import build_world, run_world
        rep = run_world(build_world(wc), workload)
        steps = rep["engine"]["steps"]
        hit_rate = rep["cache"]["hit_rate"]
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    m = rep["metrics"]
    sim_s = m["duration"]  # simulated seconds from the first send to the last request's end
    return dict(case=cfg.case, requests=n, world=format_world_overrides(cfg.overrides),
                qps=None if math.isinf(qps) else round(qps, 4), **{k: round(v, 4) for k, v in sat.items()},
                wall_s=wall, cpu_s=cpu, requests_per_s=n / wall, requests_per_cpu_s=n / cpu if cpu > 0 else 0.0,
                steps=steps, steps_per_s=steps / wall, sim_s=sim_s, sim_to_wall=sim_s / wall,
                completed=m["completed"], failed=m["failed"], sent=rep["sent"],
                violation=(rep["violation"] or {}).get("invariant"), timed_out=rep["sim"]["timed_out"],
                hit_rate=hit_rate, mean_ttft_ms=m["mean_ttft_ms"], mean_tpot_ms=m["mean_tpot_ms"],
                events=rep["sim"]["events_processed"], rss_before_run_mb=rss0, peak_rss_mb=peak_rss_mb())


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(BenchOneConfig, argv)
    print(json.dumps(run_one(cfg), sort_keys=True))


if __name__ == "__main__":
    main()
