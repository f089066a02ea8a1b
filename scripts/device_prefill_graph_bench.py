"""Eager vs CUDA-graph prompt steps on the GPU machine, side by side in one process.

    PYTHONPATH=$PWD python3 scripts/device_prefill_graph_bench.py --out $OUT

Why: an eager step with prompt tokens is bound by the host launching its ~360 kernels
(launch time = step time in the served captures, 12-26 ms for one shape), and
``openinfer.models.qwen3.prefill_graphs`` replays such steps as graphs. For each step
shape (a prefill chunk behind a cached prefix, plus decode rows) the two paths run in turn,
``--repeats`` times, on the same weights and pages: wall (call to synchronized), launch
(call to return) and CUDA-event time, medians and the eager/graph ratio; and the logits of
both paths compared (same kernels, so they should agree to the bit or nearly). Results:
``$OUT/prefill_graph_bench.json``; the table prints last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# (new prompt tokens, cached prefix, decode rows, decode context)
SHAPES = ((182, 512, 8, 1000), (112, 768, 2, 2500), (16, 1500, 3, 2500), (512, 0, 0, 0),
          (96, 768, 0, 0))


def _decode_bench() -> Any:
    spec = importlib.util.spec_from_file_location("device_decode_bench", ROOT / "scripts/device_decode_bench.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def timed(fn: Any) -> tuple[float, float, float, Any]:
    import torch
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    out = fn()
    t1 = time.perf_counter()
    b.record()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, t1 - t0, a.elapsed_time(b) / 1e3, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "results/tmp/prefill_graphs"))
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from experiments.validate.bench import fill_random
    from openinfer.models.qwen3 import ForwardBatch, Qwen3Model, SeqInput
    from openinfer.models.qwen3.prefill_graphs import PrefillGraphs
    db = _decode_bench()
    pack = db.random_pack("4b")
    model = Qwen3Model(pack.cfg, pack.weights, "triton")
    bs, width = 16, 513
    need = sum(-(-(n + c) // bs) + r * -(-(ctx + 1) // bs) for n, c, r, ctx in SHAPES)
    arena = model.make_arena(1 + need, bs)
    fill_random(arena.data, 5)
    arena.data[0].zero_()
    t = time.perf_counter()
    graphs = PrefillGraphs(model, arena, width, padding_page=0)
    graphs.capture()
    capture_s = time.perf_counter() - t
    db.log(f"captured {len(graphs.graphs)} prefill graphs in {capture_s:.1f} s, "
           f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB peak")
    g = torch.Generator().manual_seed(2)
    page, rows = 1, []
    for n, c, r, ctx in SHAPES:
        p = -(-(n + c) // bs)
        ids = torch.randint(0, pack.cfg.vocab_size, (n,), generator=g).tolist()
        seqs = [SeqInput(ids, c, list(range(page, page + p)))]
        page += p
        pd = -(-(ctx + 1) // bs)
        for i in range(r):
            seqs.append(SeqInput([11 + i], ctx, list(range(page, page + pd))))
            page += pd
        key = graphs.bucket_for(n + r, len(seqs))
        eager = lambda s=seqs: model.forward(ForwardBatch.from_seqs(s, bs, pack.device, padding_page=0), arena)
        graph = lambda s=seqs, k=key: graphs.run(s, k)
        for _ in range(3):
            eager(), graph()
        torch.cuda.synchronize()
        e_t, g_t = [], []
        for _ in range(a.repeats):
            e_t.append(timed(eager)[:3])
            g_t.append(timed(graph)[:3])
        le, lg = timed(eager)[3].float(), timed(graph)[3].float().clone()
        med = lambda xs, i: statistics.median(x[i] for x in xs) * 1e3
        row = dict(new=n, cached=c, decode_rows=r, decode_context=ctx, bucket=list(key),
                   eager=dict(wall_ms=med(e_t, 0), launch_ms=med(e_t, 1), gpu_ms=med(e_t, 2)),
                   graph=dict(wall_ms=med(g_t, 0), launch_ms=med(g_t, 1), gpu_ms=med(g_t, 2)),
                   logits_max_abs=float((le - lg).abs().max()), logit_std=float(le.std()),
                   same_top1=bool((le.argmax(-1) == lg.argmax(-1)).all()))
        row["wall_ratio"] = row["eager"]["wall_ms"] / row["graph"]["wall_ms"]
        rows.append(row)
        db.log(f"{row}")
    report = dict(capture_s=capture_s, graphs=len(graphs.graphs), repeats=a.repeats, shapes=rows,
                  gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    (out / "prefill_graph_bench.json").write_text(json.dumps(report, indent=1))
    print("new  cached rows ctx  bucket      eager wall/launch/gpu ms   graph wall/launch/gpu ms   eager/graph  max|dlogit|  top1")
    for r in rows:
        e, gr = r["eager"], r["graph"]
        print(f"{r['new']:4d} {r['cached']:5d} {r['decode_rows']:3d} {r['decode_context']:5d} {str(r['bucket']):10s} "
              f"{e['wall_ms']:6.2f} {e['launch_ms']:6.2f} {e['gpu_ms']:6.2f}      "
              f"{gr['wall_ms']:6.2f} {gr['launch_ms']:6.2f} {gr['gpu_ms']:6.2f}      {r['wall_ratio']:5.2f}x"
              f"      {r['logits_max_abs']:.3g}  {r['same_top1']}")


if __name__ == "__main__":
    main()
