"""Where a batch-1 decode step's wall time goes, read from its kernels' own timestamps.

    PYTHONPATH=$PWD python3 scripts/decode_timeline.py --out $OUT/timeline [--contexts 1024,4096]
        [--replays 20] [--graph-context TOKENS] [--variant LABEL:VAR=VALUE[,VAR=VALUE...] ...]

``decode_ablation.py`` prices a kind of kernel by removing it and timing the step again,
which changes the chain it measures. This reads the unchanged step instead, from a CUPTI
trace of CUDA-graph replays. Under PDL a kernel starts while the one before drains and
then waits inside, so its duration includes waiting and the durations of a step add up to
far more than the step. What moves the chain on is a kernel's *end*: each kernel is
charged the time from the latest end before it to its own (nothing if it ends inside an
earlier kernel), and those charges add up to the step's span exactly. A kind's charges,
less its bytes over the copy bandwidth measured in the same process, are what it costs
beyond its bytes; ``lead`` is how long before the previous kernel's end a kind's kernels
start (the overlap PDL buys).

The trace has a cost of its own, so the profiled span is printed next to the same graph
timed without the profiler; read the charges as shares of the step, not as absolute
times, when the two differ by more than a few percent. GPU only. Writes
``timeline.json`` and prints, per context, the charges by kind (next to the kind's bytes)
and by kernel name (the attention's split and reduce kernels apart).

With ``--variant`` (repeatable; launch knobs are read at import) the defaults and each
variant are traced in fresh processes one after another, each into ``OUT/LABEL/``; then
``timelines.json`` holds them all and a table sets each variant's step and charges by kind
beside the defaults': where a knob's gain or loss sits in the chain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from decode_ablation import KINDS, kind_bytes  # noqa: E402
from device_decode_bench import (bs1_graph, parse_variant, profiled_kernels,  # noqa: E402
                                 random_pack, require_cuda, run_child, token_count)

#: The order of a decoder layer's GEMMs in the step (``Qwen3Model``'s layer loop); the
#: step's last GEMM is the LM head.
LAYER_GEMMS = ("qkv", "o_proj", "gate_up", "down")


@dataclass(frozen=True)
class Kernel:
    """One kernel execution in the trace, in device microseconds."""

    name: str
    start_us: float
    end_us: float


@dataclass
class KindCharge:
    """What one kind of kernel took of one step."""

    launches: int = 0
    charge_us: float = 0.0          # sum of (own end - latest end before it), at least 0
    busy_us: float = 0.0            # sum of durations (waiting inside included)
    leads_us: list[float] = field(default_factory=list)


def log(msg: str) -> None:
    print(f"[timeline {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def kind_of(name: str) -> str | None:
    """The op kind a kernel name belongs to; None for a GEMM (placed by its order) and
    'other' for anything the model's decode step does not name (the embedding gather)."""
    if "skinny" in name:
        return None
    if "rms_norm" in name:
        return "norms"
    if "decode_split" in name or "decode_reduce" in name or "qkv_rope" in name:
        return "attention"          # q/k norm + RoPE + KV write too, as the ablation's stub
    return "other"


#: What the kernel right after a GEMM may be, in the layer's order: the attention reads
#: QKV's parts, the norm adds o_proj's and down's, and down reads gate_up's product; with
#: OPENINFER_SKINNY_FUSED_NORM_ROWS o_proj and down do that norm themselves, and the next
#: GEMM (gate_up; the next layer's QKV, or the LM head) follows them directly.
FOLLOWED_BY = dict(qkv=("attention",), o_proj=("norms", "gate_up"), gate_up=("down",),
                   down=("norms", "qkv", "lm_head"))


def label_step(names: list[str], layers: int) -> list[str]:
    """Each kernel's kind. GEMMs share one kernel, so they are told apart by their order:
    ``LAYER_GEMMS`` for every layer, then the LM head; a step whose GEMM count or whose
    kernel after a GEMM does not fit that order is refused rather than mislabelled."""
    gemms = [i for i, n in enumerate(names) if kind_of(n) is None]
    order_changed = (f"the layer's op order changed; update LAYER_GEMMS and FOLLOWED_BY "
                     f"in {Path(__file__).name}")
    if len(gemms) != len(LAYER_GEMMS) * layers + 1:
        raise ValueError(f"a step has {len(gemms)} GEMM launches, expected "
                         f"{len(LAYER_GEMMS) * layers + 1} for {layers} layers: {order_changed}")
    kinds = [kind_of(n) or "" for n in names]
    for ordinal, i in enumerate(gemms):
        kinds[i] = ("lm_head" if ordinal == len(gemms) - 1
                    else LAYER_GEMMS[ordinal % len(LAYER_GEMMS)])
    for i in gemms[:-1]:
        nxt = kinds[i + 1] if i + 1 < len(kinds) else None
        if nxt not in FOLLOWED_BY[kinds[i]]:
            raise ValueError(f"kernel {i} ({kinds[i]}) is followed by {nxt}, not "
                             f"{' or '.join(FOLLOWED_BY[kinds[i]])}: {order_changed}")
    return kinds


