"""The simulated GPU: the fake executor's seeded tokens, timed by a step model.

Tokens, EOS control (``stop_after``), step failures and LoRA adapters are exactly
:class:`~openinfer.backend.fake_executor.FakeExecutor`'s (this class only supplies its
``step_time``), so a simulated run and a scheduler unit test disagree about nothing but
how long a step takes. Busy time is accumulated here so a report can say how loaded the
device was.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from simpy.events import Event

from openinfer.backend.executor import RowResult, StepKind, StepPlan, StepResult
from openinfer.backend.fake_executor import _MASK64, FakeExecutor
from openinfer.runtime import Runtime
from sim.step_model import StepModel


class SimExecutor(FakeExecutor):
    """Executor protocol on virtual time; the step model decides each step's duration."""

    def __init__(self, rt: Runtime, model: StepModel, *, vocab_size: int = 151936, eos_token: int = 151645,
                 seed: int = 0, max_loras: int = 1) -> None:
        super().__init__(rt, vocab_size=vocab_size, eos_token=eos_token, step_time=self._timed,
                         seed=seed, max_loras=max_loras)
        self.model = model
        self.busy_s = 0.0
        self.busy_by_kind: dict[str, float] = {k.value: 0.0 for k in StepKind}
        self.steps_by_kind: dict[str, int] = {k.value: 0 for k in StepKind}

    def _timed(self, plan: StepPlan) -> float:
        dt = self.model.step_time(plan)
        kind = plan.kind.value
        self.busy_s += dt
        self.busy_by_kind[kind] += dt
        self.steps_by_kind[kind] += 1
        return dt

    def _execute(self, plan: StepPlan) -> Generator[Event, Any, StepResult]:
        """FakeExecutor's step, event for event (one sleep), with the decode rows' tokens
        computed inline: ``token(req_id, position)`` is splitmix64 of (seed, id, position)
        and this loop is the same arithmetic without two calls per row. A subclass that
        overrides ``token`` or ``_next`` gets the generic path."""
        if type(self).token is not FakeExecutor.token or type(self)._next is not FakeExecutor._next:
            return (yield from super()._execute(plan))
        rt = self.rt
        started = rt.now()
        self.steps += 1
        step = self.steps
        yield rt.sleep(self.step_time(plan))
        self.log.append((started, plan.kind, plan.prefill_tokens, len(plan.decode)))
        error = "injected step failure" if step in self.fail_steps else None
        if error is None and self.step_failure is not None:
            error = self.step_failure(plan)
        if error is not None:
            return StepResult({}, error=error, started_at=started, finished_at=rt.now())
        rows: dict[int, RowResult] = {}
        for p in plan.prefill:
            if p.is_final:
                rows[p.req_id] = RowResult(self._next(p.req_id, p.kv.num_prompt, 0), logprob=-1.0)
            else:
                rows[p.req_id] = RowResult(None)
        stop, eos, vocab, high = self.stop_after, self.eos_token, self.vocab_size, self.seed << 42
        for d in plan.decode:
            rid = d.req_id
            position = d.position + 1
            if stop and stop.get(rid) == position - d.kv.num_prompt:
                tok = eos
            else:
                x = ((high ^ (rid << 21) ^ position) + 0x9E3779B97F4A7C15) & _MASK64
                x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
                x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
                tok = (x ^ (x >> 31)) % vocab
                if tok == eos:
                    tok = (tok + 1) % vocab
            rows[rid] = RowResult(tok, -1.0)
        return StepResult(rows, started_at=started, finished_at=rt.now())

    def stats(self) -> dict[str, object]:
        return dict(steps=self.steps, busy_s=self.busy_s, busy_by_kind=dict(self.busy_by_kind),
                    steps_by_kind=dict(self.steps_by_kind))
