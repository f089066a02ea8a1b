"""Workloads: SimPy processes that send requests through a :class:`~sim.client.Client`.

* :class:`RandomWorkload` — ``vllm bench serve --dataset-name random``: input and output
  lengths uniform integers in [int(len·(1−r)), int(len·(1+r))], random token ids, an
  optional shared prefix of ``prefix_len`` tokens in front of every prompt.
* :class:`SyntheticWorkload` — any length distributions (fixed / uniform / lognormal).
* :class:`ChatWorkload` — multi-turn sessions behind one shared system prompt: turn k's
  prompt is turn k−1's prompt + its answer + new user text, sent a think time after the
  answer ended (closed loop per session; sessions arrive open loop).
* :class:`TraceWorkload` — replay of trace records (JSONL, Mooncake); prompts are built
  from hash ids so equal ids are equal text.

Arrivals use an :class:`~sim.arrivals.ArrivalSpec` (Poisson or gamma). Every draw comes
from a named ``rt.rng`` stream and every prompt from :func:`~sim.tokens.tokens_for`, so a
run replays from its seed and content never depends on event order.
"""

from __future__ import annotations

from array import array
from collections.abc import Generator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from simpy.events import Event

from openinfer.errors import require
from openinfer.kv.hashing import compact_tokens
from openinfer.runtime import Runtime
from sim.arrivals import ArrivalSpec
from sim.client import Client, RequestSpec
from sim.lengths import LengthDist
from sim.tokens import BlockTokens, tokens_for
from sim.traces import TraceRecord


class Workload(Protocol):
    def run(self, rt: Runtime, client: Client) -> Generator[Event, Any, None]:
        """Send every request, then ``client.close()``."""
        ...

    def describe(self) -> dict[str, Any]: ...


def _send_open_loop(rt: Runtime, client: Client, n: int, arrival: ArrivalSpec,
                    make: Any) -> Generator[Event, Any, None]:
    """Request i at the i-th arrival (the first at t=0, as vLLM sends it)."""
    rng = rt.rng("workload/arrival")
    for i in range(n):
        if i:
            gap = arrival.gap(rng)
            if gap > 0:
                yield rt.sleep(gap)
        client.send(make(i))
    client.close()


def _check_count(name: str, n: int) -> None:
    require(isinstance(n, int) and not isinstance(n, bool) and n >= 1, name, n, "an int >= 1")


@dataclass(frozen=True)
class RandomWorkload:
    num_requests: int = 100
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    prefix_len: int = 0
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)

    def __post_init__(self) -> None:
        _check_count("workload.num_requests", self.num_requests)
        _check_count("workload.input_len", self.input_len)
        _check_count("workload.output_len", self.output_len)
        require(isinstance(self.range_ratio, (int, float)) and 0.0 <= self.range_ratio < 1.0,
                "workload.range_ratio", self.range_ratio, "a number in [0, 1)")
        require(isinstance(self.prefix_len, int) and self.prefix_len >= 0, "workload.prefix_len",
                self.prefix_len, "an int >= 0")

    def bounds(self, length: int) -> tuple[int, int]:
        r = self.range_ratio
        return max(1, int(length * (1 - r))), max(1, int(length * (1 + r)))

    def smallest_request(self) -> tuple[int, int]:
        """(prompt tokens, max_tokens) no request of this workload goes below."""
        return self.prefix_len + self.bounds(self.input_len)[0], self.bounds(self.output_len)[0]

    def run(self, rt: Runtime, client: Client) -> Generator[Event, Any, None]:
        rng = rt.rng("workload/lengths")
        in_lo, in_hi = self.bounds(self.input_len)
        out_lo, out_hi = self.bounds(self.output_len)
        prefix = tokens_for(f"{rt.seed}/random/prefix", self.prefix_len)

        def make(i: int) -> RequestSpec:
            n = rng.randint(in_lo, in_hi)
            m = rng.randint(out_lo, out_hi)
            return RequestSpec(prefix + tokens_for(f"{rt.seed}/random/{i}", n), m)
        yield from _send_open_loop(rt, client, self.num_requests, self.arrival, make)

    def describe(self) -> dict[str, Any]:
        return dict(kind="random", **asdict(self))


