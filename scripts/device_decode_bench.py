"""Decode benchmark of issue #6 on the GPU machine: before/after in one run, kernels per step.

    PYTHONPATH=$PWD python3 scripts/device_decode_bench.py --out $OUT \\
        [--base .bench_base] [--no-pdl] [--sweep] [--tests] [--graph-context TOKENS] \\
        [--variant LABEL:VAR=VALUE[,...]]

``--base DIR`` holds an older ``openinfer/`` package (``git archive <rev> openinfer | tar -x
-C DIR``): it is benchmarked in a subprocess with ``DIR`` first on ``PYTHONPATH``, the
working tree's in another, each through the same ``experiments.validate.bench.bench_decode``
(CUDA-graph replay at bs 1/8/32/64 x 1k/4k context, floor = (weight + KV bytes) / D2D copy
bandwidth measured in that process). Each worker also counts the kernels of one bs-1
decode step under ``torch.profiler`` (graph replays; an eager step where CUPTI shows none)
and sums their device time. ``--sweep`` times the skinny-GEMM and split-KV decode
configurations against cuBLAS on the Qwen3-4B shapes (CUDA graphs over rotating weight
copies, so L2 holds none of them); ``SWEEP_PARTS=attention`` (or ``linear``) runs one half. ``--tests`` runs ``pytest tests/models`` on the GPU.
Every worker first times one eager unified step (a 182-token chunk behind 512 cached
tokens plus 8 decode rows at 1k context: wall, launch, CUDA-event and kernel time);
``EAGER_ONLY=1`` stops there, for the eager-step comparison of old and new kernels.
``--graph-context 8192`` captures the graphs for that many tokens, as a served instance's
``max_context_tokens`` does: the attention's split count follows it, not the context run.
Results: ``$OUT/decode_bench.json`` and ``$OUT/decode_bench.log``; the table prints last.

Weights are random (N(0, 1/fan_in), norms 1 + 0.1 N) drawn on the GPU and assembled by the
package's own loader code (``weights._assemble``), so no checkpoint file is written.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[decode-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def require_cuda(script: str) -> None:
    """Exit with a line saying so where no CUDA GPU is visible: the GPU tools capture CUDA
    graphs, and would otherwise fail deep inside torch."""
    import torch
    if not torch.cuda.is_available():
        sys.exit(f"{script} measures CUDA-graph decode steps: it needs a CUDA GPU, and none "
                 "is visible here (run it on the GPU machine, e.g. through a scripts/device_*.sh)")


# -- worker side --------------------------------------------------------------------------------
def random_pack(size: str, seed: int = 0) -> SimpleNamespace:
    import torch
    from openinfer.models.qwen3 import preset
    from openinfer.models.qwen3 import weights as W
    cfg, dev, dtype = preset(size), torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(seed)
    tensors = {}
    for name, shape in W.expected_shapes(cfg).items():
        x = torch.randn(shape, generator=g, device=dev, dtype=torch.float32)
        if len(shape) == 1:
            x.mul_(0.1).add_(1.0)
        else:
            x.mul_((cfg.hidden_size if name in (W.EMBED, W.LM_HEAD) else shape[1]) ** -0.5)
        tensors[name] = x.to(dtype)
    return SimpleNamespace(size=size, cfg=cfg, device=dev, dtype=dtype,
                           weights=W._assemble(cfg, tensors))


def profiled_kernels(fn: Callable[[], Any], steps: int) -> list[Any]:
    """The profiler's events of the kernels (not copies or fills) that ``steps`` calls of
    ``fn`` ran on the GPU, with their names and device time ranges."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return [e for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]


def _profiled(fn: Callable[[], Any], steps: int) -> list[tuple[str, float]]:
    """Kernel (name, us) events of ``steps`` calls of ``fn`` under the profiler."""
    return [(e.name, e.time_range.elapsed_us()) for e in profiled_kernels(fn, steps)]


def _by_kernel(ev: list[tuple[str, float]], steps: int) -> list[tuple[float, float, str]]:
    """(us per step, launches per step, name) per kernel name, most time first."""
    by_name: dict[str, list[float]] = {}
    for name, us in ev:
        by_name.setdefault(name, []).append(us)
    return sorted(((sum(v) / steps, len(v) / steps, n) for n, v in by_name.items()), reverse=True)