def split_steps(kernels: list[Kernel], replays: int) -> list[list[Kernel]]:
    """The trace's kernels in start order, cut into ``replays`` equal steps."""
    ordered = sorted(kernels, key=lambda k: k.start_us)
    if not ordered or len(ordered) % replays:
        raise ValueError(f"{len(ordered)} kernels do not split into {replays} equal steps; "
                         f"did the profiler miss graph kernels?")
    n = len(ordered) // replays
    return [ordered[i * n:(i + 1) * n] for i in range(replays)]


def charge_step(step: list[Kernel], kinds: list[str]) -> tuple[float, dict[str, KindCharge]]:
    """(span, charges by kind) of one step; the charges add up to the span."""
    charges: dict[str, KindCharge] = {}
    prev_end = step[0].start_us
    for k, kind in zip(step, kinds):
        c = charges.setdefault(kind, KindCharge())
        c.launches += 1
        c.charge_us += max(0.0, k.end_us - prev_end)
        c.busy_us += k.end_us - k.start_us
        c.leads_us.append(prev_end - k.start_us)
        prev_end = max(prev_end, k.end_us)
    return prev_end - step[0].start_us, charges


def _medians(per_step: list[dict[str, KindCharge]]) -> dict[str, dict[str, float]]:
    out = {}
    for key in per_step[0]:
        cs = [charges[key] for charges in per_step]
        out[key] = dict(launches=cs[0].launches,
                        charge_us=statistics.median(c.charge_us for c in cs),
                        busy_us=statistics.median(c.busy_us for c in cs),
                        lead_us=statistics.median(x for c in cs for x in c.leads_us))
    return out


def summarize(steps: list[list[Kernel]], layers: int) -> dict[str, Any]:
    """Median span and, per kind and per kernel name, the median of each step's charges."""
    names = [k.name for k in steps[0]]
    if any([k.name for k in step] != names for step in steps[1:]):
        raise ValueError("the traced steps launched different kernels: a step is not one "
                         "graph replay (was something else running on the GPU?)")
    kinds = label_step(names, layers)
    charged = [charge_step(step, kinds) for step in steps]
    by_name = [charge_step(step, [k.name for k in step])[1] for step in steps]
    return dict(span_us=statistics.median(span for span, _ in charged),
                kinds=_medians([charges for _, charges in charged]),
                kernels=_medians(by_name))


def trace(fn: Any, replays: int) -> list[Kernel]:
    """Every kernel ``replays`` calls of ``fn`` ran, from the CUPTI trace."""
    return [Kernel(e.name, e.time_range.start, e.time_range.end)
            for e in profiled_kernels(fn, replays)]


def table(ctx: int, plain_s: float, res: dict[str, Any], ideal_us: dict[str, float]) -> str:
    lines = [f"context {ctx}: span {res['span_us']:.1f} us profiled, {plain_s * 1e6:.1f} us "
             f"without the profiler",
             f"  {'kind':9} {'n':>4} {'charge us':>10} {'bytes us':>9} {'over/launch':>11} "
             f"{'busy us':>8} {'lead us':>8}"]
    for kind in (*KINDS, "other"):
        k = res["kinds"].get(kind)
        if k is None:
            continue
        ideal = ideal_us.get(kind, 0.0)
        lines.append(f"  {kind:9} {k['launches']:4d} {k['charge_us']:10.1f} {ideal:9.1f} "
                     f"{(k['charge_us'] - ideal) / k['launches']:11.2f} {k['busy_us']:8.1f} "
                     f"{k['lead_us']:8.2f}")
    lines.append(f"  {'kernel':40} {'n':>4} {'charge us':>10} {'busy us':>8} {'lead us':>8}")
    for name, k in sorted(res["kernels"].items(), key=lambda kv: -kv[1]["charge_us"]):
        lines.append(f"  {name[:40]:40} {k['launches']:4d} {k['charge_us']:10.1f} "
                     f"{k['busy_us']:8.1f} {k['lead_us']:8.2f}")
    return "\n".join(lines)


