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


def _landings(cls: type, engines: int, submits: list[tuple[float, int]]) -> list[float]:
    rt = SimRuntime(0)
    link = LinkSpec(bandwidth_gib_s=20.0, latency_s=10e-6, engines=engines)
    tr = cls(rt, PAGE, d2h=link, h2d=link)
    landed: list[float] = [0.0] * len(submits)

    def one(i: int, at: float, pages: int) -> Generator[Any, Any, None]:
        yield rt.sleep(at)
        yield tr.d2h(list(range(pages)), list(range(pages)))
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