def bs1_graph(model: Any, context: int, max_context: int | None = None
              ) -> tuple[Any, Any, Any]:
    """(graphs, arena, batch): ``model``'s bs-1 decode graph captured for ``max_context``
    (default ``context``; it fixes the attention's split count) over random KV, and a
    batch of one token behind ``context`` cached ones."""
    from experiments.validate.bench import fill_random
    from openinfer.models.qwen3 import ForwardBatch, SeqInput
    from openinfer.models.qwen3.cuda_graphs import DecodeGraphs
    page = 16
    pps = -(-((max_context or context) + 1) // page)
    arena = model.make_arena(1 + pps, page)
    fill_random(arena.data, 3)
    arena.data[0].zero_()
    graphs = DecodeGraphs(model, arena, max_pages_per_seq=pps, buckets=[1])
    graphs.capture()
    batch = ForwardBatch.from_seqs([SeqInput([7], context, list(range(1, 1 + pps)))], page,
                                   model.device, max_pages=pps)
    return graphs, arena, batch


def kernels_per_step(pack: Any, context: int = 4096, steps: int = 5) -> dict[str, Any]:
    """Kernels in one bs-1 decode step and their summed device time, from graph replays;
    and the replayed logits against the reference backend's on the same (random) KV."""
    import torch
    from openinfer.models.qwen3 import Qwen3Model
    model = Qwen3Model(pack.cfg, pack.weights, "triton")
    graphs, arena, batch = bs1_graph(model, context)
    graphs.run(batch)
    torch.cuda.synchronize()
    source = "graph replay"
    ev = _profiled(lambda g=graphs: g.run(batch), steps)
    if not ev:                                    # CUPTI showed no graph kernels: eager
        source = "eager forward"
        ev = _profiled(lambda a=arena: model.forward(batch, a), steps)
    top = _by_kernel(ev, steps)
    got = graphs.run(batch).clone()
    ref = Qwen3Model(pack.cfg, pack.weights, "reference").forward(batch, arena)
    # With random weights the two best logits can be a near-tie: top1_gap says by how much
    # the graph's choice trails the reference's best in the reference's own logits.
    pick = got.argmax(-1, keepdim=True)
    check = dict(max_abs=(got - ref).abs().max().item(), ref_std=ref.std().item(),
                 top1_same=bool(pick[:, 0].eq(ref.argmax(-1)).all()),
                 top1_gap=(ref.max(-1).values - ref.gather(-1, pick)[:, 0]).max().item())
    del graphs, arena
    return dict(graph_vs_reference=check, source=source, context=context, kernels_per_step=len(ev) / steps,
                kernel_us_per_step=sum(us for _, us in ev) / steps,
                top=[dict(name=n[:120], us_per_step=round(t, 2), launches_per_step=c)
                     for t, c, n in top[:25]])


def eager_step(pack: Any, prefill: int = 182, cached: int = 512, decode_rows: int = 8,
               context: int = 1000, repeats: int = 20) -> dict[str, Any]:
    """One eager (not graph-replayed) unified step, the shape served chat runs most: a
    prefill chunk behind a cached prefix plus a few decode rows. Wall and CUDA-event time,
    the host's launch time (call to return, before the sync), and the kernels under the
    profiler: a step whose launch time is its wall time is host-bound."""
    import torch
    from experiments.validate.bench import fill_random
    from openinfer.models.qwen3 import ForwardBatch, Qwen3Model, SeqInput
    bs = 16
    model = Qwen3Model(pack.cfg, pack.weights, "triton")
    pp = -(-(cached + prefill) // bs)
    pd = -(-(context + 1) // bs)
    arena = model.make_arena(1 + pp + decode_rows * pd, bs)
    fill_random(arena.data, 5)
    arena.data[0].zero_()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, pack.cfg.vocab_size, (prefill,), generator=g).tolist()
    seqs = [SeqInput(ids, cached, list(range(1, 1 + pp)))]
    for r in range(decode_rows):
        seqs.append(SeqInput([11 + r], context, list(range(1 + pp + r * pd, 1 + pp + (r + 1) * pd))))
    batch = ForwardBatch.from_seqs(seqs, bs, pack.device)
    for _ in range(3):
        model.forward(batch, arena)
    torch.cuda.synchronize()
    wall, launch, gpu = [], [], []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        model.forward(batch, arena)
        t1 = time.perf_counter()
        b.record()
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        launch.append(t1 - t0)
        gpu.append(a.elapsed_time(b) / 1e3)
    ev = _profiled(lambda a=arena: model.forward(batch, a), 1)
    top = _by_kernel(ev, 1)
    med = statistics.median
    del arena
    return dict(prefill=prefill, cached=cached, decode_rows=decode_rows, context=context,
                wall_ms=med(wall) * 1e3, launch_ms=med(launch) * 1e3, gpu_ms=med(gpu) * 1e3,
                kernels=len(ev), kernel_us=sum(us for _, us in ev),
                top=[dict(name=n[:100], us=round(t, 1), launches=c) for t, c, n in top[:15]])


def check_against_reference(pack: Any) -> dict[str, Any]:
    """Triton vs reference backend on the same weights: a 2-sequence prefill (37 and 21
    tokens) and one decode step, logits compared (bf16, so a relative error, not zero)."""
    import torch
    from openinfer.models.qwen3 import Qwen3Model, SeqInput
    res = {}
    models = {b: Qwen3Model(pack.cfg, pack.weights, b) for b in ("reference", "triton")}
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, pack.cfg.vocab_size, (n,), generator=g).tolist() for n in (38, 22)]
    tables = [[1, 2, 3], [4, 5]]
    logits = {}
    for name, model in models.items():
        arena = model.make_arena(6, 16)
        pre = model([SeqInput(x[:-1], 0, t) for x, t in zip(ids, tables)], arena)
        dec = model([SeqInput(x[-1:], len(x) - 1, t) for x, t in zip(ids, tables)], arena)
        logits[name] = (pre, dec)
    for i, step in enumerate(("prefill", "decode")):
        ref, got = logits["reference"][i], logits["triton"][i]
        res[step] = dict(max_abs=(got - ref).abs().max().item(), ref_std=ref.std().item(),
                         top1_agree=(got.argmax(-1) == ref.argmax(-1)).float().mean().item())
    return res


