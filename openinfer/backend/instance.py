"""One REAL serving instance: the twin of ``sim.world.build_world`` on a real Qwen3.

Same wiring, same classes, except the executor and the copies: BlockPool (sized from
free GPU memory unless ``num_blocks`` is given; its padding page is an arena page) →
KVArena with exactly one page per pool page → PinnedHostArena + CudaTransfer → HostTier
(the CPU tier; ``host_tier_gib=0`` turns it off) → KvStore with the variant's store config
→ CudaExecutor → Engine with the variant's scheduler switches, on a WallRuntime by default
(any Runtime is accepted: a SimRuntime gives zero-time steps, handy in tests).

Driving a workload through a client lives in ``experiments/serve_real.py`` because the
client and metrics are in ``sim/`` and ``openinfer`` must not import ``sim``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from openinfer.backend.buckets import buckets_up_to
from openinfer.backend.cuda_executor import CudaExecutor
from openinfer.backend.cuda_transfer import CudaTransfer, PinnedHostArena
from openinfer.errors import require
from openinfer.kv import BlockPool, HostTier, KvStore, Rank
from openinfer.models.qwen3.config import DTYPES
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.models.qwen3.model import Qwen3Model
from openinfer.runtime import Runtime, WallRuntime
from openinfer.scheduler import Engine, Role, SchedulerConfig
from openinfer.variants import variant as get_variant

GiB = 2**30
MIN_BLOCKS = 64


@dataclass(frozen=True)
class RealConfig:
    """What build_real_instance needs besides the checkpoint. ``None`` = decide from the
    device (sizes from free memory, triton + CUDA graphs on CUDA, reference on CPU)."""

    variant: str = "fixed"
    device: str = "cuda"
    backend: str | None = None            # reference / triton; None: triton on CUDA
    dtype: str | None = None              # float32 / bfloat16 / float16; None: checkpoint's
    block_size: int = 16
    num_blocks: int | None = None         # None: from free GPU memory (required on CPU)
    max_blocks: int | None = None         # cap on the memory-sized pool
    kv_memory_fraction: float = 0.85      # of free GPU memory after the activation reserve
    host_tier_gib: float = 4.0            # 0: no CPU tier
    host_slots: int | None = None         # overrides host_tier_gib
    prefix_cache: bool = True
    max_prefill_tokens: int = 1024
    max_decode_batch: int = 256
    max_context_tokens: int = 8192
    cuda_graphs: bool | None = None       # None: on CUDA with the triton backend
    graph_buckets: tuple[int, ...] | None = None  # None: buckets_up_to(max_decode_batch)
    prefill_graphs: bool | None = None    # steps with prompt tokens as CUDA graphs too; None: as cuda_graphs
    seed: int = 0
    poll_s: float = 2e-5                  # CUDA-event polling interval of steps and copies
    cpu_copy_delay_s: float = 0.0         # >0: CPU copies complete asynchronously (tests)

    def __post_init__(self) -> None:
        require(self.num_blocks is None or (isinstance(self.num_blocks, int) and self.num_blocks >= 2),
                "real.num_blocks", self.num_blocks, "null (size from GPU memory) or an int >= 2")
        require(self.host_tier_gib >= 0, "real.host_tier_gib", self.host_tier_gib, "a number >= 0")
        require(self.dtype is None or self.dtype in DTYPES, "real.dtype", self.dtype,
                f"null or one of {sorted(DTYPES)}")
        require(0 < self.kv_memory_fraction <= 1, "real.kv_memory_fraction", self.kv_memory_fraction,
                "a number in (0, 1]")


@dataclass
class RealInstance:
    config: RealConfig
    rt: Runtime
    model: Qwen3Model
    pool: BlockPool
    arena: KVArena
    host_arena: PinnedHostArena | None
    transfer: CudaTransfer | None
    host: HostTier | None
    store: KvStore
    executor: CudaExecutor
    engine: Engine
    sizing: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        dev = self.model.device
        return dict(config=asdict(self.config), sizing=self.sizing, device=str(dev),
                    gpu=torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                    torch=torch.__version__, backend=self.model.ops.name, dtype=str(self.model.dtype),
                    cuda_graphs=self.executor.graphs is not None,
                    graph_buckets=list(self.executor.graphs.buckets) if self.executor.graphs else [],
                    prefill_graphs=self.executor.prefill_graphs is not None)


def activation_reserve_bytes(model: Qwen3Model, cfg: RealConfig) -> int:
    """A conservative bound on the non-KV peak of one step (the spec's profiled dummy step:
    a max_prefill_tokens chunk + a full decode batch), plus a fixed margin for graphs."""
    c = model.cfg
    item = torch.empty((), dtype=model.dtype).element_size()
    tokens = cfg.max_prefill_tokens + cfg.max_decode_batch
    per_token = (c.q_size + 2 * c.kv_size + 4 * c.intermediate_size + 6 * c.hidden_size) * item
    logits = (cfg.max_decode_batch + 8) * c.vocab_size * 4 * 4  # fp32 logits + sampling temps
    return tokens * per_token + logits + 1 * GiB


def size_blocks(model: Qwen3Model, cfg: RealConfig) -> dict[str, Any]:
    per_page = KVArena.bytes_per_page_for(model.cfg, cfg.block_size, model.dtype)
    if cfg.num_blocks is not None:
        return dict(num_blocks=cfg.num_blocks, bytes_per_page=per_page, sized_from="num_blocks")
    require(model.device.type == "cuda", "real.num_blocks", None,
            "an int on a device without CUDA (the pool is sized from free GPU memory)")
    free, total = torch.cuda.mem_get_info(model.device)
    reserve = activation_reserve_bytes(model, cfg)
    budget = int(max(0, free - reserve) * cfg.kv_memory_fraction)
    n = max(MIN_BLOCKS, budget // per_page)
    if cfg.max_blocks is not None:
        n = min(n, cfg.max_blocks)
    return dict(num_blocks=int(n), bytes_per_page=per_page, free_bytes=free, total_bytes=total,
                reserve_bytes=reserve, kv_budget_bytes=budget, sized_from="free GPU memory")


def load_model(ckpt: str | Path | Qwen3Model, cfg: RealConfig) -> Qwen3Model:
    if isinstance(ckpt, Qwen3Model):
        return ckpt
    backend = cfg.backend or ("triton" if cfg.device.startswith("cuda") else "reference")
    dtype = DTYPES[cfg.dtype] if cfg.dtype is not None else None
    return Qwen3Model.from_pretrained(ckpt, device=cfg.device, dtype=dtype, backend=backend)


def build_real_instance(ckpt: str | Path | Qwen3Model, cfg: RealConfig | None = None, *,
                        rt: Runtime | None = None, name: str = "real0", role: Role = Role.MIXED,
                        peers: dict[str, PinnedHostArena] | None = None,
                        capture_graphs: bool = True) -> RealInstance:
    """A serving instance on a real Qwen3 (a checkpoint directory or a loaded model).
    ``capture_graphs``: capture the decode graphs and compile every other kernel variant
    (``CudaExecutor.warm_up``) before the first request, so none compiles mid-serve.

    ``peers``: host arenas of other instances in this process, by name, for peer_read (a
    P/D pair on one GPU); this instance's own host arena is added to it under ``name``.
    """
    cfg = cfg or RealConfig()
    v = get_variant(cfg.variant)
    rt = rt or WallRuntime(cfg.seed)
    model = load_model(ckpt, cfg)
    sizing = size_blocks(model, cfg)
    pool = BlockPool(cfg.block_size, int(sizing["num_blocks"]), entitlement=v.pool_entitlement)
    arena = model.make_arena(pool.total_blocks(), cfg.block_size)
    per_page = arena.bytes_per_page
    host_slots = cfg.host_slots if cfg.host_slots is not None else int(cfg.host_tier_gib * GiB // per_page)
    sizing.update(host_slots=host_slots, padding_page=pool.padding_page,
                  arena_bytes=arena.num_pages * per_page)
    host_arena = transfer = host = None
    if host_slots > 0:
        host_arena = PinnedHostArena.like(arena, host_slots)
        if peers is not None:
            peers[name] = host_arena
        transfer = CudaTransfer(rt, arena, host_arena, peers=peers, pool=pool, poll_s=cfg.poll_s,
                                cpu_delay_s=cfg.cpu_copy_delay_s)
        host = HostTier(rt, host_slots, transfer, name=f"{name}/host")
    store = KvStore(rt, [Rank(pool, host)], v.store_config())
    max_pages = -(-cfg.max_context_tokens // cfg.block_size) + 1
    buckets = cfg.graph_buckets if cfg.graph_buckets is not None else buckets_up_to(cfg.max_decode_batch)
    executor = CudaExecutor(rt, model, arena, padding_page=pool.padding_page, max_pages_per_seq=max_pages,
                            cuda_graphs=cfg.cuda_graphs, graph_buckets=buckets, poll_s=cfg.poll_s,
                            prefill_graphs=cfg.prefill_graphs,
                            seed=cfg.seed, transfer=transfer)
    if capture_graphs:
        executor.capture_graphs()
        if executor.on_cuda:            # (nothing compiles on the CPU)
            sizing["warm_up_steps"] = executor.warm_up()
    sched = SchedulerConfig(max_prefill_tokens=cfg.max_prefill_tokens, max_decode_batch=cfg.max_decode_batch,
                            max_context_tokens=cfg.max_context_tokens, prefix_cache=cfg.prefix_cache,
                            role=role, switches=v.scheduler_switches())
    engine = Engine(rt, store, executor, sched, name=name)
    executor.observe(engine)
    return RealInstance(cfg, rt, model, pool, arena, host_arena, transfer, host, store, executor, engine,
                        sizing)
