"""Calibration from timing records: the fit recovers what generated the timings, the
profile round-trips through its YAML file, and bad inputs name their field."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from experiments.calibrate import CalibrateConfig, calibrate
from openinfer.errors import ConfigError
from sim.arrivals import ArrivalSpec
from sim.calibrated_step_model import CalibratedStepModel
from sim.calibration import copy_order, features_of, fit_copies, fit_steps, host_gap_s, host_hold, read_jsonl
from sim.lengths import LengthDist
from sim.profile import FittedProfile, LinkFit
from sim.step_features import padded_batch
from sim.workload_spec import workload_from_dict
from sim.workloads import ChatWorkload, RandomWorkload, SyntheticWorkload

TRUE = CalibratedStepModel(intercept=1.8e-3, eager_step=2.5e-3, prefill_tokens=35e-6, prefill_attn_pairs=2e-10,
                           decode_rows_padded=25e-6, decode_context_tokens=3e-8)
GAP_S = 0.4e-3
D2H_GIB_S, H2D_GIB_S, LAT_S = 18.0, 22.0, 15e-6


def step_records(n: int = 400, seed: int = 5) -> list[dict]:
    """Records in the CudaExecutor's StepTiming layout, timed by TRUE, back to back."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        prefill = []
        if rng.random() < 0.4:
            prefill = [[rng.choice([0, 512, 2048]), rng.randint(16, 1024), True, False]]
        rows = rng.randint(0 if prefill else 1, 64)
        positions = [rng.randint(16, 4000) for _ in range(rows)]
        kind = "decode" if not prefill else ("unified" if rows else "prefill")
        rec = dict(step=i + 1, kind=kind, started_at=t, prefill_tokens=sum(p[1] for p in prefill),
                   prefill=prefill, decode_positions=positions, decode_rows=rows,
                   decode_rows_padded=padded_batch(rows) if kind == "decode" else rows,
                   graph=kind == "decode", gpu_s=None, wall_s=0.0, error=None)
        rec["wall_s"] = TRUE.features_time(features_of(rec)) * (1 + rng.gauss(0, 0.01))
        t += rec["wall_s"] + GAP_S
        out.append(rec)
    return out


def copy_records() -> list[dict]:
    out = []
    for i, pages in enumerate([1, 2, 4, 8, 16, 32, 64] * 3):
        for d, bw in (("d2h", D2H_GIB_S), ("h2d", H2D_GIB_S)):
            b = pages * 2 ** 21
            out.append(dict(index=i, dir=d, pages=pages, runs=1, bytes=b, submitted_at=0.0,
                            wall_s=LAT_S + b / (bw * 2 ** 30), gpu_s=None))
    return out


def test_fit_recovers_step_coefficients_host_gap_and_links() -> None:
    recs = step_records()
    model, quality = fit_steps(recs)
    for k, v in TRUE.coefficients().items():
        assert model.coefficients()[k] == pytest.approx(v, rel=0.15, abs=2e-5), k
    assert quality["median_rel_error"] < 0.02
    gap, n = host_gap_s(recs)
    assert gap == pytest.approx(GAP_S, rel=1e-6) and n == len(recs) - 1
    links = fit_copies(copy_records())
    assert links.d2h.gib_s == pytest.approx(D2H_GIB_S, rel=1e-6)
    assert links.h2d.gib_s == pytest.approx(H2D_GIB_S, rel=1e-6)
    assert links.d2h.latency_s == pytest.approx(LAT_S, rel=1e-4)


def test_calibrate_writes_a_profile_that_drives_the_simulator(tmp_path) -> None:
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps(r) + "\n" for r in step_records() + copy_records()))
    report = tmp_path / "validate.json"
    report.write_text(json.dumps({"environment": {"gpu": "NVIDIA H200", "date": "2026-12-03T01:00:00"}}))
    p = calibrate(CalibrateConfig(steps=str(steps), model="qwen3-0.6b", validate_report=str(report)))
    assert (p.gpu, p.date, p.name) == ("NVIDIA H200", "2026-12-03", "h200_qwen3-0.6b")
    path = p.save(tmp_path / "prof.yaml")
    back = FittedProfile.load(path)
    assert back == p
    hw = back.hardware()
    assert (hw.d2h_gib_s, hw.h2d_gib_s) == pytest.approx((D2H_GIB_S, H2D_GIB_S), rel=1e-6)
    assert hw.step_overhead_s == 0.0  # the intercept carries the fixed cost, once
    sm = back.step_time_model()
    assert sm.intercept == pytest.approx(p.step_model.intercept + GAP_S)
    back.check_model("qwen3-0.6b")
    with pytest.raises(ConfigError, match="profile.model"):
        back.check_model("qwen3-4b")