@dataclass(frozen=True)
class SyntheticWorkload:
    num_requests: int = 100
    input: LengthDist = field(default_factory=lambda: LengthDist.fixed(1024))
    output: LengthDist = field(default_factory=lambda: LengthDist.fixed(128))
    shared_prefix_len: int = 0
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)

    def __post_init__(self) -> None:
        _check_count("workload.num_requests", self.num_requests)
        require(isinstance(self.shared_prefix_len, int) and self.shared_prefix_len >= 0,
                "workload.shared_prefix_len", self.shared_prefix_len, "an int >= 0")

    def run(self, rt: Runtime, client: Client) -> Generator[Event, Any, None]:
        rng = rt.rng("workload/lengths")
        prefix = tokens_for(f"{rt.seed}/synthetic/prefix", self.shared_prefix_len)

        def make(i: int) -> RequestSpec:
            n = max(1, self.input.sample(rng))
            m = max(1, self.output.sample(rng))
            return RequestSpec(prefix + tokens_for(f"{rt.seed}/synthetic/{i}", n), m)
        yield from _send_open_loop(rt, client, self.num_requests, self.arrival, make)

    def describe(self) -> dict[str, Any]:
        return dict(kind="synthetic", **asdict(self))


@dataclass(frozen=True)
class ChatWorkload:
    """Sessions arrive by ``arrival`` (a session rate); each runs ``turns`` turns."""

    num_sessions: int = 10
    turns: LengthDist = field(default_factory=lambda: LengthDist.fixed(4))
    system_prompt_len: int = 512
    user_len: LengthDist = field(default_factory=lambda: LengthDist.lognormal(150, 0.5, max=4096))
    output_len: LengthDist = field(default_factory=lambda: LengthDist.lognormal(200, 0.5, max=2048))
    think_time_s: float = 5.0          # mean of an exponential pause after each answer
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    max_context_tokens: int = 40960    # a turn that would not fit ends its session
    max_requests: int | None = None    # stop starting turns once this many were sent

    def __post_init__(self) -> None:
        _check_count("workload.num_sessions", self.num_sessions)
        require(isinstance(self.system_prompt_len, int) and self.system_prompt_len >= 0,
                "workload.system_prompt_len", self.system_prompt_len, "an int >= 0")
        require(isinstance(self.think_time_s, (int, float)) and self.think_time_s >= 0,
                "workload.think_time_s", self.think_time_s, "a number >= 0 (seconds)")
        require(isinstance(self.max_context_tokens, int) and self.max_context_tokens >= 2,
                "workload.max_context_tokens", self.max_context_tokens, "an int >= 2")
        require(self.max_requests is None or (isinstance(self.max_requests, int) and self.max_requests >= 1),
                "workload.max_requests", self.max_requests, "null or an int >= 1")

    def smallest_request(self) -> tuple[int, int]:
        """(prompt tokens, max_tokens) no turn goes below: a first turn's."""
        return self.system_prompt_len + max(1, self.user_len.least), max(1, self.output_len.least)

    def run(self, rt: Runtime, client: Client, send_at: Mapping[tuple[int, int], float] | None = None
            ) -> Generator[Event, Any, None]:
        """``send_at``: (session, turn) -> seconds after the run began at which that turn is
        sent (or when the session's previous turn ends, if that is later), in place of the
        arrival gaps and think times (:class:`PinnedChat`); every session it names starts at
        once and waits for its own first send time, and a turn it does not name ends its
        session. The think times are drawn all the same, so every prompt and length is the
        one the unpinned run draws."""
        start = rt.now()
        system = tokens_for(f"{rt.seed}/chat/system", self.system_prompt_len)
        budget = [self.max_requests if self.max_requests is not None else -1]
        sessions = []
        if send_at is None:
            arr_rng = rt.rng("workload/arrival")
            for s in range(self.num_sessions):
                if s:
                    gap = self.arrival.gap(arr_rng)
                    if gap > 0:
                        yield rt.sleep(gap)
                if budget[0] == 0:
                    break
                sessions.append(rt.spawn(self._session(rt, client, s, system, budget, start, None)))
        else:
            sessions = [rt.spawn(self._session(rt, client, s, system, budget, start, send_at))
                        for s in range(self.num_sessions) if (s, 0) in send_at]
        if sessions:
            yield rt.all_of(sessions)
        client.close()

    def _session(self, rt: Runtime, client: Client, s: int, system: array, budget: list[int],
                 start: float, send_at: Mapping[tuple[int, int], float] | None
                 ) -> Generator[Event, Any, None]:
        rng = rt.rng(f"workload/chat/{s}")
        turns = max(1, self.turns.sample(rng))
        history = system
        for k in range(turns):
            if budget[0] == 0:
                return
            user = tokens_for(f"{rt.seed}/chat/{s}/{k}", max(1, self.user_len.sample(rng)))
            out_len = max(1, self.output_len.sample(rng))
            prompt = history + user
            if len(prompt) + out_len > self.max_context_tokens:
                return
            if send_at is not None:
                if (s, k) not in send_at:
                    return  # the recorded run never sent it
                wait = start + send_at[(s, k)] - rt.now()
                if wait > 0:
                    yield rt.sleep(wait)
                    if budget[0] == 0:  # other sessions sent the last ones meanwhile
                        return
            if budget[0] > 0:
                budget[0] -= 1
            ticket = client.send(RequestSpec(prompt, out_len, session=s, turn=k), keep_tokens=True)
            outcome = yield ticket.done
            if outcome.record.status != "finished" or outcome.tokens is None:
                return
            history = prompt + compact_tokens(outcome.tokens)
            if k + 1 < turns and self.think_time_s > 0:
                think = rng.expovariate(1.0 / self.think_time_s)
                if send_at is None:
                    yield rt.sleep(think)

    def mean_turns(self) -> float:
        return max(1.0, self.turns.expected)

    def describe(self) -> dict[str, Any]:
        return dict(kind="chat", **asdict(self))


