"""A step-time model fitted to measured steps, pluggable where the roofline is.

The roofline is a prior; a real GPU has kernel launch gaps, attention kernels with their
own efficiency, and graph replay costs the roofline cannot know. ``validate`` runs on the
real executor record (plan features, seconds) pairs; ``CalibratedStepModel.fit`` turns
them into ``t = a + g·eager_step + b·prefill_tokens + c·prefill_attn_pairs
+ d·decode_rows_padded + e·decode_context_tokens`` (plus ``d'·rows + e'·context`` for the
decode rows of an eager step) by least squares, and the simulator then runs on it. ``prefill_attn_pairs`` (≈ tokens²/2 for a cold chunk) carries the quadratic
attention term, so a 16k prompt stays superlinear. ``eager_step`` is 1 for a step with
prompt tokens that runs eagerly (no prefill graph holds it): it pays the per-kernel launch
cost of an eager pass, a constant the other terms cannot express; for the same reason a
decode row computed in an eager (unified) step does not cost what a row of a replayed
graph does, and ``eager_decode_rows`` / ``eager_decode_context_tokens`` are what such a
row costs on top (with one shared slope the served runs' unified steps dragged the
graph-decode slope up and large-batch decode came out 20-40% slow on the H200 step grid).
A prompt step replayed as a prefill graph (``prompt_graph``) computes its whole (tokens,
seqs) bucket, decode rows included, so it is charged ``graph_prompt_step`` plus
``graph_tokens`` per token of the bucket, ``graph_context_tokens`` per KV row its prompt
rows read and ``graph_decode_context_tokens`` per KV row its decode rows read (one read
each, as in a decode step: with one slope for both, the steps of a served run with prefix
hits, a short chunk beside a few decode rows, came out 3% over their median on the fit
data and 4-6% over on the held-out runs), and the shared attention pairs; fitted on the
per-row slopes instead, the bucket-(32, 8) steps of the fit workload overcharged the
held-out run's bucket-(128, 4) steps by 8-10% on three captures. Per padded decode batch a
pure decode step may pay a fitted cost of its own (``decode_buckets``). The fit minimises RELATIVE residuals by default: a 3 ms decode step and a 300 ms
prefill both matter, and absolute least squares would let the long steps drown out the
decode steps that TPOT is made of.

``mean=True`` fits the mean duration instead (quasi-likelihood for noise proportional to
the mean, by reweighting with the predicted rather than the measured time): the relative
fit divides each residual by the measured time, so a step that ran slow counts for less
and the line sits under the average; a simulator adds durations, so its latencies need the
average. Steps over ``outlier_ratio`` times their prediction (a Triton JIT compile on a new
shape: 0.5 s for a 14 ms step) are left out of that fit and counted.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from openinfer.backend.executor import StepPlan
from openinfer.errors import ConfigError, require
from sim.step_features import StepFeatures, step_features

TERMS = ("intercept", "eager_step", "prefill_tokens", "prefill_attn_pairs", "decode_rows_padded", "decode_context_tokens",
         "eager_decode_rows", "eager_decode_context_tokens", "graph_prompt_step", "graph_tokens",
         "graph_context_tokens", "graph_decode_context_tokens")
MEAN_FIT_ITERATIONS = 25
MIN_BUCKET_SAMPLES = 10   # pure decode steps a padded batch needs for a cost of its own


@dataclass(frozen=True)
class FitQuality:
    samples: int
    rmse_s: float
    r2: float
    median_rel_error: float = 0.0
    outliers: int = 0               # samples a mean fit left out (over outlier_ratio x prediction)


@dataclass(frozen=True)
class CalibratedStepModel:
    intercept: float = 0.0
    eager_step: float = 0.0
    prefill_tokens: float = 0.0
    prefill_attn_pairs: float = 0.0
    decode_rows_padded: float = 0.0
    decode_context_tokens: float = 0.0
    eager_decode_rows: float = 0.0             # extra per decode row of an eager step
    eager_decode_context_tokens: float = 0.0   # extra per context token of those rows
    graph_prompt_step: float = 0.0             # a step with prompt tokens replayed as a graph:
                                               # instead of eager_step (prefill_graphs below)
    graph_tokens: float = 0.0                  # per token of the bucket such a graph computes
    graph_context_tokens: float = 0.0          # per KV row its prompt rows read
    graph_decode_context_tokens: float | None = None  # per KV row its decode rows read (None, a
                                                      # profile from before the split: as prompt rows)
    host_per_row: float = 0.0                  # host work per (unpadded) decode row, between steps:
                                               # from the host-gap fit (sim.profile), not this fit
    pad_unified: bool = False
    prefill_graphs: bool = False   # the engine replays prompt steps that fit a bucket as graphs
    min_step_s: float = 1e-6  # a fit may extrapolate below zero; a step never takes no time
    # A pure decode step of a fitted batch (padded rows) pays that batch's own cost in place
    # of decode_rows_padded per row (bucket_cost): each bucket replays its own CUDA graph.
    decode_buckets: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        table = {}
        for key, cost in dict(self.decode_buckets).items():
            require(str(key).isdigit() and int(key) >= 1, "calibration.decode_buckets", key,
                    "padded decode batch sizes (ints >= 1) mapped to seconds")
            require(isinstance(cost, (int, float)) and not isinstance(cost, bool),
                    f"calibration.decode_buckets.{key}", cost, "seconds (a number)")
            table[int(key)] = float(cost)
        object.__setattr__(self, "decode_buckets", dict(sorted(table.items())))

    def bucket_cost(self, padded: int) -> float:
        """What a pure decode step of ``padded`` rows costs beyond the intercept and its
        context: the fitted bucket's own cost; between two fitted buckets, the line through
        them; beyond the table's ends, the edge bucket's plus ``decode_rows_padded`` a row
        (never below nothing)."""
        table = self.decode_buckets
        got = table.get(padded)
        if got is not None:
            return got
        if padded <= 0 or not table:
            return self.decode_rows_padded * max(padded, 0)
        keys = sorted(table)  # a miss: a batch no served run reached (the table is small)
        i = bisect_left(keys, padded)
        if i == 0:
            cost = table[keys[0]] - self.decode_rows_padded * (keys[0] - padded)
        elif i == len(keys):
            cost = table[keys[-1]] + self.decode_rows_padded * (padded - keys[-1])
        else:
            lo, hi = keys[i - 1], keys[i]
            cost = table[lo] + (padded - lo) / (hi - lo) * (table[hi] - table[lo])
        return max(0.0, cost)

    def features_time(self, f: StepFeatures) -> float:
        t = self.intercept + self.host_per_row * f.decode_rows
        if f.prompt_graph and f.prefill_tokens:
            # a replay computes its whole bucket; its decode rows are rows of that bucket
            t += (self.graph_prompt_step + self.graph_tokens * f.graph_tokens
                  + self.graph_context_tokens * f.prefill_context_tokens
                  + self.graph_decode_kv_rate * f.decode_context_tokens
                  + self.prefill_attn_pairs * f.prefill_attn_pairs)
        else:
            rows = (self.bucket_cost(f.decode_rows_padded) if self.decode_buckets and not f.prefill_tokens
                    else self.decode_rows_padded * f.decode_rows_padded)
            t += rows + self.decode_context_tokens * f.decode_context_tokens
            if f.prefill_tokens:
                t += (self.eager_step + self.prefill_tokens * f.prefill_tokens
                      + self.prefill_attn_pairs * f.prefill_attn_pairs
                      + self.eager_decode_rows * f.decode_rows_padded
                      + self.eager_decode_context_tokens * f.decode_context_tokens)
        return t if t > self.min_step_s else self.min_step_s

    def step_time(self, plan: StepPlan) -> float:
        return self.features_time(step_features(plan, self.pad_unified, self.prefill_graphs))

    def scaled(self, factor: float) -> CalibratedStepModel:
        """Every step ``factor`` times as long (all fitted terms scaled, so the shape is
        kept): how sensitive a simulated result is to a small error in the step model."""
        require(factor > 0, "step_scale", factor, "a number > 0")
        return replace(self, **{k: getattr(self, k) * factor for k in TERMS if getattr(self, k) is not None},
                       decode_buckets={b: c * factor for b, c in self.decode_buckets.items()})

    def coefficients(self) -> dict[str, float]:
        """The fitted terms, as charged (a profile from before the decode-row split charges
        a graph step's decode-row KV at ``graph_context_tokens``)."""
        return {**{k: getattr(self, k) for k in TERMS}, "graph_decode_context_tokens": self.graph_decode_kv_rate}

    @property
    def graph_decode_kv_rate(self) -> float:
        """Seconds per KV row a graph prompt step's decode rows read: their own fitted rate,
        or, in a profile from before the split (None), the prompt rows' rate."""
        g = self.graph_decode_context_tokens
        return self.graph_context_tokens if g is None else g

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CalibratedStepModel:
        known = set(cls.__dataclass_fields__)
        for key in data:
            if key not in known:
                raise ConfigError(f"calibration.{key}", data[key], f"one of {', '.join(sorted(known))}")
        return cls(**data)  # type: ignore[arg-type]

    @classmethod
    def fit(cls, samples: Sequence[tuple[StepFeatures | StepPlan, float]], *,
            pad_unified: bool = False, relative: bool = True, mean: bool = False) -> CalibratedStepModel:
        """Least-squares coefficients from (features or plan, measured seconds) pairs."""
        return cls.fit_with_quality(samples, pad_unified=pad_unified, relative=relative, mean=mean)[0]

    @classmethod
    def fit_with_quality(cls, samples: Sequence[tuple[StepFeatures | StepPlan, float]], *,
                         pad_unified: bool = False, relative: bool = True,
                         sample_weights: Sequence[float] | None = None, mean: bool = False,
                         outlier_ratio: float = 10.0, decode_buckets: bool = False,
                         min_bucket_samples: int = MIN_BUCKET_SAMPLES,
                         bucket_samples: Sequence[bool] | None = None) -> tuple[CalibratedStepModel, FitQuality]:
        """``fit`` plus how well the line explains the samples (RMSE, R², median relative
        error). A term no sample exercises (say, no eager step was measured) gets 0.
        ``mean``: fit the mean duration (see the module docstring). ``decode_buckets``: then
        give every padded decode batch with ``min_bucket_samples`` pure decode steps its own
        cost (:func:`bucket_table`), from the samples ``bucket_samples`` marks (all if None)."""
        require(len(samples) >= len(TERMS), "calibration.samples", len(samples),
                f"at least {len(TERMS)} (feature, seconds) pairs")
        rows, ys, feats = [], [], []
        for i, (x, seconds) in enumerate(samples):
            f = x if isinstance(x, StepFeatures) else step_features(x, pad_unified)
            feats.append(f)
            require(seconds >= 0, f"calibration.samples[{i}].seconds", seconds, "a number >= 0")
            prompt = 1.0 if f.prefill_tokens else 0.0
            graph = prompt if f.prompt_graph else 0.0
            eager = prompt - graph
            rest = 1.0 - graph          # decode steps and eager prompt steps
            rows.append((1.0, eager, eager * f.prefill_tokens, f.prefill_attn_pairs,
                         rest * f.decode_rows_padded, rest * f.decode_context_tokens,
                         eager * f.decode_rows_padded, eager * f.decode_context_tokens, graph,
                         graph * f.graph_tokens,
                         graph * f.prefill_context_tokens, graph * f.decode_context_tokens))
            ys.append(seconds)
        a = np.asarray(rows, dtype=float)
        y = np.asarray(ys, dtype=float)
        # Scale columns so the quadratic term (≈1e8) and the intercept (1) condition alike.
        scale = np.abs(a).max(axis=0)
        scale[scale == 0] = 1.0
        prior = np.ones_like(y)
        if sample_weights is not None:
            require(len(sample_weights) == len(ys), "calibration.sample_weights", len(sample_weights),
                    f"one weight per sample ({len(ys)})")
            prior = np.sqrt(np.asarray(sample_weights, dtype=float))

        def solve(weight: np.ndarray) -> np.ndarray:
            c, *_ = np.linalg.lstsq((a / scale) * weight[:, None], y * weight, rcond=None)
            return c / scale
        coef = solve(prior / np.maximum(y, 1e-6) if relative else prior)
        keep = np.ones_like(y, dtype=bool)
        if mean:
            for _ in range(MEAN_FIT_ITERATIONS):
                p = np.maximum(a @ coef, 1e-6)
                keep = y <= outlier_ratio * p
                new = solve(prior / p * keep)
                if np.allclose(new, coef, rtol=1e-9, atol=0.0):
                    break
                coef = new
        graphs = bool(a[:, TERMS.index("graph_prompt_step")].any())
        model = cls(**{k: float(c) for k, c in zip(TERMS, coef)}, pad_unified=pad_unified, prefill_graphs=graphs)
        pred = a @ coef
        if decode_buckets:
            require(bucket_samples is None or len(bucket_samples) == len(ys), "calibration.bucket_samples",
                    None if bucket_samples is None else len(bucket_samples), f"one flag per sample ({len(ys)})")
            usable = keep if bucket_samples is None else keep & np.asarray(bucket_samples, dtype=bool)
            model = replace(model, decode_buckets=bucket_table(model, feats, y, usable, min_bucket_samples))
            pred = np.array([model.features_time(f) for f in feats])
        resid = y - pred
        ss_tot = float(((y - y.mean()) ** 2).sum())
        r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
        rel = np.abs(resid) / np.maximum(y, 1e-9)
        return model, FitQuality(len(ys), float(np.sqrt((resid ** 2).mean())), r2, float(np.median(rel)),
                                 int((~keep).sum()))


def bucket_table(model: CalibratedStepModel, feats: Sequence[StepFeatures], seconds: np.ndarray,
                 keep: np.ndarray, min_samples: int = MIN_BUCKET_SAMPLES) -> dict[int, float]:
    """Per padded decode batch with ``min_samples`` kept pure decode steps: the mean of
    their measured seconds less what the fitted line charges them besides the rows (the
    intercept and the context term). One slope over the padded rows cannot follow a graph
    per bucket: on the H200 captures of 2026-12-04 it put batch 1-4 decode 3% over their
    served steps and batch 16 7% under, with the step grid's large batches pulling it."""
    base = replace(model, decode_rows_padded=0.0, decode_buckets={}, min_step_s=float("-inf"))  # no floor
    by: dict[int, list[float]] = {}
    for f, y, k in zip(feats, seconds, keep):
        if k and not f.prefill_tokens and f.decode_rows_padded > 0:
            by.setdefault(f.decode_rows_padded, []).append(float(y) - base.features_time(f))
    return {b: float(np.mean(v)) for b, v in sorted(by.items()) if len(v) >= min_samples}
