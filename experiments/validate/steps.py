"""A grid of planned steps through the real executor, for fitting the step-time model.

Each point is a ``StepPlan`` (pure prefill chunks over cached prefixes, pure decode at a
batch and context, unified steps) executed by ``CudaExecutor.execute`` on a wall-clock
runtime, exactly as the engine runs a step (graph replay for pure decode, eager
otherwise, sampling and the host copy of the tokens included). The KV in the arena is
random and every row owns distinct pages, so attention reads as many bytes as it would
in service. The first execution of each point is a warm-up and is not recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from experiments.validate.bench import fill_random
from experiments.validate.common import log
from experiments.validate.records import step_record
from openinfer.backend.executor import DecodeRow, PrefillRow, StepKind, StepPlan


@dataclass(frozen=True)
class GridSpec:
    prefill_chunks: tuple[int, ...] = (16, 64, 128, 256, 512, 1024)
    prefill_prefixes: tuple[int, ...] = (0, 1024, 4096)
    multi_prefill: tuple[tuple[int, int], ...] = ((4, 256), (8, 128), (2, 512))  # (rows, tokens each)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 32, 48, 64, 96, 128)
    decode_contexts: tuple[int, ...] = (128, 512, 1024, 2048, 4096)
    max_decode_tokens: int = 64 * 4096             # cap on batch x context (arena size)
    unified: tuple[tuple[int, int, int], ...] = ((256, 8, 1024), (512, 32, 1024), (1024, 64, 1024),
                                                 (128, 16, 4096), (1024, 8, 512))  # (chunk, rows, ctx)
    # A short chunk behind a cached prefix beside a few decode rows: the step a served engine
    # with prefix hits runs most, and the prefill-graph buckets (32..256 tokens x 2..16 seqs)
    # the cold unified points above do not reach. (chunk, start, rows, ctx)
    cached_unified: tuple[tuple[int, int, int, int], ...] = tuple(
        (n, start, rows, ctx) for n in (16, 48, 112, 240) for rows in (1, 3, 7, 15)
        for start, ctx in ((512, 1024), (2048, 2048)))
    repeats: int = 5
    block_size: int = 16
    seed: int = 0

    @classmethod
    def tiny(cls) -> GridSpec:
        return cls(prefill_chunks=(4, 9), prefill_prefixes=(0, 5), multi_prefill=((2, 3),),
                   decode_batches=(1, 3), decode_contexts=(4, 13), max_decode_tokens=64,
                   unified=((5, 2, 6),), cached_unified=((3, 5, 1, 6),), repeats=2, block_size=4)


class _Pages:
    """Hands out distinct arena pages (page 0 is padding); reset per plan."""

    def __init__(self, total: int) -> None:
        self.total, self.next = total, 1

    def take(self, n: int) -> list[int]:
        if self.next + n > self.total:
            raise ValueError(f"grid needs more than {self.total} arena pages")
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def plans(spec: GridSpec, vocab: int) -> list[tuple[str, StepPlan]]:
    g = torch.Generator().manual_seed(spec.seed)
    bs = spec.block_size
    rid = [0]

    def toks(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    def prow(pages: _Pages, start: int, n: int) -> PrefillRow:
        rid[0] += 1
        kv = SimpleNamespace(pages=pages.take(-(-(start + n) // bs)))
        return PrefillRow(rid[0], kv, start, toks(n), is_final=True)

    def drow(pages: _Pages, ctx: int) -> DecodeRow:
        rid[0] += 1
        kv = SimpleNamespace(pages=pages.take(-(-(ctx + 1) // bs)))
        return DecodeRow(rid[0], kv, toks(1)[0], ctx)

    out: list[tuple[str, Any]] = []
    for n in spec.prefill_chunks:
        for s in spec.prefill_prefixes:
            out.append((f"prefill n={n} start={s}", lambda p, n=n, s=s: StepPlan(StepKind.PREFILL, [prow(p, s, n)])))
    for rows, n in spec.multi_prefill:
        out.append((f"prefill {rows}x{n}", lambda p, rows=rows, n=n: StepPlan(
            StepKind.PREFILL, [prow(p, 0, n) for _ in range(rows)])))
    for ctx in spec.decode_contexts:
        for b in spec.decode_batches:
            if b * ctx <= spec.max_decode_tokens:
                out.append((f"decode b={b} ctx={ctx}", lambda p, b=b, ctx=ctx: StepPlan(
                    StepKind.DECODE, decode=[drow(p, ctx) for _ in range(b)])))
    for n, b, ctx in spec.unified:
        out.append((f"unified n={n} b={b} ctx={ctx}", lambda p, n=n, b=b, ctx=ctx: StepPlan(
            StepKind.UNIFIED, [prow(p, 0, n)], [drow(p, ctx) for _ in range(b)])))
    for n, s, b, ctx in spec.cached_unified:
        out.append((f"unified n={n} start={s} b={b} ctx={ctx}", lambda p, n=n, s=s, b=b, ctx=ctx: StepPlan(
            StepKind.UNIFIED, [prow(p, s, n)], [drow(p, ctx) for _ in range(b)])))
    return out


def pages_needed(spec: GridSpec) -> int:
    bs = spec.block_size
    need = [-(-(s + n) // bs) for n in spec.prefill_chunks for s in spec.prefill_prefixes]
    need += [rows * -(-n // bs) for rows, n in spec.multi_prefill]
    need += [b * -(-(ctx + 1) // bs) for ctx in spec.decode_contexts for b in spec.decode_batches
             if b * ctx <= spec.max_decode_tokens]
    need += [-(-n // bs) + b * -(-(ctx + 1) // bs) for n, b, ctx in spec.unified]
    need += [-(-(s + n) // bs) + b * -(-(ctx + 1) // bs) for n, s, b, ctx in spec.cached_unified]
    return 1 + max(need)


def max_pages_per_seq(spec: GridSpec) -> int:
    bs = spec.block_size
    longest = max([s + n for n in spec.prefill_chunks for s in spec.prefill_prefixes]
                  + [c + 1 for c in spec.decode_contexts] + [c + 1 for _, _, c in spec.unified]
                  + [max(s + n, c + 1) for n, s, _, c in spec.cached_unified])
    return -(-longest // bs) + 1


def run_grid(pack: Any, spec: GridSpec, backend: str | None = None,
             prefill_graphs: bool | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from openinfer.backend.cuda_executor import CudaExecutor
    from openinfer.models.qwen3 import Qwen3Model
    from openinfer.backend.buckets import buckets_up_to
    from openinfer.runtime import WallRuntime

    on_cuda = pack.device.type == "cuda" if hasattr(pack.device, "type") else str(pack.device).startswith("cuda")
    model = Qwen3Model(pack.cfg, pack.weights, backend or ("triton" if on_cuda else "reference"))
    n_pages = pages_needed(spec)
    arena = model.make_arena(n_pages, spec.block_size)
    fill_random(arena.data, spec.seed)
    arena.data[0].zero_()
    rt = WallRuntime(spec.seed)
    buckets = buckets_up_to(max(spec.decode_batches))
    ex = CudaExecutor(rt, model, arena, padding_page=0, max_pages_per_seq=max_pages_per_seq(spec),
                      graph_buckets=buckets, seed=spec.seed, prefill_graphs=prefill_graphs)
    ex.capture_graphs()
    records: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    for i, (name, make) in enumerate(plans(spec, pack.cfg.vocab_size)):
        walls, gpus = [], []
        for r in range(spec.repeats + 1):
            plan = make(_Pages(n_pages))
            ev = ex.execute(plan)
            rt.run(until=ev)
            res = ev.value
            t = ex.timings[-1]
            if res.error:
                raise RuntimeError(f"grid step {name}: {res.error}")
            if r == 0:
                continue                                   # warm-up
            records.append(step_record(t, "grid", f"grid/{i}/{r}", point=name))
            walls.append(t.wall_s)
            if t.gpu_s is not None:
                gpus.append(t.gpu_s)
        walls.sort()
        gpus.sort()
        points.append(dict(point=name, kind=records[-1]["kind"], features=records[-1]["features"],
                           graph=records[-1]["graph"], wall_median_s=walls[len(walls) // 2],
                           gpu_median_s=gpus[len(gpus) // 2] if gpus else None))
    log(f"grid {pack.size}: {len(points)} points, {len(records)} records")
    del ex, arena
    return dict(size=pack.size, points=points, records=len(records), block_size=spec.block_size,
                graph_buckets=list(buckets)), records
