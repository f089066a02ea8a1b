"""Property: the real transfer refuses exactly the copies and steps the exclusion rule forbids.

A state machine submits saves, loads and steps to ``CudaTransfer`` (asynchronous CPU copies
that land ``DELAY`` after submission) in random order and at random times, and keeps its own
list of the copies in flight. Whatever the interleaving, the transfer refuses an operation
exactly when the list holds a copy it would race with (a write against any reader or writer
of the page or slot, a read against a writer), and when everything has landed nothing is
left counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from openinfer.backend.cuda_transfer import CudaTransfer, PageInFlight, PinnedHostArena
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.runtime import SimRuntime


DELAY = 0.01
PAGES, SLOTS = 8, 6


@dataclass(frozen=True)
class Copy:
    reads: frozenset[tuple[str, int]]    # ("page" | "slot", index)
    writes: frozenset[tuple[str, int]]
    lands_at: float


def _ids(kind: str, ids: list[int]) -> frozenset[tuple[str, int]]:
    return frozenset((kind, i) for i in ids)


pages = st.lists(st.integers(1, PAGES - 1), min_size=1, max_size=3, unique=True)
slots = st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=3, unique=True)


class CopyExclusionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rt = SimRuntime(0)
        arena = KVArena.allocate(PAGES, 1, 2, 1, 4, torch.float32, "cpu")
        host = PinnedHostArena.like(arena, SLOTS, pin=False)
        self.tr = CudaTransfer(self.rt, arena, host, cpu_delay_s=DELAY)
        self.flying: list[Copy] = []

    def _races(self, reads: frozenset, writes: frozenset) -> bool:
        now = self.rt.now()
        live = [c for c in self.flying if c.lands_at > now]
        return any(writes & (c.reads | c.writes) or reads & c.writes for c in live)

    def _try(self, op, reads: frozenset, writes: frozenset, is_copy: bool) -> None:
        expected = self._races(reads, writes)
        try:
            op()
        except PageInFlight:
            assert expected, "refused an operation that races with no copy in flight"
            return
        assert not expected, "accepted an operation that races with a copy in flight"
        if is_copy:
            self.flying.append(Copy(reads, writes, self.rt.now() + DELAY))

    @rule(p=pages, s=slots)
    def save(self, p: list[int], s: list[int]) -> None:
        n = min(len(p), len(s))
        p, s = p[:n], s[:n]
        self._try(lambda: self.tr.d2h(p, s), _ids("page", p), _ids("slot", s), True)

    @rule(s=slots, p=pages)
    def load(self, s: list[int], p: list[int]) -> None:
        n = min(len(p), len(s))
        p, s = p[:n], s[:n]
        self._try(lambda: self.tr.h2d(s, p), _ids("slot", s), _ids("page", p), True)

    @rule(r=st.lists(st.integers(1, PAGES - 1), max_size=3, unique=True),
          w=st.lists(st.integers(1, PAGES - 1), max_size=3, unique=True))
    def step(self, r: list[int], w: list[int]) -> None:
        self._try(lambda: self.tr.check_step(r, w), _ids("page", r), _ids("page", w), False)

    @rule(dt=st.sampled_from([0.0013, 0.0031, 0.0071, 0.0173]))
    def advance(self, dt: float) -> None:
        until = self.rt.now() + dt
        # a copy landing at the very instant the run stops is neither side of it
        assume(all(abs(c.lands_at - until) > 1e-9 for c in self.flying))
        self.rt.run(until=until)

    @invariant()
    def nothing_counted_once_everything_landed(self) -> None:
        if all(c.lands_at < self.rt.now() for c in self.flying):
            assert self.tr.pages_in_flight() == 0


CopyExclusionMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
test_copy_exclusion_machine = CopyExclusionMachine.TestCase
