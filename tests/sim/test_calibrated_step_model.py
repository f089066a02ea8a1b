"""The fitted step model recovers known coefficients and plugs in where the roofline does."""

from __future__ import annotations

import random

import pytest

from sim_helpers import decode_plan, prefill_plan, unified_plan
from openinfer.errors import ConfigError
from sim.calibrated_step_model import CalibratedStepModel
from sim.step_features import StepFeatures, padded_batch
from sim.workloads import RandomWorkload
from sim.arrivals import ArrivalSpec
from sim.world import WorldConfig, build_world, run_world

TRUE = CalibratedStepModel(intercept=2.1e-3, eager_step=1.4e-3, prefill_tokens=41e-6, prefill_attn_pairs=3.0e-10,
                           decode_rows_padded=30e-6, decode_context_tokens=4.2e-8,
                           eager_decode_rows=250e-6, eager_decode_context_tokens=-1e-8)


def _samples(noise: float, n: int = 300) -> list[tuple[StepFeatures, float]]:
    rng = random.Random(7)
    out = []
    for _ in range(n):
        tokens = rng.choice([0, 0, rng.randint(1, 1024)])
        start = rng.randint(0, 8192) if tokens else 0
        rows = rng.randint(0 if tokens else 1, 256)
        ctx = rows * rng.randint(16, 4096)
        f = StepFeatures(prefill_tokens=tokens, prefill_attn_pairs=tokens * start + tokens * (tokens + 1) // 2,
                         prefill_context_tokens=start + tokens, logit_rows=1 if tokens else 0, decode_rows=rows,
                         decode_rows_padded=padded_batch(rows), decode_context_tokens=ctx)
        out.append((f, TRUE.features_time(f) + rng.gauss(0, noise)))  # noise: absolute jitter, s
    return out


def test_fit_recovers_known_coefficients_exactly_without_noise() -> None:
    model, quality = CalibratedStepModel.fit_with_quality(_samples(0.0))
    for k, v in TRUE.coefficients().items():
        assert model.coefficients()[k] == pytest.approx(v, rel=1e-6), k
    assert quality.r2 > 0.999999


def test_fit_is_close_with_measurement_noise() -> None:
    model = CalibratedStepModel.fit(_samples(50e-6, n=2000))  # 50 µs timer jitter
    for k, v in TRUE.coefficients().items():
        assert model.coefficients()[k] == pytest.approx(v, rel=0.1), k


def test_relative_fit_keeps_short_decode_steps_accurate_under_proportional_noise() -> None:
    """Timings jitter in proportion to their length; an absolute fit would let the long
    prefills decide the coefficients and miss the short decode steps TPOT is made of."""
    rng = random.Random(3)
    noisy = [(f, t * (1.0 + rng.gauss(0, 0.05))) for f, _ in _samples(0.0, n=2000)
             for t in [TRUE.features_time(f)]]
    decode_only = [f for f, _ in noisy if not f.prefill_tokens][:200]

    def worst_decode_error(model: CalibratedStepModel) -> float:
        return max(abs(model.features_time(f) / TRUE.features_time(f) - 1) for f in decode_only)

    relative = CalibratedStepModel.fit(noisy)
    absolute = CalibratedStepModel.fit(noisy, relative=False)
    assert worst_decode_error(relative) < 0.03
    assert worst_decode_error(relative) < worst_decode_error(absolute)


def test_fit_accepts_plans_and_round_trips_through_a_dict() -> None:
    plans = [decode_plan(b, c) for b in (1, 5, 17, 64, 200) for c in (100, 900, 3000)]
    plans += [prefill_plan(n, start=s) for n in (64, 512, 1024) for s in (0, 2048)] + [unified_plan(256, 16, 500)]
    samples = [(p, TRUE.step_time(p)) for p in plans]
    model = CalibratedStepModel.fit(samples)
    assert model.step_time(plans[3]) == pytest.approx(TRUE.step_time(plans[3]), rel=1e-6)
    assert CalibratedStepModel.from_dict(model.to_dict()) == model
    with pytest.raises(ConfigError, match="calibration.slope"):
        CalibratedStepModel.from_dict({"slope": 1.0})
    with pytest.raises(ConfigError, match="calibration.samples"):
        CalibratedStepModel.fit(samples[:3])


