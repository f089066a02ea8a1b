"""The structured configs behind conf/: one dataclass per Hydra config group.

They give Hydra the keys and types (a misspelt key or a string where a number goes fails
at composition). Defaults that the simulator already has are read from its own dataclasses
(``WorldConfig``, ``ClusterConfig``, ``FaultSpec``) rather than repeated, and ranges are
checked by building those dataclasses (``experiments.config.build``), so each rule lives
in one place: the simulator's ``__post_init__``.
"""

from __future__ import annotations

import math
from dataclasses import MISSING as DC_MISSING
from dataclasses import dataclass, field, fields
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore

from sim.cluster import ClusterConfig
from sim.faults import FaultSpec
from sim.world import WorldConfig


def default(cls: type, name: str) -> Any:
    """The simulator's default for ``cls.name`` (the one source of truth)."""
    f = next(f for f in fields(cls) if f.name == name)
    if f.default is not DC_MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


@dataclass
class ModelConf:
    name: str = default(WorldConfig, "model")


@dataclass
class HardwareConf:
    name: str = default(WorldConfig, "hardware")


@dataclass
class WorkloadConf:
    """What the client sends. ``chat``: multi-turn sessions behind a shared system prompt
    (``qps`` is the request rate; sessions arrive at qps/turns); ``random``: vllm bench's
    random dataset."""

    kind: str = "chat"
    num_requests: int = 400
    qps: float = 8.0
    arrival: str = "poisson"
    cv: float = 1.0
    turns: int = 4
    system_prompt_len: int = 512
    user_len: int = 150
    output_len: int = 128
    think_time_s: float = 2.0
    input_len: int = 1024
    range_ratio: float = 0.0
    prefix_len: int = 0
    abort_probability: float = default(WorldConfig, "abort_probability")
    abort_after_s: float = default(WorldConfig, "abort_after_s")


@dataclass
class StoreConf:
    block_size: int = default(WorldConfig, "block_size")
    num_blocks: Optional[int] = default(WorldConfig, "num_blocks")
    host_tier_gib: float = default(WorldConfig, "host_tier_gib")
    prefix_cache: bool = default(WorldConfig, "prefix_cache")
    transfer: str = default(WorldConfig, "transfer")
    resolve_deadline_s: float = default(WorldConfig, "resolve_deadline_s")


@dataclass
class SchedulerConf:
    max_prefill_tokens: int = default(WorldConfig, "max_prefill_tokens")
    max_decode_batch: int = default(WorldConfig, "max_decode_batch")
    max_context_tokens: int = default(WorldConfig, "max_context_tokens")
    order: str = default(WorldConfig, "order")
    decode_full_hit: bool = default(WorldConfig, "decode_full_hit")


@dataclass
class VariantConf:
    """Variants to run, one after another: ``pr829``, ``fixed`` or ``fixed+F2`` etc."""

    names: List[str] = field(default_factory=lambda: ["pr829", "fixed"])


@dataclass
class FaultConf:
    port: str = "metaserver"
    kind: str = "stall"
    start_s: float = default(FaultSpec, "start_s")
    heal_s: float = math.inf
    probability: float = default(FaultSpec, "probability")
    delay_s: float = default(FaultSpec, "delay_s")
    match: str = default(FaultSpec, "match")
    target: str = "all"  # an instance (prefill0, decode0) or all (the only choice for MetaServer ports)


@dataclass
class FaultsConf:
    name: str = "none"
    schedule: List[FaultConf] = field(default_factory=list)


@dataclass
class BackendConf:
    """Where the scheduler runs. Only the SimPy world here (the GPU path is experiments.validate);
    ``step_model``: only the roofline so far (a fitted model runs through experiments.simulate's
    ``calibration=`` or ``profile=``)."""

    kind: str = "sim"
    step_model: str = "roofline"


@dataclass
class ExperimentConf:
    name: str = "pd_chat"
    mixed: int = 0
    prefill: int = 1
    decode: int = 1
    policy: str = default(ClusterConfig, "policy")
    metaserver_rpc_s: float = default(ClusterConfig, "metaserver_rpc_s")
    seed: int = default(WorldConfig, "seed")
    max_sim_s: float = 600.0          # hang guard (simulated s): a run still waiting then is a finding
    settle_s: float = 10.0            # after the last answer: at most this long for the stores to settle
                                      # (saves visible and registered, restores landed), then end checks
    monitors: bool = True
    monitor_pool_every: int = default(WorldConfig, "monitor_pool_every")
    timeline_every: int = 4
    timeline_max_rows: int = default(WorldConfig, "timeline_max_rows")
    chunk_s: float = 1.0              # simulated seconds between progress updates
    progress: Optional[bool] = None   # null: a bar when stderr is a terminal
    plots: bool = True
    objective: str = "p99_ttft_ms"    # what a sweep job returns (the Optuna sweeper minimises it)


@dataclass
class Config:
    model: ModelConf = field(default_factory=ModelConf)
    hardware: HardwareConf = field(default_factory=HardwareConf)
    workload: WorkloadConf = field(default_factory=WorkloadConf)
    store: StoreConf = field(default_factory=StoreConf)
    scheduler: SchedulerConf = field(default_factory=SchedulerConf)
    variant: VariantConf = field(default_factory=VariantConf)
    faults: FaultsConf = field(default_factory=FaultsConf)
    backend: BackendConf = field(default_factory=BackendConf)
    experiment: ExperimentConf = field(default_factory=ExperimentConf)


GROUPS: dict[str, type] = {"model": ModelConf, "hardware": HardwareConf, "workload": WorkloadConf,
                           "store": StoreConf, "scheduler": SchedulerConf, "variant": VariantConf,
                           "faults": FaultsConf, "backend": BackendConf, "experiment": ExperimentConf}


def register() -> None:
    """``base_config`` in Hydra's ConfigStore: conf/config.yaml lists it first in its defaults,
    so every group's YAML merges into a typed node and is checked key by key."""
    ConfigStore.instance().store(name="base_config", node=Config)
