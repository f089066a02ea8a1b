"""The simulated GPU: the fake executor's seeded tokens, timed by a step model.

Tokens, EOS control (``stop_after``), step failures and LoRA adapters are exactly
:class:`~openinfer.backend.fake_executor.FakeExecutor`'s (this class only supplies its
``step_time``), so a simulated run and a scheduler unit test disagree about nothing but
how long a step takes. Busy time is accumulated here so a report can say how loaded the
device was.
"""

from __future__ import annotations

from openinfer.backend.executor import StepKind, StepPlan
from openinfer.backend.fake_executor import FakeExecutor
from openinfer.runtime import Runtime
from sim.step_model import StepModel


class SimExecutor(FakeExecutor):
    """Executor protocol on virtual time; the step model decides each step's duration."""

    def __init__(self, rt: Runtime, model: StepModel, *, vocab_size: int = 151936, eos_token: int = 151645,
                 seed: int = 0, max_loras: int = 1) -> None:
        super().__init__(rt, vocab_size=vocab_size, eos_token=eos_token, step_time=self._timed,
                         seed=seed, max_loras=max_loras, keep_log=False)  # counters below instead
        self.model = model
        self.busy_s = 0.0
        self.busy_by_kind: dict[str, float] = {k.value: 0.0 for k in StepKind}
        self.steps_by_kind: dict[str, int] = {k.value: 0 for k in StepKind}

    def _timed(self, plan: StepPlan) -> float:
        dt = self.model.step_time(plan)
        kind = plan.kind._value_  # the value itself: ``.value`` is a descriptor call a step
        self.busy_s += dt
        self.busy_by_kind[kind] += dt
        self.steps_by_kind[kind] += 1
        return dt

    def stats(self) -> dict[str, object]:
        return dict(steps=self.steps, busy_s=self.busy_s, busy_by_kind=dict(self.busy_by_kind),
                    steps_by_kind=dict(self.steps_by_kind))
