"""Turn the scheduler's choice into a StepPlan with its pages drawn (schedule phase),
and undo that if the step cannot run.

First chunks create the request's KV and adopt its cached prefix here (the hold is
still alive, so the blocks cannot have been evicted); the executor's real chunk starts at
the KV position, so prefix hits and chunking compose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from openinfer.backend.executor import DecodeRow, PrefillRow, StepKind, StepPlan
from openinfer.kv.hashing import salt_hash
from openinfer.kv.pool import BlockPool
from openinfer.kv.request_kv import KvState, RequestKv
from openinfer.scheduler.records import ActiveRequest, PendingRequest

if TYPE_CHECKING:
    from openinfer.scheduler.cohort import DecodeCohort


def choose_kind(chunks: Sequence[PendingRequest], active: Sequence[ActiveRequest]) -> StepKind | None:
    """Unified when prompts and decodes can share a step; Prefill when forced or alone."""
    # asked only when there are chunks (a decode-only pass would build a generator for nothing)
    needs_all_logits = bool(chunks) and any(p.req.echo and p.req.logprobs for p in chunks)
    if chunks and active and not needs_all_logits:
        return StepKind.UNIFIED
    if chunks:
        return StepKind.PREFILL
    if active:
        return StepKind.DECODE
    return None


def build_step(kind: StepKind, chunks: Sequence[PendingRequest], active: Sequence[ActiveRequest],
               pool: BlockPool, prefix_cache: bool, cohort: DecodeCohort | None = None) -> tuple[StepPlan, bool]:
    """Schedule every row's KV; (plan, ok). On failure the plan's draws are already undone.
    With a ``cohort`` (holding ``active``) the decode rows are its DecodeBatch."""
    plan = StepPlan(kind)
    ok = True
    for p in chunks:
        kv = ensure_kv(p, pool)
        if not p.prefix_adopted:
            p.prefix_adopted = True
            if prefix_cache and not p.req.echo:
                p.cached_tokens = kv.match_and_add_prefix()
            p.prefill_pos = kv.prefill_position
        start = kv.prefill_position
        n = min(p.step_chunk, p.prompt_len - start)
        if not kv.schedule_prefill(n):
            ok = False
            break
        plan.prefill.append(PrefillRow(p.id, kv, start, p.req.prompt[start:start + n],
                                       is_final=start + n == p.prompt_len, lora=p.req.lora,
                                       all_logits=p.req.echo and p.req.logprobs))
    if ok and kind is not StepKind.PREFILL and cohort is not None:
        ok = cohort.schedule(plan, active)
    elif ok and kind is not StepKind.PREFILL:
        add_row = plan.decode.append  # once per row per token in a simulation
        for a in active:
            kv = a.kv
            if not kv.schedule_decode():
                ok = False
                break
            add_row(DecodeRow(a.id, kv, a.last_token, kv.kv_position, a.req.lora))
    if not ok:
        revert_step(plan)
    return plan, ok


def ensure_kv(p: PendingRequest, pool: BlockPool) -> RequestKv:
    """The request's KV record (created at admission, or here for a bare first chunk)."""
    if p.kv is None:
        p.kv = RequestKv(pool, p.req.prompt, p.req.max_tokens, salt_hash(p.req.cache_salt, p.req.lora),
                         prompt_hashes=p.hashes)
    return p.kv


def revert_step(plan: StepPlan) -> None:
    for row in (*plan.prefill, *plan.decode):
        if row.kv.state in (KvState.PREFILL_SCHEDULED, KvState.DECODE_SCHEDULED):
            row.kv.revert_schedule()
