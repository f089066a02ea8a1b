"""Served workloads: the real scheduler + store + executor through ``serve_real.run_served``.

Two workloads on the same model, each served in three phases on one instance (cold, then
again with prefixes in the GPU radix, then again after evicting the GPU copies so every
hit is restored from the CPU tier): ``fit`` (random prompts behind a shared prefix, open
loop) feeds the calibration; ``heldout`` (multi-turn chat, other seed, arrival rate and
lengths) is the fidelity workload the fit never sees. Each workload's exact description
(the ``sim.workloads`` ``describe()`` dict that ``sim.workload_spec.workload_from_dict``
rebuilds, the run_served ``workload_cfg``, the runtime seed, the instance config and
sizing, the phases) is in the report, so the simulator can replay it exactly.

Records go to ``served_<name>.jsonl`` in ``experiments.validate.records``' format (the
step and copy lines; a step line also carries ``launch_s``, the seconds the executor's
launch kept the host thread: ``serve_real.HostTiming``, whose per-phase host load and CPU
clock are under ``host_phases``); the per-request records (phase, ttft, tpot, e2el, gpu_blocks,
cpu_blocks, ...) are in the report under ``requests_detail`` for per-request comparison.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from experiments.validate.common import free_cuda, is_cuda, log
from experiments.validate.records import copy_record, step_record, write_jsonl
from sim.calibration import read_jsonl


def workloads(quick: bool, cpu: bool) -> dict[str, dict[str, Any]]:
    if cpu:
        return dict(fit=dict(kind="random", num_requests=4, input_len=24, output_len=4, prefix_len=8,
                             range_ratio=0.25, rate="inf", seed=0),
                    heldout=dict(kind="chat", num_sessions=2, turns=2, system_prompt_len=8, user_len=6,
                                 output_len=3, think_time_s=0.0, rate="inf", seed=1))
    if quick:
        return dict(fit=dict(kind="random", num_requests=8, input_len=256, output_len=16, prefix_len=128,
                             range_ratio=0.5, rate=16.0, seed=0),
                    heldout=dict(kind="chat", num_sessions=4, turns=2, system_prompt_len=256, user_len=64,
                                 output_len=16, think_time_s=0.1, rate=4.0, seed=1))
    return dict(fit=dict(kind="random", num_requests=64, input_len=1024, output_len=128, prefix_len=512,
                         range_ratio=0.5, rate=8.0, process="poisson", seed=0),
                heldout=dict(kind="chat", num_sessions=16, turns=3, system_prompt_len=768, user_len=96,
                             output_len=64, think_time_s=0.5, rate=3.0, process="gamma", cv=1.5, seed=1))


def instance_cfg(cpu: bool, block_size: int) -> dict[str, Any]:
    if cpu:
        return dict(num_blocks=256, block_size=4, host_slots=512, max_context_tokens=256,
                    max_prefill_tokens=64, max_decode_batch=8)
    return dict(block_size=block_size, max_blocks=8192, host_tier_gib=12.0, max_context_tokens=8192,
                max_prefill_tokens=1024, max_decode_batch=64)


def served_section(cfg: Any, packs: Any, out_dir: Path) -> dict[str, Any]:
    try:
        from experiments.serve_real import run_served
    except ImportError as err:
        return dict(status="skipped", reason=f"experiments.serve_real is not available ({err})")
    from openinfer.models.qwen3 import Qwen3Model
    cpu = not is_cuda(cfg.device)
    size = "tiny" if cpu else cfg.served_size
    pack = packs.get(size)
    inst_cfg = instance_cfg(cpu, cfg.block_size)
    if cfg.prefill_graphs is not None:
        inst_cfg["prefill_graphs"] = cfg.prefill_graphs
    if cfg.served_host_tier_gib is not None:  # (ValidateConfig refuses it on the CPU)
        inst_cfg["host_tier_gib"] = float(cfg.served_host_tier_gib)
    out: dict[str, Any] = dict(model=size, instance_cfg=inst_cfg, workloads={})
    chosen = workloads(cfg.quick, cpu)
    if cfg.heldout_sessions is not None:  # a longer held-out run: more sessions, same rate and shape
        chosen["heldout"]["num_sessions"] = cfg.heldout_sessions
    for name, wl in ((n, chosen[n]) for n in cfg.served_workload_list()):
        log(f"served {name}: {wl}")
        model = Qwen3Model(pack.cfg, pack.weights, "reference" if cpu else "triton")
        with tempfile.TemporaryDirectory(prefix=f"served-{name}-") as tmp:
            rep = run_served(pack.ckpt, cfg.device, dict(wl), out_dir=tmp, instance_cfg=dict(inst_cfg),
                             max_wall_s=cfg.served_timeout_s, model=model, host_timing=True)
            steps = read_jsonl([Path(tmp, "steps.jsonl")])
            copies_p = Path(tmp, "copies.jsonl")
            copies = read_jsonl([copies_p]) if copies_p.exists() else []
        host = rep.get("host_timing") or {}
        launch = host.get("launch_s") or []
        records = [step_record(s, f"served:{name}", f"served:{name}",
                               **({"launch_s": launch[i]} if i < len(launch) and len(launch) == len(steps) else {}))
                   for i, s in enumerate(steps)]
        records += [copy_record(c, f"served:{name}", f"served:{name}") for c in copies]
        phase_summary = {}
        requests = []
        gpu_hits = cpu_hits = 0
        for ph, p in rep["phases"].items():
            requests += [dict(phase=ph, **r) for r in p.get("requests", [])]
            gpu_hits += p["cache"].get("gpu_blocks", 0)
            cpu_hits += p["cache"].get("cpu_blocks", 0)
            phase_summary[ph] = {k: v for k, v in p.items() if k != "requests"}
        f = write_jsonl(out_dir / f"served_{name}.jsonl", records)
        finished = rep.get("all_finished", False)
        out["workloads"][name] = dict(
            status="ok" if rep.get("ok") else "failed", ok=rep.get("ok"), all_finished=finished,
            requests=sum(p["sent"] for p in rep["phases"].values()),
            gpu_hit_blocks=gpu_hits, cpu_hit_blocks=cpu_hits,
            hits_from_both_tiers=bool(gpu_hits > 0 and cpu_hits > 0),
            workload=rep.get("workload"), workload_cfg=wl, runtime_seed=wl.get("seed", 0),
            phases=phase_summary, evicted_gpu_blocks=rep.get("evicted_gpu_blocks"),
            steps=rep.get("steps"), copies=rep.get("copies"), store=rep.get("store"),
            host_tier=rep.get("host_tier"), quiescent=rep.get("quiescent"), instance=rep.get("instance"),
            host_phases=host.get("phases"), file=f, requests_detail=requests)
        log(f"served {name}: ok={rep.get('ok')} finished={finished} gpu_hits={gpu_hits} cpu_hits={cpu_hits} "
            f"steps={len(steps)} copies={len(copies)}")
        del model, rep
        free_cuda()
    ws = out["workloads"].values()
    out["passed"] = all(w["ok"] and w["hits_from_both_tiers"] for w in ws)
    return out
