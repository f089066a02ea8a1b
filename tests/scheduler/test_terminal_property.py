"""Property: under variant ``fixed``, for random small workloads, every request that was not
cancelled gets exactly one terminal event, none gets more than one, nothing follows a
terminal event, and at quiescence every page is back (spec §10 monitors 3, 7, 8).

Workloads: 1-8 requests, prompts of 1-80 tokens that sometimes share prefixes, max_tokens
1-20, random arrival times, random client cancels at random times, pools of 20-60 blocks,
with and without a host tier (and in pure-L2 mode), with random tie-breaking among simultaneous events.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sched_helpers import at, make_engine
from openinfer.runtime import OrderSpec
from openinfer.scheduler.request import TERMINAL

STEMS = [[(7 * s + 13 * i) % 997 + 1 for i in range(80)] for s in range(3)]

request_st = st.fixed_dictionaries({
    # None: a private prompt; otherwise the first `shared` tokens come from a common stem
    "stem": st.one_of(st.none(), st.integers(0, len(STEMS) - 1), st.integers(0, len(STEMS) - 1)),
    "shared": st.one_of(st.integers(0, 80), st.integers(16, 80)),
    "length": st.integers(1, 80),
    "max_tokens": st.integers(1, 20),
    "arrival": st.one_of(st.floats(0.0, 0.05, allow_nan=False), st.floats(0.0, 0.3, allow_nan=False)),
    "cancel_at": st.one_of(st.none(), st.floats(0.0, 0.3, allow_nan=False)),
})

workload_st = st.fixed_dictionaries({
    "seed": st.integers(0, 2**16),
    "num_blocks": st.integers(20, 60),
    "tier": st.booleans(),
    "l1_off": st.booleans(),              # with a tier: every hit is a host restore (pure L2)
    "host_pages": st.sampled_from([8, 64, 400]),
    "max_prefill_tokens": st.sampled_from([32, 64, 1024]),
    "requests": st.lists(request_st, min_size=1, max_size=8),
})


def build_prompt(i: int, r: dict) -> list[int]:
    n = r["length"]
    if r["stem"] is None:
        return [2000 + 100 * i + k for k in range(n)]
    shared = min(r["shared"], n)
    return STEMS[r["stem"]][:shared] + [3000 + 100 * i + k for k in range(n - shared)]


def check_workload(w: dict, fail_steps: frozenset[int] = frozenset()) -> None:
    rig = make_engine(num_blocks=w["num_blocks"], tier=w["tier"], host_pages=w["host_pages"],
                      variant="fixed", seed=w["seed"], order=OrderSpec("random"),
                      max_prefill_tokens=w["max_prefill_tokens"])
    if w["tier"] and w["l1_off"]:
        rig.store.set_l1_retention_disabled(True)
    rig.ex.fail_steps = set(fail_steps)
    handles: dict[int, object] = {}
    cancelled: set[int] = set()

    for i, r in enumerate(w["requests"]):
        def submit(i: int = i, r: dict = r) -> None:
            handles[i] = rig.submit(build_prompt(i, r), r["max_tokens"])
        at(rig.rt, r["arrival"], submit)
        if r["cancel_at"] is not None:
            def cancel(i: int = i) -> None:
                h = handles.get(i)
                if h is not None:
                    h.cancel()  # type: ignore[attr-defined]
                    cancelled.add(i)
            at(rig.rt, max(r["cancel_at"], r["arrival"]), cancel)

    rig.run(until=60.0)  # generous bound: the workload needs well under a second
    assert len(handles) == len(w["requests"])
    assert not rig.eng.has_work(), "engine still has work long after the workload"
    rig.run()            # nothing may be left scheduled that changes the outcome

    for i, h in handles.items():
        evs = h.events  # type: ignore[attr-defined]
        terms = [e for e in evs if e.kind in TERMINAL]
        assert len(terms) <= 1, (i, [e.kind for e in evs])
        if terms:
            assert evs[-1] is terms[0], (i, [e.kind for e in evs])  # nothing after terminal
        if i not in cancelled:
            assert len(terms) == 1, (i, [e.kind for e in evs])

    rig.pool.check()
    assert rig.pool.available_blocks() == rig.pool.max_request_blocks()
    assert rig.store.pinned_blocks(0) == 0
    assert rig.store.quiescent(0) == []


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload_st)
def test_every_request_gets_exactly_one_terminal_and_pages_return(w: dict) -> None:
    check_workload(w)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload_st, st.frozensets(st.integers(1, 40), max_size=3))
def test_terminal_and_page_invariants_survive_step_failures(w: dict, fail_steps: frozenset[int]) -> None:
    """Same property with injected step errors (§5.8): failed requests end with Error."""
    check_workload(w, fail_steps)
