"""Serving metrics of a run, named as ``vllm bench serve`` names them.

Per request (from its RequestHandle event stream): TTFT = first Token − submit, E2EL =
terminal − submit, TPOT = (E2EL − TTFT)/(tokens − 1), ITL = gaps between Tokens. The
summary uses vLLM's keys (``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms``, ... for
ttft/tpot/itl/e2el; ``request_throughput``, ``output_throughput``,
``total_token_throughput``, ``completed``, ``duration``) so numbers can be put next to a
real benchmark's. Records are compact and computed once, at a request's end, so a long run
keeps one small record per request and one float per inter-token gap, not every event.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from openinfer.scheduler.request import EventKind, RequestEvent

STATUSES = ("finished", "rejected", "error", "aborted")
PERCENTILES = (99,)


@dataclass(slots=True)
class RequestRecord:
    req_id: int
    submitted_at: float
    prompt_len: int
    status: str = "finished"         # finished / rejected / error / aborted
    scheduled_at: float | None = None
    first_token_at: float | None = None
    ended_at: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    message: str | None = None       # why it was rejected or failed, as the engine said
    session: int | None = None
    turn: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.submitted_at

    @property
    def e2el(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.submitted_at

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or self.first_token_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.first_token_at) / (self.output_tokens - 1)


def request_record(req_id: int, submitted_at: float, prompt_len: int, events: Iterable[RequestEvent],
                   *, token_times: Sequence[float] | None = None, aborted_at: float | None = None,
                   itl_out: array | None = None) -> RequestRecord:
    """One request's record from its event stream (``aborted_at``: the client gave up then).

    ``token_times`` given: ``events`` are the stream's other events and the tokens are
    these times (a sink's compact ``stream()``); otherwise both come from ``events``.
    Inter-token gaps are appended to ``itl_out`` when given."""
    if token_times is None:
        events = list(events)
        token_times = array("d", [e.time for e in events if e.kind is EventKind.TOKEN])
    rec = RequestRecord(req_id, submitted_at, prompt_len)
    terminal: RequestEvent | None = None
    for ev in events:
        kind = ev.kind
        if kind is EventKind.SCHEDULED:
            rec.scheduled_at = ev.time
            rec.cached_tokens = ev.cached_tokens
        elif kind in (EventKind.FINISHED, EventKind.ERROR, EventKind.REJECTED):
            terminal = ev
    if token_times:
        rec.first_token_at = token_times[0]
        rec.output_tokens = len(token_times)
        if itl_out is not None and len(token_times) > 1:
            times = np.asarray(token_times, dtype=np.float64)
            # np.diff's own subtraction, without its Python-level argument handling (a few
            # microseconds a request, more than the subtraction of a few hundred times)
            itl_out.frombytes((times[1:] - times[:-1]).tobytes())
    if terminal is not None:
        # by identity: a dict keyed by the members hashes each through Enum.__hash__ (Python)
        kind = terminal.kind
        rec.status = "finished" if kind is EventKind.FINISHED else "error" if kind is EventKind.ERROR \
            else "rejected"
        rec.ended_at = terminal.time
        rec.finish_reason = terminal.reason._value_ if terminal.reason is not None else None
        rec.message = terminal.message
    else:
        rec.status = "aborted"
        rec.ended_at = aborted_at
    return rec


def itls(events: Iterable[RequestEvent]) -> list[float]:
    """Inter-token latencies of one stream (seconds)."""
    times = [e.time for e in events if e.kind is EventKind.TOKEN]
    return [b - a for a, b in zip(times, times[1:])]


def _stats(name: str, values_s: Sequence[float] | np.ndarray, percentiles: Sequence[int]) -> dict[str, float]:
    arr = np.asarray(values_s, dtype=float) * 1e3
    if arr.size == 0:
        out = {f"mean_{name}_ms": 0.0, f"median_{name}_ms": 0.0, f"std_{name}_ms": 0.0}
        out.update({f"p{p}_{name}_ms": 0.0 for p in percentiles})
        return out
    out = {f"mean_{name}_ms": float(arr.mean()), f"median_{name}_ms": float(np.median(arr)),
           f"std_{name}_ms": float(arr.std())}
    out.update({f"p{p}_{name}_ms": float(np.percentile(arr, p)) for p in percentiles})
    return out


@dataclass(frozen=True)
class CacheSummary:
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def cache_summary(records: Iterable[RequestRecord]) -> CacheSummary:
    """Prefix-cache hit rate: cached tokens over prompt tokens of scheduled requests."""
    prompt = cached = 0
    for r in records:
        if r.scheduled_at is not None:
            prompt += r.prompt_len
            cached += r.cached_tokens
    return CacheSummary(prompt, cached, cached / prompt if prompt else 0.0)


def summarize(records: Sequence[RequestRecord], itl_s: Sequence[float] | array, duration_s: float,
              percentiles: Sequence[int] = PERCENTILES, ndigits: int = 6) -> dict[str, float | int]:
    """The ``vllm bench serve`` result block over finished requests."""
    done = [r for r in records if r.status == "finished"]
    in_tok = sum(r.prompt_len for r in done)
    out_tok = sum(r.output_tokens for r in done)
    dur = duration_s if duration_s > 0 else 0.0
    out: dict[str, float | int] = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration": dur,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput": len(done) / dur if dur else 0.0,
        "output_throughput": out_tok / dur if dur else 0.0,
        "total_token_throughput": (in_tok + out_tok) / dur if dur else 0.0,
    }
    out.update(_stats("ttft", [r.ttft for r in done if r.ttft is not None], percentiles))
    out.update(_stats("tpot", [t for r in done if (t := r.tpot) is not None], percentiles))
    out.update(_stats("itl", np.frombuffer(itl_s, dtype=float) if isinstance(itl_s, array) else itl_s,
                      percentiles))
    out.update(_stats("e2el", [r.e2el for r in done if r.e2el is not None], percentiles))
    return {k: (round(v, ndigits) if isinstance(v, float) else v) for k, v in out.items()}


def status_counts(records: Iterable[RequestRecord]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for r in records:
        counts[r.status] += 1
    return counts


def first_messages(records: Iterable[RequestRecord]) -> dict[str, str]:
    """The engine's message for the first rejected and the first failed request: a run
    whose requests were all turned away says why without a trace of its events."""
    out: dict[str, str] = {}
    for r in records:
        if r.status in ("rejected", "error") and r.status not in out and r.message:
            out[r.status] = r.message
    return out
