"""What one GPU (and its host link) can do, as the few numbers a roofline needs.

The step model never asks "which GPU is this?"; it asks for peak FLOP/s, HBM bandwidth,
how much of each a real kernel mix sustains, and what a step costs before any math. Keeping
those in one validated record lets a sweep swap hardware by name (``h200``, ``rtx5090``)
or from a dict (a Hydra group, a calibration file) without touching the model.

Defaults and why:

* ``matmul_efficiency=0.6``: bf16 GEMMs of a 2.5k–4k-hidden model reach ~60 % of the
  data-sheet dense peak on Hopper-class parts; attention shares the factor.
* ``memory_efficiency=0.8``: streaming weights and paged KV sustains ~80 % of HBM peak.
* ``step_overhead_s=0.3 ms``: launch + sampling + host bookkeeping of one step when the
  decode path is a CUDA graph (spec §1.3: scheduler host work < 10 µs, so this is device
  side: graph launch, sampling kernels, the D2H of sampled ids). With it the 5090 preset
  predicts decode bs1 ctx1024 at ≈6.0 ms against §1.3's measured 5.96 ms.
* host copies default to ≈20 GiB/s effective (spec §1.3/§10: paged 64 KiB segment copies,
  not the link's peak), below the PCIe peak kept in ``pcie_gib_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from openinfer.errors import ConfigError, require

GiB = 1024 ** 3


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator plus its host link. Units: bytes, seconds, FLOP."""

    name: str = "h200"
    memory_gib: float = 140.0                 # HBM capacity visible to the process
    hbm_bandwidth_tb_s: float = 4.8           # data-sheet peak, 1e12 B/s
    bf16_tflops: float = 989.0                # dense bf16 tensor peak, 1e12 FLOP/s
    matmul_efficiency: float = 0.6            # share of peak FLOP/s sustained
    memory_efficiency: float = 0.8            # share of peak bandwidth sustained
    step_overhead_s: float = 0.3e-3           # fixed cost of any step
    pcie_gib_s: float = 55.0                  # link peak per direction (upper bound of copies)
    d2h_gib_s: float = 20.0                   # effective paged GPU -> host copy bandwidth
    h2d_gib_s: float = 20.0                   # effective paged host -> GPU copy bandwidth
    copy_latency_s: float = 20e-6             # per copy operation
    copy_engines: int = 1                     # per direction
    peer_gib_s: float = 21.7                  # RDMA pull (spec §1.3, 400G IB)
    peer_latency_s: float = 3e-3
    peer_connect_s: float = 0.053             # first contact with a peer
    gpu_memory_utilization: float = 0.90      # spec §1.2
    memory_margin_mib: float = 150.0          # spec §1.2
    runtime_reserved_gib: float = 1.0         # CUDA context, allocator slack, graphs, logits
    activation_bytes_per_token: float = 22e3  # spec §1.2: prefill scratch ≈22 KB/token

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and bool(self.name), "hardware.name", self.name,
                "a non-empty string")
        for name in ("memory_gib", "hbm_bandwidth_tb_s", "bf16_tflops", "pcie_gib_s", "d2h_gib_s",
                     "h2d_gib_s", "peer_gib_s"):
            v = getattr(self, name)
            require(_is_number(v) and v > 0, f"hardware.{name}", v, "a number > 0")
        for name in ("matmul_efficiency", "memory_efficiency", "gpu_memory_utilization"):
            v = getattr(self, name)
            require(_is_number(v) and 0 < v <= 1, f"hardware.{name}", v, "a number in (0, 1]")
        for name in ("step_overhead_s", "copy_latency_s", "peer_latency_s", "peer_connect_s",
                     "memory_margin_mib", "runtime_reserved_gib", "activation_bytes_per_token"):
            v = getattr(self, name)
            require(_is_number(v) and v >= 0, f"hardware.{name}", v, "a number >= 0")
        require(isinstance(self.copy_engines, int) and not isinstance(self.copy_engines, bool)
                and self.copy_engines >= 1, "hardware.copy_engines", self.copy_engines, "an int >= 1")
        for name in ("d2h_gib_s", "h2d_gib_s"):
            v = getattr(self, name)
            require(v <= self.pcie_gib_s, f"hardware.{name}", v,
                    f"a number <= hardware.pcie_gib_s={self.pcie_gib_s} (a copy cannot beat its link)")

    # -- sustained rates ----------------------------------------------------------------
    @property
    def flops_per_s(self) -> float:
        """Sustained bf16 FLOP/s of the kernel mix."""
        return self.bf16_tflops * 1e12 * self.matmul_efficiency

    @property
    def bytes_per_s(self) -> float:
        """Sustained HBM bytes/s."""
        return self.hbm_bandwidth_tb_s * 1e12 * self.memory_efficiency

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GiB)

    def kv_budget_bytes(self, weight_bytes: int, profile_tokens: int) -> int:
        """Spec §1.2: total·util − weights − profiled non-KV peak − margin (never < 0)."""
        budget = (self.memory_gib * GiB * self.gpu_memory_utilization - weight_bytes
                  - self.runtime_reserved_gib * GiB - self.activation_bytes_per_token * profile_tokens
                  - self.memory_margin_mib * 2 ** 20)
        return max(0, int(budget))

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareSpec:
        """A preset by ``preset``/``name`` (if it names one) overridden by the other keys."""
        data = dict(data)
        known = {f.name for f in fields(cls)}
        base_name = data.pop("preset", None)
        if base_name is None and data.get("name") in PRESETS:
            base_name = data["name"]
        for key in data:
            if key not in known:
                raise ConfigError(f"hardware.{key}", data[key], f"one of the keys {', '.join(sorted(known))}")
        base = preset(base_name) if base_name is not None else cls()
        return replace(base, **data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


H200 = HardwareSpec()

# RTX 5090: GDDR7 1.792 TB/s, ~209.5 dense bf16 TFLOP/s, 32 GiB, PCIe 5.0 x16. Same
# efficiency factors as the H200 on purpose: the spec §1.3 5090 numbers then check the
# model's shape rather than being fitted into it.
RTX5090 = HardwareSpec(name="rtx5090", memory_gib=31.5, hbm_bandwidth_tb_s=1.792, bf16_tflops=209.5,
                       pcie_gib_s=55.0, d2h_gib_s=20.0, h2d_gib_s=20.0)

PRESETS: dict[str, HardwareSpec] = {"h200": H200, "rtx5090": RTX5090}


def preset(name: str) -> HardwareSpec:
    spec = PRESETS.get(name)
    if spec is None:
        raise ConfigError("hardware", name, f"one of {', '.join(sorted(PRESETS))}")
    return spec
