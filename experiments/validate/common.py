"""Shared pieces of ``experiments.validate``: timing, environment, scratch space, sections.

Timing follows the device method: warm up first, time each repeat with CUDA events around
the region (a host clock on the CPU), report the median. Every number that a bound is
compared against is measured in the same process, never a datasheet value.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from openinfer.models.qwen3.kernels._tuning import knobs_set
from openinfer.provenance import tree_digests


def log(msg: str) -> None:
    print(f"[validate {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def sync(device: str | torch.device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], Any], device: str | torch.device, repeats: int,
            warmup: int = 2) -> dict[str, Any]:
    """Median/min/max seconds of ``fn`` over ``repeats`` timed calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    if is_cuda(device):
        pairs = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            pairs.append((s, e))
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1e3 for s, e in pairs]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return summarize_times(times)


def summarize_times(times: list[float]) -> dict[str, Any]:
    return dict(median_s=statistics.median(times), min_s=min(times), max_s=max(times),
                repeats=len(times))


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = dict(
        date_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        python=sys.version.split()[0], platform=platform.platform(),
        torch=torch.__version__, torch_cuda=torch.version.cuda, device=device)
    for mod in ("triton", "transformers", "safetensors", "simpy", "numpy"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as err:  # noqa: BLE001 - a missing package is a fact to report
            env[mod] = f"unavailable ({type(err).__name__})"
    if is_cuda(device):
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=torch.cuda.get_device_name(device), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                   driver=_driver_version())
    else:
        env["gpu"] = None
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET", "0")
    env["knobs"] = knobs_set()     # launch knobs: a report must say it did not time defaults
    env["source"] = tree_digests()  # the files that ran (python -m openinfer.provenance)
    return env


def _driver_version() -> str | None:
    try:
        import subprocess
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def scratch_dir(preferred: str | None = None) -> Path:
    """A temp folder for checkpoints: tmpfs when it is there and large enough."""
    import tempfile
    if preferred:
        Path(preferred).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=preferred, prefix="validate-"))
    shm = Path("/dev/shm")
    if shm.is_dir():
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize > 24 * 2**30:
            return Path(tempfile.mkdtemp(dir=shm, prefix="validate-"))
    return Path(tempfile.mkdtemp(prefix="validate-"))


def weight_bytes(weights: Any) -> int:
    """Bytes of every distinct weight tensor (tied embeddings count once)."""
    seen: set[int] = set()
    total = 0
    tensors = [weights.embed_tokens, weights.norm, weights.lm_head]
    for lw in weights.layers:
        tensors += [getattr(lw, f) for f in lw.__dataclass_fields__]
    for t in tensors:
        key = t.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def guarded(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one section; an exception becomes the section's recorded error, not a crash."""
    t0 = time.perf_counter()
    log(f"section {name}: start")
    try:
        out = fn()
        out.setdefault("status", "ok")
    except Exception as err:  # noqa: BLE001 - report, never hide, a failing section
        traceback.print_exc()
        out = dict(status="error", error=f"{type(err).__name__}: {err}",
                   traceback=traceback.format_exc()[-4000:])
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    log(f"section {name}: {out['status']} in {out['wall_s']} s")
    return out


def free_cuda() -> None:
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
