"""Copy-engine queueing: one engine serialises, two overlap; the arithmetic queue lands
copies exactly when the process-based one does."""

from __future__ import annotations

import random
from collections.abc import Generator
from typing import Any

import pytest

from openinfer.runtime import SimRuntime
from sim.copy_engine import LinkSpec, ModeledTransfer
from sim.copy_queue import QueuedTransfer

PAGE = 2_359_296
GIB = 1024 ** 3


def _landings(cls: type, engines: int, submits: list[tuple[float, int]], direction: str = "d2h",
              step_ends: float | None = None) -> list[float]:
    """When each copy of ``submits`` ((time, pages)) lands; with ``step_ends``, every copy is
    ordered after a step that ends then (``after_compute``)."""
    rt = SimRuntime(0)
    link = LinkSpec(bandwidth_gib_s=20.0, latency_s=10e-6, engines=engines)
    tr = cls(rt, PAGE, d2h=link, h2d=link)
    if step_ends is not None:
        tr.after_compute = lambda: step_ends
    copy = getattr(tr, direction)
    landed: list[float] = [0.0] * len(submits)

    def one(i: int, at: float, pages: int) -> Generator[Any, Any, None]:
        yield rt.sleep(at)
        yield copy(list(range(pages)), list(range(pages)))
        landed[i] = rt.now()
    for i, (at, pages) in enumerate(submits):
        rt.spawn(one(i, at, pages))
    rt.run()
    return landed


@pytest.mark.parametrize("cls", [ModeledTransfer, QueuedTransfer])
def test_two_copies_on_one_engine_serialize(cls: type) -> None:
    dt = 10e-6 + 4 * PAGE / (20 * GIB)
    a, b = _landings(cls, 1, [(0.0, 4), (0.0, 4)])
    assert a == pytest.approx(dt) and b == pytest.approx(2 * dt)


@pytest.mark.parametrize("cls", [ModeledTransfer, QueuedTransfer])
def test_two_engines_overlap(cls: type) -> None:
    dt = 10e-6 + 4 * PAGE / (20 * GIB)
    a, b = _landings(cls, 2, [(0.0, 4), (0.0, 4)])
    assert a == pytest.approx(dt) and b == pytest.approx(dt)


@pytest.mark.parametrize("engines", [1, 2, 3])
def test_queued_transfer_lands_like_modeled_transfer(engines: int) -> None:
    rng = random.Random(engines)
    submits = [(round(rng.uniform(0, 0.01), 6), rng.randint(1, 30)) for _ in range(60)]
    assert _landings(QueuedTransfer, engines, submits) == pytest.approx(_landings(ModeledTransfer, engines, submits))


def test_idle_link_starts_at_once() -> None:
    a, b = _landings(QueuedTransfer, 1, [(0.0, 1), (1.0, 1)])
    assert b - 1.0 == pytest.approx(a)


def test_on_a_held_host_a_copy_that_lands_mid_step_is_seen_when_the_step_ends() -> None:
    """The real engine's host thread is held by a step (sim.host_thread): the DMA starts when
    it is submitted, but its completion, like an arrival that falls due meanwhile, is handled
    after the step, in the order they fell due; a free host sees both on time."""
    from sim.host_thread import HostClockRuntime

    def run(rt: SimRuntime, hold: bool) -> dict[str, float]:
        link = LinkSpec(bandwidth_gib_s=20.0, latency_s=10e-6)
        tr = QueuedTransfer(rt, PAGE, d2h=link, h2d=link)
        seen: dict[str, float] = {}
        order.clear()

        def copy() -> Generator[Any, Any, None]:
            yield tr.h2d([0, 1], [0, 1])          # lands after ~0.23 ms
            seen["copy"] = rt.now()
            order.append("copy")

        def arrival() -> Generator[Any, Any, None]:
            yield rt.sleep(1e-3)
            seen["arrival"] = rt.now()
            order.append("arrival")

        def step() -> Generator[Any, Any, None]:
            if hold:
                rt.hold(5e-3)                      # a 5 ms step from t=0
            else:
                yield rt.sleep(5e-3)
            seen["step_end"] = rt.now()
            return
            yield
        rt.spawn(copy())
        rt.spawn(arrival())
        rt.spawn(step())
        rt.run()
        return seen

    order: list[str] = []
    dma = 10e-6 + 2 * PAGE / (20 * GIB)
    free = run(SimRuntime(0), hold=False)
    assert free["copy"] == pytest.approx(dma) and free["arrival"] == pytest.approx(1e-3)
    held = run(HostClockRuntime(0), hold=True)
    assert held["step_end"] == held["copy"] == held["arrival"] == pytest.approx(5e-3)
    assert order == ["copy", "arrival"]
    rt = HostClockRuntime(0)
    tr = QueuedTransfer(rt, PAGE, d2h=LinkSpec(20.0, 10e-6), h2d=LinkSpec(20.0, 10e-6))
    tr.h2d([0], [0])
    rt.hold(5e-3)
    assert tr.h2d_link.queue_delay() == 0.0   # the engine was free: the DMA ran during the step


@pytest.mark.parametrize("cls", [ModeledTransfer, QueuedTransfer])
def test_a_copy_submitted_mid_step_starts_when_the_step_ends_and_the_next_queues_behind_it(cls: type) -> None:
    """The CUDA executor orders its copy streams after every step launched so far: a
    restore submitted 1 ms into a 4 ms step runs from 4 ms, not from 1 ms, and the copy
    queued after it waits for it; a copy submitted after the step starts at once."""
    dt = 10e-6 + 5 * PAGE / (20 * GIB)
    a, b, c = _landings(cls, 1, [(1e-3, 5), (1.1e-3, 5), (10e-3, 5)], "h2d", step_ends=4e-3)
    assert a == pytest.approx(4e-3 + dt) and b == pytest.approx(4e-3 + 2 * dt)
    assert c == pytest.approx(10e-3 + dt)


def test_copies_after_step_in_a_world_follow_the_executors_step() -> None:
    """``world.copies_after_step`` wires the world's copies to its executor's step in
    flight; off (the default), a copy starts when it is submitted."""
    from sim.world import WorldConfig, build_world
    from sim_helpers import decode_plan
    for ordered in (False, True):
        w = build_world(WorldConfig(copies_after_step=ordered, num_blocks=64, host_tier_gib=0.1))
        landed: dict[str, float] = {}

        def go() -> Generator[Any, Any, None]:
            step = w.executor.execute(decode_plan(4, 1000))
            yield w.rt.sleep(1e-4)
            yield w.transfer.h2d([0], [1])
            landed["copy"] = w.rt.now()
            yield step
            landed["step"] = w.executor.busy_until
        w.rt.spawn(go())
        w.rt.run()
        dma = w.transfer.h2d_link.spec.seconds(w.transfer.page_bytes)
        want = (landed["step"] if ordered else 1e-4) + dma
        assert landed["copy"] == pytest.approx(want), ordered
