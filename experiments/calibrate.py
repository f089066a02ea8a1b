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
a step to its end (``sim.host_thread``), as the real engine does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from experiments.cli import main_guard, parse_overrides
from openinfer.errors import ConfigError, require
from sim.calibration import OUTLIER_RATIO, fit_copies, fit_steps, host_gap_s, host_hold, read_jsonl
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
    name: str | None = None
    out: str | None = None

    def __post_init__(self) -> None:
        require(bool(self.steps), "steps", self.steps, "one or more JSONL files of step timings, comma-separated")
        require(bool(self.model), "model", self.model, "the model geometry the timings were measured on "
                "(e.g. qwen3-0.6b)")
        require(self.target in TARGETS, "target", self.target, f"one of {', '.join(TARGETS)}")
        require(self.copy_target in TARGETS, "copy_target", self.copy_target, f"one of {', '.join(TARGETS)}")


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
    step_files = [p for p in cfg.steps.split(",") if p]
    records = read_jsonl(step_files)
    copy_records = read_jsonl([p for p in cfg.copies.split(",") if p]) if cfg.copies else records
    gpu, date = _gpu_and_date(cfg)
    step_model, step_quality = fit_steps(records, cfg.target, cfg.balance_kinds, cfg.mean_fit)
    gap, gaps = host_gap_s(records, cfg.target)
    links = fit_copies(copy_records, cfg.copy_target)
    hold = host_hold(records if not cfg.copies else [*records, *copy_records])
    slug = gpu.lower().replace("nvidia", "").strip().replace(" ", "-")
    name = cfg.name or f"{slug}_{cfg.model}"
    return FittedProfile(
        name=name, gpu=gpu, date=date, model=cfg.model, base_hardware=cfg.base_hardware,
        step_model=step_model, d2h=links.d2h, h2d=links.h2d, host_overhead_s=gap,
        host_holds_steps=hold.holds, quality=dict(steps=step_quality, host_gaps=gaps, host_hold=hold.as_dict()),
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
    print(f"  host gap between back-to-back steps {p.host_overhead_s * 1e3:.3f} ms "
          f"({p.quality['host_gaps']} gaps)")
    h = p.quality.get("host_hold") or {}
    print(f"  host    a step {'holds' if p.host_holds_steps else 'does not hold'} the host thread: "
          f"{h.get('seen_inside', 0)} of {h.get('due_inside', 0)} copies that landed inside a step were seen "
          "before it ended")
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
