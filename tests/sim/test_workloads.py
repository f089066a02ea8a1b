"""Workloads honour their distributions (fixed seed), chat sessions build on their past,
and traces (Mooncake included) parse into equal text for equal hash ids."""

from __future__ import annotations

import json
import statistics
from typing import Any

import pytest

from sim_helpers import instant_server
from openinfer.errors import ConfigError
from openinfer.runtime import SimRuntime
from openinfer.scheduler.request import RequestHandle, TokenSink
from sim.arrivals import ArrivalSpec
from sim.client import AbortSpec, Client
from sim.lengths import LengthDist
from sim.tokens import BlockTokens, tokens_for
from sim.traces import load_trace, parse_lines, synthetic_mooncake_lines
from sim.workloads import ChatWorkload, PinnedChat, RandomWorkload, SyntheticWorkload, TraceWorkload


def _gaps(spec: ArrivalSpec, n: int = 20_000) -> list[float]:
    rng = SimRuntime(3).rng("t")
    return [spec.gap(rng) for _ in range(n)]


def test_poisson_and_gamma_arrivals_have_the_asked_rate_and_cv() -> None:
    g = _gaps(ArrivalSpec(rate=8.0))
    assert statistics.mean(g) == pytest.approx(1 / 8, rel=0.03)
    assert statistics.pstdev(g) / statistics.mean(g) == pytest.approx(1.0, rel=0.05)
    for cv in (0.5, 2.0):
        g = _gaps(ArrivalSpec(rate=8.0, process="gamma", cv=cv))
        assert statistics.mean(g) == pytest.approx(1 / 8, rel=0.05)
        assert statistics.pstdev(g) / statistics.mean(g) == pytest.approx(cv, rel=0.08)
    assert ArrivalSpec(rate=float("inf")).gap(SimRuntime(0).rng("x")) == 0.0


def test_length_distributions_have_their_means() -> None:
    rng = SimRuntime(5).rng("len")
    for dist, mean in [(LengthDist.fixed(77), 77), (LengthDist.uniform(100, 300), 200),
                       (LengthDist.lognormal(1000, 0.6), 1000), (LengthDist("exponential", mean=50), 50)]:
        xs = [dist.sample(rng) for _ in range(20_000)]
        assert statistics.mean(xs) == pytest.approx(mean, rel=0.03), dist.kind
    capped = LengthDist.lognormal(1000, 1.0, max=1200)
    assert max(capped.sample(rng) for _ in range(2000)) == 1200


@pytest.mark.parametrize("bad,field", [(dict(kind="zipf"), "length.kind"), (dict(kind="uniform", low=5, high=2),
                                       "length.high"), (dict(mean=-1), "length.mean")])
