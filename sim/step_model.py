"""Roofline step time: how long the GPU takes for one step plan.

A step is one forward pass. Its time is ``overhead + max(compute, memory)``: the pass
cannot finish before its FLOPs are done at the sustained FLOP rate, nor before its bytes
have streamed through HBM, and a well-fused pass overlaps the two. For a unified step the
prefill chunk and the decode rows share the pass, so their FLOPs and bytes add before the
max (that is why a decode row rides almost free on a compute-bound prefill chunk).

* compute = 2·body_params·(prefill tokens + padded decode rows)
            + LM head for every sampled row + attention FLOPs (4·L·H·d per query/key pair:
            quadratic in context for a long prefill, linear in context per decode row)
* memory  = weights streamed once + the KV every row reads and writes.

Decode steps replay CUDA graphs, so their batch is padded to the next bucket (spec §1.4):
the padding costs FLOPs, not KV bytes, and shows up once the step is compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from openinfer.backend.executor import StepPlan
from sim.hardware import HardwareSpec
from sim.model_geometry import ModelGeometry
from sim.step_features import StepFeatures, step_features


class StepModel(Protocol):
    def step_time(self, plan: StepPlan) -> float:
        """Seconds the device spends on ``plan``."""
        ...


@dataclass(frozen=True)
class StepBreakdown:
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.overhead_s + max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


class RooflineStepModel:
    """``step_time(plan)`` from a model geometry and a hardware spec."""

    def __init__(self, model: ModelGeometry, hardware: HardwareSpec, *, pad_unified: bool = False) -> None:
        self.model = model
        self.hardware = hardware
        self.pad_unified = pad_unified
        # Per-unit costs folded into seconds once: step_time runs every simulated step.
        fl = hardware.flops_per_s
        bw = hardware.bytes_per_s
        self._s_dense = model.dense_flops_per_token / fl
        self._s_head = model.lm_head_flops_per_row / fl
        self._s_pair = model.attn_flops_per_pair / fl
        self._s_weights = model.weight_read_bytes / bw
        self._s_kv = model.kv_bytes_per_token / bw
        self._overhead = hardware.step_overhead_s

    def _compute_memory(self, f: StepFeatures) -> tuple[float, float]:
        compute = ((f.prefill_tokens + f.decode_rows_padded) * self._s_dense
                   + (f.logit_rows + f.decode_rows_padded) * self._s_head
                   + (f.prefill_attn_pairs + f.decode_context_tokens) * self._s_pair)
        memory = self._s_weights + (f.prefill_context_tokens + f.decode_context_tokens) * self._s_kv
        return compute, memory

    def breakdown(self, f: StepFeatures) -> StepBreakdown:
        compute, memory = self._compute_memory(f)
        return StepBreakdown(compute, memory, self._overhead)

    def features_time(self, f: StepFeatures) -> float:
        """``breakdown(f).total_s`` (the same sum), without building the frozen breakdown:
        this runs every simulated step."""
        compute, memory = self._compute_memory(f)
        return self._overhead + (memory if memory > compute else compute)  # max(), once a step

    def step_time(self, plan: StepPlan) -> float:
        return self.features_time(step_features(plan, self.pad_unified))
