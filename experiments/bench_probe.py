"""Cost of probing a long prompt against a warm pool (hashing + radix match + pin/unpin).

    python -m experiments.bench_probe [repeats=31] [max_blocks=2048]

Prints the median wall time per probe at 1/8, 1/4, 1/2 and all of ``max_blocks`` blocks,
with and without hashing, and the ratio of each size's time to the smallest one's, so
linearity is read off one run on one machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from experiments.cli import main_guard, parse_overrides, write_report
from openinfer.errors import require
from openinfer.kv import BlockPool, RequestKv, block_hashes, probe_prefix, salt_hash


@dataclass
class BenchProbeConfig:
    repeats: int = 31
    max_blocks: int = 2048
    block_size: int = 16
    report: str | None = None

    def __post_init__(self) -> None:
        require(self.repeats >= 3, "repeats", self.repeats, "an int >= 3")
        require(self.max_blocks >= 8, "max_blocks", self.max_blocks, "an int >= 8")


def _median_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def bench(cfg: BenchProbeConfig) -> dict:
    bs = cfg.block_size
    pool = BlockPool(bs, cfg.max_blocks + 2)
    tokens = [(i * 7919) % 151936 for i in range(cfg.max_blocks * bs)]
    warm = RequestKv(pool, tokens, 1, salt_hash())
    assert warm.schedule_prefill(len(tokens))
    warm.apply_prefill(next_token=0)
    warm.release()  # every block now inactive and matchable: a warm pool
    rows = []
    for blocks in (cfg.max_blocks // 8, cfg.max_blocks // 4, cfg.max_blocks // 2, cfg.max_blocks):
        prompt = tokens[:blocks * bs]
        hashes = block_hashes(prompt, bs)

        def probe_only(h=hashes, n=len(prompt)) -> None:
            probe_prefix(pool, h, n).release()

        def hash_and_probe(p=prompt) -> None:
            probe_prefix(pool, block_hashes(p, bs), len(p)).release()

        probe = probe_prefix(pool, hashes, len(prompt))
        hit = probe.gpu_hit
        probe.release()
        rows.append(dict(blocks=blocks, gpu_hit=hit, probe_ms=_median_ms(probe_only, cfg.repeats),
                         hash_and_probe_ms=_median_ms(hash_and_probe, cfg.repeats)))
    base = rows[0]
    for row in rows:
        scale = row["blocks"] / base["blocks"]
        row["probe_ratio_per_block"] = round(row["probe_ms"] / base["probe_ms"] / scale, 2)
        row["hash_and_probe_ratio_per_block"] = round(
            row["hash_and_probe_ms"] / base["hash_and_probe_ms"] / scale, 2)
    return dict(rows=rows, repeats=cfg.repeats, target_ms=5.0)


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(BenchProbeConfig, argv)
    report = bench(cfg)
    print(f"probe of a warm pool, median of {cfg.repeats} (per-block cost ratio vs the smallest size)")
    print(f"{'blocks':>7} {'probe ms':>9} {'ratio':>6} {'hash+probe ms':>14} {'ratio':>6}")
    for r in report["rows"]:
        print(f"{r['blocks']:>7} {r['probe_ms']:>9.3f} {r['probe_ratio_per_block']:>6} "
              f"{r['hash_and_probe_ms']:>14.3f} {r['hash_and_probe_ratio_per_block']:>6}")
    write_report(cfg.report, report)


if __name__ == "__main__":
    main()
