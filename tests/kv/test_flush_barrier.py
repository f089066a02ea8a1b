"""Flush barriers (spec §3.7, §4.2, §4.5, findings F2 and F3).

Corrected store (``StoreConfig()``): barriers are chained and each is bounded by a 5 s
deadline. The PR's store (``PR829``): neither — the tests below assert the PR's bugs.
"""

from __future__ import annotations

import pytest

from kvworld import World, prompt
from openinfer.backend.transfer import InstantTransfer
from openinfer.kv import (Gate, KvStore, MetaServer, PeerDirectory, PeerTier, Ports, Rank, SaveClass,
                          SaveCursor, StoreConfig)
from openinfer.kv.pool import BlockPool
from openinfer.runtime import SimRuntime
from openinfer.variants import variant

NS = "qwen3-test"
PR829 = variant("pr829").store_config()   # the store the pull request shipped


def _seal(w_or_store, pool, tokens):
    """Prefill a producer, seal it (Cacheable) and return its sealed hashes."""
    from openinfer.kv import RequestKv, salt_hash
    kv = RequestKv(pool, tokens, 1, salt_hash())
    assert kv.schedule_prefill(len(tokens))
    kv.apply_prefill(next_token=0)
    cursor = SaveCursor()
    w_or_store.retire(0, kv, cursor, SaveClass.CACHEABLE)
    return [h for h in cursor.records[-1].hashes]


class Recorder:
    """A flush_saves_then callback that notes when it ran and what was visible then."""

    def __init__(self, rt, check=lambda: True):
        self.rt = rt
        self.check = check
        self.calls = []

    def __call__(self, outcome):
        self.calls.append((self.rt.now(), outcome, self.check()))


# -- F2: chained barriers -----------------------------------------------------------------------

def _chain_gap(config):
    """S1 held at the save gate; A takes S1; S2 submitted and lands; B started."""
    w = World(config=config, gated=("save",))
    save_gate = w.gates["save"]
    s1 = _seal(w.store, w.pool, prompt(33, family=1))
    w.advance()
    assert len(save_gate.waiting) == 1
    w.ports.remove("save", save_gate)  # later saves go straight through; S1 stays held

    s1_visible = lambda: all(w.host.contains(h) for h in s1)  # noqa: E731
    a = Recorder(w.rt, s1_visible)
    b = Recorder(w.rt, s1_visible)
    w.store.flush_saves_then(0, a)  # A takes S1's handle
    s2 = _seal(w.store, w.pool, prompt(33, family=2))
    w.store.flush_saves_then(0, b)  # B only finds S2
    w.advance(1.0)
    assert all(w.host.contains(h) for h in s2)
    assert not s1_visible()
    return w, save_gate, a, b


def test_chained_barrier_does_not_complete_before_an_earlier_barriers_save():
    w, gate, a, b = _chain_gap(StoreConfig())
    assert a.calls == [] and b.calls == []  # B waits for A, which waits for S1
    gate.release_all()
    w.advance()
    assert [c[2] for c in a.calls] == [True] and [c[2] for c in b.calls] == [True]
    assert a.calls[0][0] <= b.calls[0][0]
    assert a.calls[0][1].ok and b.calls[0][1].ok
    assert w.store.stats.flush_timeouts == 0
    assert w.quiescent() == []


def test_pr829_barrier_calls_back_before_the_earlier_save_is_visible():
    w, gate, a, b = _chain_gap(PR829)
    assert a.calls == []
    assert len(b.calls) == 1
    t, outcome, s1_visible_then = b.calls[0]
    assert outcome.ok and s1_visible_then is False  # KV-ready advertised early (F2)
    gate.release_all()
    w.advance()
    assert len(a.calls) == 1 and a.calls[0][2] is True


def test_flush_covers_saves_submitted_before_it_only():
    w = World(gated=("save",))
    s1 = _seal(w.store, w.pool, prompt(17, family=1))
    flush = w.store.flush_saves(0)
    w.advance()
    assert not flush.triggered
    w.gates["save"].release_all()
    w.advance()
    assert flush.value.ok and all(w.host.contains(h) for h in s1)
    assert w.quiescent() == []