def test_profile_and_records_reject_bad_input_by_name(tmp_path) -> None:
    with pytest.raises(ConfigError, match="profile.slope"):
        FittedProfile.from_dict(dict(name="x", gpu="g", date="d", model="m", slope=1))
    with pytest.raises(ConfigError, match="profile.copies.gib_s"):
        LinkFit(gib_s=0.0, latency_s=0.0)
    with pytest.raises(ConfigError, match="step record"):
        features_of({"kind": "decode"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        calibrate(CalibrateConfig(steps=str(bad), model="m", gpu="g", date="2026-12-01"))
    # what the profile would be built on is checked before any fit writes one
    with pytest.raises(ConfigError, match="base_hardware"):
        CalibrateConfig(steps="s.jsonl", model="m", base_hardware="h900")
    with pytest.raises(ConfigError, match="date"):
        CalibrateConfig(steps="s.jsonl", model="m", date="yesterday")


def test_calibrate_cli_names_a_bad_key_and_exits_2() -> None:
    out = subprocess.run([sys.executable, "-m", "experiments.calibrate", "steps=x", "model=m", "target=cpu_s"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "target" in out.stderr and "wall_s" in out.stderr


@pytest.mark.parametrize("workload", [
    RandomWorkload(num_requests=7, input_len=300, output_len=20, range_ratio=0.2, prefix_len=64,
                   arrival=ArrivalSpec(5.0, "gamma", 2.0)),
    SyntheticWorkload(num_requests=3, input=LengthDist.uniform(10, 90), output=LengthDist.lognormal(50, 0.3),
                      shared_prefix_len=16),
    ChatWorkload(num_sessions=2, turns=LengthDist.fixed(3), user_len=LengthDist.fixed(40),
                 arrival=ArrivalSpec(math.inf), max_requests=5),
])
def test_a_described_workload_rebuilds_the_same_workload(workload) -> None:
    d = json.loads(json.dumps(workload.describe()).replace("Infinity", '"inf"'))  # a strict-JSON report
    assert workload_from_dict(d) == workload


def test_workload_from_dict_names_unknown_fields() -> None:
    with pytest.raises(ConfigError, match="workload.qps"):
        workload_from_dict(dict(kind="random", qps=3))
    with pytest.raises(ConfigError, match="workload.kind"):
        workload_from_dict(dict(kind="trace"))


def _served_run(held: bool, n: int = 60, seed: int = 3) -> list[dict]:
    """Back-to-back 5 ms steps and copies submitted between them whose DMA ends 1 ms into
    the next step; the poller sees a copy done at once (free host) or after the step (held)."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        out.append(dict(type="step", run="served:x", kind="decode", t_start_s=t, wall_s=5e-3,
                        decode_positions=[100], decode_rows_padded=1))
        sub = t - 1e-4
        gpu = 1e-3 + 1e-4 + rng.uniform(0, 1e-4)
        seen = gpu + 2e-5 if not held else (t + 5e-3 - sub) + 3e-5
        out.append(dict(type="copy", run="served:x", dir="d2h", pages=1, bytes=2 ** 21, submitted_at=sub,
                        gpu_s=gpu, wall_s=seen))
        t += 5e-3 + 2e-4
    return out


@pytest.mark.parametrize("held", [True, False])
def test_host_hold_is_read_from_when_copies_are_seen_done(held: bool, tmp_path) -> None:
    recs = _served_run(held)
    got = host_hold(recs)
    assert got.holds is held and got.due_inside == 60 and got.seen_inside == (0 if held else 60)
    path = tmp_path / "served.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs + step_records(60)))
    p = calibrate(CalibrateConfig(steps=str(path), model="qwen3-0.6b", gpu="g", date="2026-12-03"))
    assert p.host_holds_steps is held
    assert FittedProfile.load(p.save(tmp_path / "p.yaml")).host_holds_steps is held
    assert host_hold(step_records(60)).holds is False  # no copy evidence: the free host is kept


def _restores_mid_step(ordered: bool, n: int = 30) -> list[dict]:
    """Free-host 5 ms steps, each with a 0.3 ms H2D submitted 1 ms in: seen done 0.3 ms
    later (the copy ran at once) or just after the step ended (ordered after it)."""
    out = []
    for i in range(n):
        t = i * 5.2e-3
        out.append(dict(type="step", run="served:x", kind="decode", t_start_s=t, wall_s=5e-3,
                        decode_positions=[100], decode_rows_padded=1))
        sub = t + 1e-3
        seen = (t + 5e-3 + 3e-4 + 2e-5 - sub) if ordered else 3e-4 + 2e-5
        out.append(dict(type="copy", run="served:x", dir="h2d", pages=1, bytes=2 ** 21, submitted_at=sub,
                        gpu_s=3e-4, wall_s=seen))
    return out


@pytest.mark.parametrize("ordered", [True, False])
def test_copy_order_is_read_from_when_mid_step_copies_are_seen(ordered: bool, tmp_path) -> None:
    """A copy submitted during a step that is seen done only after the step, though its DMA
    was short, was ordered after the step: the profile says so and the world follows it."""
    recs = _restores_mid_step(ordered)
    got = copy_order(recs, host_holds=False)
    assert got.after_step is ordered and got.submitted_mid_step == 30 and got.seen_after_it == (30 if ordered else 0)
    assert copy_order(recs, host_holds=True).after_step is False   # a held host sees them late anyway
    assert host_hold(recs).due_inside == 0     # mid-step submissions are no evidence of a held host
    path = tmp_path / "served.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs + step_records(60)))
    p = calibrate(CalibrateConfig(steps=str(path), model="qwen3-0.6b", gpu="g", date="2026-12-04"))
    assert p.copies_after_step is ordered
    again = FittedProfile.load(p.save(tmp_path / "p.yaml"))
    assert again.copies_after_step is ordered
    from sim.world import WorldConfig
    world = again.world(WorldConfig(model="qwen3-0.6b", num_blocks=64, host_tier_gib=0.1))
    assert world.config.copies_after_step is ordered and (world.transfer.after_compute is not None) is ordered


def test_captures_read_together_keep_their_runs_apart(tmp_path) -> None:
    """Two captures of one workload both have a run ``served:x`` on clocks that overlap;
    read together, each record's run names its file, so the per-run analyses do not
    interleave one capture's steps with the other's."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in _restores_mid_step(True)))
    shifted = [dict(r, **{k: r[k] + 2.6e-3 for k in ("t_start_s", "submitted_at") if k in r})
               for r in _restores_mid_step(True)]
    b.write_text("".join(json.dumps(r) + "\n" for r in shifted))
    both = read_jsonl([a, b])
    assert {r["run"] for r in both} == {f"{a}#served:x", f"{b}#served:x"}
    got = copy_order(both, host_holds=False)
    assert got.after_step and got.submitted_mid_step == 60 and got.seen_after_it == 60
    assert read_jsonl([a])[0]["run"] == "served:x"          # one file: the names stay as written


def test_decode_batch_costs_come_from_the_served_steps_not_the_grid(tmp_path) -> None:
    """The step grid runs each step alone, faster than the same batch served; the line may
    learn shapes from it, but the per-batch decode costs the simulator charges a served
    instance are the served steps' own."""
    served = [dict(r, source="served:fit") for r in step_records(600)]
    grid = [dict(r, source="grid", wall_s=r["wall_s"] * 0.8) for r in step_records(300, seed=9)]
    model, q = fit_steps(served + grid)
    assert q["decode_buckets"] == len(model.decode_buckets) > 0

    def level(recs: list[dict]) -> float:
        dec = [r for r in recs if r["kind"] == "decode" and r["decode_rows_padded"] in model.decode_buckets]
        return sum(model.features_time(features_of(r)) for r in dec) / sum(r["wall_s"] for r in dec)
    assert level(served) == pytest.approx(1.0, abs=0.01)
    assert level(grid) == pytest.approx(1 / 0.8, abs=0.03)
    line, _ = fit_steps(served + grid, decode_buckets=False)
    assert not line.decode_buckets
    from sim.profile import FittedProfile
    path = FittedProfile("t", "g", "2026-12-04", "qwen3-0.6b", step_model=model).save(tmp_path / "p.yaml")
    assert FittedProfile.load(path).step_model == model       # the table survives the YAML


def test_a_compressed_capture_reads_as_its_plain_file(tmp_path) -> None:
    import gzip
    plain, packed = tmp_path / "s.jsonl", tmp_path / "s.jsonl.gz"
    text = "".join(json.dumps(r) + "\n" for r in _restores_mid_step(True))
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_jsonl([packed]) == read_jsonl([plain])
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    body = bytearray(packed.read_bytes())
    body[12:40] = bytes(28)                                    # a gzip header, a broken stream
    (tmp_path / "broken.gz").write_bytes(bytes(body))
    for bad in ("bad.gz", "broken.gz"):
        with pytest.raises(ConfigError, match=bad):
            read_jsonl([tmp_path / bad])


def test_separate_copies_need_one_steps_file(tmp_path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in step_records(60)))
    with pytest.raises(ConfigError, match="copies"):
        calibrate(CalibrateConfig(steps=f"{path},{path}", copies=str(path), model="qwen3-0.6b", gpu="g",
                                  date="2026-12-04"))


def _steps_before_prefill(held: bool, case: str) -> int:
    """Steps the engine runs between a request's arrival and the step that computes its
    prompt, while another request keeps it decoding, on a profile whose host is held or free.
    ``case``: the prefix is in the GPU radix ("gpu"), or misses the CPU tier after a GPU hit
    ("miss"), or was evicted to the CPU tier and is restored ("restore")."""
    from openinfer.scheduler.request import GenerateRequest, SamplingParams
    from sim.world import WorldConfig
    prof = FittedProfile(name="t", gpu="g", date="d", model="qwen3-0.6b",
                         step_model=CalibratedStepModel(intercept=4e-3, eager_step=8e-3),
                         d2h=LinkFit(50.0, 3e-5), h2d=LinkFit(48.0, 6e-5), host_holds_steps=held)
    w = prof.world(WorldConfig(model="qwen3-0.6b", num_blocks=512, host_tier_gib=1.0, transfer="queued",
                               monitors=False))
    rt, eng = w.rt, w.engine
    starts: list[tuple[float, list[int]]] = []
    eng.observers.append(lambda k, d: starts.append((rt.now(), [r.req_id for r in d["plan"].prefill]))
                         if k == "step_start" else None)
    params = SamplingParams(ignore_eos=True)
    prompt = list(range(1, 129))                          # 8 blocks
    first = eng.submit(GenerateRequest(prompt, 2, params))
    rt.run(until=first.done)
    rt.run(until=w.store.settle(0))
    if case == "restore":
        w.pool.evict_inactive()
    eng.submit(GenerateRequest(list(range(500, 540)), 400, params))
    extra = 48 if case == "miss" else 16                  # 48: a full block past the hit is queried

    def later():  # type: ignore[no-untyped-def]
        yield rt.sleep(0.1003)                            # mid-step
        return eng.submit(GenerateRequest(prompt + [7] * extra, 2, params))
    proc = rt.spawn(later())
    rt.run(until=proc)
    req = proc.value
    rt.run(until=req.done)
    after = [s for s in starts if s[0] >= req.submitted_at]
    return next(i for i, s in enumerate(after) if req.req_id in s[1])


@pytest.mark.parametrize("case, held_steps", [("gpu", 1), ("miss", 3), ("restore", 5)])
def test_a_held_host_admits_as_many_steps_late_as_the_h200_did(case: str, held_steps: int) -> None:
    """results/gpu/served_fit.jsonl (H200, busy engine): a GPU-radix hit reached its prefill
    after 1 step (61 of 64 requests), a CPU-tier miss after 3 (36 of 64; 26 after 4), a
    CPU-tier restore after 5 (62 of 64: 2 steps to the H2D submit, 1 in flight, 2 to
    admission). The resolve's hops advance only between steps. A free host admits every
    one of them after 1 step, which is why TTFT came out 20-60% low."""
    assert _steps_before_prefill(True, case) == held_steps
    assert _steps_before_prefill(False, case) == 1


def test_a_held_host_needs_the_queued_transfer() -> None:
    from sim.world import WorldConfig
    prof = FittedProfile(name="t", gpu="g", date="d", model="qwen3-0.6b", host_holds_steps=True)
    with pytest.raises(ConfigError, match="world.transfer"):
        prof.world(WorldConfig(model="qwen3-0.6b", num_blocks=64, transfer="modeled"))
