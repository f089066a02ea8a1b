"""Per-request metrics from an event stream, and the vllm-bench-named summary."""

from __future__ import annotations

from array import array

import pytest

from openinfer.scheduler.request import EventKind, FinishReason, RequestEvent
from sim.metrics import cache_summary, itls, request_record, summarize


def _stream(times: list[float], t_sched: float = 0.1, cached: int = 32, end: float | None = None) -> list[RequestEvent]:
    ev = [RequestEvent(EventKind.SCHEDULED, 1, t_sched, cached_tokens=cached)]
    ev += [RequestEvent(EventKind.TOKEN, 1, t, token=5) for t in times]
    ev.append(RequestEvent(EventKind.FINISHED, 1, end if end is not None else times[-1], reason=FinishReason.LENGTH))
    return ev


def test_ttft_tpot_itl_e2el_of_one_request() -> None:
    out = array("d")
    rec = request_record(1, 1.0, 100, _stream([1.2, 1.25, 1.35, 1.4]), itl_out=out)
    assert rec.ttft == pytest.approx(0.2)
    assert rec.e2el == pytest.approx(0.4)
    assert rec.tpot == pytest.approx(0.2 / 3)
    assert list(out) == pytest.approx([0.05, 0.1, 0.05])
    assert itls(_stream([1.2, 1.25, 1.35, 1.4])) == pytest.approx([0.05, 0.1, 0.05])
    assert rec.output_tokens == 4 and rec.cached_tokens == 32 and rec.finish_reason == "length"


def test_aborted_and_rejected_streams() -> None:
    aborted = request_record(2, 0.0, 10, [RequestEvent(EventKind.TOKEN, 2, 0.5, token=1)], aborted_at=0.7)
    assert aborted.status == "aborted" and aborted.ended_at == 0.7 and aborted.tpot is None
    rejected = request_record(3, 0.0, 10, [RequestEvent(EventKind.REJECTED, 3, 0.0, message="x")])
    assert rejected.status == "rejected" and rejected.ttft is None


def test_summary_uses_vllm_bench_serve_names() -> None:
    out = array("d")
    recs = [request_record(i, 0.0, 100, _stream([0.1 * i, 0.1 * i + 0.01, 0.1 * i + 0.03], cached=16 * i),
                           itl_out=out) for i in range(1, 5)]
    s = summarize(recs, out, duration_s=2.0)
    for key in ("completed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
                "total_input_tokens", "total_output_tokens"):
        assert key in s
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p99", "std"):
            assert f"{stat}_{m}_ms" in s
    assert s["completed"] == 4 and s["request_throughput"] == 2.0 and s["output_throughput"] == 6.0
    assert s["total_token_throughput"] == (400 + 12) / 2
    assert s["mean_ttft_ms"] == pytest.approx(250.0) and s["median_itl_ms"] == pytest.approx(15.0)
    c = cache_summary(recs)
    assert c.prompt_tokens == 400 and c.cached_tokens == 16 * 10 and c.hit_rate == pytest.approx(0.4)


def test_empty_summary_is_zeros() -> None:
    s = summarize([], array("d"), 0.0)
    assert s["completed"] == 0 and s["mean_ttft_ms"] == 0.0 and s["request_throughput"] == 0.0
