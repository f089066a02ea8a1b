"""From the real executor's timing records to a :class:`~sim.profile.FittedProfile`.

``experiments.validate`` writes one JSON line per executed step and per page copy. A step
line carries the plan's counts (either the :class:`~sim.step_features.StepFeatures` fields
themselves, or the raw rows: ``prefill`` as ``[start, n, is_final, all_logits]`` or dicts,
``decode_positions`` and ``decode_rows_padded``: the CudaExecutor's ``StepTiming``), the
step ``kind``, ``started_at`` and its measured seconds (``wall_s``: what the scheduler
waited, the default target; ``gpu_s``: CUDA-event time). A copy line (``CopyRecord``)
carries ``dir`` (``d2h``/``h2d``), ``bytes`` and ``wall_s`` / ``gpu_s``. Everything here is pure
arithmetic on those records, so it is tested on the CPU with synthetic timings.
"""

from __future__ import annotations

import gzip
import json
import zlib
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from openinfer.backend.executor import StepKind, StepPlan
from openinfer.errors import ConfigError, require
from sim.calibrated_step_model import CalibratedStepModel
from sim.profile import LinkFit
from sim.step_features import StepFeatures, step_features

# What the executor did with a step (replayed a prefill graph, and of which bucket) comes
# from its ``prefill_graph`` field, not from the counts.
GRAPH_FIELDS = ("prompt_graph", "graph_tokens")
FEATURE_FIELDS = tuple(f.name for f in fields(StepFeatures) if f.name not in GRAPH_FIELDS)
COPY_DIRECTIONS = ("d2h", "h2d")
GiB = 1024 ** 3
MAX_BACK_TO_BACK_GAP_S = 0.02  # a longer gap means the engine had nothing to run, not overhead
MAX_HOST_GAP_S = 3e-3          # the host-gap regression: longer gaps are an arrival's own work or idling
OUTLIER_RATIO = 10.0           # a step this many times its prediction was a JIT compile, not a step
COPY_WAIT_MIN_STEPS = 10       # steps that started with a copy in flight needed to decide a wait
COPY_WAIT_MIN_SLOPE = 0.5      # extra step time per second of copy still in flight: ~1 waits, ~0 overlaps


