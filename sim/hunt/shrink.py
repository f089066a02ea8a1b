"""Shrinking: make a failing scenario as small as it gets while it still violates the
same invariant. Greedy and deterministic: drop whole parts first (requests, faults,
controls, seeded prefixes), then make the remaining parts smaller, until a full pass
changes nothing or the attempt budget is spent.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

from sim.hunt.runner import RunResult, run_scenario
from sim.hunt.scenario import Scenario


def _candidates(sc: Scenario) -> Iterator[Scenario]:
    for attr in ("requests", "faults", "controls", "seeded_prefixes"):
        for i in reversed(range(len(getattr(sc, attr)))):
            c = copy.deepcopy(sc)
            del getattr(c, attr)[i]
            yield c
    if sc.teardown_at is not None:
        c = copy.deepcopy(sc)
        c.teardown_at = None
        yield c
    for i, r in enumerate(sc.requests):
        for new_len in sorted({len(r.prompt) // 2, len(r.prompt) - sc.block_size, len(r.prompt) - 1}, reverse=True):
            if 1 <= new_len < len(r.prompt):
                c = copy.deepcopy(sc)
                c.requests[i].prompt = r.prompt[:new_len]
                yield c
        for new_max in sorted({r.max_tokens // 2, r.max_tokens - sc.block_size, r.max_tokens - 1}, reverse=True):
            if 1 <= new_max < r.max_tokens:
                c = copy.deepcopy(sc)
                c.requests[i].max_tokens = new_max
                yield c
        for field, plain in (("cancel_at", None), ("lora", None), ("echo", False), ("logprobs", False)):
            if getattr(r, field) != plain:
                c = copy.deepcopy(sc)
                setattr(c.requests[i], field, plain)
                yield c
    for i, f in enumerate(sc.faults):
        if f.probability < 1.0:
            c = copy.deepcopy(sc)
            c.faults[i] = type(f)(**{**f.__dict__, "probability": 1.0})
            yield c
    for i, p in enumerate(sc.seeded_prefixes):
        if len(p) > sc.block_size:
            c = copy.deepcopy(sc)
            c.seeded_prefixes[i] = p[:len(p) - sc.block_size]
            yield c
    for n in sorted({sc.num_blocks - 1, sc.num_blocks * 3 // 4}, reverse=True):
        if n >= 2:
            c = copy.deepcopy(sc)
            c.num_blocks = n
            yield c
    if sc.order != "fifo":
        c = copy.deepcopy(sc)
        c.order = "fifo"
        yield c


def shrink(result: RunResult, max_attempts: int = 400,
           run: Callable[[Scenario], RunResult] = run_scenario) -> tuple[RunResult, int]:
    """The smallest run found that violates the same invariant, and the attempts used."""
    target = result.invariant
    best = result
    attempts = 0
    improved = True
    while improved and attempts < max_attempts:
        improved = False
        for cand in _candidates(best.scenario):
            if attempts >= max_attempts:
                break
            attempts += 1
            r = run(cand)
            if r.invariant == target and (cand.size(), r.events) < (best.scenario.size(), best.events):
                best = r
                improved = True
                break
    return best, attempts
