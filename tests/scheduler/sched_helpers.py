"""Wiring for the scheduler contract tests (spec §9.2): bs 16, decode cap 64, FakeExecutor.

``make_engine`` builds one world (runtime, pool, optional host tier, store, fake
executor, engine) under a named variant; the small functions below read request streams
and drive the runtime. Nothing here changes library behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from openinfer.backend.fake_executor import FakeExecutor
from openinfer.backend.transfer import InstantTransfer
from openinfer.kv import BlockPool, HostTier, KvStore, Rank
from openinfer.runtime import OrderSpec, SimRuntime
from openinfer.scheduler import Engine, EventKind, GenerateRequest, RequestHandle, SchedulerConfig
from openinfer.scheduler.request import TERMINAL, TokenSink
from openinfer.variants import variant as get_variant

BS = 16
DECODE_CAP = 64


@dataclass
class Rig:
    rt: SimRuntime
    pool: BlockPool
    host: HostTier | None
    store: KvStore
    ex: FakeExecutor
    eng: Engine
    peaks: dict[int, int] = field(default_factory=dict)     # req_id -> max resident pages
    kv_written: dict[int, int] = field(default_factory=dict)  # req_id -> max kv_position
    chunks: dict[int, list[int]] = field(default_factory=dict)  # req_id -> prefill chunk sizes
    step_prefill_tokens: list[int] = field(default_factory=list)

    def submit(self, prompt: list[int], max_tokens: int, **kw: Any) -> RequestHandle:
        return self.eng.submit(GenerateRequest(prompt, max_tokens, **kw))

    def run(self, until: float | None = None) -> None:
        self.rt.run(until=until)

    def at_rest(self) -> bool:
        """Pool back to every usable page, no pins, nothing open in the store."""
        return (self.pool.available_blocks() == self.pool.max_request_blocks()
                and self.store.pinned_blocks(0) == 0 and self.store.quiescent(0) == [])


def make_engine(num_blocks: int = 200, block_size: int = BS, decode_cap: int = DECODE_CAP, *,
                tier: bool = False, host_pages: int = 400, lora_control: bool = False,
                variant: str = "fixed", seed: int = 0, order: OrderSpec | None = None,
                vocab_size: int = 151936, eos_token: int = 151645, max_loras: int = 1,
                **cfg: Any) -> Rig:
    v = get_variant(variant)
    rt = SimRuntime(seed, order)
    pool = BlockPool(block_size, num_blocks, entitlement=v.pool_entitlement)
    host = HostTier(rt, host_pages, InstantTransfer(rt)) if tier else None
    store = KvStore(rt, [Rank(pool, host)], v.store_config())
    ex = FakeExecutor(rt, vocab_size=vocab_size, eos_token=eos_token, max_loras=max_loras)
    config = SchedulerConfig(max_decode_batch=decode_cap, lora_control=lora_control,
                             switches=v.scheduler_switches(), **cfg)
    eng = Engine(rt, store, ex, config)
    rig = Rig(rt, pool, host, store, ex, eng)
    eng.observers.append(_recorder(rig))
    return rig


def _recorder(rig: Rig) -> Callable[[str, dict[str, Any]], None]:
    """Peak page draw per request (pages are drawn at schedule time, before step_start)."""

    def observe(kind: str, data: dict[str, Any]) -> None:
        if kind == "step_start":
            plan = data["plan"]
            rig.step_prefill_tokens.append(plan.prefill_tokens)
            for row in plan.prefill:
                rig.chunks.setdefault(row.req_id, []).append(len(row.tokens))
            for row in (*plan.prefill, *plan.decode):
                rig.peaks[row.req_id] = max(rig.peaks.get(row.req_id, 0), row.kv.resident_blocks)
        elif kind == "step_end":
            plan = data["plan"]
            for row in (*plan.prefill, *plan.decode):
                rig.kv_written[row.req_id] = max(rig.kv_written.get(row.req_id, 0), row.kv.kv_position)
    return observe


# -- reading streams ---------------------------------------------------------------------
def kinds(h: RequestHandle) -> list[EventKind]:
    return [e.kind for e in h.events]


def terminals(h: RequestHandle) -> list:
    return [e for e in h.events if e.kind in TERMINAL]


def only_terminal(h: RequestHandle):
    ts = terminals(h)
    assert len(ts) == 1, f"request {h.req_id}: expected one terminal event, got {[e.kind for e in h.events]}"
    return ts[0]


def prompt(n: int, base: int = 1) -> list[int]:
    """``n`` distinct-looking token ids starting at ``base`` (no accidental prefix sharing
    when callers use different bases)."""
    return [base + i for i in range(n)]


def sink(rt: SimRuntime, rid: int) -> TokenSink:
    return TokenSink(rid, rt)


def wait(ev) -> Generator:  # type: ignore[no-untyped-def]
    yield ev


def at(rt: SimRuntime, t: float, fn: Callable[[], Any]) -> None:
    """Call ``fn`` at simulated time ``t``."""

    def proc() -> Generator:
        yield rt.sleep(t - rt.now())
        fn()
    rt.spawn(proc())


def run_until(rig: Rig, cond: Callable[[], bool], limit: float = 10.0, tick: float = 0.0005) -> None:
    """Advance the simulation in small slices until ``cond()`` holds (or fail at ``limit``)."""
    while not cond():
        if rig.rt.now() >= limit:
            raise AssertionError(f"condition not reached by t={limit}")
        rig.rt.run(until=rig.rt.now() + tick)
