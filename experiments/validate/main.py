"""``python -m experiments.validate report=PATH [out_dir=DIR] [sections=...]``: the GPU report.

    python -m experiments.validate report=$OUT/validate.json out_dir=$OUT \
        [sections=golden,offload,served,bench,steps] [golden_sizes=0.6b,4b] [bench_size=4b]
        [served_size=4b] [quick=false] [device=cuda] [prefill_graphs=true|false]
        [served_workloads=fit,heldout] [heldout_sessions=N] [served_host_tier_gib=G]

One JSON report (written again after every section, so a run cut short still leaves what
it measured): the environment (GPU, driver, torch/triton/transformers versions, date), then
one entry per section with its own pass/fail or target/met fields, and a ``summary``.
Timing records for calibration go to ``out_dir`` as JSONL (``experiments.validate.records``
describes the format). Random-weight checkpoints are generated into a temp folder (tmpfs
when there is room) and deleted at the end.

On a machine without CUDA, ``device=cpu dtype=float32 golden_sizes=tiny`` runs the same
code on a tiny model (the CPU test does): sections that need a GPU say so and are skipped.
``dtype=bfloat16`` works there too: the tiny model's Triton golden passes (worst relative
error 0.011 against HF, top-1 agreement 0.917), since the interpreter rounds to bf16 as the
GPU does (``kernels/_interpret.py``; it truncated before: 0.028 and 0.875, a fail). A
golden that does not pass, like a missed target, is a result in the report, not an exit
code; a section that raised exits 1.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from experiments.cli import comma_list, main_guard, parse_overrides, write_report
from experiments.validate import common
from experiments.validate.common import free_cuda, guarded, is_cuda, log
from openinfer.errors import require

SECTIONS = ("golden", "offload", "served", "bench", "steps")
SERVED_WORKLOADS = ("fit", "heldout")


@dataclass
class ValidateConfig:
    report: str = ""
    out_dir: str | None = None
    sections: str = ",".join(SECTIONS)
    device: str = "cuda"
    dtype: str = "bfloat16"
    golden_sizes: str = "0.6b,4b"
    golden_backends: str = "reference,triton"
    bench_size: str = "4b"
    served_size: str = "4b"
    grid_size: str | None = None            # None: the served size (the calibration's model)
    quick: bool = False                     # few repeats, small grid: the smoke run
    repeats: int = 30
    seed: int = 0
    block_size: int = 16
    scratch: str | None = None              # where checkpoints go (default: tmpfs or /tmp)
    keep_checkpoints: bool = False
    served_timeout_s: float = 240.0
    prefill_graphs: bool | None = None      # prompt steps as CUDA graphs (served, steps); None: on CUDA
    served_workloads: str = ",".join(SERVED_WORKLOADS)  # which of the served section's workloads run
    heldout_sessions: int | None = None     # sessions of the held-out chat (None: 16; quick 4, CPU 2)
    served_host_tier_gib: float | None = None  # the served instance's CPU tier (None: 12 GiB on a GPU)

    def __post_init__(self) -> None:
        from openinfer.kv.pool import check_block_size
        from openinfer.models.qwen3.config import DTYPES, PRESETS
        from openinfer.models.qwen3.ops import BACKENDS
        require(bool(self.report), "report", self.report, "a path for the JSON report")
        # names checked here, not when a section reaches them (after others spent GPU time)
        sizes = comma_list(self.golden_sizes)
        require(all(s in PRESETS for s in sizes), "golden_sizes", self.golden_sizes,
                f"a comma list of {', '.join(PRESETS)}")
        for key in ("bench_size", "served_size", "grid_size"):
            size = getattr(self, key)
            require((size is None and key == "grid_size") or size in PRESETS, key, size,
                    f"one of {', '.join(PRESETS)}")
        require(self.dtype in DTYPES, "dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        backends = comma_list(self.golden_backends)
        require(bool(backends) and all(b in BACKENDS for b in backends), "golden_backends",
                self.golden_backends, f"a comma list of {', '.join(BACKENDS)}")
        check_block_size(self.block_size)
        from openinfer.models.qwen3.kernels._interpret import interpreting
        require(common.is_cuda(self.device) or interpreting() or "triton" not in backends
                or "golden" not in self.section_list(), "golden_backends", self.golden_backends,
                "reference with device=cpu unless TRITON_INTERPRET=1: Triton kernels run on the CPU "
                "only in the interpreter, chosen before the command starts (a machine without a "
                "GPU chooses it by itself)")
        unknown = [s for s in self.section_list() if s not in SECTIONS]
        require(not unknown, "sections", self.sections, f"a comma list of {', '.join(SECTIONS)}")
        chosen = self.served_workload_list()
        require(bool(chosen) and all(w in SERVED_WORKLOADS for w in chosen) and len(set(chosen)) == len(chosen),
                "served_workloads", self.served_workloads,
                f"a comma list of distinct names among {', '.join(SERVED_WORKLOADS)}")
        sessions = self.heldout_sessions
        require(sessions is None or (type(sessions) is int and sessions >= 1), "heldout_sessions", sessions,
                "null or an int >= 1 (a longer held-out run, same rate)")
        require(sessions is None or "heldout" in chosen, "heldout_sessions", sessions,
                "null unless served_workloads includes heldout")
        tier = self.served_host_tier_gib
        require(tier is None or (isinstance(tier, (int, float)) and not isinstance(tier, bool) and tier > 0),
                "served_host_tier_gib", tier, "null or a size in GiB > 0 (a longer held-out run saves more "
                "pages than 12 GiB hold)")
        require(tier is None or common.is_cuda(self.device), "served_host_tier_gib", tier,
                "null on the CPU (its tiny instance sizes its tier in slots)")

    def served_workload_list(self) -> list[str]:
        return comma_list(self.served_workloads)

    def section_list(self) -> list[str]:
        return comma_list(self.sections)


class ModelPack:
    """One random-weight checkpoint, its weights on the device, and HF on demand."""

    def __init__(self, size: str, cfg: Any, ckpt: Path, device: str, dtype: torch.dtype) -> None:
        from openinfer.models.qwen3 import load_weights
        self.size, self.cfg, self.ckpt = size, cfg, ckpt
        self.device = torch.device(device)
        self.dtype = dtype
        self.weights = load_weights(ckpt, cfg, device, dtype)
        self._hf = None

    def hf(self):
        if self._hf is None:
            from experiments.validate.golden import load_hf
            log(f"loading HF Qwen3ForCausalLM {self.size}")
            self._hf = load_hf(self.ckpt, self.dtype, str(self.device))
        return self._hf

    def drop_hf(self) -> None:
        self._hf = None
        free_cuda()


class Packs:
    def __init__(self, cfg: ValidateConfig, scratch: Path) -> None:
        self.cfg, self.scratch = cfg, scratch
        self.packs: dict[str, ModelPack] = {}
        self.made: dict[str, dict[str, Any]] = {}

    def get(self, size: str) -> ModelPack:
        if size not in self.packs:
            import time
            from openinfer.models.qwen3 import preset, write_random_checkpoint
            from openinfer.models.qwen3.config import DTYPES
            mcfg = preset(size, torch_dtype=self.cfg.dtype)
            t0 = time.perf_counter()
            gen_dev = self.cfg.device if is_cuda(self.cfg.device) else "cpu"
            ckpt = write_random_checkpoint(mcfg, self.scratch / size, seed=self.cfg.seed, dtype=self.cfg.dtype,
                                           device=gen_dev)
            t1 = time.perf_counter()
            self.packs[size] = ModelPack(size, mcfg, ckpt, self.cfg.device, DTYPES[self.cfg.dtype])
            self.made[size] = dict(params=mcfg.num_parameters(), write_s=round(t1 - t0, 2),
                                   load_s=round(time.perf_counter() - t1, 2),
                                   bytes=(ckpt / "model.safetensors").stat().st_size, seed=self.cfg.seed,
                                   generator=f"write_random_checkpoint on {gen_dev}")
            log(f"checkpoint {size}: {self.made[size]}")
        return self.packs[size]

    def release(self, keep: set[str]) -> None:
        for size in list(self.packs):
            if size not in keep:
                del self.packs[size]
        free_cuda()


def _golden(cfg: ValidateConfig, packs: Packs) -> dict[str, Any]:
    from experiments.validate.golden import GoldenSpec, golden_for_pack
    out: dict[str, Any] = {}
    backends = tuple(comma_list(cfg.golden_backends))
    for size in comma_list(cfg.golden_sizes):
        spec = GoldenSpec.tiny() if size == "tiny" else GoldenSpec(block_size=cfg.block_size)
        pack = packs.get(size)
        out[size] = guarded(f"golden {size}", lambda: golden_for_pack(pack, backends, spec))
        if size not in (cfg.bench_size,):
            pack.drop_hf()
    out["passed"] = all(v.get("passed", False) for k, v in out.items() if isinstance(v, dict))
    return out


def _offload(cfg: ValidateConfig, packs: Packs) -> dict[str, Any]:
    from experiments.validate.offload import offload_section
    cuda = is_cuda(cfg.device)
    size = cfg.bench_size if cuda else "tiny"   # on the CPU only the tiny model is practical
    pack = packs.get(size)
    reps = 5 if cfg.quick else 20
    bench_pages = 256 if cuda else 0  # CPU copies are synchronous: no timing
    return offload_section(pack, cfg.block_size if size != "tiny" else 4, 64 if cuda else 4,
                           bench_pages, reps, cfg.seed)


def _bench(cfg: ValidateConfig, packs: Packs) -> dict[str, Any]:
    from experiments.validate import bench as B
    if not is_cuda(cfg.device):
        return dict(status="skipped", reason="benchmarks need a CUDA GPU (CUDA graphs, CUDA events)")
    spec = B.BenchSpec(repeats=5 if cfg.quick else cfg.repeats, block_size=cfg.block_size, seed=cfg.seed,
                       e2e_new_tokens=32 if cfg.quick else 128)
    out: dict[str, Any] = dict(spec=asdict(spec), targets=B.TARGETS)
    out["bounds"] = guarded("bounds", lambda: dict(copy=B.copy_bandwidth(cfg.device, spec.copy_mib, spec.repeats),
                                                   matmul=B.matmul_rate(cfg.device, spec.matmul_n, spec.repeats)))
    if out["bounds"]["status"] != "ok":
        # decode and prefill are judged against bounds measured here, in this process
        return dict(out, status="failed", reason=f"the bounds failed: {out['bounds'].get('error')}")
    bw = out["bounds"]["copy"]["bytes_per_s"]
    mm = out["bounds"]["matmul"]["flops_per_s"]
    log(f"bounds: copy {bw / 1e12:.2f} TB/s, matmul {mm / 1e12:.0f} TFLOP/s")
    pack = packs.get(cfg.bench_size)
    out["model"] = cfg.bench_size
    out["decode"] = guarded("bench decode", lambda: B.bench_decode(pack, spec, bw))
    free_cuda()
    out["prefill"] = guarded("bench prefill", lambda: B.bench_prefill(pack, spec, mm))
    free_cuda()
    out["e2e"] = guarded("bench e2e", lambda: B.bench_e2e(pack, spec))
    pack.drop_hf()
    return out


def _steps(cfg: ValidateConfig, packs: Packs, out_dir: Path) -> dict[str, Any]:
    from experiments.validate.records import write_jsonl
    from experiments.validate.steps import GridSpec, run_grid
    size = cfg.grid_size or cfg.served_size
    if not is_cuda(cfg.device):
        size = "tiny"
        spec = GridSpec.tiny()
    else:
        spec = GridSpec(block_size=cfg.block_size, seed=cfg.seed)
        if cfg.quick:
            spec = GridSpec(prefill_chunks=(64, 512), prefill_prefixes=(0, 2048), multi_prefill=((4, 128),),
                            decode_batches=(1, 8, 32), decode_contexts=(512, 2048), unified=((256, 8, 1024),),
                            cached_unified=((48, 512, 3, 1024),), repeats=2, block_size=cfg.block_size, seed=cfg.seed)
    summary, records = run_grid(packs.get(size), spec, prefill_graphs=cfg.prefill_graphs)
    summary["file"] = write_jsonl(out_dir / f"steps_grid_{size}.jsonl", records)
    summary["model"] = size
    return summary


def _served(cfg: ValidateConfig, packs: Packs, out_dir: Path) -> dict[str, Any]:
    from experiments.validate.served import served_section
    return served_section(cfg, packs, out_dir)


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    g = report.get("golden") or {}
    for size, v in g.items():
        if isinstance(v, dict) and "backends" in v:
            for b, bv in v["backends"].items():
                s[f"golden/{size}/{b}"] = dict(passed=bv["passed"], worst_rel_err_vs_hf=max(
                    c["rel_err_vs_hf"] for c in bv["cases"].values()), worst_max_abs_vs_hf=max(
                    c["max_abs_vs_hf"] for c in bv["cases"].values()), min_top1_vs_hf=min(
                    c["top1_vs_hf"] for c in bv["cases"].values()))
        elif isinstance(v, dict) and v.get("status") == "error":
            s[f"golden/{size}"] = dict(passed=False, error=v.get("error"))
    o = report.get("offload") or {}
    if "round_trip" in o:
        s["offload/round_trip"] = dict(passed=o["round_trip"]["passed"], pages=o["round_trip"]["pages"])
        for d in ("d2h", "h2d"):
            if o.get("copy_bench") and d in o["copy_bench"]:
                s[f"bench/page_copy_{d}"] = o["copy_bench"][d]["target"]
    b = report.get("bench") or {}
    for key, path in (("bench/decode_bs1", ("decode", "target_bs1")), ("bench/prefill_2k", ("prefill", "target")),
                      ("bench/e2e_vs_hf", ("e2e", "target"))):
        node: Any = b
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if node is not None:
            s[key] = node
    sv = report.get("served") or {}
    for name, w in (sv.get("workloads") or {}).items():
        if isinstance(w, dict):
            s[f"served/{name}"] = dict(all_finished=w.get("all_finished"), requests=w.get("requests"),
                                       gpu_hit_blocks=w.get("gpu_hit_blocks"), cpu_hit_blocks=w.get("cpu_hit_blocks"),
                                       status=w.get("status"))
    return s


def run(cfg: ValidateConfig) -> dict[str, Any]:
    out_dir = Path(cfg.out_dir or Path(cfg.report).parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    if is_cuda(cfg.device):
        require(torch.cuda.is_available(), "device", cfg.device, "cpu (no CUDA device is visible)")
    scratch = common.scratch_dir(cfg.scratch)
    report: dict[str, Any] = dict(environment=common.environment(cfg.device), config=asdict(cfg))
    report["environment"]["date"] = report["environment"]["date_utc"][:10]
    packs = Packs(cfg, scratch)
    todo = cfg.section_list()
    order = [s for s in ("golden", "offload", "bench", "steps", "served") if s in todo]
    try:
        for name in order:
            if name == "golden":
                report["golden"] = guarded("golden", lambda: _golden(cfg, packs))
            elif name == "offload":
                report["offload"] = guarded("offload", lambda: _offload(cfg, packs))
            elif name == "bench":
                report["bench"] = guarded("bench", lambda: _bench(cfg, packs))
            elif name == "steps":
                report["steps"] = guarded("steps", lambda: _steps(cfg, packs, out_dir))
            elif name == "served":
                packs.release(keep=set())         # run_served loads its own model
                report["served"] = guarded("served", lambda: _served(cfg, packs, out_dir))
            report["checkpoints"] = packs.made
            report["summary"] = summarize(report)
            write_report(cfg.report, report)
            free_cuda()
    finally:
        if not cfg.keep_checkpoints:
            shutil.rmtree(scratch, ignore_errors=True)
    report["summary"] = summarize(report)
    write_report(cfg.report, report)
    return report


def print_summary(report: dict[str, Any]) -> None:
    env = report["environment"]
    source = env.get("source", {}).get("tree", "unrecorded")
    print(f"validate: {env.get('gpu') or 'cpu'}  torch {env['torch']}  triton {env['triton']}  "
          f"transformers {env['transformers']}  {env['date_utc']}  source {source}")
    for key, v in report["summary"].items():
        if "ratio" in v:
            print(f"  {key:<24} value {v['value']:.4g} {v['unit']}  bound {v['bound']:.4g}  ratio {v['ratio']:.3f}  "
                  f"target {v['target']}  met {v['met']}")
        else:
            print(f"  {key:<24} {v}")
    for name in SECTIONS:
        sec = report.get(name)
        if isinstance(sec, dict) and sec.get("status") not in (None, "ok"):
            print(f"  section {name}: {sec.get('status')} {sec.get('error') or sec.get('reason') or ''}")


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(ValidateConfig, argv)
    report = run(cfg)
    print_summary(report)
    raised = [name for name in SECTIONS if _raised(report.get(name))]
    if raised:   # a missed target is a result; a section (or a part of one) that raised is a failed run
        print(f"validate: section {', '.join(raised)} raised (its traceback is in the report)",
              file=sys.stderr)
        raise SystemExit(1)


def _raised(node: Any) -> bool:
    """Whether a section or any part of it (a golden size, a benchmark: each is guarded on
    its own) recorded an error."""
    if isinstance(node, dict):
        return node.get("status") == "error" or any(_raised(v) for v in node.values())
    if isinstance(node, list):
        return any(_raised(v) for v in node)
    return False


_ = fields  # re-exported for tests that list the keys
