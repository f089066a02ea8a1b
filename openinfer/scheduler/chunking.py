"""Chunked prefill: which prompt tokens go into this step (spec §5.5).

A shared budget of ``max_prefill_tokens`` per step is walked from the front of the
prefilling queue, so older chunked prompts finish before newer ones start. Echo prompts
are never split (their prompt logprobs need the whole prompt in one forward). In
request-local mode every request's chunks are ``min(remaining, budget)`` regardless of
the queue, taken whole or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from openinfer.scheduler.records import PendingRequest

_BY_ID = attrgetter("id")


def take_prefill_chunks(prefilling: Sequence[PendingRequest], budget_tokens: int,
                        request_local: bool = False) -> list[PendingRequest]:
    """Set ``step_chunk`` on the requests that run this step; returns them in id order.

    Runs every scheduler pass: the smaller of two counts by a comparison (CPython 3.11's
    ``min`` parses its arguments by keyword machinery), and a sort only of two or more."""
    budget = budget_tokens
    taken: list[PendingRequest] = []
    for p in prefilling:
        if budget <= 0:
            break
        remaining = p.prompt_len - p.prefill_pos
        if remaining <= 0:
            continue
        if p.req.echo:
            if remaining > budget:
                continue
            chunk = remaining
        elif request_local:
            chunk = remaining if remaining < budget_tokens else budget_tokens
            if chunk > budget:
                continue
        else:
            chunk = remaining if remaining < budget else budget
        p.step_chunk = chunk
        budget -= chunk
        taken.append(p)
    if len(taken) > 1:
        taken.sort(key=_BY_ID)
    return taken
