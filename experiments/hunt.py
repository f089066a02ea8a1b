"""The bug hunter: explore small random runs within a time budget, check every run with
the generic monitors, shrink the first failure of each invariant, report them.

    python -m experiments.hunt variant=pr829 budget_s=60 report=PATH

The report groups failures by invariant: how many runs violated it, when it was first
found, and the shrunk run (its scenario file, event count, readable timeline and the
command that replays it). ``variant=fixed`` must report nothing.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.cli import comma_list, main_guard, parse_overrides, write_report
from openinfer.errors import require
from openinfer.variants import variant as parse_variant
from sim.hunt.runner import RunResult, run_scenario
from sim.hunt.scenario import random_scenario
from sim.hunt.shrink import shrink
from sim.monitors import INVARIANTS


@dataclass
class HuntConfig:
    variant: str = "pr829"
    budget_s: float = 60.0
    seed: int = 0
    max_runs: int = 0             # 0: as many as the budget allows
    shrink_attempts: int = 300
    until_found: str = ""         # comma-separated invariants: stop once all are found
    report: str | None = None
    scenarios_dir: str | None = None
    quiet: bool = False

    def __post_init__(self) -> None:
        parse_variant(self.variant)  # a clear error for a bad variant name, before any run
        require(self.budget_s > 0, "budget_s", self.budget_s, "a number of seconds > 0")
        require(self.max_runs >= 0, "max_runs", self.max_runs, "an int >= 0 (0 = no limit)")
        require(self.shrink_attempts >= 0, "shrink_attempts", self.shrink_attempts,
                "an int >= 0 (0 = report each finding unshrunk)")
        unknown = [i for i in self.wanted() if i not in INVARIANTS]
        require(not unknown, "until_found", self.until_found, f"invariants among {', '.join(INVARIANTS)}")

    def wanted(self) -> list[str]:
        return comma_list(self.until_found)


def scenario_seed(master: int, index: int) -> int:
    return master * 1_000_003 + index


def hunt(cfg: HuntConfig) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    t0 = time.perf_counter()
    found: dict[str, dict[str, Any]] = {}
    runs = 0
    sim_events = 0
    out_dir = Path(cfg.scenarios_dir or (Path(cfg.report).with_suffix("") if cfg.report else "outputs/hunt"))
    while time.perf_counter() - t0 < cfg.budget_s and (cfg.max_runs == 0 or runs < cfg.max_runs):
        sc = random_scenario(rng, scenario_seed(cfg.seed, runs), cfg.variant)
        runs += 1
        result = run_scenario(sc)
        sim_events += result.sim_events
        name = result.invariant
        if name is None:
            continue
        if name in found:
            found[name]["count"] += 1
            continue
        found_s = time.perf_counter() - t0
        small, attempts = shrink(result, cfg.shrink_attempts)
        found[name] = _entry(small, result, found_s, runs, attempts, time.perf_counter() - t0, out_dir)
        if not cfg.quiet:
            print(f"[{found_s:6.2f}s] {name}: run {runs}, shrunk to {small.events} events "
                  f"in {attempts} attempts -> {found[name]['replay']}", flush=True)
        if cfg.wanted() and all(w in found for w in cfg.wanted()):
            break
    elapsed = time.perf_counter() - t0
    return dict(variant=cfg.variant, seed=cfg.seed, budget_s=cfg.budget_s, runs=runs,
                elapsed_s=round(elapsed, 3), runs_per_s=round(runs / elapsed, 1) if elapsed else None,
                sim_events=sim_events, invariants_checked=list(INVARIANTS),
                violations=dict(sorted(found.items())))


def _entry(small: RunResult, first: RunResult, found_s: float, runs: int, attempts: int,
           reported_s: float, out_dir: Path) -> dict[str, Any]:
    assert small.violation is not None and first.violation is not None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{small.violation.name}.json"
    path.write_text(small.scenario.to_json() + "\n")
    return dict(
        count=1, found_after_s=round(found_s, 3), reported_after_s=round(reported_s, 3),
        runs_to_find=runs, seed=first.scenario.seed, detail=small.violation.detail,
        first_detail=first.violation.detail, first_events=first.events, events=small.events,
        sim_events=small.sim_events, shrink_attempts=attempts, scenario_file=str(path),
        replay=f"python -m experiments.replay scenario={path}",
        timeline=[f"{t:9.4f}s {text}" for t, text in small.timeline] + [f"VIOLATION {small.violation}"],
        config=dict(requests=len(small.scenario.requests), faults=[f.describe() for f in small.scenario.faults],
                    num_blocks=small.scenario.num_blocks, block_size=small.scenario.block_size,
                    role=small.scenario.role, order=small.scenario.order))


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(HuntConfig, argv)
    report = hunt(cfg)
    print(f"hunt variant={cfg.variant} seed={cfg.seed}: {report['runs']} runs in {report['elapsed_s']} s "
          f"({report['runs_per_s']} runs/s); {len(report['violations'])} invariant(s) violated")
    for name, v in report["violations"].items():
        print(f"  {name}: {v['count']} run(s); first after {v['found_after_s']} s (run {v['runs_to_find']}); "
              f"shrunk to {v['events']} events\n    {v['detail']}\n    replay: {v['replay']}")
    write_report(cfg.report, report)


if __name__ == "__main__":
    main()