def working_tree_module(name: str) -> Any:
    """``openinfer.<name>`` from this script's tree, not from the package the worker
    imports: a ``--base`` worker's older openinfer may not have it."""
    spec = importlib.util.spec_from_file_location(f"_tree_{name}", ROOT / "openinfer" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(label: str, out: Path, graph_context: int = 0) -> None:
    import torch
    from experiments.validate.bench import BenchSpec, bench_decode, copy_bandwidth
    import openinfer
    package = Path(openinfer.__file__).parent
    res: dict[str, Any] = dict(label=label, package=str(package),
                               source_digest=working_tree_module("provenance").source_digest(package))
    pack = random_pack("4b")
    spec = BenchSpec(graph_context=graph_context)
    res["graph_context"] = graph_context
    res["eager"] = eager_step(pack)
    e = res["eager"]
    log(f"{label}: eager unified step wall {e['wall_ms']:.2f} ms, launch {e['launch_ms']:.2f} ms, "
        f"gpu {e['gpu_ms']:.2f} ms, {e['kernels']} kernels, {e['kernel_us']:.0f} us kernel time; "
        f"top {e['top'][:6]}")
    if os.environ.get("EAGER_ONLY") == "1":
        (out / f"worker_{label}.json").write_text(json.dumps(res, indent=1))
        return
    res["copy"] = copy_bandwidth("cuda", spec.copy_mib, spec.repeats)
    log(f"{label}: copy {res['copy']['bytes_per_s'] / 1e12:.2f} TB/s")
    res["decode"] = bench_decode(pack, spec, res["copy"]["bytes_per_s"])
    torch.cuda.empty_cache()
    try:
        res["check"] = check_against_reference(pack)
        log(f"{label}: triton vs reference {res['check']}")
    except Exception as err:  # noqa: BLE001
        res["check"] = dict(error=f"{type(err).__name__}: {err}")
        log(f"{label}: check failed: {err}")
    try:
        res["profile"] = kernels_per_step(pack)
        log(f"{label}: {res['profile']['kernels_per_step']:.0f} kernels per bs1 step "
            f"({res['profile']['source']}), {res['profile']['kernel_us_per_step']:.0f} us of "
            f"kernel time")
    except Exception as err:  # noqa: BLE001 - the numbers above still count
        res["profile"] = dict(error=f"{type(err).__name__}: {err}")
        log(f"{label}: profile failed: {err}")
    (out / f"worker_{label}.json").write_text(json.dumps(res, indent=1))


# -- sweep ------------------------------------------------------------------------------------
def graph_time(fns: list[Callable[[], Any]], replays: int = 7) -> float:
    """Seconds per call of ``fns`` (run in turn inside one CUDA graph), median of replays."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del g
    return statistics.median(times) / len(fns)


def sweep_linear(bandwidth: float) -> list[dict[str, Any]]:
    import torch
    import torch.nn.functional as F
    from openinfer.models.qwen3 import kernels as K
    from openinfer.models.qwen3.kernels import reference as R
    from openinfer.models.qwen3.kernels.skinny_linear import launch_config
    shapes = dict(qkv=(6144, 2560, False), o_proj=(2560, 4096, False),
                  gate_up=(2 * 9728, 2560, True), down=(2560, 9728, False),
                  lm_head=(151936, 2560, False))
    tiles = [(64, 128, 4, 4), (32, 128, 4, 4), (64, 256, 3, 4), (128, 128, 4, 4),
             (64, 128, 6, 4), (32, 256, 4, 4), (16, 128, 4, 4), (16, 256, 4, 4),
             (32, 128, 4, 2), (16, 128, 6, 2)]
    rows = []
    for name, (n, k, gated) in shapes.items():
        nbytes = n * k * 2
        copies = max(2, -(-400 * 2**20 // nbytes))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for m in (1, 8):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            if gated:
                base = graph_time([lambda w=w: R.silu_mul(F.linear(x, w)) for w in ws])
            else:
                base = graph_time([lambda w=w: F.linear(x, w) for w in ws])
            rows.append(dict(shape=name, m=m, impl="cublas", s=base, tbps=nbytes / base / 1e12))
            cfgs = []
            default = launch_config(x, ws[0], gated, name != "lm_head")
            cfgs.append(default)
            for bn, bk, st, nw in tiles if m == 1 else tiles[:3]:
                for split in ((1,) if gated or name == "lm_head" else (1, 2, 4, 8)):
                    if k // split >= 2 * bk:
                        cfgs.append(K.SkinnyConfig(bn, bk, split, nw, st))
            for cfg in dict.fromkeys(cfgs):
                if gated:
                    fns = [lambda w=w, c=cfg: K.skinny_gated(x, w, cfg=c) for w in ws]
                elif name == "lm_head":
                    fns = [lambda w=w, c=cfg: K.skinny_linear(x, w, torch.float32, c) for w in ws]
                else:
                    fns = [lambda w=w, c=cfg: K.skinny_linear(x, w, cfg=c) for w in ws]
                try:
                    t = graph_time(fns)
                except Exception as err:  # noqa: BLE001 - a config that fails to build
                    rows.append(dict(shape=name, m=m, impl="skinny", cfg=cfg.__dict__,
                                     error=str(err)[:200]))
                    continue
                rows.append(dict(shape=name, m=m, impl="skinny", cfg=cfg.__dict__, s=t,
                                 tbps=nbytes / t / 1e12, default=cfg == default))
            best = min((r for r in rows if r["shape"] == name and r["m"] == m and "s" in r),
                       key=lambda r: r["s"])
            log(f"linear {name} m={m}: cublas {base * 1e6:.1f} us; best {best['impl']} "
                f"{best.get('cfg')} {best['s'] * 1e6:.1f} us ({best['tbps']:.2f} TB/s, "
                f"copy {bandwidth / 1e12:.2f})")
        del ws
        torch.cuda.empty_cache()
    return rows


def sweep_attention() -> list[dict[str, Any]]:
    import torch
    from openinfer.models.qwen3 import kernels as K
    from openinfer.models.qwen3.kv_arena import KVArena
    layers, page = 8, 16
    rows = []
    for b, ctx in ((1, 1024), (1, 4096), (8, 1024), (8, 4096)):
        pps = -(-(4096 + 1) // page)
        arena = KVArena.allocate(1 + b * pps, layers, page, 8, 128, torch.bfloat16, "cuda")
        arena.data.normal_()
        bt = torch.arange(1, 1 + b * pps, dtype=torch.int32, device="cuda").view(b, pps)
        lens = torch.full((b,), ctx + 1, dtype=torch.int32, device="cuda")
        q = torch.randn(b, 32, 128, device="cuda", dtype=torch.bfloat16)
        kv = b * (ctx + 1) * 8 * 128 * 2 * 2
        for splits, bn, nw in ((None, 64, 4), (8, 64, 4), (32, 64, 4), (64, 64, 4),
                               (64, 64, 8), (32, 32, 4), (64, 32, 4), (128, 32, 4),
                               (16, 128, 8), (32, 128, 8)):
            fns = [lambda kc=arena.k(i), vc=arena.v(i), s=splits, n=bn, w=nw: K.decode_attention(
                q, kc, vc, bt, lens, 128 ** -0.5, s, n, w) for i in range(layers)]
            try:
                t = graph_time(fns)
            except Exception as err:  # noqa: BLE001
                rows.append(dict(b=b, ctx=ctx, splits=splits, block_n=bn, warps=nw,
                                 error=str(err)[:200]))
                continue
            rows.append(dict(b=b, ctx=ctx, splits=splits, block_n=bn, warps=nw, s=t,
                             tbps=kv / t / 1e12))
        best = min((r for r in rows if r["b"] == b and r["ctx"] == ctx and "s" in r),
                   key=lambda r: r["s"])
        dflt = next(r for r in rows if r["b"] == b and r["ctx"] == ctx and r["splits"] is None)
        log(f"attention b={b} ctx={ctx}: default {dflt['s'] * 1e6:.1f} us; best splits="
            f"{best['splits']} block_n={best['block_n']} warps={best['warps']} "
            f"{best['s'] * 1e6:.1f} us ({best['tbps']:.2f} TB/s)")
        del arena
        torch.cuda.empty_cache()
    return rows


def sweep_worker(out: Path) -> None:
    from experiments.validate.bench import copy_bandwidth
    bw = copy_bandwidth("cuda", 4096, 20)["bytes_per_s"]
    res: dict[str, Any] = dict(copy_bytes_per_s=bw)
    parts = os.environ.get("SWEEP_PARTS", "attention,linear").split(",")
    for name, fn in (("attention", sweep_attention), ("linear", lambda: sweep_linear(bw))):
        if name not in parts:
            continue
        try:
            res[name] = fn()
        except Exception as err:  # noqa: BLE001
            res[name] = dict(error=f"{type(err).__name__}: {err}")
            log(f"sweep {name} failed: {err}")
        (out / "worker_sweep.json").write_text(json.dumps(res, indent=1))


# -- driver ---------------------------------------------------------------------------------------
def run_child(args: list[str], pythonpath: str, timeout: float, script: str = __file__,
              **env_extra: str) -> int:
    """``script`` (this one by default) with ``args`` in a fresh process, ``env_extra`` set:
    a launch knob is read at import, so each setting needs a process of its own."""
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONUNBUFFERED="1", **env_extra)
    try:
        return subprocess.run([sys.executable, script, *args], env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        log(f"child {args} timed out after {timeout} s")
        return 124


def table(workers: dict[str, dict[str, Any]]) -> str:
    lines = ["label       bs  ctx    ms      floor ms  ratio   (floor = bytes / copy BW of that worker)"]
    for label, res in workers.items():
        if "decode" not in res:
            lines.append(f"{label}: no result")
            continue
        for p in res["decode"]["points"]:
            lines.append(f"{label:11} {p['batch']:3} {p['context']:5} {p['median_s'] * 1e3:7.3f} "
                         f"{p['floor_s'] * 1e3:9.3f}  {p['ratio_to_floor']:5.2f}x")
        prof = res.get("profile", {})
        chk = prof.get("graph_vs_reference", {})
        lines.append(f"{label:11} graph vs reference logits: max abs {chk.get('max_abs')}, "
                     f"ref std {chk.get('ref_std')}, same top-1 {chk.get('top1_same')} "
                     f"(gap {chk.get('top1_gap')})")
        lines.append(f"{label:11} copy {res['copy']['bytes_per_s'] / 1e12:.3f} TB/s; kernels per "
                     f"bs1 step: {prof.get('kernels_per_step')} ({prof.get('source')}), kernel "
                     f"time {prof.get('kernel_us_per_step', float('nan')):.0f} us; openinfer "
                     f"source {res.get('source_digest')}")
    return "\n".join(lines)


def token_count(text: str) -> int:
    """The argparse type of ``--graph-context`` (here and in decode_ablation.py): a token
    count >= 0, 0 meaning the longest context run."""
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n}: want a token count >= 0 (0: the longest context)")
    return n


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``LABEL:VAR=VALUE[,VAR=VALUE...]`` -> (label, {var: value}), or exit naming the form."""
    label, sep, assigns = text.partition(":")
    env: dict[str, str] = {}
    for assign in assigns.split(","):
        var, eq, value = assign.partition("=")
        if not (eq and var):
            env = {}
            break
        env[var] = value
    if not (sep and label and env) or label in ("before", "after", "sweep"):
        sys.exit(f"--variant {text!r}: want LABEL:VAR=VALUE[,VAR=VALUE...] with a new label, "
                 "e.g. l2_24:OPENINFER_L2_PREFETCH_MB=24")
    return label, env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "results/tmp/decode"))
    ap.add_argument("--base", default=None)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--tests", action="store_true")
    ap.add_argument("--no-pdl", action="store_true",
                    help="also benchmark the working tree with OPENINFER_PDL=0")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:VAR=VALUE[,...]",
                    help="also benchmark the working tree with environment VAR=VALUE "
                         "(repeatable), e.g. l2_24:OPENINFER_L2_PREFETCH_MB=24")
    ap.add_argument("--graph-context", type=token_count, default=0, metavar="TOKENS",
                    help="capture the decode graphs for this many tokens (default: the longest "
                         "context, 4096); it fixes the attention's split count, as a served "
                         "instance's max_context_tokens does")
    ap.add_argument("--tests-timeout", type=float, default=150)
    ap.add_argument("--worker", default=None)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.worker == "sweep":
        return sweep_worker(out)
    if a.worker:
        return worker(a.worker, out, a.graph_context)
    here = str(ROOT)
    t0 = time.perf_counter()
    rc: dict[str, int] = {}
    common = ["--out", str(out), "--graph-context", str(a.graph_context)]
    rc["after"] = run_child(["--worker", "after", *common], here, 150)
    variants = [parse_variant(v) for v in a.variant]
    if a.no_pdl:
        variants.insert(0, ("after_nopdl", {"OPENINFER_PDL": "0"}))
    for label, env in variants:
        rc[label] = run_child(["--worker", label, *common], here, 120, **env)
    if a.base:
        base = str((ROOT / a.base).resolve())
        rc["before"] = run_child(["--worker", "before", *common], f"{base}:{here}", 120)
    if a.sweep:
        rc["sweep"] = run_child(["--worker", "sweep", "--out", str(out)], here, 150)
    if a.tests:
        env = dict(os.environ, PYTHONPATH=here, PYTHONUNBUFFERED="1")
        t = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "tests/models"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=a.tests_timeout)
        except subprocess.TimeoutExpired as err:
            p = SimpleNamespace(returncode=124, stdout=str(err.stdout or ""),
                                stderr=f"timed out after {a.tests_timeout} s")
        rc["tests"] = p.returncode
        tail = (p.stdout + p.stderr)[-3000:]
        (out / "pytest_models_gpu.txt").write_text(p.stdout + p.stderr)
        log(f"pytest tests/models on the GPU: rc={p.returncode} in "
            f"{time.perf_counter() - t:.0f} s\n{tail}")
    workers = {}
    for label in ["before", "after"] + [v[0] for v in variants]:
        f = out / f"worker_{label}.json"
        if f.exists():
            workers[label] = json.loads(f.read_text())
    report: dict[str, Any] = dict(rc=rc, wall_s=round(time.perf_counter() - t0, 1),
                                  workers=workers)
    sw = out / "worker_sweep.json"
    if sw.exists():
        report["sweep"] = json.loads(sw.read_text())
    try:
        report["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
        import torch
        import triton
        report["versions"] = dict(torch=torch.__version__, triton=triton.__version__)
    except Exception as err:  # noqa: BLE001
        report["nvidia_smi"] = str(err)
    (out / "decode_bench.json").write_text(json.dumps(report, indent=1))
    print(table(workers), flush=True)
    print(f"rc={rc} wall {report['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