def test_calibrated_model_drives_a_world() -> None:
    w = build_world(WorldConfig(num_blocks=2000, host_tier_gib=0.0), step_model=TRUE)
    rep = run_world(w, RandomWorkload(num_requests=10, input_len=200, output_len=20, arrival=ArrivalSpec(50.0)))
    assert rep["metrics"]["completed"] == 10
    assert rep["engine"]["busy_s"] > 0


def test_a_decode_row_of_an_eager_step_costs_what_it_costs_there_not_what_a_graph_row_does() -> None:
    """Graph-replayed decode rows are cheap, rows computed in an eager unified step are not
    (on the H200 0.35 ms against 12 µs). One shared slope, fitted on a served run full of
    unified steps, over-charged every large graph batch; the split fit recovers both."""
    samples = _samples(0.0, n=600)
    model = CalibratedStepModel.fit(samples)
    big_graph = StepFeatures(decode_rows=128, decode_rows_padded=128, decode_context_tokens=128 * 4096)
    assert model.features_time(big_graph) == pytest.approx(TRUE.features_time(big_graph), rel=1e-6)
    shared = CalibratedStepModel.fit([(f, TRUE.features_time(f) - (TRUE.eager_decode_rows * f.decode_rows_padded
                                       + TRUE.eager_decode_context_tokens * f.decode_context_tokens
                                       if f.prefill_tokens else 0.0)) for f, _ in samples])
    assert shared.eager_decode_rows == pytest.approx(0.0, abs=1e-9)  # nothing extra when there is nothing extra


def test_mean_fit_adds_up_to_the_measured_time_when_some_steps_run_slow() -> None:
    """A tenth of the steps run 1.8x slow (as eager steps did in slow stretches on the H200)
    and one is a 40x JIT compile: the ratio fit sits under the average and the simulated
    total comes out short; the mean fit's total matches, the compile left out and counted."""
    rng = random.Random(11)
    base = _samples(0.0, n=3000)
    noisy = [(f, t * (1.8 if rng.random() < 0.1 else 1.0) * (1 + rng.gauss(0, 0.02))) for f, t in base]
    noisy[5] = (noisy[5][0], noisy[5][1] * 40)
    kept = noisy[:5] + noisy[6:]
    total = sum(t for _, t in kept)
    ratio = CalibratedStepModel.fit(noisy)
    mean, q = CalibratedStepModel.fit_with_quality(noisy, mean=True)
    assert sum(ratio.features_time(f) for f, _ in kept) / total - 1 < -0.03
    assert sum(mean.features_time(f) for f, _ in kept) / total - 1 == pytest.approx(0.0, abs=0.01)
    assert q.outliers == 1


def _graphed(f: StepFeatures) -> StepFeatures:
    """``f`` as the executor runs it with prefill graphs on: replayed in its bucket if one holds it."""
    from dataclasses import replace
    from openinfer.backend.buckets import prefill_bucket
    bucket = prefill_bucket(f.prefill_tokens + f.decode_rows, 1 + f.decode_rows) if f.prefill_tokens else None
    return replace(f, prompt_graph=1, graph_tokens=bucket[0]) if bucket else f


GRAPH_TRUE = CalibratedStepModel(**{**TRUE.to_dict(), "graph_prompt_step": 0.3e-3, "graph_tokens": 9e-6,
                                    "graph_context_tokens": 2.5e-7, "graph_decode_context_tokens": 4e-8,
                                    "prefill_graphs": True})