@dataclass(frozen=True)
class PinnedChat:
    """A chat workload replayed on a recorded run's clock: each turn is sent when the
    recorded run sent it (``send_at``: (session, turn) -> seconds after its start), or when
    the session's previous turn ends here if that is later (its prompt needs the answer).

    The closed loop otherwise lets a small latency error move every later arrival: a
    session whose answer comes 3% late sends its next turn into a burst it missed in the
    recorded run. Pinned, a simulated request meets the load the recorded one met, which
    tells a per-request latency error from that drift (``experiments.fidelity arrivals=real``)."""

    chat: ChatWorkload
    send_at: Mapping[tuple[int, int], float]

    def run(self, rt: Runtime, client: Client) -> Generator[Event, Any, None]:
        return self.chat.run(rt, client, send_at=self.send_at)

    def mean_turns(self) -> float:
        return self.chat.mean_turns()

    def describe(self) -> dict[str, Any]:
        """The chat workload it pins and how many turns; not a ``workload_from_dict`` input:
        the send times belong to a recorded run, which is where to rebuild them from."""
        return dict(kind="pinned_chat", chat=self.chat.describe(), pinned_turns=len(self.send_at))


@dataclass(frozen=True)
class TraceWorkload:
    """Replay records at their arrival times divided by ``speedup``."""

    records: Sequence[TraceRecord]
    speedup: float = 1.0
    limit: int | None = None
    source: str = "trace"
    salt: str = "mooncake"

    def __post_init__(self) -> None:
        require(isinstance(self.speedup, (int, float)) and self.speedup > 0, "workload.speedup", self.speedup,
                "a number > 0")
        require(self.limit is None or (isinstance(self.limit, int) and self.limit >= 1), "workload.limit",
                self.limit, "null or an int >= 1")
        require(len(self.records) >= 1, "workload.records", len(self.records), "at least one trace record")

    def run(self, rt: Runtime, client: Client) -> Generator[Event, Any, None]:
        blocks: dict[int, BlockTokens] = {}
        records = self.records if self.limit is None else self.records[:self.limit]
        for i, r in enumerate(records):
            t = r.arrival_s / self.speedup
            if t > rt.now():
                yield rt.sleep(t - rt.now())
            if r.prompt is not None:
                prompt = list(r.prompt)  # as given: the engine judges each id (a bool, > int64)
            else:
                bt = blocks.get(r.block_tokens)
                if bt is None:
                    bt = blocks[r.block_tokens] = BlockTokens(r.block_tokens, self.salt)
                prompt = bt.prompt(list(r.hash_ids or ()), r.input_len, f"{self.salt}/tail/{i}")
            client.send(RequestSpec(prompt, r.output_len))
        client.close()

    def describe(self) -> dict[str, Any]:
        n = len(self.records) if self.limit is None else min(self.limit, len(self.records))
        return dict(kind="trace", source=self.source, requests=n, speedup=self.speedup, salt=self.salt)
