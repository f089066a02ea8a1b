"""Where a batch-1 decode step's time goes, measured inside the real CUDA-graph step.

    PYTHONPATH=$PWD python3 scripts/decode_ablation.py --out $OUT/ablation [--contexts 1024,4096]
        [--graph-context TOKENS] [--ops KEY=VALUE[,...]] [--repeats N]

Kernels of a step overlap (PDL lets each start while the one before drains), so a kernel
timed alone, or its profiler duration inside the step, does not say what it costs the
step. This takes the other way round: the bs-1 step of the 4B geometry (random weights) is
captured and timed, then captured again with one kind of operation replaced by a stand-in
that launches nothing (it hands back a preallocated tensor of the right shape), and the
difference is that kind's marginal cost in the chain. Each kind's cost is set against its
bytes over the copy bandwidth measured in the same process: what is left is the kind's
overhead (launch, ramp, tail, waiting), given per op of the kind (a layer's attention,
one of its two residual-add norms, one projection): how many kernels an op takes depends
on the launch knobs (the split merge in the attention, the norm in a GEMM's tail), and a
per-op figure reads the same either way. Where o_proj's or down_proj's GEMM does the norm
after it in its tail (OPENINFER_SKINNY_FUSED_NORM_ROWS), removing the projection removes
that launch whole, tail included, and removing ``norms`` leaves the projection's GEMM
without its tail: the two costs overlap by the tail's share. The logits of an ablated step are
meaningless; only its time is used. ``--ops KEY=VALUE[,...]`` (repeatable) also times the
whole step with other ``TritonOps`` settings, e.g. ``--ops decode_splits=16 --ops
decode_splits=64``, side by side with the default in the same process.

GPU only; medians of ``--repeats`` graph replays. Writes ``ablation.json`` and prints a
table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from device_decode_bench import bs1_graph, random_pack, require_cuda, token_count  # noqa: E402

KINDS = ("attention", "norms", "qkv", "o_proj", "gate_up", "down", "lm_head")


def log(msg: str) -> None:
    print(f"[ablation {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stub_ops(skip: str, **settings: int) -> Any:
    """Triton ops with the ``skip`` kind replaced by a stand-in that launches nothing."""
    import torch
    from openinfer.models.qwen3.kernels.skinny_linear import launch_config
    from openinfer.models.qwen3.ops import TritonOps

    class StubOps(TritonOps):
        def __init__(self) -> None:
            super().__init__(**settings)
            self.skip = skip
            self.proj = {}                  # weight shape -> projection name (model_with)
            self.static: dict[tuple, torch.Tensor] = {}

        def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> Any:
            key = (shape, dtype)
            if key not in self.static:
                self.static[key] = torch.zeros(shape, dtype=dtype, device=device)
            return self.static[key]

        def linear(self, x, w):
            if self.proj.get(tuple(w.shape)) != self.skip:
                return super().linear(x, w)
            n = w.shape[0]
            split = launch_config(x, w, False, True).split_k
            dtype = torch.float32 if split > 1 else w.dtype
            return self._zeros((split, x.shape[0], n), dtype, x.device)

        def gate_up_silu(self, x, w):
            if self.skip != "gate_up":
                return super().gate_up_silu(x, w)
            return self._zeros((x.shape[0], w.shape[0] // 2), w.dtype, x.device)

        def add_rms_norm(self, parts, residual, w, eps):
            if self.skip != "norms":
                return super().add_rms_norm(parts, residual, w, eps)
            return self._zeros(tuple(residual.shape), residual.dtype, residual.device), residual

        def linear_add_rms_norm(self, x, w, residual, norm_w, eps):
            # o_proj or down_proj with the norm after it: one launch where the norm is in
            # the GEMM's tail, which a stubbed projection takes with it; a stubbed norm
            # leaves the GEMM without its tail, and an unfused pair loses just its half
            projection_stubbed = self.proj.get(tuple(w.shape)) == self.skip
            if self.skip != "norms" and not projection_stubbed:
                return super().linear_add_rms_norm(x, w, residual, norm_w, eps)
            if projection_stubbed and self.norm_in_tail(x):
                normed = self._zeros(tuple(residual.shape), residual.dtype, residual.device)
                return normed, residual
            return self.add_rms_norm(self.linear(x, w), residual, norm_w, eps)

        def qkv_attention(self, qkv, q_w, k_w, cos, sin, eps, k_cache, v_cache, batch,
                          num_q_heads, scale):
            if self.skip != "attention":
                return super().qkv_attention(qkv, q_w, k_w, cos, sin, eps, k_cache, v_cache,
                                             batch, num_q_heads, scale)
            return self._zeros((qkv.shape[1], num_q_heads, k_cache.shape[-1]), k_cache.dtype,
                               k_cache.device)

        def lm_head(self, x, w):
            if self.skip != "lm_head":
                return super().lm_head(x, w)
            return self._zeros((x.shape[0], w.shape[0]), torch.float32, x.device)

    return StubOps()


def kind_bytes(cfg: Any, context: int, dtype: Any) -> dict[str, int]:
    """Bytes each kind must read once a step: its weights in ``dtype``, and for attention
    the KV of the ``context`` cached tokens and the new one."""
    import torch
    from experiments.validate.bench import kv_bytes_per_token
    e = torch.empty((), dtype=dtype).element_size()
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    return dict(attention=(context + 1) * kv_bytes_per_token(cfg, dtype), norms=0,
                qkv=layers * (cfg.q_size + 2 * cfg.kv_size) * h * e,
                o_proj=layers * h * cfg.q_size * e, gate_up=layers * 2 * i * h * e,
                down=layers * h * i * e, lm_head=cfg.vocab_size * h * e)


def ops_per_step(cfg: Any) -> dict[str, int]:
    """How many ops of each kind a step has, whatever kernels they take: a layer's
    attention (q/k norm, RoPE, KV write, the splits and their merge), its two residual-add
    norms (the first layer's input norm is not one), each projection, the LM head."""
    n = cfg.num_hidden_layers
    return dict(attention=n, norms=2 * n, qkv=n, o_proj=n, gate_up=n, down=n, lm_head=1)


def model_with(pack: Any, ops: Any) -> Any:
    """The model over ``pack``'s weights with ``ops``, which learns the projections' shapes."""
    from openinfer.models.qwen3 import Qwen3Model
    c = pack.cfg
    ops.proj = {(c.q_size + 2 * c.kv_size, c.hidden_size): "qkv",
                (c.hidden_size, c.q_size): "o_proj",
                (c.hidden_size, c.intermediate_size): "down"}
    return Qwen3Model(c, pack.weights, ops)


def step_time(pack: Any, ops: Any, context: int, max_context: int, repeats: int) -> float:
    """Median seconds of the bs-1 decode graph at ``context`` cached tokens with ``ops``;
    the graph is captured for ``max_context`` (which fixes the attention's split count, as
    ``experiments.validate.bench.bench_decode`` does)."""
    import torch
    from experiments.validate.common import time_fn
    graphs, arena, batch = bs1_graph(model_with(pack, ops), context, max_context)
    t = time_fn(lambda g=graphs: g.run(batch), pack.device, repeats, warmup=3)["median_s"]
    del graphs, arena
    torch.cuda.empty_cache()
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/tmp/ablation")
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--ops", action="append", default=[], metavar="KEY=VALUE[,...]",
                    help="also time the step with these TritonOps settings (repeatable)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--graph-context", type=token_count, default=0, metavar="TOKENS",
                    help="capture for this many tokens (default: the longest context); it "
                         "fixes the attention's split count, as max_context_tokens does")
    a = ap.parse_args()
    require_cuda("decode_ablation.py")
    import torch
    from experiments.validate.bench import copy_bandwidth
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    pack = random_pack("4b")
    bw = copy_bandwidth("cuda", 4096, 20)["bytes_per_s"]
    log(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.3f} TB/s")
    rows: list[dict[str, Any]] = []
    contexts = [int(x) for x in a.contexts.split(",")]
    top = max(a.graph_context, *contexts)
    for ctx in contexts:
        full = step_time(pack, stub_ops(""), ctx, top, a.repeats)
        rows.append(dict(context=ctx, what="step", s=full))
        log(f"ctx {ctx}: step {full * 1e3:.3f} ms")
        nbytes, count = kind_bytes(pack.cfg, ctx, pack.dtype), ops_per_step(pack.cfg)
        for kind in KINDS:
            t = step_time(pack, stub_ops(kind), ctx, top, a.repeats)
            cost = full - t
            ideal = nbytes[kind] / bw
            rows.append(dict(context=ctx, what=f"without {kind}", s=t, cost_s=cost,
                             ideal_s=ideal, ops=count[kind],
                             overhead_us_per_op=(cost - ideal) / count[kind] * 1e6))
            log(f"ctx {ctx}: {kind:9} costs {cost * 1e6:7.1f} us a step (bytes alone "
                f"{ideal * 1e6:6.1f} us), {(cost - ideal) / count[kind] * 1e6:5.2f} us over "
                f"per op ({count[kind]} ops)")
        for text in a.ops:
            settings = {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
            t = step_time(pack, stub_ops("", **settings), ctx, top, a.repeats)
            rows.append(dict(context=ctx, what=text, s=t))
            log(f"ctx {ctx}: {text}: step {t * 1e3:.3f} ms ({(t - full) * 1e6:+.1f} us)")
        (out / "ablation.json").write_text(json.dumps(dict(
            device=torch.cuda.get_device_name(), copy_bytes_per_s=bw, rows=rows), indent=1))


if __name__ == "__main__":
    main()