def test_graph_prompt_steps_are_fitted_on_their_bucket() -> None:
    """With prefill graphs on, a small prompt step replays a graph: it skips the eager
    launch cost and computes its whole bucket. The fit keeps the two constants apart,
    recovers the bucket's per-token cost and what a KV row read by a prompt row and by a
    decode row costs (a decode row reads its KV once; on the H200 one shared slope put the
    held-out run's 112-token steps beside 7 decode rows 10% over), and remembers that the
    engine graphs prompt steps, so the simulator charges each plan what it would pay."""
    samples = [(g, GRAPH_TRUE.features_time(g)) for f, _ in _samples(0.0, n=800) for g in [_graphed(f)]]
    assert any(f.prompt_graph for f, _ in samples) and any(f.prefill_tokens and not f.prompt_graph for f, _ in samples)
    model = CalibratedStepModel.fit(samples)
    assert model.prefill_graphs
    for k, v in GRAPH_TRUE.coefficients().items():
        assert model.coefficients()[k] == pytest.approx(v, rel=1e-6, abs=1e-15), k
    assert not CalibratedStepModel.fit(_samples(0.0)).prefill_graphs
    # a profile from before the split charges a decode row's KV as a prompt row's
    old = CalibratedStepModel(**{**GRAPH_TRUE.to_dict(), "graph_decode_context_tokens": None})
    f = StepFeatures(prefill_tokens=16, prefill_context_tokens=900, decode_rows=3, decode_rows_padded=3,
                     decode_context_tokens=3000, prompt_graph=1, graph_tokens=32)
    assert old.features_time(f) - GRAPH_TRUE.features_time(f) == pytest.approx(3000 * (2.5e-7 - 4e-8))
    assert old.scaled(2.0).graph_decode_context_tokens is None


def test_a_graph_replay_costs_its_bucket_not_its_rows() -> None:
    """Two prompt steps in the same (tokens, seqs) bucket with the same KV read cost the
    same however many of the bucket's tokens are real; the next bucket up costs more."""
    from sim.step_features import step_features
    small, large = (step_features(prefill_plan(n), prefill_graphs=True) for n in (70, 120))
    assert (small.graph_tokens, large.graph_tokens) == (128, 128)
    same_ctx = StepFeatures(prefill_tokens=70, prefill_context_tokens=120, prompt_graph=1, graph_tokens=128)
    assert GRAPH_TRUE.features_time(same_ctx) == pytest.approx(
        GRAPH_TRUE.features_time(StepFeatures(prefill_tokens=120, prefill_context_tokens=120, prompt_graph=1,
                                              graph_tokens=128)))
    up = step_features(prefill_plan(200), prefill_graphs=True)
    assert up.graph_tokens == 256 and GRAPH_TRUE.features_time(up) > GRAPH_TRUE.features_time(large)


def test_step_features_mark_the_prompt_steps_a_prefill_graph_holds() -> None:
    from sim.step_features import step_features
    small = unified_plan(100, 3, 1000)
    assert step_features(small, prefill_graphs=True).prompt_graph == 1
    assert step_features(small).prompt_graph == 0                       # graphs off
    assert step_features(prefill_plan(600), prefill_graphs=True).prompt_graph == 0   # > 512 tokens
    assert step_features(unified_plan(64, 20, 1000), prefill_graphs=True).prompt_graph == 0
    assert step_features(decode_plan(4, 1000), prefill_graphs=True).prompt_graph == 0


def test_a_scaled_model_makes_every_step_that_much_longer_and_keeps_the_host_work() -> None:
    """``fidelity sensitivity=`` reruns on a scaled model: each step, whatever its kind, is
    ``factor`` times the fitted one, and the host's per-row work (added by the profile after
    the fit) is not the GPU's and stays."""
    model = CalibratedStepModel(**{**TRUE.to_dict(), "graph_prompt_step": 1.1e-3, "graph_tokens": 6e-6,
                                   "graph_context_tokens": 2e-7, "prefill_graphs": True})
    for f in [f for f, _ in _samples(0.0, 60)] + [StepFeatures(prefill_tokens=48, prefill_attn_pairs=900,
                                                               prefill_context_tokens=900, prompt_graph=1,
                                                               graph_tokens=64, decode_rows=3, decode_rows_padded=4)]:
        assert model.scaled(1.01).features_time(f) == pytest.approx(1.01 * model.features_time(f), rel=1e-12)
    hosted = CalibratedStepModel(intercept=3e-3, host_per_row=5e-6)
    one_row = StepFeatures(decode_rows=1, decode_rows_padded=1)
    assert hosted.scaled(2.0).features_time(one_row) == pytest.approx(2 * 3e-3 + 5e-6)
    with pytest.raises(ConfigError, match="step_scale"):
        model.scaled(0.0)


