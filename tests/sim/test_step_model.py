"""Roofline sanity and the spec §1.3 order-of-magnitude checks."""

from __future__ import annotations

import pytest

from sim_helpers import decode_plan, prefill_plan, unified_plan
from openinfer.backend.executor import PrefillRow, StepKind, StepPlan
from sim.hardware import preset as hw_preset
from sim.model_geometry import preset as model_preset
from sim.step_features import GRAPH_BUCKETS, padded_batch, step_features
from sim.step_model import RooflineStepModel

QWEN = model_preset("qwen3-4b")
H200 = RooflineStepModel(QWEN, hw_preset("h200"))
R5090 = RooflineStepModel(QWEN, hw_preset("rtx5090"))


def test_graph_buckets_follow_spec() -> None:
    assert GRAPH_BUCKETS[:9] == (1, 2, 4, 8, 16, 20, 24, 32, 40)
    assert GRAPH_BUCKETS[-1] == 256 and all(b - a == 8 for a, b in zip(GRAPH_BUCKETS[7:], GRAPH_BUCKETS[8:]))
    assert [padded_batch(n) for n in (1, 3, 5, 17, 21, 25, 33, 255)] == [1, 4, 8, 20, 24, 32, 40, 256]


def test_decode_grows_with_batch_and_context_as_bandwidth_predicts() -> None:
    t = H200.step_time
    assert t(decode_plan(1, 1024)) < t(decode_plan(8, 1024)) < t(decode_plan(64, 1024)) < t(decode_plan(256, 1024))
    assert t(decode_plan(32, 512)) < t(decode_plan(32, 2048)) < t(decode_plan(32, 8192))
    # memory-bound: the extra time is exactly the extra KV bytes over sustained bandwidth
    extra_bytes = 32 * (8192 - 2048) * QWEN.kv_bytes_per_token
    assert t(decode_plan(32, 8192)) - t(decode_plan(32, 2048)) == pytest.approx(
        extra_bytes / hw_preset("h200").bytes_per_s, rel=1e-9)
    assert H200.breakdown(step_features(decode_plan(32, 8192))).bound == "memory"


def test_prefill_grows_with_tokens_and_long_prompts_are_superlinear() -> None:
    t = H200.step_time
    assert t(prefill_plan(256)) < t(prefill_plan(1024)) < t(prefill_plan(4096))

    def ttft(n: int) -> float:  # chunked at 1024 tokens per step, as the scheduler does
        return sum(t(prefill_plan(min(1024, n - s), start=s, final=s + 1024 >= n)) for s in range(0, n, 1024))
    assert ttft(16384) / ttft(1024) > 16 * 1.2


def test_bucket_padding_is_visible_once_compute_bound() -> None:
    t = H200.step_time
    # short contexts at a large batch: FLOPs of the padded graph batch decide
    assert H200.breakdown(step_features(decode_plan(201, 16))).bound == "compute"
    assert t(decode_plan(201, 16)) == pytest.approx(t(decode_plan(208, 16)), rel=0.01)
    assert t(decode_plan(201, 16)) > t(decode_plan(200, 16)) * 1.02
    # unified steps run eagerly: no padding
    assert step_features(unified_plan(64, 201, 16)).decode_rows_padded == 201


def test_unified_is_one_pass_cheaper_than_two() -> None:
    t = H200.step_time
    both = t(unified_plan(1024, 64, 1024))
    assert max(t(prefill_plan(1024)), t(decode_plan(64, 1024))) <= both
    assert both < t(prefill_plan(1024)) + t(decode_plan(64, 1024))


def test_attention_pairs_count_causal_work_of_a_chunk() -> None:
    f = step_features(StepPlan(StepKind.PREFILL, prefill=[
        PrefillRow(0, None, 100, [1] * 10, is_final=False)]))  # type: ignore[arg-type]
    assert f.prefill_attn_pairs == sum(100 + i + 1 for i in range(10))
    assert f.prefill_context_tokens == 110 and f.logit_rows == 0


def test_rtx5090_matches_spec_1_3_order_of_magnitude() -> None:
    t = R5090.step_time
    decode = t(decode_plan(1, 1024))
    assert 5.96e-3 / 2 < decode < 5.96e-3 * 2
    prefill = t(prefill_plan(1024))
    assert 44e-3 / 2 < prefill < 44e-3 * 2
    unified = t(unified_plan(1024 - 16, 16, 1024))
    assert 45.1e-3 / 2 < unified < 45.1e-3 * 2
    ttft_16k = sum(t(prefill_plan(1024, start=s, final=s == 15 * 1024)) for s in range(0, 16384, 1024))
    assert 1.144 / 2 < ttft_16k < 1.144 * 2
    bs128 = t(decode_plan(128, 1024))
    assert 13.7e-3 / 2 < bs128 < 13.7e-3 * 2
