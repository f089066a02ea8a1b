"""Serve a workload through the real scheduler + KvStore + CUDA Qwen3 executor.

API (for ``experiments/validate.py``; no hydra/omegaconf, importable on the device):

    run_served(ckpt_dir, device="cuda", workload_cfg=None, *, out_dir=None,
               instance_cfg=None, phases=("cold", "gpu", "cpu"), max_wall_s=300.0,
               model=None) -> dict

* ``ckpt_dir``: an HF-layout Qwen3 checkpoint (``experiments.make_checkpoint``).
* ``device``: "cuda" or "cpu" (CPU: reference backend, ``instance_cfg`` must fix
  ``num_blocks``; defaults below do).
* ``workload_cfg``: dict, ``kind`` = "random" (default) with RandomWorkload fields
  (num_requests, input_len, output_len, range_ratio, prefix_len) or "chat" with
  num_sessions, turns, system_prompt_len, user_len, output_len, think_time_s (fixed
  lengths); both take ``rate`` (req/s, "inf" or float), ``process`` and ``cv``; ``seed``.
  Prompt ids are reduced modulo the model's vocabulary (the tiny model has 256).
* ``instance_cfg``: a ``RealConfig`` or a dict of its fields (``device`` is set from the
  argument).
* ``phases``: the same workload is served once per phase, in the order below whatever
  order they are listed in, on one instance (``serve_phases``, which the simulator's
  fidelity replay runs too):
  "cold" (first contact; GPU hits only within the phase), "gpu" (again: prefixes hit the
  GPU radix), "cpu" (first the GPU copy is evicted — ``pool.evict_inactive()`` after a
  flush barrier — so every hit is restored from the CPU tier through CudaTransfer).
* ``out_dir``: if given, writes ``steps.jsonl`` (StepTiming per step), ``copies.jsonl``
  (CopyRecord per copy) and ``served.json`` (the returned dict).

Returns a JSON-ready dict: ``ok`` (every request of every phase finished, the store is
quiescent), ``phases[name]`` = {metrics (vllm-bench names, sim.metrics.summarize),
outcomes, cache: {prompt_tokens, cached_tokens, hit_rate, gpu_blocks, cpu_blocks},
requests: [per-request records + gpu_blocks/cpu_blocks], duration_s, timed_out},
``steps`` (per-kind counts and seconds), ``copies`` (per direction: copies, pages, bytes,
gpu_s, gib_s), ``store``, ``host_tier``, ``quiescent`` (open issues, [] when at rest),
``instance`` (config, sizing, GPU name, versions), ``files``.

Step record fields (StepTiming, seconds): step, kind, started_at, prefill_tokens,
prefill [(start, n, is_final, all_logits)], decode_positions, decode_rows,
decode_rows_padded, graph, gpu_s (CUDA events, None on CPU), wall_s (runtime time from
execute() to result), error. ``step_features(rec)`` turns one into sim's StepFeatures.
Copy record fields (CopyRecord): index, dir (d2h/h2d/peer), pages, runs, bytes,
submitted_at, wall_s, gpu_s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import torch

from openinfer.backend.cuda_executor import StepTiming
from openinfer.backend.instance import RealConfig, RealInstance, build_real_instance
from openinfer.errors import require
from openinfer.scheduler.request import GenerateRequest, RequestHandle
from sim.client import Client
from sim.metrics import cache_summary, status_counts, summarize
from sim.calibration import features_of
from sim.step_features import StepFeatures
from sim.workload_spec import workload_from_flat
from sim.workloads import Workload

PHASES = ("cold", "gpu", "cpu")
CPU_DEFAULTS = dict(num_blocks=512, block_size=16, host_slots=1024, max_context_tokens=2048,
                    max_prefill_tokens=512, max_decode_batch=32)


def make_workload(cfg: dict[str, Any] | None) -> Workload:
    """A workload from a plain dict (see the module docstring; ``sim.workload_spec``)."""
    return workload_from_flat(cfg)


def step_features(rec: StepTiming | dict[str, Any]) -> StepFeatures:
    """sim's StepFeatures of a recorded step, with the decode padding that really ran."""
    return features_of(rec.as_dict() if isinstance(rec, StepTiming) else rec)


def _instance_config(device: str, instance_cfg: RealConfig | dict[str, Any] | None) -> RealConfig:
    if isinstance(instance_cfg, RealConfig):
        return replace(instance_cfg, device=device)
    given = dict(instance_cfg or {})
    known = {f.name for f in fields(RealConfig)}
    unknown = sorted(set(given) - known)
    require(not unknown, "instance_cfg", unknown, f"fields of RealConfig: {sorted(known)}")
    base = dict(CPU_DEFAULTS) if device == "cpu" else {}
    base.update(given)
    base["device"] = device
    return RealConfig(**base)