def read_jsonl(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The records of every file, in order (a ``.gz`` file is read through gzip: a long
    capture's step records are committed compressed). With several files each record's ``run`` is
    qualified by its file: two captures of the same workload both have a run
    ``served:fit`` on clocks that overlap, and the per-run analyses (host gaps, host hold,
    copy order) must not interleave their steps."""
    paths = list(paths)
    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            raw = Path(path).read_bytes()
            lines = (gzip.decompress(raw) if str(path).endswith(".gz") else raw).decode().splitlines()
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:  # (BadGzipFile is an OSError)
            raise ConfigError("steps", str(path), f"a readable JSONL file of timing records ({err})") from None
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ConfigError(f"{path}:{n}", line[:60], f"one JSON object per line ({err})") from None
                if len(paths) > 1 and isinstance(rec, dict):
                    rec["run"] = f"{path}#{rec.get('run')}"
                out.append(rec)
    return out


def is_copy(rec: Mapping[str, Any]) -> bool:
    return rec.get("type") == "copy" or "dir" in rec


def _rows(rec: Mapping[str, Any]) -> list[SimpleNamespace]:
    """A record's prefill rows as the plan rows ``step_features`` reads (``tokens`` is a
    range: only its length is read)."""
    out = []
    for row in rec.get("prefill", rec.get("prefill_rows", ())):
        if isinstance(row, Mapping):
            start, n, final, all_logits = row["start"], row["n"], row.get("is_final", False), row.get("all_logits", False)
        else:
            start, n = row[0], row[1]
            final = bool(row[2]) if len(row) > 2 else False
            all_logits = bool(row[3]) if len(row) > 3 else False
        out.append(SimpleNamespace(start=int(start), tokens=range(int(n)), is_final=bool(final),
                                   all_logits=bool(all_logits)))
    return out


def features_of(rec: Mapping[str, Any]) -> StepFeatures:
    """The step counts of one record, whichever of the two forms it uses. Raw rows go
    through ``sim.step_features.step_features`` (the one implementation of the counts the
    simulator charges), with the decode padding the real executor recorded."""
    given = rec.get("features", rec)
    bucket = rec.get("prefill_graph")                   # [tokens, seqs]: what the executor replayed
    graph = dict(prompt_graph=int(bool(bucket or given.get("prompt_graph"))),
                 graph_tokens=int(bucket[0]) if bucket else int(given.get("graph_tokens", 0)))
    if all(k in given for k in FEATURE_FIELDS):
        return StepFeatures(**{k: int(given[k]) for k in FEATURE_FIELDS}, **graph)
    if "prefill" not in rec and "prefill_rows" not in rec and "decode_positions" not in rec:
        raise ConfigError("step record", sorted(rec)[:8], f"the fields {', '.join(FEATURE_FIELDS)} "
                          "or prefill + decode_positions")
    prefill = _rows(rec)
    decode = [SimpleNamespace(position=int(p)) for p in rec.get("decode_positions", ())]
    pure_decode = rec.get("kind", StepKind.DECODE.value if not prefill else "") == StepKind.DECODE.value
    kind = StepKind.DECODE if pure_decode else StepKind.UNIFIED
    f = step_features(StepPlan(kind, prefill=prefill, decode=decode))  # type: ignore[arg-type]
    padded = rec.get("decode_rows_padded")
    return replace(f, **graph,
                   decode_rows_padded=f.decode_rows_padded if padded is None else int(padded))


def sampled_steps(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The step records a fit samples: every step that ran without error (a failed step's
    time says nothing about a step's cost), in order; :func:`step_samples` keeps exactly these."""
    return [r for r in records if not is_copy(r) and not r.get("error")]


def step_samples(records: Sequence[Mapping[str, Any]], target: str = "wall_s",
                 waits: Mapping[int, float] | None = None) -> list[tuple[StepFeatures, float, str]]:
    """(features, seconds, kind) of each of :func:`sampled_steps`; ``waits`` (from
    :func:`step_waits`) is taken off the seconds of the steps it names."""
    out = []
    waits = waits or {}
    for rec in sampled_steps(records):
        require(rec.get(target) is not None, f"step record.{target}", None,
                f"records that carry {target} (choose target=wall_s or target=gpu_s)")
        out.append((features_of(rec), float(rec[target]) - waits.get(id(rec), 0.0), str(rec.get("kind", ""))))
    return out


def _start(rec: Mapping[str, Any]) -> float | None:
    t = rec.get("started_at", rec.get("t_start_s"))
    return None if t is None else float(t)


def host_gap_s(records: Sequence[Mapping[str, Any]], target: str = "wall_s") -> tuple[float, int]:
    """Median time between one step's end and the next one's start when they ran back to
    back (same ``run``; gaps over MAX_BACK_TO_BACK_GAP_S are idle time, not overhead)."""
    steps = [r for r in records if not is_copy(r) and _start(r) is not None and r.get(target) is not None]
    gaps = []
    for a, b in zip(steps, steps[1:]):
        if a.get("run") != b.get("run"):
            continue
        gap = _start(b) - (_start(a) + float(a[target]))
        if 0 <= gap < MAX_BACK_TO_BACK_GAP_S:
            gaps.append(gap)
    return (float(np.median(gaps)) if gaps else 0.0), len(gaps)


def _by_run(records: Sequence[Mapping[str, Any]], target: str = "wall_s"
            ) -> dict[str, tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]]:
    """Per ``run``: its steps in start order and its copies in submission order."""
    runs: dict[str, tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]] = {}
    for r in records:
        if is_copy(r):
            if r.get("submitted_at") is not None:
                runs.setdefault(str(r.get("run")), ([], []))[1].append(r)
        elif _start(r) is not None and r.get(target) is not None:
            runs.setdefault(str(r.get("run")), ([], []))[0].append(r)
    for steps, copies in runs.values():
        steps.sort(key=lambda r: _start(r))  # type: ignore[arg-type, return-value]
        copies.sort(key=lambda c: float(c["submitted_at"]))
    return runs


