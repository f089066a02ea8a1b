"""What the real engine's host does around copies, fitted from timing records and replayed
by the held host: the host-gap fit recovers the work between steps (base, around eager
steps, per decode row, per copy submitted), the copy-wait test tells a D2H that holds the
next step from an H2D that overlaps it, the step fit leaves that wait out of its target,
and the held executor charges the copies and waits for the D2H in flight."""

from __future__ import annotations

import random
from collections.abc import Generator
from types import SimpleNamespace
from typing import Any

import pytest

from sim_helpers import decode_plan
from sim.calibrated_step_model import CalibratedStepModel
from sim.calibration import copy_wait, features_of, fit_host_gaps, fit_steps, step_waits
from sim.copy_engine import LinkSpec
from sim.copy_queue import QueuedLink
from sim.host_thread import HostClockRuntime, HostHeldExecutor
from sim.profile import FittedProfile

BASE, AFTER_E, BEFORE_E, PER_ROW, PER_COPY = 1.0e-4, 2.0e-4, 1.5e-4, 1.0e-5, 2.4e-4
STEP = CalibratedStepModel(intercept=4e-3, eager_step=15e-3, decode_rows_padded=3e-5)


def served(n: int = 400, seed: int = 7, d2h_waits: bool = True) -> list[dict]:
    """Back-to-back steps of one run with copies submitted in the gaps (gap = the host
    work above). Every copy is a D2H or an H2D still in flight when the next step starts;
    a step that starts with a D2H in flight waits for it (its wall time grows by the copy's
    remaining time, its CUDA-event time does not) when ``d2h_waits``; an H2D never waits."""
    rng = random.Random(seed)
    out: list[dict] = []
    t, prev = 0.0, None
    for i in range(n):
        eager = rng.random() < 0.15
        rows = rng.randint(0 if eager else 1, 12)
        positions = [rng.randint(16, 2000) for _ in range(rows)]
        prefill = [[0, 64, True, False]] if eager else []
        kind = "decode" if not eager else ("unified" if rows else "prefill")
        rec = dict(type="step", run="served:x", step=i + 1, kind=kind, prefill=prefill,
                   decode_positions=positions, decode_rows=rows, decode_rows_padded=rows, graph=not eager,
                   error=None)
        feats = SimpleNamespace(prefill_tokens=64 if eager else 0)
        copies = rng.choice([0, 0, 0, 1, 2])
        gap = BASE + PER_ROW * (prev["decode_rows"] if prev else 0) + PER_COPY * copies
        gap += (AFTER_E if prev and prev["prefill"] else 0.0) + (BEFORE_E if feats.prefill_tokens else 0.0)
        if prev is not None:
            t = prev["started_at"] + prev["wall_s"] + gap
        left = 0.0
        for c in range(copies):
            d = rng.choice(["d2h", "h2d"])
            dur = rng.uniform(2e-4, 2e-3)
            sub = t - gap + (c + 1) * PER_COPY
            out.append(dict(type="copy", run="served:x", dir=d, pages=4, bytes=4 << 21, submitted_at=sub,
                            gpu_s=dur, wall_s=dur + 1e-4))
            if d == "d2h" and d2h_waits:
                left = max(left, sub + dur - t)
        gpu = STEP.features_time(features_of(rec))
        rec.update(started_at=t, gpu_s=gpu, wall_s=gpu + 8e-5 + max(0.0, left))
        out.append(rec)
        prev = rec
    return out


def test_the_host_gap_fit_recovers_the_work_between_steps() -> None:
    g = fit_host_gaps(served())
    assert g.samples == 399 and g.left_out == 0
    for got, want in ((g.base, BASE), (g.after_eager, AFTER_E), (g.before_eager, BEFORE_E),
                      (g.per_row, PER_ROW), (g.per_copy, PER_COPY)):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("d2h_waits", [True, False])
def test_copy_wait_tells_a_blocking_d2h_from_an_overlapped_h2d(d2h_waits: bool) -> None:
    recs = served(d2h_waits=d2h_waits)
    d2h, h2d = copy_wait(recs, "d2h"), copy_wait(recs, "h2d")
    assert d2h.waits is d2h_waits and h2d.waits is False
    assert d2h.slope == pytest.approx(1.0 if d2h_waits else 0.0, abs=0.05)
    assert d2h.samples >= 10 and h2d.samples >= 10


def test_the_step_fit_leaves_the_copy_wait_out() -> None:
    recs = served()
    waits = step_waits(recs, ("d2h",))
    assert waits and all(w > 0 for w in waits.values())
    plain, _ = fit_steps(recs, balance_kinds=False, mean=True)
    fixed, q = fit_steps(recs, balance_kinds=False, mean=True, wait_for=("d2h",))
    assert q["copy_waits_removed"] == len(waits)
    # CUDA-event time + 80 µs: the intercept, once the waits are out
    assert fixed.intercept == pytest.approx(STEP.intercept + 8e-5, rel=1e-3)
    assert plain.intercept > fixed.intercept + 5e-6


def test_the_held_host_charges_copies_and_waits_for_a_d2h_in_flight() -> None:
    rt = HostClockRuntime(0)
    ex = HostHeldExecutor(rt, CalibratedStepModel(intercept=4e-3), seed=1)
    links = SimpleNamespace(d2h_link=QueuedLink(rt, LinkSpec(1.0, 0.0)), h2d_link=QueuedLink(rt, LinkSpec(1.0, 0.0)))
    ex.attach_copies(links, per_copy_s=2e-4, wait_for=("d2h",))
    plan = decode_plan(1, 100)

    def go() -> Generator[Any, Any, Any]:
        d2h_lands = links.d2h_link.landing_time(3 * 2 ** 20)   # 3 MiB at 1 GiB/s: lands in ~2.93 ms
        links.h2d_link.landing_time(50 * 2 ** 20)             # an H2D in flight: overlapped
        t0 = rt.now()
        yield ex.execute(plan)
        first = rt.now() - t0
        t1 = rt.now()
        yield ex.execute(plan)                                 # nothing new, nothing in flight
        return d2h_lands - t0, first, rt.now() - t1
    d2h_left, first, second = rt.run_process(go())
    assert first == pytest.approx(d2h_left + 4e-3)             # 2 copies' 0.4 ms lie inside the wait
    assert second == pytest.approx(4e-3)
    assert ex.copy_submit_s == pytest.approx(4e-4) and ex.copy_wait_s == pytest.approx(d2h_left - 4e-4)


def test_profile_host_gap_reaches_the_step_model_and_round_trips(tmp_path) -> None:
    p = FittedProfile(name="t", gpu="g", date="d", model="qwen3-0.6b", step_model=STEP, host_overhead_s=BASE,
                      host_gap=dict(after_eager=AFTER_E, before_eager=BEFORE_E, per_row=PER_ROW, per_copy=PER_COPY),
                      steps_wait_for=("d2h",))
    sm = p.step_time_model()
    assert sm.intercept == pytest.approx(STEP.intercept + BASE)
    assert sm.eager_step == pytest.approx(STEP.eager_step + AFTER_E + BEFORE_E)
    assert sm.host_per_row == pytest.approx(PER_ROW)
    again = FittedProfile.load(p.save(tmp_path / "p.yaml"))
    assert again == p
    with pytest.raises(Exception, match="host_gap"):
        FittedProfile(name="t", gpu="g", date="d", model="m", host_gap=dict(per_page=1.0))