def compare(runs: dict[str, dict[str, Any]]) -> str:
    """Per context, each run's step (timed without the profiler) and its charges by kind,
    as differences from the first run's (the defaults')."""
    base_label = next(iter(runs))
    lines = []
    for i, base in enumerate(runs[base_label]["rows"]):
        lines.append(f"context {base['context']}: step ms, and charge by kind against "
                     f"{base_label} (us)")
        lines.append(f"  {'label':12} {'step ms':>8} {'vs':>7} "
                     + " ".join(f"{k:>9}" for k in (*KINDS, "other")))
        for label, run in runs.items():
            row = run["rows"][i]
            change = row["step_s"] / base["step_s"] - 1
            cells = []
            for k in (*KINDS, "other"):
                mine, theirs = row["kinds"].get(k), base["kinds"].get(k)
                cells.append(f"{'-':>9}" if mine is None or theirs is None else
                             f"{mine['charge_us'] - theirs['charge_us']:+9.1f}")
            lines.append(f"  {label[:12]:12} {row['step_s'] * 1e3:8.3f} {change:+7.1%} "
                         + " ".join(cells))
    return "\n".join(lines)


def run_variants(a: argparse.Namespace, out: Path) -> None:
    """The defaults and each ``--variant``, each traced by a fresh process of this script."""
    variants = [("defaults", {})] + [parse_variant(v) for v in a.variant]
    labels = [label for label, _ in variants]
    if len(set(labels)) < len(labels):
        sys.exit(f"--variant labels must differ from each other and from 'defaults': {labels}")
    out.mkdir(parents=True, exist_ok=True)
    runs, rc = {}, {}
    for label, env in variants:
        args = ["--out", str(out / label), "--contexts", a.contexts, "--replays",
                str(a.replays), "--graph-context", str(a.graph_context)]
        rc[label] = run_child(args, str(ROOT), a.child_timeout, script=__file__, **env)
        done = out / label / "timeline.json"
        if rc[label] == 0 and done.exists():
            runs[label] = json.loads(done.read_text())
        else:
            log(f"{label}: no timeline (rc {rc[label]})")
    (out / "timelines.json").write_text(json.dumps(dict(
        rc=rc, variants=dict(variants), runs=runs), indent=1))
    if "defaults" in runs:
        print(compare(runs), flush=True)
    failed = [label for label in labels if label not in runs]
    if failed:
        sys.exit(f"no timeline for {', '.join(failed)} (exit status in {out / 'timelines.json'})")


def context_list(text: str) -> str:
    """The argparse type of ``--contexts``: comma-separated token counts of at least 1."""
    try:
        ok = all(int(x) >= 1 for x in text.split(","))
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text!r}: want token counts >= 1, e.g. 1024,4096")
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/tmp/timeline")
    ap.add_argument("--contexts", type=context_list, default="1024,4096",
                    help="cached tokens of the traced steps, comma-separated")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--graph-context", type=token_count, default=0, metavar="TOKENS",
                    help="capture for this many tokens (default: the longest context); it "
                         "fixes the attention's split count, as max_context_tokens does")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:VAR=VALUE[,...]",
                    help="also trace the step with these environment settings (launch knobs), "
                         "in a fresh process beside the defaults' (repeatable)")
    ap.add_argument("--child-timeout", type=float, default=60,
                    help="seconds each process of --variant may take")
    a = ap.parse_args()
    if a.replays < 1:
        ap.error("--replays must be at least 1")
    require_cuda("decode_timeline.py")
    if a.variant:
        return run_variants(a, Path(a.out))
    import torch
    from experiments.validate.bench import copy_bandwidth
    from experiments.validate.common import time_fn
    from openinfer.models.qwen3 import Qwen3Model
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    pack = random_pack("4b")
    bw = copy_bandwidth("cuda", 4096, 20)["bytes_per_s"]
    log(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.3f} TB/s")
    contexts = [int(x) for x in a.contexts.split(",")]
    top = max(a.graph_context, *contexts)
    model = Qwen3Model(pack.cfg, pack.weights, "triton")
    rows = []
    for ctx in contexts:
        graphs, arena, batch = bs1_graph(model, ctx, top)
        run = lambda g=graphs: g.run(batch)  # noqa: E731
        plain = time_fn(run, pack.device, 30, warmup=3)["median_s"]
        res = summarize(split_steps(trace(run, a.replays), a.replays), pack.cfg.num_hidden_layers)
        ideal = {k: b / bw * 1e6 for k, b in kind_bytes(pack.cfg, ctx, pack.dtype).items()}
        print(table(ctx, plain, res, ideal), flush=True)
        rows.append(dict(context=ctx, step_s=plain, bytes_us=ideal, **res))
        del graphs, arena
        torch.cuda.empty_cache()
    (out / "timeline.json").write_text(json.dumps(dict(
        device=torch.cuda.get_device_name(), copy_bytes_per_s=bw, replays=a.replays,
        rows=rows), indent=1))


if __name__ == "__main__":
    main()