@dataclass(frozen=True)
class HostGapFit:
    """The host thread's work between two back-to-back steps, as the real engine did it:
    ``base + after_eager·[the step before had prompt tokens] + before_eager·[the next one
    has] + per_row·decode rows of the step before + per_copy·copies submitted in the gap``
    (seconds). Least squares over gaps under MAX_HOST_GAP_S (a longer one is an arrival's
    own work or the engine idling; ``left_out`` counts them)."""

    base: float = 0.0
    after_eager: float = 0.0
    before_eager: float = 0.0
    per_row: float = 0.0
    per_copy: float = 0.0
    samples: int = 0
    left_out: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_host_gaps(records: Sequence[Mapping[str, Any]], target: str = "wall_s") -> HostGapFit:
    rows, ys, left_out = [], [], 0
    for steps, copies in _by_run(records, target).values():
        subs = [float(c["submitted_at"]) for c in copies]
        for a, b in zip(steps, steps[1:]):
            end = _start(a) + float(a[target])  # type: ignore[operator]
            gap = _start(b) - end  # type: ignore[operator]
            if not 0 <= gap < MAX_BACK_TO_BACK_GAP_S:
                continue
            if gap >= MAX_HOST_GAP_S:
                left_out += 1
                continue
            n = bisect_right(subs, _start(b)) - bisect_right(subs, end)  # type: ignore[arg-type]
            rows.append((1.0, float(features_of(a).prefill_tokens > 0), float(features_of(b).prefill_tokens > 0),
                         float(features_of(a).decode_rows), float(n)))
            ys.append(gap)
    if not ys:
        return HostGapFit(left_out=left_out)
    a_ = np.asarray(rows)
    coef, *_ = np.linalg.lstsq(a_, np.asarray(ys), rcond=None)
    # a term no gap exercises (no copies, no eager step) is 0, not a least-norm guess
    coef = [float(c) if a_[:, i].any() else 0.0 for i, c in enumerate(coef)]
    return HostGapFit(*coef, samples=len(ys), left_out=left_out)


@dataclass(frozen=True)
class CopyWait:
    """Does a step that starts while a copy of ``direction`` is in flight wait for it? The
    H200 captures say: a D2H in flight holds the next step's host for the rest of the
    copy, then the step runs as usual (slope 0.95-1.03 in four captures); an H2D in flight
    overlaps (slope about 0). ``slope``: extra step seconds (wall minus CUDA-event time,
    over the steps without a copy in flight) per second of the copy still in flight."""

    direction: str
    waits: bool
    samples: int
    slope: float
    mean_wait_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def copy_in_flight_s(step: Mapping[str, Any], copies: Sequence[Mapping[str, Any]], direction: str) -> float:
    """Seconds until every ``direction`` copy in flight when the step started had landed
    (submission + CUDA-event time; 0 when none was)."""
    s0 = _start(step)
    left = 0.0
    for c in copies:
        if c.get("dir") != direction or c.get("gpu_s") is None:
            continue
        sub = float(c["submitted_at"])
        if sub > s0:  # type: ignore[operator]
            break
        left = max(left, sub + float(c["gpu_s"]) - s0)  # type: ignore[operator]
    return left


def copy_wait(records: Sequence[Mapping[str, Any]], direction: str) -> CopyWait:
    """Whether steps wait for an in-flight copy of ``direction`` (steps need ``gpu_s``)."""
    xs, ys, free = [], [], []
    for steps, copies in _by_run(records).values():
        for s in steps:
            if s.get("gpu_s") is None or s.get("error"):
                continue
            left = copy_in_flight_s(s, copies, direction)
            extra = float(s["wall_s"]) - float(s["gpu_s"])
            (xs if left > 0 else free).append(left if left > 0 else extra)
            if left > 0:
                ys.append(extra)
    if len(xs) < COPY_WAIT_MIN_STEPS or not free:
        return CopyWait(direction, False, len(xs), 0.0, 0.0)
    x = np.asarray(xs)
    y = np.asarray(ys) - float(np.median(free))
    slope = float((x * y).sum() / (x * x).sum())
    return CopyWait(direction, slope >= COPY_WAIT_MIN_SLOPE, len(xs), slope, float(x.mean()))


def step_waits(records: Sequence[Mapping[str, Any]], directions: Sequence[str]) -> dict[int, float]:
    """Per step record (by ``id``), the seconds it waited for copies of ``directions`` in
    flight when it started: what the simulator adds back on its own (``sim.host_thread``),
    so the step fit leaves it out of the target."""
    out: dict[int, float] = {}
    if not directions:
        return out
    for steps, copies in _by_run(records).values():
        for s in steps:
            w = max(copy_in_flight_s(s, copies, d) for d in directions)
            if w > 0:
                out[id(s)] = min(w, max(0.0, float(s["wall_s"]) - float(s.get("gpu_s") or 0.0)))
    return out


@dataclass(frozen=True)
class HostHold:
    """Does a step hold the host thread? Evidence from the copies: a copy whose DMA finished
    (``submitted_at + gpu_s``) well inside a step is seen by its poller (``submitted_at +
    wall_s``) inside that step on a free host, and only after the step on a held one."""

    holds: bool
    due_inside: int      # copies whose DMA finished >= HOLD_MARGIN_S before the step ended
    seen_inside: int     # ... of which the host saw done before the step ended

    def as_dict(self) -> dict[str, Any]:
        return dict(holds=self.holds, due_inside=self.due_inside, seen_inside=self.seen_inside)