def test_length_errors_name_the_field(bad: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        LengthDist(**bad)


def _drive(workload: Any, seed: int = 0, **client_kw: Any) -> tuple[list, Client, SimRuntime]:
    rt = SimRuntime(seed)
    submit, seen = instant_server(rt)
    client = Client(rt, submit, **client_kw)
    rt.spawn(workload.run(rt, client))
    rt.run(until=client.all_done)
    return seen, client, rt


def test_random_dataset_follows_vllm_range_ratio() -> None:
    w = RandomWorkload(num_requests=3000, input_len=1000, output_len=200, range_ratio=0.5, prefix_len=32,
                       arrival=ArrivalSpec(rate=100.0))
    seen, client, rt = _drive(w)
    ins = [len(r.prompt) - 32 for r in seen]
    outs = [r.max_tokens for r in seen]
    assert min(ins) >= 500 and max(ins) <= 1500 and min(outs) >= 100 and max(outs) <= 300
    assert statistics.mean(ins) == pytest.approx(1000, rel=0.03)
    assert statistics.mean(outs) == pytest.approx(200, rel=0.03)
    assert all(r.prompt[:32] == seen[0].prompt[:32] for r in seen)  # the shared prefix
    assert all(r.params.ignore_eos for r in seen)                    # output length via max_tokens
    assert rt.now() == pytest.approx(3000 / 100, rel=0.05)           # Poisson at 100/s
    assert client.sent == 3000 and len(client.records) == 3000


def test_random_dataset_validation_names_the_field() -> None:
    with pytest.raises(ConfigError, match="workload.range_ratio"):
        RandomWorkload(range_ratio=1.0)
    with pytest.raises(ConfigError, match="arrival.rate"):
        ArrivalSpec(rate=0)


def test_synthetic_lognormal_lengths() -> None:
    w = SyntheticWorkload(num_requests=2000, input=LengthDist.lognormal(400, 0.5), output=LengthDist.uniform(10, 30),
                          arrival=ArrivalSpec(rate=1000.0, process="gamma", cv=2.0))
    seen, _, _ = _drive(w)
    assert statistics.mean(len(r.prompt) for r in seen) == pytest.approx(400, rel=0.05)
    assert statistics.mean(r.max_tokens for r in seen) == pytest.approx(20, rel=0.03)


def test_chat_turns_extend_the_previous_prompt_and_answer() -> None:
    w = ChatWorkload(num_sessions=6, turns=LengthDist.fixed(3), system_prompt_len=64,
                     user_len=LengthDist.fixed(10), output_len=LengthDist.fixed(3), think_time_s=2.0,
                     arrival=ArrivalSpec(rate=10.0))
    seen, client, rt = _drive(w)
    assert len(seen) == 18
    system = tokens_for("0/chat/system", 64)
    assert all(r.prompt[:64] == system for r in seen)
    by_session: dict[int, list] = {}
    for rec, req in zip(sorted(client.records, key=lambda r: r.req_id), seen):
        by_session.setdefault(rec.session, []).append((rec.turn, req))
    answer = [7, 8, 9]  # what instant_server answers
    for turns in by_session.values():
        turns.sort(key=lambda x: x[0])
        for (_, prev), (_, nxt) in zip(turns, turns[1:]):
            assert nxt.prompt[:len(prev.prompt)] == prev.prompt
            assert list(nxt.prompt[len(prev.prompt):len(prev.prompt) + 3]) == answer
            assert len(nxt.prompt) == len(prev.prompt) + 3 + 10
    assert rt.now() > 2.0  # think time between turns


def _slow_server(rt: SimRuntime, delay_s: float) -> tuple[Any, list[tuple[float, Any]]]:
    """A submit callable that answers three tokens ``delay_s`` after each request."""
    from openinfer.scheduler.request import EventKind, FinishReason, RequestEvent
    sent: list[tuple[float, Any]] = []

    def submit(req: Any, on_event: object = None) -> RequestHandle:
        rid = len(sent) + 1
        sent.append((rt.now(), req))
        sink = TokenSink(rid, rt)

        def answer() -> Any:
            yield rt.sleep(delay_s)
            now = rt.now()
            sink.send(RequestEvent(EventKind.SCHEDULED, rid, now))
            for i in range(min(3, req.max_tokens)):
                sink.send(RequestEvent(EventKind.TOKEN, rid, now, token=7 + i))
            sink.send(RequestEvent(EventKind.FINISHED, rid, now, reason=FinishReason.LENGTH))
        rt.spawn(answer())
        return RequestHandle(rid, sink, req, submitted_at=rt.now())
    return submit, sent


def _chat_run(workload: Any, delay_s: float) -> tuple[list[tuple[float, Any]], Client]:
    rt = SimRuntime(0)
    submit, sent = _slow_server(rt, delay_s)
    client = Client(rt, submit)
    rt.spawn(workload.run(rt, client))
    rt.run(until=client.all_done)
    return sent, client


def test_pinned_chat_sends_each_turn_at_its_recorded_time_or_when_its_answer_came() -> None:
    chat = ChatWorkload(num_sessions=4, turns=LengthDist.fixed(3), system_prompt_len=16,
                        user_len=LengthDist.uniform(4, 12), output_len=LengthDist.uniform(2, 6), think_time_s=0.5,
                        arrival=ArrivalSpec(rate=4.0))
    free_sent, free = _chat_run(chat, delay_s=0.1)
    recorded = {(r.session, r.turn): r.submitted_at for r in free.records}
    # on its own clock the pinned run sends exactly what the closed loop sent, when it sent it
    pinned_sent, _ = _chat_run(PinnedChat(chat, recorded), delay_s=0.1)
    assert [(t, r.prompt, r.max_tokens) for t, r in pinned_sent] == \
        [(pytest.approx(t), r.prompt, r.max_tokens) for t, r in free_sent]
    # answers 0.4 s slower: a turn goes at its recorded time unless its answer came later
    slow_sent, slow = _chat_run(PinnedChat(chat, recorded), delay_s=0.5)
    ends = {(r.session, r.turn): r.submitted_at + 0.5 for r in slow.records}
    for r in slow.records:
        due = recorded[(r.session, r.turn)]
        want = due if r.turn == 0 else max(due, ends[(r.session, r.turn - 1)])
        assert r.submitted_at == pytest.approx(want)
    assert sorted(r.prompt for _, r in slow_sent) == sorted(r.prompt for _, r in free_sent)  # same text
    # what the recorded run never sent is not sent: session 3, and session 1's last turn
    partial = {k: v for k, v in recorded.items() if k[0] != 3 and k != (1, 2)}
    _, cut = _chat_run(PinnedChat(chat, partial), delay_s=0.1)
    assert {(r.session, r.turn) for r in cut.records} == set(partial)
    assert PinnedChat(chat, partial).describe() == dict(kind="pinned_chat", chat=chat.describe(),
                                                        pinned_turns=len(partial))
    # sessions need not be listed in time order: each waits for its own first turn
    late_first = {**recorded, (0, 0): 5.0}
    _, shuffled = _chat_run(PinnedChat(chat, late_first), delay_s=0.1)
    firsts = {r.session: r.submitted_at for r in shuffled.records if r.turn == 0}
    assert firsts[0] == pytest.approx(5.0)
    assert all(firsts[s] == pytest.approx(recorded[(s, 0)]) for s in (1, 2, 3))
    # the request cap holds however long a pinned turn waited
    capped = ChatWorkload(**{**{f: getattr(chat, f) for f in chat.__dataclass_fields__}, "max_requests": 5})
    sent, _ = _chat_run(PinnedChat(capped, recorded), delay_s=0.1)
    assert len(sent) == 5


def test_chat_max_requests_caps_the_run() -> None:
    w = ChatWorkload(num_sessions=50, turns=LengthDist.fixed(4), system_prompt_len=8,
                     user_len=LengthDist.fixed(4), output_len=LengthDist.fixed(2), think_time_s=0.1,
                     arrival=ArrivalSpec(rate=100.0), max_requests=37)
    seen, client, _ = _drive(w)
    assert len(seen) == 37 == client.sent


def test_eos_mode_puts_the_length_in_stop_after() -> None:
    stop: dict[int, int] = {}
    w = RandomWorkload(num_requests=5, input_len=20, output_len=9, arrival=ArrivalSpec(rate=10.0))
    rt = SimRuntime(0)
    submit, seen = instant_server(rt)
    client = Client(rt, submit, output_mode="eos", stop_after=stop, max_tokens_cap=64)
    sent: list[dict[int, int]] = []
    orig = client._ended
    client._ended = lambda t, a: (sent.append(dict(stop)), orig(t, a))  # type: ignore[method-assign]
    rt.spawn(w.run(rt, client))
    rt.run(until=client.all_done)
    assert all(r.max_tokens == 64 and not r.params.ignore_eos for r in seen)
    assert sent[0] == {1: 9} and stop == {}  # set on submit, dropped at the end


def test_aborts_follow_their_probability() -> None:
    rt = SimRuntime(11)

    def submit(req: Any, on_event: Any = None) -> RequestHandle:
        submit.n += 1  # type: ignore[attr-defined]
        # a server that never answers: every request ends only by abort
        return RequestHandle(submit.n, TokenSink(submit.n, rt), req, submitted_at=rt.now())  # type: ignore[attr-defined]
    submit.n = 0  # type: ignore[attr-defined]
    client = Client(rt, submit, abort=AbortSpec(probability=0.3, after_s=0.5, delay="fixed"))
    w = RandomWorkload(num_requests=2000, input_len=4, output_len=4, arrival=ArrivalSpec(rate=1000.0))
    rt.spawn(w.run(rt, client))
    rt.run(until=5.0)
    aborted = [r for r in client.records if r.status == "aborted"]
    assert len(aborted) / 2000 == pytest.approx(0.3, abs=0.03)
    assert all(r.ended_at - r.submitted_at == pytest.approx(0.5) for r in aborted)
    with pytest.raises(ConfigError, match="abort.probability"):
        AbortSpec(probability=2)


MOONCAKE = [
    '{"timestamp": 2000, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}',
    '{"timestamp": 500, "input_length": 1100, "output_length": 0, "hash_ids": [0, 1, 2]}',
    '{"timestamp": 1000, "input_length": 300, "output_length": 12, "hash_ids": [9]}',
]


def test_mooncake_parsing(tmp_path) -> None:
    recs = parse_lines(MOONCAKE)
    assert [r.arrival_s for r in recs] == [0.0, 0.5, 1.5]  # ms -> s, sorted, shifted to 0
    assert [r.input_len for r in recs] == [1100, 300, 700]
    assert recs[0].output_len == 1 and recs[0].hash_ids == (0, 1, 2)
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(MOONCAKE) + "\n")
    assert load_trace(path) == recs


