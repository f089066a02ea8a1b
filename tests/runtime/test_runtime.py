"""The Runtime seam: replayable event order, bounded waits, seeded streams, wall time."""

from __future__ import annotations

import time

import pytest

from openinfer.errors import ConfigError
from openinfer.runtime import OrderSpec, SimRuntime, WallRuntime


def _racing_world(seed: int, order: OrderSpec) -> list[tuple[float, str, int]]:
    """Many processes whose steps collide at the same timestamps; returns the trace."""
    rt = SimRuntime(seed=seed, order=order)
    log: list[tuple[float, str, int]] = []

    def worker(name: str, period: float, steps: int):
        for i in range(steps):
            log.append((rt.now(), name, i))
            yield rt.sleep(period)
        ev = rt.event()
        rt.spawn(_signal(ev))
        yield ev
        log.append((rt.now(), name, -1))

    def _signal(ev):
        yield rt.sleep(0)
        ev.succeed()

    for k in range(6):
        rt.spawn(worker(f"w{k}", period=0.001 * (1 + k % 2), steps=8))
    rt.run(until=1.0)
    return log


ORDERS = [OrderSpec("fifo"), OrderSpec("random"), OrderSpec("pct", depth=2), OrderSpec("pct", depth=5)]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: f"{o.policy}-{o.depth}")
@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_same_seed_and_order_replays_the_same_event_order(order, seed):
    first = _racing_world(seed, order)
    second = _racing_world(seed, order)
    assert len(first) == 6 * 9
    assert first == second


@pytest.mark.parametrize("policy", ["random", "pct"])
def test_non_fifo_orders_reach_other_interleavings(policy):
    fifo = _racing_world(0, OrderSpec("fifo"))
    differs = [s for s in range(20) if _racing_world(s, OrderSpec(policy)) != fifo]
    assert differs, f"{policy} order never differed from fifo over 20 seeds"
    # ... and the seed matters: not every seed gives the same interleaving
    traces = {tuple(_racing_world(s, OrderSpec(policy))) for s in range(6)}
    assert len(traces) > 1


def test_orders_only_reorder_simultaneous_events():
    """Whatever the order, time never runs backwards and each worker's own steps stay in order."""
    for policy in ("random", "pct"):
        for seed in range(5):
            log = _racing_world(seed, OrderSpec(policy))
            times = [t for t, _, _ in log]
            assert times == sorted(times)
            for k in range(6):
                steps = [i for _, n, i in log if n == f"w{k}"]
                assert steps == list(range(8)) + [-1]
            assert sorted(log) == sorted(_racing_world(0, OrderSpec("fifo")))


def test_unknown_order_policy_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match="order.policy"):
        OrderSpec("lifo").build(0)
    with pytest.raises(ConfigError, match="order.depth"):
        OrderSpec("pct", depth=-1).build(0)


def test_wait_returns_false_at_the_deadline_when_the_event_never_fires():
    rt = SimRuntime()
    ev = rt.event()
    seen = {}

    def waiter():
        seen["ok"] = yield from rt.wait(ev, deadline=0.25)
        seen["t"] = rt.now()

    rt.spawn(waiter())
    rt.run(until=5.0)
    assert seen == {"ok": False, "t": pytest.approx(0.25)}
    assert not ev.triggered  # the observed operation is not cancelled by the timeout


def test_wait_returns_true_when_the_event_fires_before_the_deadline():
    rt = SimRuntime()
    ev = rt.event()
    seen = {}

    def waiter():
        seen["ok"] = yield from rt.wait(ev, deadline=1.0)
        seen["t"] = rt.now()

    def firer():
        yield rt.sleep(0.3)
        ev.succeed("v")

    rt.spawn(waiter())
    rt.spawn(firer())
    rt.run(until=5.0)
    assert seen == {"ok": True, "t": pytest.approx(0.3)}


def test_wait_without_deadline_waits_for_the_event_and_past_deadline_does_not_block():
    rt = SimRuntime()
    ev = rt.event()
    seen = {}

    def unbounded():
        seen["unbounded"] = yield from rt.wait(ev, deadline=None)
        seen["t"] = rt.now()

    def late():
        yield rt.sleep(2.0)
        seen["past"] = yield from rt.wait(rt.event(), deadline=1.0)
        seen["t_past"] = rt.now()
        ev.succeed()

    rt.spawn(unbounded())
    rt.spawn(late())
    rt.run(until=10.0)
    assert seen["past"] is False and seen["t_past"] == pytest.approx(2.0)
    assert seen["unbounded"] is True and seen["t"] == pytest.approx(2.0)


def test_wait_on_an_already_triggered_event_is_true_even_past_the_deadline():
    rt = SimRuntime()
    seen = {}

    def proc():
        yield rt.sleep(1.0)
        seen["ok"] = yield from rt.wait(rt.done(3), deadline=0.5)

    rt.run_process(proc())
    assert seen["ok"] is True


