"""Every fault port can stall, fail and heal without a safety or liveness violation
under ``fixed`` — the same scenario with a planted bug is what the canaries catch."""

from __future__ import annotations

import random

import pytest

from sim.faults import FaultSpec
from sim.hunt.runner import run_scenario
from sim.hunt.scenario import PORT_KINDS, ReqSpec, Scenario


def _scenario(port: str, kind: str, role: str) -> Scenario:
    rng = random.Random(f"{port}/{kind}/{role}")
    shared = [rng.randrange(999) for _ in range(48)]
    reqs = [ReqSpec(round(0.02 * i, 3), shared[: 8 + 8 * i] + [rng.randrange(999) for _ in range(5)],
                    1 if role == "prefill" else 12) for i in range(5)]
    return Scenario(seed=3, variant="fixed", order="random", block_size=4, num_blocks=40, role=role,
                    peer=True, seeded_prefixes=[shared[:32]], max_prefill_tokens=16, requests=reqs,
                    resolve_deadline_s=1.0, flush_deadline_s=0.5,
                    faults=[FaultSpec(port, kind, start_s=0.0, heal_s=0.6, delay_s=0.05)])


CASES = [(p, k, role) for p, kinds in PORT_KINDS.items() for k in kinds for role in ("mixed", "prefill")
         if not (p == "flush" and role == "mixed")]  # only a prefill server flushes on finish


@pytest.mark.parametrize("port,kind,role", CASES)
def test_fault_heals_without_violation_under_fixed(port: str, kind: str, role: str) -> None:
    result = run_scenario(_scenario(port, kind, role))
    assert result.fault_hits[0] > 0, "the scenario must exercise the faulted port"
    assert result.violation is None, "\n".join(f"{t:.4f} {e}" for t, e in result.timeline[-30:])