def test_mooncake_equal_hash_ids_give_equal_tokens() -> None:
    bt = BlockTokens()
    a = bt.prompt([0, 1, 2], 1100, "a")
    b = bt.prompt([0, 1], 700, "b")
    c = BlockTokens().prompt([9], 300, "c")
    assert len(a) == 1100 and len(b) == 700 and len(c) == 300
    assert a[:700] == b                       # shared ids 0, 1: shared text, cut at the length
    assert list(a[:512]) != list(c[:300]) + [0] * 212 and c != a[:300]
    assert BlockTokens().prompt([0], 600, "x")[512:] == tokens_for("x", 88)  # past the last block: unique tail


def test_trace_replay_sends_at_trace_times() -> None:
    recs = parse_lines(MOONCAKE)
    seen, client, rt = _drive(TraceWorkload(recs, speedup=2.0))
    assert [len(r.prompt) for r in seen] == [1100, 300, 700]
    assert [r.submitted_at for r in sorted(client.records, key=lambda r: r.req_id)] == [0.0, 0.25, 0.75]
    assert seen[2].prompt == seen[0].prompt[:700]


@pytest.mark.parametrize("line,field", [
    ('{"timestamp": -1, "input_length": 3, "output_length": 1}', "trace:1.timestamp"),
    ('{"timestamp": 1, "input_length": 0, "output_length": 1}', "trace:1.input_length"),
    ('{"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": "x"}', "trace:1.hash_ids"),
    ('{"arrival_s": 0.1, "input_len": 4}', "trace:1.output_len"),
    ('not json', "trace:1"),
])
def test_trace_errors_name_line_and_field(line: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_lines([line])


def test_generic_jsonl_and_synthetic_mooncake_format() -> None:
    recs = parse_lines([json.dumps({"arrival_s": 0.5, "prompt": [1, 2, 3], "output_len": 4}),
                        json.dumps({"arrival_s": 0.0, "input_len": 40, "output_len": 2, "hash_ids": [1, 2],
                                    "block_tokens": 32})])
    assert recs[0].input_len == 40 and recs[0].block_tokens == 32 and recs[1].prompt == (1, 2, 3)
    lines = synthetic_mooncake_lines(50, 1)
    assert all({"timestamp", "input_length", "output_length", "hash_ids"} <= set(json.loads(x)) for x in lines)
    assert len(parse_lines(lines)) == 50


def test_smallest_request_is_a_lower_bound_of_every_request_sent() -> None:
    """What start-up checks the pool and context limits against: no request goes below it."""
    random_wl = RandomWorkload(num_requests=200, input_len=50, output_len=9, range_ratio=0.5, prefix_len=7,
                               arrival=ArrivalSpec(rate=1000.0))
    chat = ChatWorkload(num_sessions=30, turns=LengthDist.fixed(3), system_prompt_len=20,
                        user_len=LengthDist.lognormal(10, 1.0), output_len=LengthDist.uniform(3, 9),
                        think_time_s=0.0, arrival=ArrivalSpec(rate=1000.0))
    assert random_wl.smallest_request() == (7 + 25, 4)
    assert chat.smallest_request() == (21, 3)
    for wl in (random_wl, chat):
        least_prompt, least_out = wl.smallest_request()
        sent, _, _ = _drive(wl)
        assert sent and all(len(r.prompt) >= least_prompt and r.max_tokens >= least_out for r in sent)
    assert LengthDist.fixed(12).least == 12 and LengthDist.lognormal(100, 0.5, min=5).least == 5