def test_sleep_of_negative_duration_is_zero_and_run_process_returns_value():
    rt = SimRuntime()

    def proc():
        yield rt.sleep(-1.0)
        assert rt.now() == 0.0
        yield rt.sleep(0.5)
        return "done"

    assert rt.run_process(proc()) == "done"
    assert rt.now() == pytest.approx(0.5)


def _draw(r, n=16):
    return [r.getrandbits(32) for _ in range(n)]


def test_rng_streams_replay_from_seed_and_are_independent():
    a1 = _draw(SimRuntime(seed=3).rng("arrivals"))
    a2 = _draw(SimRuntime(seed=3).rng("arrivals"))
    assert a1 == a2  # replayable across runtimes with the same seed

    rt = SimRuntime(seed=3)
    assert _draw(rt.rng("arrivals")) == a1  # a fresh handle replays the stream from its start
    b = _draw(rt.rng("faults"))
    assert b != a1  # distinct streams are distinct

    # Consuming one stream does not perturb another.
    rt2 = SimRuntime(seed=3)
    arr = rt2.rng("arrivals")
    _draw(arr, 1000)
    assert _draw(rt2.rng("faults")) == b

    # A different seed gives a different stream of the same name.
    assert _draw(SimRuntime(seed=4).rng("arrivals")) != a1


def test_rng_is_independent_of_event_order_policy():
    assert _draw(SimRuntime(5, OrderSpec("random")).rng("x")) == _draw(SimRuntime(5).rng("x"))


def test_wall_runtime_now_advances_with_real_time():
    rt = WallRuntime()
    t_wall = time.monotonic()
    t0 = rt.now()
    assert t0 >= 0.0

    def proc():
        yield rt.sleep(0.03)
        return rt.now()

    t1 = rt.run_process(proc())
    elapsed = time.monotonic() - t_wall
    assert t1 >= t0 + 0.03
    assert elapsed >= 0.03  # the sleep really waited
    time.sleep(0.01)
    assert rt.now() >= t1 + 0.01  # now() keeps following the wall clock between events


def test_wall_runtime_processes_events_no_earlier_than_their_time():
    """With an injected clock: the environment sleeps until each event is due."""
    clock = {"t": 100.0}
    slept: list[float] = []

    def fake_clock():
        return clock["t"]

    def fake_sleep(dt):
        slept.append(dt)
        clock["t"] += dt

    rt = WallRuntime(clock=fake_clock, sleep=fake_sleep)
    stamps = []

    def proc():
        yield rt.sleep(0.5)
        stamps.append(rt.now())
        clock["t"] += 0.2  # synchronous work inside a process shows up as time passing
        stamps.append(rt.now())
        yield rt.sleep(0.1)
        stamps.append(rt.now())

    rt.run_process(proc())
    assert stamps == [pytest.approx(0.5), pytest.approx(0.7), pytest.approx(0.8)]
    assert sum(slept) == pytest.approx(0.6)


def test_later_is_pending_until_it_fires_and_answers_with_what_it_computes_then():
    """A flush takes the saves whose landing is still pending: a landing event that looked
    triggered from the moment it was queued (a SimPy Timeout) would be skipped."""
    rt = SimRuntime()
    state = {"x": 1}
    ev = rt.later(0.5, lambda: ("landed at", rt.now(), state["x"]))
    seen = {}

    def waiter():
        seen["value"] = yield ev

    rt.spawn(waiter())
    rt.run(until=0.4)
    assert not ev.triggered
    state["x"] = 2  # computed when it fires, not when it was made
    rt.run(until=1.0)
    assert seen["value"] == ("landed at", pytest.approx(0.5), 2)
    assert ev.processed and ev.compute is None  # what it captured is let go


def test_then_answers_through_a_fresh_timer_as_one_event_and_otherwise_through_a_second():
    rt = SimRuntime()
    timer = rt.timer(0.2)
    fused = rt.then(timer, lambda: "a")
    assert fused is timer  # nobody waited on the timer yet: it carries the answer itself
    plain = rt.sleep(0.3)
    second = rt.then(plain, lambda: ("b", rt.now()))
    assert second is not plain
    rt.run(until=1.0)
    assert fused.value == "a" and second.value == ("b", pytest.approx(0.3))
    assert rt.then(plain, lambda: "c").value == "c"  # already processed: answered at once

    def events_for(make) -> int:
        fresh = SimRuntime()
        answer = fresh.then(make(fresh), lambda: "d")
        fresh.run(until=1.0)
        assert answer.value == "d"
        return fresh.env.events_processed

    assert events_for(lambda r: r.timer(0.1)) == events_for(lambda r: r.sleep(0.1)) - 1
