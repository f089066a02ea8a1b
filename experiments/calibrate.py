"""Fit the simulator's step-time and copy models to the real executor's timings.

    python -m experiments.calibrate steps=results/gpu/steps_fit.jsonl \
        validate_report=results/gpu/validate_h200_full.json model=qwen3-4b \
        [copies=PATH] [target=wall_s|gpu_s] [out=conf/profiles/NAME.yaml]

``steps`` (comma-separated for several files) are the JSONL timing records
``experiments.validate`` wrote; copy records may sit in the same files or in ``copies``.
The GPU name and date come from the validate report (so a profile names the run it
stands on), or from ``gpu=`` / ``date=``. Prints the fit quality and writes the profile;
``experiments.fidelity`` and ``experiments.simulate profile=PATH`` run on it.

Besides the step and copy coefficients it measures whether a step holds the engine's host
thread (``sim.calibration.host_hold``: are copies that land during a step seen before it
ends?); a profile that says so makes the simulator defer everything that falls due during
a step to its end (``sim.host_thread``), as the real engine does. It also fits the host's
work between back-to-back steps (``sim.calibration.fit_host_gaps``: a base, more around a
step with prompt tokens, per decode row, per copy submitted) and whether a step waits for
a copy in flight when it starts (``sim.calibration.copy_wait``, per direction); the wait a
step spent on such a copy is taken off its measured time before the step fit, since the
simulator adds it itself; and whether a copy submitted during a step starts only when that
step ends (``sim.calibration.copy_order``: the CUDA executor orders its copy streams after
the compute stream), which the profile passes on as ``world.copies_after_step``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from experiments.cli import comma_list, main_guard, parse_overrides
from openinfer.errors import ConfigError, require
from sim.calibration import (COPY_DIRECTIONS, OUTLIER_RATIO, copy_wait, fit_copies, fit_host_gaps, fit_steps, host_gap_s,
                             copy_order, host_hold, read_jsonl)
from sim.hardware import preset as hardware_preset
from sim.profile import FittedProfile

TARGETS = ("wall_s", "gpu_s")


@dataclass
class CalibrateConfig:
    steps: str = ""
    model: str = ""
    copies: str | None = None
    validate_report: str | None = None
    gpu: str | None = None
    date: str | None = None
    base_hardware: str = "h200"
    target: str = "wall_s"
    copy_target: str = "gpu_s"
    balance_kinds: bool = True
    mean_fit: bool = True                   # fit mean step durations (false: the ratio, the old fit)
    decode_buckets: bool = True             # a cost per measured decode batch (false: one slope over rows)
    name: str | None = None
    out: str | None = None

    def __post_init__(self) -> None:
        require(bool(self.steps), "steps", self.steps, "one or more JSONL files of step timings, comma-separated")
        require(bool(self.model), "model", self.model, "the model geometry the timings were measured on "
                "(e.g. qwen3-0.6b)")
        require(self.target in TARGETS, "target", self.target, f"one of {', '.join(TARGETS)}")
        require(self.copy_target in TARGETS, "copy_target", self.copy_target, f"one of {', '.join(TARGETS)}")
        # what a profile is built on, checked before the fit writes one nothing could load
        try:
            hardware_preset(self.base_hardware)
        except ConfigError as err:
            raise ConfigError("base_hardware", err.value, err.accepted) from None
        require(self.date is None or re.fullmatch(r"\d{4}-\d{2}-\d{2}", self.date) is not None, "date",
                self.date, "YYYY-MM-DD (the day the timings were measured)")


def _gpu_and_date(cfg: CalibrateConfig) -> tuple[str, str]:
    gpu, date = cfg.gpu, cfg.date
    if cfg.validate_report:
        try:
            rep = json.loads(Path(cfg.validate_report).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError("validate_report", cfg.validate_report, f"a readable validate report ({err})") from None
        env = rep.get("environment", rep)
        gpu = gpu or env.get("gpu") or env.get("gpu_name")
        date = date or env.get("date")
    require(bool(gpu), "gpu", gpu, "the GPU name (or validate_report=PATH that records it)")
    require(bool(date), "date", date, "the measurement date YYYY-MM-DD (or validate_report=PATH)")
    return str(gpu), str(date)[:10]


def calibrate(cfg: CalibrateConfig) -> FittedProfile:
    step_files = comma_list(cfg.steps)
    copy_files = comma_list(cfg.copies) if cfg.copies else []
    require(not copy_files or (len(step_files) == 1 and len(copy_files) == 1), "copies", cfg.copies,
            "one file beside one steps file (copies are matched to steps by run, on one clock); "
            "for several captures leave copies= out: validate writes each capture's copies into its steps files")
    records = read_jsonl(step_files)
    copy_records = read_jsonl(copy_files) if copy_files else records
    gpu, date = _gpu_and_date(cfg)
    timed = records if not cfg.copies else [*records, *copy_records]
    waits = {d: copy_wait(timed, d) for d in COPY_DIRECTIONS}
    wait_for = tuple(d for d, w in waits.items() if w.waits)
    step_model, step_quality = fit_steps(timed, cfg.target, cfg.balance_kinds, cfg.mean_fit, wait_for=wait_for,
                                         decode_buckets=cfg.decode_buckets)
    median_gap, gaps = host_gap_s(records, cfg.target)
    gap_fit = fit_host_gaps(timed, cfg.target)
    links = fit_copies(copy_records, cfg.copy_target)
    hold = host_hold(timed)
    order = copy_order(timed, hold.holds)
    slug = gpu.lower().replace("nvidia", "").strip().replace(" ", "-")
    name = cfg.name or f"{slug}_{cfg.model}"
    return FittedProfile(
        name=name, gpu=gpu, date=date, model=cfg.model, base_hardware=cfg.base_hardware,
        step_model=step_model, d2h=links.d2h, h2d=links.h2d,
        host_overhead_s=gap_fit.base if gap_fit.samples else median_gap,
        host_holds_steps=hold.holds,
        host_gap=dict(after_eager=gap_fit.after_eager, before_eager=gap_fit.before_eager,
                      per_row=gap_fit.per_row, per_copy=gap_fit.per_copy) if gap_fit.samples else {},
        steps_wait_for=wait_for,
        copies_after_step=order.after_step,
        quality=dict(copy_order=order.as_dict(), steps=step_quality, host_gaps=gaps, median_host_gap_s=median_gap, host_gap_fit=gap_fit.as_dict(),
                     host_hold=hold.as_dict(), copy_wait={d: w.as_dict() for d, w in waits.items()}),
        source=dict(steps=step_files, copies=cfg.copies, target=cfg.target, copy_target=cfg.copy_target,
                    validate_report=cfg.validate_report))


def print_profile(p: FittedProfile, path: Path) -> None:
    q = p.quality["steps"]
    print(f"calibrate: {p.gpu} / {p.model} ({p.date}) -> {path}")
    print(f"  steps   {q['samples']} samples  R² {q['r2']:.4f}  median |rel err| {q['median_rel_error']:.2%}  "
          f"rmse {q['rmse_s'] * 1e3:.3f} ms")
    print(f"  {q.get('fit', 'ratio')} fit; median signed error by kind: " + "  ".join(
        f"{k} {v:+.1%}" for k, v in q["median_signed_rel_error_by_kind"].items()))
    if "total_rel_error_by_kind" in q:
        print("  error of each kind's total time: " + "  ".join(
            f"{k} {v:+.1%}" for k, v in q["total_rel_error_by_kind"].items())
            + f"  ({q.get('outliers', 0)} steps over {OUTLIER_RATIO:g}x their prediction left out: JIT compiles)")
    coef = p.step_model.coefficients()
    print("  step    " + "  ".join(f"{k}={v:.3g}" for k, v in coef.items()))
    if p.step_model.decode_buckets:
        print("  decode batch costs (ms, besides the intercept and context): " + "  ".join(
            f"{b}:{c * 1e3:.3f}" for b, c in p.step_model.decode_buckets.items()))
    g = p.host_gap
    gf = p.quality.get("host_gap_fit") or {}
    print(f"  host gap between back-to-back steps {p.host_overhead_s * 1e3:.3f} ms"
          + (f" + {g.get('after_eager', 0) * 1e3:.3f} after / {g.get('before_eager', 0) * 1e3:.3f} before a step "
             f"with prompt tokens + {g.get('per_row', 0) * 1e6:.1f} µs per decode row + "
             f"{g.get('per_copy', 0) * 1e3:.3f} ms per copy submitted ({gf.get('samples', 0)} gaps; "
             f"{gf.get('left_out', 0)} over 3 ms left out)" if g else f" ({p.quality['host_gaps']} gaps)"))
    for d, w in (p.quality.get("copy_wait") or {}).items():
        print(f"  {d} in flight at a step's start: {'the step waits for it' if w['waits'] else 'overlapped'} "
              f"({w['samples']} steps, {w['slope']:+.2f} s of extra step time per s of copy left, "
              f"mean {w['mean_wait_s'] * 1e3:.3f} ms left)")
    if q.get("copy_waits_removed"):
        print(f"  step fit: {q['copy_waits_removed']} steps' copy waits ({q['copy_wait_removed_s'] * 1e3:.1f} ms) "
              "taken off their measured time (the simulator adds them)")
    h = p.quality.get("host_hold") or {}
    print(f"  host    a step {'holds' if p.host_holds_steps else 'does not hold'} the host thread: "
          f"{h.get('seen_inside', 0)} of {h.get('due_inside', 0)} copies that landed inside a step were seen "
          "before it ended")
    o = p.quality.get("copy_order") or {}
    print(f"  copies  {'start when the step in flight ends' if p.copies_after_step else 'start when submitted'}: "
          f"{o.get('seen_after_it', 0)} of {o.get('submitted_mid_step', 0)} copies submitted during a step (DMA "
          "short enough to land inside it) were seen only after it ended")
    for d in ("d2h", "h2d"):
        link = getattr(p, d)
        if link is not None:
            print(f"  {d}     {link.gib_s:.2f} GiB/s + {link.latency_s * 1e6:.1f} µs per copy "
                  f"({link.samples} copies, median |rel err| {link.median_rel_error:.2%})")
        else:
            print(f"  {d}     no copy records: the base preset's link is kept")


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(CalibrateConfig, argv)
    profile = calibrate(cfg)
    path = Path(cfg.out or f"conf/profiles/{profile.name}.yaml")
    profile.save(path)
    print_profile(profile, path)


if __name__ == "__main__":
    main()
