"""The decode cohort (scheduler/cohort.py) against the per-row decode path: the same world
run both ways gives the same report, token for token and event for event."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings, strategies as st

from openinfer.backend.executor import DecodeBatch
from openinfer.backend.fake_executor import FakeExecutor
from sim.arrivals import ArrivalSpec
from sim.lengths import LengthDist
from sim.workloads import ChatWorkload
from sim.world import WorldConfig, build_world, make_client, run_world


def _run(cfg: WorldConfig, wl_seed: int, n: int, cohort: bool) -> tuple[str, list]:
    w = build_world(cfg)
    if not cohort:
        w.engine.cohort = None  # before the loop's first pass: the per-row path throughout
    else:
        assert w.engine.cohort is not None
    streams: list = []
    client = make_client(w)
    real_submit = client._submit

    def submit(req, on_event):
        h = real_submit(req, on_event)
        streams.append(h)
        return h
    client._submit = submit
    wl = ChatWorkload(num_sessions=max(1, n // 3), turns=LengthDist.fixed(3), system_prompt_len=64 + wl_seed % 200,
                      user_len=LengthDist.lognormal(40, 0.5), output_len=LengthDist.lognormal(25, 0.8),
                      think_time_s=0.3, arrival=ArrivalSpec(rate=20.0), max_requests=n)
    rep = run_world(w, wl, client)
    rep["sim"].pop("events_processed")
    events = [[(e.kind.value, e.time, e.token, e.completion_tokens) for e in h.events] for h in streams]
    return json.dumps(rep, sort_keys=True), events


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 30), blocks=st.sampled_from([80, 160, 600]),
       abort=st.sampled_from([0.0, 0.3]), mode=st.sampled_from(["max_tokens", "eos"]),
       order=st.sampled_from(["fifo", "random"]), bs=st.sampled_from([4, 16]))
def test_cohort_and_per_row_paths_agree(seed, n, blocks, abort, mode, order, bs):
    cfg = WorldConfig(seed=seed, num_blocks=blocks, block_size=bs, host_tier_gib=0.05, abort_probability=abort,
                      abort_after_s=0.2, output_mode=mode, max_tokens_cap=80, order=order)
    a = _run(cfg, seed, n, cohort=True)
    b = _run(cfg, seed, n, cohort=False)
    assert a[0] == b[0]
    assert a[1] == b[1]


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(-2**40, 2**40), vocab=st.integers(2, 200_000), eos=st.integers(0, 200_000),
       rows=st.lists(st.tuples(st.integers(1, 2**40), st.integers(0, 2**30), st.integers(0, 2**20)),
                     min_size=1, max_size=40),
       stops=st.lists(st.booleans(), min_size=40, max_size=40))
def test_vectorised_tokens_match_the_per_row_formula(seed, vocab, eos, rows, stops):
    ex = FakeExecutor(rt=None, vocab_size=vocab, eos_token=eos, seed=seed)
    rids = np.array([r for r, _, _ in rows], dtype=np.int64)
    pos = np.array([p + n for _, p, n in rows], dtype=np.int64)
    nprompt = np.array([n for _, _, n in rows], dtype=np.int64)
    ex.stop_after = {int(r): int(p + 1 - n) for (r, _, _), p, n, s in zip(rows, pos, nprompt, stops) if s}
    got = ex.decode_tokens(DecodeBatch(rids, pos, nprompt, lambda: [])).tolist()
    want = [ex._next(int(r), int(p) + 1, int(p) + 1 - int(n)) for r, p, n in zip(rids, pos, nprompt)]
    assert got == want
