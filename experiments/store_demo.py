"""The store's two-act round trip on simulated time, with Qwen3-4B page sizes.

Act 1: a request prefills, its sealed blocks are saved to the CPU tier, a flush barrier
says they are visible, the request finishes. Act 2: the GPU copy is evicted; a new request
with the same prefix resolves it from the CPU tier, and its first chunk matches every
restored block. Prints what happened and when.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from experiments.cli import main_guard, parse_overrides, write_report
from openinfer.errors import require
from openinfer.kv import (CacheScope, HostTier, KvStore, NeverCancelled, Rank, RequestKv,
                          ResolvePolicy, SaveClass, SaveCursor, StoreConfig, salt_hash)
from openinfer.kv.pool import BlockPool, check_block_size
from openinfer.kv.request_kv import ceil_div
from openinfer.runtime import SimRuntime
from sim.copy_engine import LinkSpec, ModeledTransfer

QWEN3_4B_BYTES_PER_TOKEN = 2 * 36 * 8 * 128 * 2  # K+V, 36 layers, 8 kv heads, head_dim 128, bf16


@dataclass
class DemoConfig:
    prompt_tokens: int = 4096
    suffix_tokens: int = 100
    block_size: int = 16
    gpu_blocks: int = 1828
    host_blocks: int = 3640
    pcie_gib_s: float = 20.0
    seed: int = 0
    report: str | None = None

    def __post_init__(self) -> None:
        check_block_size(self.block_size)
        require(self.prompt_tokens >= self.block_size, "prompt_tokens", self.prompt_tokens,
                f"an int >= block_size ({self.block_size}): only whole blocks are sealed and saved")
        require(self.suffix_tokens >= 1, "suffix_tokens", self.suffix_tokens, "an int >= 1")
        need = ceil_div(self.prompt_tokens, self.block_size) + 1
        require(self.gpu_blocks >= need, "gpu_blocks", self.gpu_blocks,
                f"an int >= {need}: the prompt's blocks plus the padding page")
        sealed = self.prompt_tokens // self.block_size
        require(self.host_blocks >= sealed, "host_blocks", self.host_blocks,
                f"an int >= {sealed}: every sealed block of the prompt, or act 2 restores nothing")
        require(self.pcie_gib_s > 0, "pcie_gib_s", self.pcie_gib_s, "a number > 0 (GiB/s)")


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    rt = SimRuntime(seed=cfg.seed)
    page_bytes = QWEN3_4B_BYTES_PER_TOKEN * cfg.block_size
    link = LinkSpec(bandwidth_gib_s=cfg.pcie_gib_s)
    transfer = ModeledTransfer(rt, page_bytes, d2h=link, h2d=link)
    pool = BlockPool(cfg.block_size, cfg.gpu_blocks)
    host = HostTier(rt, cfg.host_blocks, transfer)
    store = KvStore(rt, [Rank(pool, host)], StoreConfig())
    rng = rt.rng("prompt")
    prefix = [rng.randrange(151936) for _ in range(cfg.prompt_tokens)]
    second = prefix + [rng.randrange(151936) for _ in range(cfg.suffix_tokens)]
    report: dict[str, Any] = {}

    def scenario() -> Generator[Any, Any, None]:
        kv = RequestKv(pool, prefix, 1, salt_hash())
        assert kv.schedule_prefill(len(prefix)), "DemoConfig sizes gpu_blocks for the prompt"
        kv.apply_prefill(next_token=0)
        cursor = SaveCursor()
        t0 = rt.now()
        sealed = store.seal(0, kv, cursor, SaveClass.CACHEABLE)
        kv.release()
        flushed = yield store.flush_saves(0)
        report["act1"] = dict(sealed_blocks=sealed, flush_ok=flushed.ok,
                              flush_ms=round((rt.now() - t0) * 1e3, 3),
                              host_resident_blocks=host.resident_blocks())
        evicted = pool.evict_inactive()
        t1 = rt.now()
        prefix_hold = yield store.resolve_prefix(0, "second", second, CacheScope(), ResolvePolicy(),
                                                 NeverCancelled())
        restore_s = rt.now() - t1
        kv2 = RequestKv(pool, second, 16, salt_hash())
        matched = kv2.match_and_add_prefix()
        prefix_hold.release()
        kv2.release()
        loaded = prefix_hold.outcome.loaded_blocks
        report["act2"] = dict(
            evicted_gpu_blocks=evicted, hit_tokens=prefix_hold.hit_tokens,
            gpu_blocks=prefix_hold.outcome.gpu_blocks, restored_blocks=loaded,
            restore_ms=round(restore_s * 1e3, 3),
            effective_gib_s=round(loaded * page_bytes / restore_s / 2**30, 2) if restore_s else None,
            matched_tokens=matched, recompute_tokens=len(second) - matched)

    rt.run_process(scenario())
    report["store_stats"] = store.stats.as_dict()
    report["quiescent"] = store.quiescent(0) == []
    a1, a2 = report["act1"], report["act2"]
    report["ok"] = bool(a1["flush_ok"] and a2["restored_blocks"] == a1["sealed_blocks"]
                        and a2["matched_tokens"] == a1["sealed_blocks"] * cfg.block_size
                        and report["quiescent"])
    report["config"] = dict(cfg.__dict__)
    return report


def print_report(report: dict[str, Any]) -> None:
    a1, a2 = report["act1"], report["act2"]
    print("openinfer store round trip (simulated time, Qwen3-4B pages of "
          f"{QWEN3_4B_BYTES_PER_TOKEN * report['config']['block_size'] / 2**20:.2f} MiB)")
    print(f"  act 1: sealed {a1['sealed_blocks']} blocks -> CPU tier; flush barrier done after "
          f"{a1['flush_ms']} ms (ok={a1['flush_ok']}); host holds {a1['host_resident_blocks']} blocks")
    print(f"  act 2: evicted {a2['evicted_gpu_blocks']} GPU blocks; resolve restored "
          f"{a2['restored_blocks']} blocks in {a2['restore_ms']} ms ({a2['effective_gib_s']} GiB/s); "
          f"hit {a2['hit_tokens']} tokens")
    print(f"         next prefill matched {a2['matched_tokens']} tokens, recomputes "
          f"{a2['recompute_tokens']}")
    print(f"  quiescent at the end: {report['quiescent']}; round trip "
          f"{'complete' if report['ok'] else 'INCOMPLETE'}")


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(DemoConfig, argv)
    report = run_demo(cfg)
    print_report(report)
    write_report(cfg.report, report)
    if not report["ok"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
