"""SimExecutor: FakeExecutor's surface and tokens, the step model's durations."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from sim_helpers import decode_plan, prefill_plan
from openinfer.backend.fake_executor import FakeExecutor
from openinfer.runtime import SimRuntime
from sim.capacity import RequestShape, saturation_qps
from sim.gpu_executor import SimExecutor
from sim.hardware import preset as hw_preset
from sim.model_geometry import preset as model_preset
from sim.step_model import RooflineStepModel
from sim.timeline import TimelineSampler
from sim.world import WorldConfig, build_world

MODEL = RooflineStepModel(model_preset("qwen3-4b"), hw_preset("h200"))


def test_surface_tokens_and_durations() -> None:
    rt = SimRuntime(0)
    ex = SimExecutor(rt, MODEL, seed=5, max_loras=1)
    fake = FakeExecutor(rt, seed=5)
    assert (ex.vocab_size, ex.eos_token) == (fake.vocab_size, fake.eos_token)
    assert ex.load_adapter("a") is None and ex.adapters() == ["a"] and ex.load_adapter("b") is not None
    assert ex.unload_adapter("a") is None and ex.adapters() == []
    plan = decode_plan(8, 100)
    ex.stop_after[3] = 1  # EOS at completion index 1 for request 3

    def go() -> Generator[Any, Any, Any]:
        t0 = rt.now()
        res = yield ex.execute(plan)
        return rt.now() - t0, res
    dt, res = rt.run_process(go())
    assert dt == pytest.approx(MODEL.step_time(plan))
    assert res.rows[0].token == fake.token(0, 101)
    assert res.rows[3].token == ex.eos_token
    assert ex.busy_s == pytest.approx(dt) and ex.steps_by_kind["decode"] == 1


def test_saturation_estimate_is_between_decode_and_prefill_bounds() -> None:
    qps = saturation_qps(MODEL, RequestShape(prompt_tokens=1000, cached_tokens=0, output_tokens=200))
    decode_only = 256 / (200 * MODEL.step_time(decode_plan(256, 1100)))
    assert 0.3 * decode_only < qps < decode_only
    assert qps < 1.0 / (MODEL.step_time(prefill_plan(1000)) - MODEL.step_time(decode_plan(1, 1)) * 0.9)


def test_timeline_stays_bounded() -> None:
    w = build_world(WorldConfig(num_blocks=200, timeline_every=1, timeline_max_rows=8))
    sampler: TimelineSampler = w.timeline
    for i in range(100):
        sampler._observe("step_start", {"plan": decode_plan(1, 1)})
    d = sampler.as_dict()
    assert 4 <= len(d["rows"]) <= 8 and d["every"] >= 8
    steps = [r[1] for r in d["rows"]]
    assert all(s % d["every"] == 0 for s in steps)


class _SpendsInProcess(SimExecutor):
    """The same step time spent by a process (the path an executor that overrides
    ``_spend`` takes): its answers must equal the one-timeout path's."""

    def _spend(self, seconds: float) -> Generator[Any, Any, None]:
        yield self.rt.sleep(seconds)


def test_a_step_without_its_own_process_answers_as_the_process_does() -> None:
    answers = []
    for cls in (SimExecutor, _SpendsInProcess):
        rt = SimRuntime(0)
        ex = cls(rt, MODEL, seed=3)
        ex.stop_after[2] = 1
        ex.fail_steps.add(2)

        def go() -> Generator[Any, Any, Any]:
            out = []
            for plan in (decode_plan(4, 50), decode_plan(4, 51), prefill_plan(64)):
                res = yield ex.execute(plan)
                out.append((rt.now(), res.error, res.started_at, res.finished_at,
                            {k: v.token for k, v in res.rows.items()}))
            return out
        answers.append((rt.run_process(go()), ex.steps, ex.log))
    assert answers[0] == answers[1]
    assert answers[0][2] == []  # a simulation keeps no per-step log
