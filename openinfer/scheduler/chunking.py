"""Chunked prefill: which prompt tokens go into this step (spec §5.5).

A shared budget of ``max_prefill_tokens`` per step is walked from the front of the
prefilling queue, so older chunked prompts finish before newer ones start. Echo prompts
are never split (their prompt logprobs need the whole prompt in one forward). In
request-local mode every request's chunks are ``min(remaining, budget)`` regardless of
the queue, taken whole or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from openinfer.scheduler.records import PendingRequest


def take_prefill_chunks(prefilling: Sequence[PendingRequest], budget_tokens: int,
                        request_local: bool = False) -> list[PendingRequest]:
    """Set ``step_chunk`` on the requests that run this step; returns them in id order."""
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
            chunk = min(remaining, budget_tokens)
            if chunk > budget:
                continue
        else:
            chunk = min(remaining, budget)
        p.step_chunk = chunk
        budget -= chunk
        taken.append(p)
    taken.sort(key=lambda p: p.id)
    return taken
