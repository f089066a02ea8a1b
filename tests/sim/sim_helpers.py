"""Small builders shared by the simulator tests: plans without an engine, and a stub
server that answers every request at once (for workload-shape tests)."""

from __future__ import annotations

from collections.abc import Callable

from openinfer.backend.executor import DecodeRow, PrefillRow, StepKind, StepPlan
from openinfer.runtime import Runtime
from openinfer.scheduler.request import (EventKind, FinishReason, GenerateRequest, RequestEvent, RequestHandle,
                                         TokenSink)

class _Kv:
    """Stands in for RequestKv where only ``num_prompt`` is read."""

    def __init__(self, num_prompt: int) -> None:
        self.num_prompt = num_prompt


def decode_plan(batch: int, context: int, kind: StepKind = StepKind.DECODE) -> StepPlan:
    """``batch`` decode rows whose dangling token sits at position ``context``."""
    rows = [DecodeRow(i, _Kv(context), 1, context) for i in range(batch)]  # type: ignore[arg-type]
    return StepPlan(kind, decode=rows)


def prefill_plan(tokens: int, start: int = 0, final: bool = True) -> StepPlan:
    row = PrefillRow(0, _Kv(start + tokens), start, [1] * tokens, is_final=final)  # type: ignore[arg-type]
    return StepPlan(StepKind.PREFILL, prefill=[row])


def unified_plan(tokens: int, batch: int, context: int) -> StepPlan:
    p = prefill_plan(tokens)
    d = decode_plan(batch, context)
    return StepPlan(StepKind.UNIFIED, prefill=p.prefill, decode=d.decode)


def instant_server(rt: Runtime, tokens_per_request: int = 3
                   ) -> tuple[Callable[[GenerateRequest, object], RequestHandle], list[GenerateRequest]]:
    """A submit callable that finishes every request at once with a few tokens."""
    seen: list[GenerateRequest] = []

    def submit(req: GenerateRequest, on_event: object = None) -> RequestHandle:
        rid = len(seen) + 1
        seen.append(req)
        sink = TokenSink(rid, rt)
        now = rt.now()
        sink.send(RequestEvent(EventKind.SCHEDULED, rid, now))
        for i in range(min(tokens_per_request, req.max_tokens)):
            sink.send(RequestEvent(EventKind.TOKEN, rid, now, token=7 + i))
        sink.send(RequestEvent(EventKind.FINISHED, rid, now, reason=FinishReason.LENGTH))
        return RequestHandle(rid, sink, req, submitted_at=now)
    return submit, seen