BUCKET_COST = {1: 20e-6, 2: 60e-6, 4: 90e-6, 8: 400e-6, 16: 1.3e-3}   # not a line in the rows


def _bucketed_samples(n: int = 600) -> list[tuple[StepFeatures, float]]:
    """Prompt steps on TRUE's line, pure decode steps paying BUCKET_COST per padded batch."""
    truth = CalibratedStepModel(**{**TRUE.to_dict(), "decode_buckets": BUCKET_COST})
    rng = random.Random(11)
    feats = [f for f, _ in _samples(0.0, n) if f.prefill_tokens]
    for _ in range(n):
        rows = rng.randint(1, 16)
        feats.append(StepFeatures(decode_rows=rows, decode_rows_padded=padded_batch(rows),
                                  decode_context_tokens=rows * rng.randint(16, 4096)))
    return [(f, truth.features_time(f)) for f in feats]


def test_each_measured_decode_batch_gets_its_own_cost() -> None:
    """A CUDA graph per decode bucket: the fitted table gives every bucket measured often
    enough the cost it was measured at, where one slope over the padded rows cannot."""
    samples = _bucketed_samples()
    line = CalibratedStepModel.fit(samples, mean=True)
    table = CalibratedStepModel.fit_with_quality(samples, mean=True, decode_buckets=True)[0]
    decode = [(f, t) for f, t in samples if not f.prefill_tokens]
    assert {f.decode_rows_padded for f, _ in decode} == set(BUCKET_COST)

    def worst(model: CalibratedStepModel) -> float:
        return max(abs(model.features_time(f) / t - 1) for f, t in decode)
    assert worst(table) < 0.02 < worst(line)
    counts = {b: sum(1 for f, _ in decode if f.decode_rows_padded == b) for b in BUCKET_COST}
    few = CalibratedStepModel.fit_with_quality(samples, mean=True, decode_buckets=True,
                                               min_bucket_samples=min(counts.values()) + 1)[0]
    assert set(few.decode_buckets) == {b for b, c in counts.items() if c > min(counts.values())}
    only_big = CalibratedStepModel.fit_with_quality(
        samples, mean=True, decode_buckets=True,
        bucket_samples=[f.decode_rows_padded >= 8 for f, _ in samples])[0]
    assert set(only_big.decode_buckets) == {8, 16}            # the samples allowed to set a cost


def test_a_batch_between_or_beyond_the_fitted_ones_follows_their_line() -> None:
    m = CalibratedStepModel(intercept=1e-3, decode_rows_padded=1e-4, decode_buckets={"4": 2e-4, 8: 6e-4})
    assert m.decode_buckets == {4: 2e-4, 8: 6e-4}              # keys from JSON are strings
    assert m.bucket_cost(4) == 2e-4 and m.bucket_cost(6) == pytest.approx(4e-4)
    assert m.bucket_cost(2) == pytest.approx(2e-4 - 2 * 1e-4)   # below: the edge and the slope
    assert m.bucket_cost(12) == pytest.approx(6e-4 + 4 * 1e-4)  # above
    assert m.features_time(StepFeatures(decode_rows=5, decode_rows_padded=8)) == pytest.approx(1e-3 + 6e-4)
    eager = StepFeatures(prefill_tokens=10, decode_rows=5, decode_rows_padded=5)
    assert m.features_time(eager) == pytest.approx(1e-3 + 5 * 1e-4 + 10 * m.prefill_tokens)  # rows of a prompt step
    assert CalibratedStepModel.from_dict(m.to_dict()) == m
    import json
    assert CalibratedStepModel.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    with pytest.raises(ConfigError, match="decode_buckets"):
        CalibratedStepModel(decode_buckets={"batch": 1e-3})
    with pytest.raises(ConfigError, match="decode_buckets.8"):
        CalibratedStepModel(decode_buckets={8: None})         # a YAML null
    steep = CalibratedStepModel(decode_rows_padded=1e-4, decode_buckets={8: 1e-4})
    assert steep.bucket_cost(1) == 0.0                        # extrapolated below nothing: nothing
    with pytest.raises(ConfigError, match="bucket_samples"):
        CalibratedStepModel.fit_with_quality(_bucketed_samples(40), decode_buckets=True, bucket_samples=[True])