# Regression (found by this test): a chained barrier whose predecessor timed out reported
# ok=True although saves the predecessor drained were still not visible.
def test_barrier_after_a_timed_out_predecessor_does_not_claim_success():
    w = World(gated=("save",))
    s1 = _seal(w.store, w.pool, prompt(17, family=1))
    a = Recorder(w.rt)
    w.store.flush_saves_then(0, a)  # takes S1, which never lands
    w.run_until(4.0)
    b = Recorder(w.rt, lambda: all(w.host.contains(h) for h in s1))
    w.store.flush_saves_then(0, b)  # covers S1 too (submitted before it)
    w.run_until(20.0)
    assert a.calls and a.calls[0][1].timed_out
    assert b.calls
    _, outcome, s1_visible = b.calls[0]
    assert not s1_visible
    assert not outcome.ok  # it cannot vouch for S1


# -- F3: bounded barriers, with a MetaServer registration stall ---------------------------------------

class PeerWorld:
    def __init__(self, config=None):
        self.rt = SimRuntime()
        self.pool = BlockPool(16, 64)
        self.ms_ports = Ports()
        self.reg_gate = self.ms_ports.install("registration", Gate(self.rt))
        self.metaserver = MetaServer(self.rt, ports=self.ms_ports)
        self.tier = PeerTier(self.rt, 256, InstantTransfer(self.rt), name="prefill-0", namespace=NS,
                             metaserver=self.metaserver, directory=PeerDirectory())
        self.store = KvStore(self.rt, [Rank(self.pool, self.tier)], config or StoreConfig())

    def run_until(self, t):
        self.rt.run(until=t)

    def registered(self, hashes):
        return all(self.metaserver.is_registered(NS, h) for h in hashes)


def test_successful_flush_means_every_saved_block_is_registered():
    pw = PeerWorld()
    saved = []
    for fam in range(3):
        saved += _seal(pw.store, pw.pool, prompt(40, family=fam))
    rec = Recorder(pw.rt, lambda: pw.registered(saved))
    pw.store.flush_saves_then(0, rec)
    pw.run_until(0.5)
    assert rec.calls == []  # visible locally, but the registration RPC is held
    assert all(pw.tier.contains(h) for h in saved) and not pw.registered(saved)
    pw.reg_gate.release(1)
    pw.run_until(0.6)
    assert rec.calls == []  # one of three registrations delivered: still not a barrier
    pw.reg_gate.open_gate()
    pw.run_until(0.7)
    assert len(rec.calls) == 1
    _, outcome, all_registered = rec.calls[0]
    assert outcome.ok and not outcome.timed_out and all_registered
    assert pw.tier.counters["registrations"] == 3
    assert pw.store.quiescent(0) == []


def test_stalled_registration_barrier_runs_its_callback_at_the_deadline():
    pw = PeerWorld()
    saved = _seal(pw.store, pw.pool, prompt(40))
    a = Recorder(pw.rt)
    pw.store.flush_saves_then(0, a)
    pw.run_until(1.0)
    b = Recorder(pw.rt)
    pw.store.flush_saves_then(0, b)  # a second finish at t = 1 s
    pw.run_until(4.99)
    assert a.calls == [] and b.calls == []
    pw.run_until(5.01)
    assert len(a.calls) == 1
    t_a, out_a, _ = a.calls[0]
    assert t_a == pytest.approx(5.0) and out_a.timed_out and not out_a.ok
    assert pw.store.stats.flush_timeouts == 1
    pw.run_until(30.0)
    assert len(b.calls) == 1
    t_b, out_b, _ = b.calls[0]
    assert t_b <= 6.0 + 1e-9  # bounded by its own deadline: no accumulation behind A
    assert out_b.timed_out
    assert pw.store.stats.flush_timeouts == 2
    assert pw.store.flushes.open_barriers == 0

    # once the MetaServer answers again a new barrier succeeds and everything is registered
    pw.reg_gate.open_gate()
    c = Recorder(pw.rt, lambda: pw.registered(saved))
    pw.store.flush_saves_then(0, c)
    pw.run_until(31.0)
    assert len(c.calls) == 1 and c.calls[0][1].ok and c.calls[0][2]
    assert pw.store.quiescent(0) == []


