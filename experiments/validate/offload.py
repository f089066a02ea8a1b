"""Offload with real bytes through the backend's CudaTransfer, and its copy benchmark.

Round trip: random KV in arena pages → D2H into pinned host slots → H2D into DIFFERENT
pages; the restored pages must be byte-identical to the originals (compared as int16
words, so -0.0 vs 0.0 or NaN payloads would count as differences).

Benchmark: the same path moving N pages (one page = one block of all layers, as KVArena
pages; scattered page ids, so one memcpy per page) versus a plain pinned ``copy_`` of the
same bytes as one contiguous tensor. Path time is the CUDA-event time CudaTransfer
records on its side stream; the ratio is plain_time / path_time (target >= 0.8).
"""

from __future__ import annotations

from typing import Any

import torch

from experiments.validate.bench import TARGETS, entry, fill_random
from experiments.validate.common import is_cuda, log, time_fn
from openinfer.models.qwen3.kv_arena import KVArena


def _transfer(arena: KVArena, slots: int):
    from openinfer.backend.cuda_transfer import CudaTransfer, PinnedHostArena
    from openinfer.runtime import WallRuntime
    rt = WallRuntime(0)
    host = PinnedHostArena.like(arena, slots)
    return rt, host, CudaTransfer(rt, arena, host)


def _run(rt, ev) -> None:
    rt.run(until=ev)


def round_trip(arena: KVArena, n_pages: int, seed: int) -> dict[str, Any]:
    fill_random(arena.data, seed)
    rt, host, tr = _transfer(arena, n_pages)
    g = torch.Generator().manual_seed(seed)
    perm = (torch.randperm(arena.num_pages - 1, generator=g) + 1).tolist()
    src, dst = perm[:n_pages], perm[n_pages:2 * n_pages]
    slots = torch.randperm(n_pages, generator=g).tolist()
    before = arena.data[src].clone()
    _run(rt, tr.d2h(src, slots))
    host_ok = torch.equal(host.data[slots].to(arena.data.device).view(torch.int16), before.view(torch.int16))
    arena.data[dst] = torch.randn(before.shape, device=before.device).to(before.dtype)  # other data
    _run(rt, tr.h2d(slots, dst))
    if is_cuda(arena.data.device):
        torch.cuda.synchronize()
    restored = arena.data[dst]
    ok = torch.equal(restored.view(torch.int16), before.view(torch.int16))
    return dict(pages=n_pages, bytes_per_page=arena.bytes_per_page, host_pinned=host.pinned,
                host_copy_identical=bool(host_ok), restored_identical=bool(ok),
                passed=bool(ok and host_ok), path="openinfer.backend.cuda_transfer.CudaTransfer",
                copies=[r.as_dict() for r in tr.records])


def bench_copies(arena: KVArena, n_pages: int, repeats: int, seed: int) -> dict[str, Any]:
    device = arena.data.device
    rt, host, tr = _transfer(arena, n_pages)
    g = torch.Generator().manual_seed(seed + 7)
    pages = (torch.randperm(arena.num_pages - 1, generator=g)[:n_pages] + 1).tolist()
    slots = torch.randperm(n_pages, generator=g).tolist()
    nbytes = n_pages * arena.bytes_per_page
    out: dict[str, Any] = dict(pages=n_pages, bytes=nbytes, bytes_per_page=arena.bytes_per_page,
                               repeats=repeats)
    # the plain pinned copy of the same bytes, one contiguous tensor each way
    gpu = torch.empty(nbytes // 2, dtype=torch.int16, device=device)
    pinned = torch.empty(nbytes // 2, dtype=torch.int16, pin_memory=is_cuda(device))
    gpu.random_()
    plain = {"d2h": time_fn(lambda: pinned.copy_(gpu, non_blocking=True), device, repeats, warmup=2),
             "h2d": time_fn(lambda: gpu.copy_(pinned, non_blocking=True), device, repeats, warmup=2)}
    del gpu, pinned
    for d in ("d2h", "h2d"):
        recs = []
        for i in range(repeats + 2):
            ev = tr.d2h(pages, slots) if d == "d2h" else tr.h2d(slots, pages)
            _run(rt, ev)
            if i >= 2:
                recs.append(tr.records[-1])
        gpu_s = sorted(r.gpu_s for r in recs if r.gpu_s is not None)
        wall_s = sorted(r.wall_s for r in recs)
        path_s = gpu_s[len(gpu_s) // 2] if gpu_s else wall_s[len(wall_s) // 2]
        wall_med = wall_s[len(wall_s) // 2]
        bound_s = plain[d]["median_s"]
        ratio = bound_s / path_s
        log(f"copies {d}: path {nbytes / path_s / 1e9:.1f} GB/s (wall {nbytes / wall_med / 1e9:.1f}), "
            f"plain {nbytes / bound_s / 1e9:.1f} GB/s, ratio {ratio:.2f}")
        out[d] = dict(path_median_s=path_s, path_wall_median_s=wall_med, plain=plain[d],
                      path_bytes_per_s=nbytes / path_s, plain_bytes_per_s=nbytes / bound_s,
                      memcpy_calls_per_copy=recs[-1].runs,
                      target=entry(nbytes / path_s, nbytes / bound_s, ratio, TARGETS["page_copy_fraction_min"],
                                   ratio >= TARGETS["page_copy_fraction_min"], "bytes/s",
                                   note="ratio = plain pinned copy time / CudaTransfer copy time (CUDA events "
                                        "on its side stream); wall ratio = same with submit-to-observed time",
                                   wall_ratio=bound_s / wall_med))
    # a size sweep, so a fit can separate per-copy latency from bandwidth
    for k in sorted({1, 4, 16, 64, n_pages}):
        if k > n_pages:
            continue
        for _ in range(5):
            _run(rt, tr.d2h(pages[:k], slots[:k]))
            _run(rt, tr.h2d(slots[:k], pages[:k]))
    out["records"] = [r.as_dict() for r in tr.records]
    return out


def offload_section(pack: Any, block_size: int, round_trip_pages: int, bench_pages: int, repeats: int,
                    seed: int) -> dict[str, Any]:
    n = max(2 * round_trip_pages, bench_pages) + 1
    arena = KVArena.for_config(pack.cfg, n, block_size, pack.dtype, pack.device)
    rt_res = round_trip(arena, round_trip_pages, seed)
    log(f"offload round trip {pack.size}: {round_trip_pages} pages identical={rt_res['restored_identical']}")
    bench = bench_copies(arena, bench_pages, repeats, seed) if bench_pages else None
    del arena
    return dict(size=pack.size, block_size=block_size, round_trip=rt_res, copy_bench=bench,
                passed=rt_res["passed"])