class RequestTiers:
    """Per request: blocks its resolve found in the GPU radix and restored from the CPU."""

    def __init__(self, inst: Any) -> None:
        self.by_req: dict[int, tuple[int, int]] = {}
        inst.engine.observers.append(self._on)

    def _on(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "admission":
            for p in data["result"].admitted:
                o = p.kv_prefix.outcome
                self.by_req[p.id] = (o.gpu_blocks, o.loaded_blocks)


def _submitter(inst: RealInstance):  # type: ignore[no-untyped-def]
    vocab = inst.executor.vocab_size

    def submit(req: GenerateRequest, on_event: Any = None) -> RequestHandle:
        if any(t >= vocab for t in req.prompt):
            req = replace(req, prompt=[t % vocab for t in req.prompt])
        return inst.engine.submit(req, on_event)
    return submit


def serve_phase(inst: Any, workload: Workload, tiers: RequestTiers, max_wall_s: float) -> dict[str, Any]:
    """Serve ``workload`` once through a fresh Client until every request ended."""
    rt = inst.rt
    start = rt.now()
    client = Client(rt, _submitter(inst))
    rt.spawn(workload.run(rt, client))
    guard = rt.sleep(max_wall_s)
    rt.run(until=rt.any_of([client.all_done, guard]))
    timed_out = not client.all_done.triggered
    records = sorted(client.records, key=lambda r: r.req_id)
    reqs = []
    gpu = cpu = 0
    for r in records:
        g, c = tiers.by_req.get(r.req_id, (0, 0))
        gpu += g
        cpu += c
        reqs.append(dict(asdict(r), ttft=r.ttft, tpot=r.tpot, e2el=r.e2el, gpu_blocks=g, cpu_blocks=c))
    duration = max(0.0, client.last_end_s - start)
    return dict(metrics=summarize(records, client.itl, duration), outcomes=status_counts(records),
                sent=client.sent, cache=dict(cache_summary(records).as_dict(), gpu_blocks=gpu, cpu_blocks=cpu),
                requests=reqs, duration_s=round(duration, 6), timed_out=timed_out)


def serve_phases(inst: Any, workload: Workload | Mapping[str, Workload], phases: Sequence[str] = PHASES,
                 max_wall_s: float = 300.0,
                 on_phase: Callable[[str, str], None] | None = None) -> tuple[dict[str, Any], dict[str, int]]:
    """Serve ``workload`` once per phase on one instance, in the order cold → gpu → cpu
    whatever order ``phases`` lists them in (each phase's caches are what the earlier ones
    left). Before "cpu" the saves are let land and the inactive GPU copies evicted, so its
    hits come from the CPU tier. ``inst`` is a RealInstance or a simulated ``World``
    (anything with ``rt``, ``engine``, ``store`` and ``pool``): the fidelity replay runs
    exactly this. ``workload`` may be one per phase (a mapping from phase to workload: the
    fidelity replay pins each phase's turns to that phase's recorded send times).
    ``on_phase(phase, "start" | "end")`` is called around each phase's serving.
    Returns (per-phase results, GPU blocks evicted before each phase)."""
    for ph in phases:
        require(ph in PHASES, "phases", ph, f"each one of {PHASES}")
    tiers = RequestTiers(inst)
    served: dict[str, Any] = {}
    evicted: dict[str, int] = {}
    for ph in (p for p in PHASES if p in phases):
        if ph == "cpu":
            inst.rt.run(until=inst.store.settle(0))
            evicted[ph] = inst.pool.evict_inactive()
        if on_phase is not None:
            on_phase(ph, "start")
        served[ph] = serve_phase(inst, workload[ph] if isinstance(workload, Mapping) else workload,
                                 tiers, max_wall_s)
        if on_phase is not None:
            on_phase(ph, "end")
    return served, evicted


def serve_workload(inst: RealInstance, workload: Workload, *, phases: Sequence[str] = PHASES,
                   max_wall_s: float = 300.0, on_phase: Callable[[str, str], None] | None = None
                   ) -> dict[str, Any]:
    """Serve ``workload`` once per phase on ``inst`` (see the module docstring)."""
    served, evicted = serve_phases(inst, workload, phases, max_wall_s, on_phase)
    out: dict[str, Any] = {"phases": served}
    if evicted:
        out["evicted_gpu_blocks"] = evicted
    inst.rt.run(until=inst.store.settle(0))
    out["quiescent"] = inst.store.quiescent(0)
    out["all_finished"] = all(p["outcomes"]["finished"] == p["sent"] and not p["timed_out"]
                              for p in out["phases"].values())
    out["ok"] = out["all_finished"] and not out["quiescent"]
    out["steps"] = inst.executor.timing_summary()
    out["copies"] = inst.transfer.summary() if inst.transfer is not None else None
    out["store"] = inst.store.stats.as_dict()
    out["host_tier"] = dict(inst.host.counters, resident_blocks=inst.host.resident_blocks(),
                            capacity=inst.host.capacity) if inst.host is not None else None
    return out


class HostTiming:
    """What the host thread did during a served run, for telling a slow host from a slow GPU:
    per step, the seconds ``CudaExecutor._launch`` kept the thread (building the batch,
    enqueueing forward and sampling; the rest of ``wall_s`` is the thread polling, free for
    other work), and per phase the process CPU time, the load average and the mean CPU
    clock at its start and end. Instrumentation of the harness: it reads the clock, the
    engine does not."""

    def __init__(self, inst: RealInstance) -> None:
        import time
        self.launch_s: list[float] = []
        self.phases: dict[str, dict[str, Any]] = {}
        ex = inst.executor
        launch = ex._launch
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return launch(*args, **kwargs)
            finally:
                self.launch_s.append(clock() - t0)
        ex._launch = timed  # type: ignore[method-assign]
        self._rt = inst.rt

    @staticmethod
    def snapshot() -> dict[str, Any]:
        import os
        t = os.times()
        out: dict[str, Any] = dict(cpu_user_s=t.user, cpu_sys_s=t.system)
        try:
            out["loadavg_1m"] = os.getloadavg()[0]
        except OSError:
            pass
        try:
            mhz = [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("cpu MHz")]
            if mhz:
                out["cpu_mhz_mean"] = round(sum(mhz) / len(mhz), 1)
                out["cpu_mhz_min"] = min(mhz)
        except (OSError, ValueError, IndexError):
            pass
        return out

    def on_phase(self, phase: str, when: str) -> None:
        self.phases.setdefault(phase, {})[when] = dict(self.snapshot(), t=self._rt.now(), steps=len(self.launch_s))

    def as_dict(self) -> dict[str, Any]:
        return dict(launch_s=[round(x, 7) for x in self.launch_s], phases=self.phases)


def json_safe(x: Any) -> Any:
    """Non-finite floats as strings ("inf"), so the report is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def run_served(ckpt_dir: str | Path, device: str = "cuda", workload_cfg: dict[str, Any] | None = None, *,
               out_dir: str | Path | None = None, instance_cfg: RealConfig | dict[str, Any] | None = None,
               phases: Sequence[str] = PHASES, max_wall_s: float = 300.0, model: Any = None,
               host_timing: bool = False) -> dict[str, Any]:
    """Build a real instance, serve the workload per phase, write the records; the report.

    ``model``: an already loaded Qwen3Model to reuse (skips loading ``ckpt_dir``).
    ``host_timing``: add ``HostTiming`` (per-step launch seconds, per-phase host load) to the
    report under ``host_timing``."""
    cfg = _instance_config(device, instance_cfg)
    if workload_cfg and "seed" in workload_cfg:
        cfg = replace(cfg, seed=int(workload_cfg["seed"]))
    inst = build_real_instance(model if model is not None else ckpt_dir, cfg)
    workload = make_workload(workload_cfg)
    timing = HostTiming(inst) if host_timing else None
    report = serve_workload(inst, workload, phases=phases, max_wall_s=max_wall_s,
                            on_phase=timing.on_phase if timing is not None else None)
    if timing is not None:
        report["host_timing"] = timing.as_dict()
    report["workload"] = workload.describe()
    report["instance"] = inst.describe()
    report = json_safe(report)
    report["files"] = {}
    if out_dir is not None:
        out = Path(out_dir)
        report["files"]["steps"] = str(inst.executor.write_timings_jsonl(out / "steps.jsonl"))
        if inst.transfer is not None:
            report["files"]["copies"] = str(inst.transfer.write_copies_jsonl(out / "copies.jsonl"))
        report["files"]["served"] = str(out / "served.json")
        (out / "served.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.serve_real CKPT_DIR [DEVICE] [OUT_DIR]`` — a quick run."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["--help"], ["-h"]):
        print(__doc__)
        return 0
    usage = "usage: python -m experiments.serve_real CKPT_DIR [cpu|cuda] [OUT_DIR] (--help: the API)"
    device = args[1] if len(args) > 1 else "cuda"
    problem = None
    if not 1 <= len(args) <= 3:
        problem = f"expected 1 to 3 arguments, got {len(args)}"
    elif not (Path(args[0]) / "config.json").is_file():
        problem = (f"CKPT_DIR={args[0]!r} has no config.json: expected a checkpoint folder "
                   "(python -m experiments.make_checkpoint size=tiny out=DIR)")
    elif device.split(":")[0] not in ("cpu", "cuda"):
        problem = f"DEVICE={device!r} is invalid: expected cpu or cuda (cuda:N)"
    elif device != "cpu" and not torch.cuda.is_available():
        problem = f"DEVICE={device!r} but no CUDA device is visible: pass cpu"
    if problem is not None:
        print(f"error: {problem}\n{usage}", file=sys.stderr)
        return 2
    rep = run_served(args[0], device, out_dir=args[2] if len(args) > 2 else None)
    slim = {k: v for k, v in rep.items() if k != "phases"}
    slim["phases"] = {k: {n: v for n, v in p.items() if n != "requests"} for k, p in rep["phases"].items()}
    print(json.dumps(slim, indent=2, default=str))
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
