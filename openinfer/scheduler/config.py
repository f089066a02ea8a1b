"""Scheduler settings, the P/D role, and the scheduler-side switches of the PR's bugs."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from openinfer.errors import require


class Role(Enum):
    MIXED = "mixed"
    PREFILL = "prefill"   # P of P/D: Finished is withheld behind the flush barrier
    DECODE = "decode"     # D of P/D: resolves with the full-hit policy


@dataclass(frozen=True)
class SchedulerSwitches:
    """Named behaviours of the one scheduler; the fixed values are the defaults."""

    # F1: when the considered request is budget-deferred, shed rear holds of queued requests.
    shed_holds_on_defer: bool = True
    # F4: "idle" (when control commands apply) also requires no resolve in flight.
    idle_requires_no_resolves: bool = True
    # F5 (bug when True): subtract save-pinned pages from a budget already net of them.
    subtract_pinned: bool = False
    # H9: a prefill server's Finished says when its KV is not all visible and registered
    # (barrier timeout, failed save, dropped registration) instead of advertising it.
    mark_degraded_kv_ready: bool = True
    # H13: the load snapshot's waiting count includes resolves in flight.
    snapshot_counts_resolves: bool = True
    # H16: a rejected request's prefix hold is dropped with it.
    reject_drops_hold: bool = True
    # C1 (found by the hunter): a control waits for the generates that arrived before it,
    # even those that arrived behind an earlier pending control.
    controls_in_arrival_order: bool = True
    # S1: a failed prefill-only step leaves the decoding requests (not in it) alone.
    failed_prefill_keeps_decodes: bool = True


@dataclass(frozen=True)
class SchedulerConfig:
    max_prefill_tokens: int = 1024
    max_decode_batch: int = 256
    max_context_tokens: int = 40960
    prefix_cache: bool = True
    lora_control: bool = False        # the LoRA-control engine (Generate + Control channel)
    role: Role = Role.MIXED
    # The decode role's resolve: the PR's qwen3 decode role uses the plain policy (a Miss is
    # a cold prefill at once, spec 5.11); True waits for the full hit until the resolve
    # deadline, as HEAD's glm52 decode side does.
    decode_full_hit: bool = False
    request_local_chunks: bool = False
    resolve_poll_interval_s: float = 0.005
    idle_tick_s: float = 0.001        # a scheduler pass with no plan: the Rust loop spins
    # Decode rows as a cohort of arrays (scheduler/cohort.py) when the executor answers a
    # DecodeBatch with a token array; False: one DecodeRow and one apply per row per token.
    # The same effects either way.
    decode_cohort: bool = True
    switches: SchedulerSwitches = field(default_factory=SchedulerSwitches)

    def __post_init__(self) -> None:
        require(self.max_prefill_tokens >= 1, "scheduler.max_prefill_tokens", self.max_prefill_tokens,
                "an int >= 1")
        require(1 <= self.max_decode_batch <= 256, "scheduler.max_decode_batch", self.max_decode_batch,
                "an int in [1, 256] (the last CUDA-graph bucket)")
        require(self.max_context_tokens >= 2, "scheduler.max_context_tokens", self.max_context_tokens,
                "an int >= 2")
        require(self.resolve_poll_interval_s > 0, "scheduler.resolve_poll_interval_s",
                self.resolve_poll_interval_s, "a number > 0 (seconds)")
        require(self.idle_tick_s > 0, "scheduler.idle_tick_s", self.idle_tick_s, "a number > 0 (seconds)")

    @property
    def flush_on_finish(self) -> bool:
        return self.role is Role.PREFILL
