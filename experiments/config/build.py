"""From a composed (typed) config to the simulator's objects, checked before any run.

Every range rule is the simulator's own ``__post_init__`` (WorldConfig, ClusterConfig,
FaultSpec, the workloads, ArrivalSpec, LengthDist) or its preset/variant lookups; this
module maps their field names back to the Hydra keys a user typed, so an error names
``store.num_blocks`` rather than ``world.num_blocks``. The only rules here are those
between objects no one of them sees together: a fault's port against the instances'
tiers, and the pool and context limits against the workload's smallest request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from openinfer.errors import ConfigError, require
from openinfer.kv.request_kv import lifetime_blocks
from openinfer.variants import variant as parse_variant
from sim.cluster import ClusterConfig
from sim.cluster_run import PlacedFault
from sim.faults import METASERVER_PORTS, TIER_PORTS, FaultSpec
from sim.hardware import preset as hardware_preset
from sim.metrics import summarize
from sim.model_geometry import preset as model_preset
from sim.workload_spec import KIND_ONLY_KEYS, workload_from_flat
from sim.workloads import Workload
from sim.world import WorldConfig

WORKLOAD_KINDS = tuple(KIND_ONLY_KEYS)   # chat, random
# what a sweep job can return to a sweeper: the vllm-bench metric keys, plus the finished count
OBJECTIVES = tuple(k for k in summarize([], [], 0.0) if k not in ("failed",)) + ("finished", "hit_rate")
# the objectives an optimising sweeper must maximise (the rest are times: minimise)
HIGHER_IS_BETTER = ("completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                    "output_throughput", "total_token_throughput", "finished", "hit_rate")
BACKENDS = ("sim",)
STEP_MODELS = ("roofline",)  # a fitted model needs build_cluster to take one (not yet)

# simulator field -> the Hydra key that sets it
_WORLD_KEYS = {
    "model": "model.name", "hardware": "hardware.name", "block_size": "store.block_size",
    "num_blocks": "store.num_blocks", "host_tier_gib": "store.host_tier_gib", "prefix_cache": "store.prefix_cache",
    "transfer": "store.transfer", "max_prefill_tokens": "scheduler.max_prefill_tokens",
    "max_decode_batch": "scheduler.max_decode_batch", "max_context_tokens": "scheduler.max_context_tokens",
    "decode_full_hit": "scheduler.decode_full_hit", "resolve_deadline_s": "store.resolve_deadline_s",
    "order": "scheduler.order", "seed": "experiment.seed", "max_sim_s": "experiment.max_sim_s",
    "timeline_every": "experiment.timeline_every", "timeline_max_rows": "experiment.timeline_max_rows",
    "abort_probability": "workload.abort_probability", "abort_after_s": "workload.abort_after_s",
}
_RENAMES = {**{f"world.{k}": v for k, v in _WORLD_KEYS.items()},
            "cluster.mixed": "experiment.mixed", "cluster.prefill": "experiment.prefill",
            "cluster.decode": "experiment.decode", "cluster.policy": "experiment.policy",
            "arrival.rate": "workload.qps", "arrival.process": "workload.arrival", "arrival.cv": "workload.cv",
            "cluster.metaserver_rpc_s": "experiment.metaserver_rpc_s",
            "workload.num_sessions": "workload.num_requests", "model": "model.name", "hardware": "hardware.name",
            # the objects WorldConfig makes to check its fields name them in their own terms
            "order.policy": "scheduler.order", "abort.probability": "workload.abort_probability",
            "abort.after_s": "workload.abort_after_s", "monitor.check_pool_every": "experiment.monitor_pool_every"}


@dataclass
class Experiment:
    """One validated experiment: a cluster config per variant, the workload, the faults."""

    variants: list[str]
    clusters: dict[str, ClusterConfig]
    workload: Workload
    faults: list[PlacedFault]
    settle_s: float
    chunk_s: float
    monitors: bool
    progress: bool | None
    plots: bool
    objective: str
    config: dict[str, Any] = field(default_factory=dict)


def _renamed(err: ConfigError, prefix: str = "") -> ConfigError:
    key = _RENAMES.get(err.field, err.field)
    if prefix and key.startswith("fault."):
        key = prefix + key[len("fault"):]
    return ConfigError(key, err.value, err.accepted)


def make_workload(w: Any, max_context_tokens: int) -> Workload:
    """The workload group's flat form; a chat session ends before a turn that would outgrow
    the instances' context limit (``scheduler.max_context_tokens``), as a client that knows
    the served model's length would, instead of sending it to be rejected."""
    require(isinstance(w.qps, (int, float)) and w.qps > 0, "workload.qps", w.qps,
            "a number > 0 (requests per second) or inf")
    require(w.kind in WORKLOAD_KINDS, "workload.kind", w.kind, f"one of {', '.join(WORKLOAD_KINDS)}")
    require(w.num_requests >= 1, "workload.num_requests", w.num_requests, "an int >= 1")
    require(w.turns >= 1, "workload.turns", w.turns, "an int >= 1")
    require(w.user_len >= 1, "workload.user_len", w.user_len, "an int >= 1")
    require(w.output_len >= 1, "workload.output_len", w.output_len, "an int >= 1")
    flat = dict(kind=w.kind, output_len=w.output_len, rate=w.qps, process=w.arrival, cv=w.cv)
    flat.update({k: getattr(w, k) for k in KIND_ONLY_KEYS[w.kind]})
    if w.kind == "random":
        flat.update(num_requests=w.num_requests)
    else:  # qps is the request rate: sessions of ``turns`` requests arrive at qps/turns
        flat.update(rate=w.qps / w.turns, num_sessions=-(-w.num_requests // w.turns), max_requests=w.num_requests,
                    length_sigma=0.5, max_context_tokens=max_context_tokens)
    return workload_from_flat(flat)


class _HasSmallest(Protocol):
    def smallest_request(self) -> tuple[int, int]: ...


def check_serves_one(workload: _HasSmallest, world: WorldConfig) -> None:
    """Refuse limits under which even the workload's smallest request is never served (the
    run would reject every request, or a chat session would end before its first turn)."""
    prompt, max_tokens = workload.smallest_request()
    require(prompt + max_tokens <= world.max_context_tokens, "scheduler.max_context_tokens",
            world.max_context_tokens, f"an int >= {prompt + max_tokens}: the workload's smallest request "
            f"is {prompt} prompt + {max_tokens} output tokens")
    if world.num_blocks is not None:   # a pool sized from memory holds any request
        need = lifetime_blocks(prompt, max_tokens, world.block_size)
        require(need < world.num_blocks, "store.num_blocks", world.num_blocks,
                f"an int >= {need + 1}: the workload's smallest request needs {need} KV pages, "
                "and one page of the pool is the padding page")


def make_faults(cfg: Any, instances: list[str], has_host_tier: bool) -> list[PlacedFault]:
    out = []
    for i, f in enumerate(cfg.faults.schedule):
        prefix = f"faults.schedule[{i}]"
        try:
            spec = FaultSpec(port=f.port, kind=f.kind, start_s=float(f.start_s), heal_s=float(f.heal_s),
                             probability=float(f.probability), delay_s=float(f.delay_s), match=f.match)
        except ConfigError as err:
            raise _renamed(err, prefix) from None
        require(f.target == "all" or f.target in instances, f"{prefix}.target", f.target,
                f"all or one of {', '.join(instances)}")
        require(f.port not in METASERVER_PORTS or cfg.experiment.prefill > 0, f"{prefix}.port",
                f.port, "a tier port (query, load, save, flush) or step: without P/D there is no MetaServer")
        require(f.target == "all" or f.port not in METASERVER_PORTS, f"{prefix}.target", f.target,
                f"all for port {f.port}: the MetaServer is shared, its faults hit every instance")
        require(f.port not in TIER_PORTS or has_host_tier, f"{prefix}.port", f.port,
                "step, or store.host_tier_gib > 0: the query, load, save and flush ports are the "
                "CPU tier's, and without one the fault would never fire")
        out.append(PlacedFault(spec, f.target))
    return out


def build(cfg: DictConfig | Any) -> Experiment:
    """Check everything and build; a problem raises ConfigError naming the Hydra key."""
    try:
        return _build(cfg)
    except ConfigError as err:
        raise _renamed(err) from None


def _build(cfg: Any) -> Experiment:
    if isinstance(cfg, DictConfig):
        # a ``+key=value`` override opens the struct for itself; the schema still says no
        from experiments.config.schema import Config
        OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.to_container(cfg))
    e = cfg.experiment
    names = list(cfg.variant.names)
    require(len(names) >= 1, "variant.names", names, "at least one variant (pr829, fixed, fixed+F2, ...)")
    for n in names:
        try:
            parse_variant(n)
        except ConfigError as err:
            raise ConfigError("variant.names", n, err.accepted) from None
    model_preset(cfg.model.name)
    hardware_preset(cfg.hardware.name)
    require(cfg.backend.kind in BACKENDS, "backend.kind", cfg.backend.kind,
            f"one of {', '.join(BACKENDS)} (the GPU run is experiments.validate)")
    require(cfg.backend.step_model in STEP_MODELS, "backend.step_model", cfg.backend.step_model,
            f"one of {', '.join(STEP_MODELS)}")
    require(e.objective in OBJECTIVES, "experiment.objective", e.objective, f"one of {', '.join(OBJECTIVES)}")
    require(e.settle_s >= 0, "experiment.settle_s", e.settle_s, "a number >= 0 (seconds)")
    require(e.chunk_s > 0, "experiment.chunk_s", e.chunk_s, "a number > 0 (seconds)")
    require(math.isfinite(e.max_sim_s), "experiment.max_sim_s", e.max_sim_s, "a finite number > 0 (seconds)")
    clusters = {}
    for n in names:
        st, sc = cfg.store, cfg.scheduler
        world = WorldConfig(variant=n, model=cfg.model.name, hardware=cfg.hardware.name, block_size=st.block_size,
                            num_blocks=st.num_blocks, host_tier_gib=st.host_tier_gib, prefix_cache=st.prefix_cache,
                            max_prefill_tokens=sc.max_prefill_tokens, max_decode_batch=sc.max_decode_batch,
                            max_context_tokens=sc.max_context_tokens, seed=e.seed, order=sc.order,
                            decode_full_hit=sc.decode_full_hit, resolve_deadline_s=st.resolve_deadline_s,
                            abort_probability=cfg.workload.abort_probability,
                            abort_after_s=cfg.workload.abort_after_s, timeline_every=e.timeline_every,
                            timeline_max_rows=e.timeline_max_rows, max_sim_s=e.max_sim_s, transfer=st.transfer,
                            monitors=e.monitors, monitor_pool_every=e.monitor_pool_every)
        clusters[n] = ClusterConfig(world=world, mixed=e.mixed, prefill=e.prefill, decode=e.decode,
                                    policy=e.policy, metaserver_rpc_s=e.metaserver_rpc_s)
    first = clusters[names[0]]
    instances = ([f"mixed{i}" for i in range(first.mixed)] + [f"prefill{i}" for i in range(first.prefill)]
                 + [f"decode{i}" for i in range(first.decode)])
    workload = make_workload(cfg.workload, cfg.scheduler.max_context_tokens)
    check_serves_one(workload, first.world)  # type: ignore[arg-type]  # chat and random have it
    faults = make_faults(cfg, instances, first.has_host_tier)
    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else {}
    return Experiment(names, clusters, workload, faults, e.settle_s, e.chunk_s, e.monitors, e.progress, e.plots,
                      e.objective, plain)  # type: ignore[arg-type]