HOLD_MARGIN_S = 5e-4       # a poll (20 µs) and the Python around it fit many times over
HOLD_MIN_COPIES = 20
HOLD_MAX_SHARE = 0.05      # a free host sees nearly all of them inside the step


def _step_spans(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """Per run, the (starts, ends) of its steps in time order."""
    steps = sorted((r for r in records if not is_copy(r) and _start(r) is not None and r.get("wall_s") is not None),
                   key=lambda r: (str(r.get("run")), _start(r)))
    by_run: dict[str, tuple[list[float], list[float]]] = {}
    for r in steps:
        starts, ends = by_run.setdefault(str(r.get("run")), ([], []))
        starts.append(_start(r))  # type: ignore[arg-type]
        ends.append(_start(r) + float(r["wall_s"]))  # type: ignore[operator]
    return by_run


def _timed_copies(records: Sequence[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    return (c for c in records if is_copy(c) and c.get("gpu_s") is not None and c.get("wall_s") is not None
            and c.get("submitted_at") is not None)


def _step_at(spans: tuple[list[float], list[float]], t: float) -> int | None:
    """The index of the step running at ``t``, if one is."""
    starts, ends = spans
    i = bisect_right(starts, t) - 1
    return i if i >= 0 and t < ends[i] else None


def host_hold(records: Sequence[Mapping[str, Any]]) -> HostHold:
    """Whether the real engine's host is held during a step (``sim.host_thread``), from the
    step and copy records of served runs (copies without ``gpu_s`` carry no evidence, nor
    do copies submitted during the step they would land in: those are ordered after it,
    :func:`copy_order`, so their DMA did not finish inside it)."""
    by_run = _step_spans(records)
    due = seen = 0
    for c in _timed_copies(records):
        spans = by_run.get(str(c.get("run")), ([], []))
        submitted = float(c["submitted_at"])
        landed = submitted + float(c["gpu_s"])
        i = _step_at(spans, landed)
        if i is None or landed >= spans[1][i] - HOLD_MARGIN_S or submitted >= spans[0][i]:
            continue
        due += 1
        seen += submitted + float(c["wall_s"]) < spans[1][i]
    holds = due >= HOLD_MIN_COPIES and seen <= HOLD_MAX_SHARE * due
    return HostHold(holds, due, seen)


@dataclass(frozen=True)
class CopyOrder:
    """Does a copy submitted during a step start only when that step ends? The CUDA
    executor orders its copy streams after every step launched so far; on a free host a
    copy that did not wait would be seen landing inside the step."""

    after_step: bool
    submitted_mid_step: int   # copies submitted during a step whose DMA alone would end inside it
    seen_after_it: int        # ... of which the host saw land only after that step ended

    def as_dict(self) -> dict[str, Any]:
        return dict(after_step=self.after_step, submitted_mid_step=self.submitted_mid_step,
                    seen_after_it=self.seen_after_it)


ORDER_MIN_COPIES = 10
ORDER_MIN_SHARE = 0.8


def copy_order(records: Sequence[Mapping[str, Any]], host_holds: bool) -> CopyOrder:
    """:class:`CopyOrder` from served runs' step and copy records. On a held host every
    copy is seen after the step anyway, so there the records cannot tell and the answer is
    no (the simulator then defers what lands mid-step to the step's end regardless)."""
    by_run = _step_spans(records)
    mid = after = 0
    for c in _timed_copies(records):
        spans = by_run.get(str(c.get("run")), ([], []))
        submitted = float(c["submitted_at"])
        i = _step_at(spans, submitted)
        if i is None or submitted + float(c["gpu_s"]) >= spans[1][i] - HOLD_MARGIN_S:
            continue
        mid += 1
        after += submitted + float(c["wall_s"]) >= spans[1][i]
    ordered = not host_holds and mid >= ORDER_MIN_COPIES and after >= ORDER_MIN_SHARE * mid
    return CopyOrder(ordered, mid, after)


@dataclass(frozen=True)
class CopyFits:
    d2h: LinkFit | None
    h2d: LinkFit | None


def fit_link(samples: Sequence[tuple[int, float]]) -> LinkFit:
    """``seconds = latency + bytes / bandwidth`` by relative least squares; with one copy
    size only the bandwidth is identifiable, so the latency is taken as 0."""
    require(len(samples) >= 1, "copies", 0, "at least one copy record per direction")
    b = np.asarray([s[0] for s in samples], dtype=float)
    y = np.asarray([s[1] for s in samples], dtype=float)
    w = 1.0 / np.maximum(y, 1e-9)
    if len(set(b.tolist())) >= 2:
        a = np.stack([np.ones_like(b), b / GiB], axis=1)
        (lat, per_gib), *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
        if per_gib <= 0:
            lat, per_gib = 0.0, float(np.median(y / (b / GiB)))
        lat = max(0.0, float(lat))
    else:
        lat, per_gib = 0.0, float(np.median(y / (b / GiB)))
    pred = lat + b / GiB * per_gib
    return LinkFit(gib_s=1.0 / float(per_gib), latency_s=lat, samples=len(samples),
                   median_rel_error=float(np.median(np.abs(pred - y) / np.maximum(y, 1e-12))))


def fit_copies(records: Sequence[Mapping[str, Any]], target: str = "gpu_s") -> CopyFits:
    """Per direction, the link as the copy engine ran it (``gpu_s``, the default: the
    simulator queues copies on its own engines, so submit-to-done time would count the
    queueing twice) or as the store saw it (``wall_s``). Records without ``target``
    fall back to ``wall_s``."""
    by_dir: dict[str, list[tuple[int, float]]] = {d: [] for d in COPY_DIRECTIONS}
    for rec in records:
        if is_copy(rec) and rec.get("dir") in COPY_DIRECTIONS:
            seconds = rec.get(target) if rec.get(target) is not None else rec.get("wall_s")
            if seconds is not None and rec.get("bytes", 0) > 0 and seconds > 0:
                by_dir[rec["dir"]].append((int(rec["bytes"]), float(seconds)))
    return CopyFits(*(fit_link(by_dir[d]) if by_dir[d] else None for d in COPY_DIRECTIONS))


def fit_steps(records: Sequence[Mapping[str, Any]], target: str = "wall_s", balance_kinds: bool = True,
              mean: bool = True, wait_for: Sequence[str] = (), decode_buckets: bool = True
              ) -> tuple[CalibratedStepModel, dict[str, Any]]:
    """The step model, with each step kind weighing the same in total when
    ``balance_kinds``: a served run is mostly decode steps, and unweighted they would
    decide the eager intercept and the prefill slope that TTFT depends on. ``mean``: fit
    the mean duration (what a simulator's sums need), not the ratio (see
    ``sim.calibrated_step_model``). The quality says per kind the median signed error and
    how far the predicted total of that kind's steps is from the measured one.
    ``wait_for``: copy directions a step waits for (:func:`copy_wait`); that wait is the
    simulator's to add, so it is taken off the measured seconds. ``decode_buckets``: each
    padded decode batch measured often enough in a served run gets its own cost
    (``sim.calibrated_step_model.bucket_table``). Only served steps set those costs when
    there are any: the step grid runs each step alone, and on the H200 its decode steps
    took 10-20% less than the same batch served (copies, the host's polling and other work
    beside it), which the simulator of a served instance must charge. The grid's steps
    still inform the line (its batches and contexts reach where served runs do not)."""
    waits = step_waits(records, wait_for)
    served = [str(r.get("source", "")).startswith("served") for r in sampled_steps(records)]  # per sample
    samples = step_samples(records, target, waits)
    weights = None
    if balance_kinds:
        counts: dict[str, int] = {}
        for _, _, kind in samples:
            counts[kind] = counts.get(kind, 0) + 1
        weights = [1.0 / counts[kind] for _, _, kind in samples]
    model, q = CalibratedStepModel.fit_with_quality([(f, t) for f, t, _ in samples], sample_weights=weights,
                                                    mean=mean, outlier_ratio=OUTLIER_RATIO,
                                                    decode_buckets=decode_buckets,
                                                    bucket_samples=served if any(served) else None)
    per_kind: dict[str, float] = {}
    per_kind_sum: dict[str, float] = {}
    for kind in sorted({k for _, _, k in samples}):
        pairs = [(model.features_time(f), t) for f, t, k in samples if k == kind and t > 0]
        rel = [p / t - 1 for p, t in pairs]
        per_kind[kind] = float(np.median(rel)) if rel else 0.0
        kept = [(p, t) for p, t in pairs if t <= OUTLIER_RATIO * p]
        per_kind_sum[kind] = float(sum(p for p, _ in kept) / sum(t for _, t in kept) - 1) if kept else 0.0
    return model, dict(samples=q.samples, rmse_s=q.rmse_s, r2=q.r2, median_rel_error=q.median_rel_error,
                       median_signed_rel_error_by_kind=per_kind, total_rel_error_by_kind=per_kind_sum,
                       outliers=q.outliers, balance_kinds=balance_kinds, fit="mean" if mean else "ratio",
                       copy_waits_removed=len(waits), copy_wait_removed_s=float(sum(waits.values())),
                       decode_buckets=len(model.decode_buckets))
