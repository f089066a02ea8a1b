"""Admission: which deferred requests start prefilling this tick (spec §5.4).

FCFS with skipping against a lifetime page budget: a request is admitted when its
lifetime pages, less the pages its own prefix hold already pins, fit what is available
after the future draws of every admitted request. Two switches live here:
``shed_holds_on_defer`` (the F1 fix: a budget-deferred request sheds the holds of queued
requests behind it, rear-most first) and ``subtract_pinned`` (F5: charge save-pinned
pages a second time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from openinfer.kv.pool import BlockPool
from openinfer.kv.request_kv import ceil_div, lifetime_blocks
from openinfer.scheduler.config import SchedulerConfig
from openinfer.scheduler.records import ActiveRequest, PendingRequest


class RejectReason(Enum):
    CONTEXT_LENGTH = "context_length"
    ECHO_PREFILL_TOKENS = "echo_prefill_tokens"
    KV_BUDGET = "kv_budget"


def credit(p: PendingRequest, block_size: int) -> int:
    return p.kv_prefix.credit_blocks(block_size)


@dataclass
class AdmissionResult:
    """One pass's decisions, each list in queue order but ``shed`` (rear-most first).

    A pass looks at requests one by one while a batch slot is free, then leaves the
    vetted rest of the queue deferred where it stands (``kept``, positions in the queue)
    and looks at the arrivals behind it. ``considered`` and ``deferred`` hold the requests
    it looked at (with ``vetted=0``, as in the tests, the whole queue); ``requeue`` turns
    the queue into the one the pass leaves without copying the kept part.
    """

    admitted: list[PendingRequest] = field(default_factory=list)
    deferred: list[PendingRequest] = field(default_factory=list)
    rejected: list[tuple[PendingRequest, RejectReason, str]] = field(default_factory=list)
    shed: list[PendingRequest] = field(default_factory=list)
    cancelled: list[PendingRequest] = field(default_factory=list)  # the client left while it waited
    budget_deferred: list[PendingRequest] = field(default_factory=list)
    considered: list[PendingRequest] = field(default_factory=list)  # queue order
    kept: range = range(0)
    deferred_before_kept: int = 0  # deferred[:this] stand before ``kept`` in the queue

    def requeue(self, queue: list[PendingRequest], front: Sequence[PendingRequest] = ()) -> None:
        """Make ``queue``, the list this pass was given, the queue it leaves, in place:
        ``front`` (the engine's admissions that lost a race for pages), the deferred
        requests before ``kept``, the kept ones, then the deferred ones after them. The
        kept requests are only moved along the list, not copied: a saturated queue is
        long, and a copy per pass made the t=0 batch quadratic."""
        cut = self.deferred_before_kept
        queue[self.kept.stop:] = self.deferred[cut:]
        queue[:self.kept.start] = [*front, *self.deferred[:cut]]


def future_draws(active: Sequence[ActiveRequest], prefilling: Sequence[PendingRequest],
                 block_size: int) -> int:
    """Pages admitted requests will still draw (conservative by ≤1 page per request)."""
    total = 0
    bs = block_size
    for a in active:
        # Every admission pass walks every running request, so this is lifetime_blocks(n, m)
        # - ceil_div(n + generated - 1) written out (one row of a 64-row batch was five
        # calls; tests/scheduler/test_admission_contract.py holds it to the two functions).
        req = a.req
        n, m = len(req.prompt), req.max_tokens
        life = -(-(n + m if m > 1 else n) // bs)
        total += (life if life > 1 else 1) + (1 - n - a.generated) // bs
    for p in prefilling:
        total += (lifetime_blocks(p.prompt_len, p.req.max_tokens, block_size)
                  - ceil_div(p.prefill_pos, block_size) - credit(p, block_size))
    return total


def _rejection(p: PendingRequest, bs: int, pool: BlockPool,
               cfg: SchedulerConfig) -> tuple[RejectReason, str] | None:
    """Why a request can never be admitted, or None."""
    n, m = p.prompt_len, p.req.max_tokens
    if n + m > cfg.max_context_tokens:
        return RejectReason.CONTEXT_LENGTH, (f"prompt ({n}) + max_tokens ({m}) exceeds max_context_tokens "
                                             f"({cfg.max_context_tokens})")
    if p.req.echo and n > cfg.max_prefill_tokens:
        return RejectReason.ECHO_PREFILL_TOKENS, (f"echo prompt ({n}) exceeds max_prefill_tokens "
                                                  f"({cfg.max_prefill_tokens})")
    life = lifetime_blocks(n, m, bs)
    if life > pool.max_request_blocks():
        return RejectReason.KV_BUDGET, (f"needs {life} KV pages, the pool can never hold more than "
                                        f"{pool.max_request_blocks()}")
    return None


def admit(deferred: Sequence[PendingRequest], active: Sequence[ActiveRequest],
          prefilling: Sequence[PendingRequest], pool: BlockPool, pinned: int,
          cfg: SchedulerConfig, on_shed: Callable[[PendingRequest], None] | None = None,
          vetted: int = 0, clients_left: bool = False) -> AdmissionResult:
    """Split ``deferred`` (queue order) into admitted, deferred and rejected requests.

    ``vetted``: the first ``vetted`` requests of ``deferred`` passed ``_rejection`` on an
    earlier pass (the engine's queue is those, then the arrivals since). Its answer reads
    only the request, ``cfg`` and the pool's size, none of which change, so it is not asked
    again. And since a pass never gets a slot back, once none is left a vetted request can
    only be deferred: the vetted rest of the queue is left where it stands (``kept``), so a
    saturated batch's pass looks at its admissions and its new arrivals, not the queue.
    ``clients_left``: some waiter's client may have gone since the last pass; the whole
    queue is walked then, so that it leaves with its hold now, not once a slot frees.
    """
    bs = pool.block_size
    sw = cfg.switches

    def budget_now() -> int:
        base = pool.available_blocks() - (pinned if sw.subtract_pinned else 0)
        return base - future_draws(active, prefilling, bs)

    out = AdmissionResult()

    def recompute() -> int:
        """After holds were dropped mid-pass: what is free, less this pass's admissions."""
        return budget_now() - sum(lifetime_blocks(a.prompt_len, a.req.max_tokens, bs) - credit(a, bs)
                                  for a in out.admitted)

    budget = budget_now()
    slots = cfg.max_decode_batch - len(active) - len(prefilling)
    queue = deferred

    def consider(i: int, p: PendingRequest) -> None:
        """The request at queue[i]: reject, admit or defer it (shedding holds behind it)."""
        nonlocal budget, slots
        if p.sink.is_closed():   # gone while it waited: it leaves the queue, its hold with it
            out.cancelled.append(p)
            if p.kv_prefix.hit_tokens and not p.kv_prefix.released:
                p.drop_hold()    # now, so the requests behind it see the freed pages
                budget = recompute()
            return
        if i >= vetted:
            reason = _rejection(p, bs, pool, cfg)
            if reason is not None:
                out.rejected.append((p, *reason))
                if sw.reject_drops_hold and p.kv_prefix.hit_tokens and not p.kv_prefix.released:
                    p.drop_hold()  # at once, so the requests behind it see the freed pages
                    budget = recompute()
                return
        fresh = lifetime_blocks(p.prompt_len, p.req.max_tokens, bs) - credit(p, bs)
        if slots > 0 and fresh > budget and sw.shed_holds_on_defer:
            for rear in reversed(queue[i + 1:]):
                if fresh <= budget:
                    break
                if rear.kv_prefix.hit_tokens and not rear.kv_prefix.released:
                    rear.drop_hold()
                    out.shed.append(rear)
                    if on_shed is not None:
                        on_shed(rear)
                    budget = recompute()
        if fresh <= budget and slots > 0:
            out.admitted.append(p)
            budget -= fresh
            slots -= 1
        else:
            out.deferred.append(p)
            if slots > 0:
                out.budget_deferred.append(p)

    i = 0
    while i < len(queue) and (slots > 0 or clients_left):
        consider(i, queue[i])
        i += 1
    # No slot left (and no client gone): ``consider`` of a vetted request would only defer it.
    out.kept = range(i, max(i, vetted))
    out.deferred_before_kept = len(out.deferred)
    for j in range(out.kept.stop, len(queue)):
        consider(j, queue[j])
    out.considered = [*queue[:i], *queue[out.kept.stop:]]
    return out