def test_pr829_stalled_registration_barrier_never_calls_back():
    pw = PeerWorld(PR829)
    _seal(pw.store, pw.pool, prompt(40))
    a = Recorder(pw.rt)
    pw.store.flush_saves_then(0, a)
    pw.run_until(1.0)
    b = Recorder(pw.rt)
    pw.store.flush_saves_then(0, b)
    pw.run_until(120.0)
    assert a.calls == [] and b.calls == []  # Finished withheld forever (F3)
    assert pw.store.stats.flush_timeouts == 0
    assert pw.store.flushes.open_barriers == 2


def test_stalled_save_barrier_times_out_with_the_default_deadline():
    w = World(gated=("save",))
    _seal(w.store, w.pool, prompt(17))
    flush = w.store.flush_saves(0)
    w.run_until(4.9)
    assert not flush.triggered
    w.run_until(5.1)
    assert flush.triggered and flush.value.timed_out
    assert flush.value.finished_at - flush.value.started_at == pytest.approx(5.0)
    assert w.store.stats.flush_timeouts == 1


def test_a_barrier_waits_for_the_registrations_queued_before_it_not_for_later_ones():
    """Regression (review, 2026-12-06): the barrier waited for an empty registration queue.
    With saves arriving faster than the MetaServer registers them (25/s against 20/s) the
    queue never empties, so every barrier ran into its deadline and reported its request's
    KV as degraded although its own saves were registered within 0.2 s."""
    from openinfer.kv import RequestKv, salt_hash
    rt = SimRuntime(0)
    pool = BlockPool(16, 4000)
    meta = MetaServer(rt, rpc_latency_s=0.05)
    tier = PeerTier(rt, 100_000, InstantTransfer(rt), name="p0", namespace=NS, metaserver=meta,
                    directory=PeerDirectory())
    store = KvStore(rt, [Rank(pool, tier)], StoreConfig())
    records = []

    def producer():
        for i in range(500):
            kv = RequestKv(pool, [10_000 * i + j for j in range(16)], 1, salt_hash())
            kv.schedule_prefill(16)
            kv.apply_prefill(next_token=0)
            cursor = SaveCursor()
            store.seal(0, kv, cursor, SaveClass.CACHEABLE)
            kv.release()
            records.append(cursor.records[0])
            yield rt.sleep(0.04)

    out = {}

    def barrier():
        yield rt.sleep(0.85)
        mine = list(records)                     # every save submitted before the barrier
        out["outcome"] = yield store.flush_saves(0)
        out["at"], out["mine"], out["queued_then"] = rt.now(), mine, len(tier._queue)

    rt.spawn(producer())
    rt.spawn(barrier())
    rt.run(until=30)
    outcome = out["outcome"]
    assert outcome.ok and not outcome.timed_out
    assert all(r.registered_at is not None and r.registered_at <= out["at"] for r in out["mine"])
    assert out["at"] < 0.85 + 1.0                # not the 5 s deadline
    assert out["queued_then"] > 0                # later registrations were still queued


@pytest.mark.parametrize("config, drained", [(StoreConfig(), False), (PR829, True)],
                         ids=["fixed", "pr829"])
def test_teardown_says_the_arena_is_free_only_once_no_save_reads_it(config, drained):
    """HEAD's teardown (spec 3.9): loads, then saves, each bounded. A save an earlier
    barrier took is still reading GPU pages: the chained store's teardown waits for it and,
    at its bound, says the arena must be leaked; the PR's unchained one (F2) says it may be
    freed while that D2H still reads it."""
    w = World(config=config, gated=("save",))
    gate = w.gates["save"]
    s1 = _seal(w.store, w.pool, prompt(33, family=1))
    w.advance()
    w.ports.remove("save", gate)
    w.store.flush_saves_then(0, Recorder(w.rt))          # takes S1, which stays in flight
    heard = []
    teardown = w.store.teardown(0, limit_s=1.0, on_loads=heard.append)
    w.run_until(w.rt.now() + 2.0)
    out = teardown.value
    assert heard == [True] and out.loads_drained
    assert out.saves_drained is drained and not any(w.host.contains(h) for h in s1)
    assert out.arena_free is drained
    gate.release_all()
    w.advance()
    assert all(w.host.contains(h) for h in s1)
