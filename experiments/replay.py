"""Replay one scenario (as the hunter wrote it) and print its timeline and verdict.

    python -m experiments.replay scenario=PATH [variant=NAME]

``variant`` re-runs the same scenario under another variant (e.g. ``fixed``) to show the
violation is the variant's. Exit status 1 when an invariant is violated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from experiments.cli import main_guard, parse_overrides
from openinfer.errors import ConfigError
from sim.hunt.runner import run_scenario
from sim.hunt.scenario import Scenario


@dataclass
class ReplayConfig:
    scenario: str = ""
    variant: str | None = None


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(ReplayConfig, argv)
    path = Path(cfg.scenario)
    if not path.is_file():
        raise ConfigError("scenario", cfg.scenario, "the path of a scenario JSON file written by experiments.hunt")
    try:
        sc = Scenario.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError, AttributeError) as err:   # JSONDecodeError is a ValueError
        # exit 1 means "an invariant was violated": a file that is not a scenario is exit 2
        raise ConfigError("scenario", cfg.scenario, "a scenario file from experiments.hunt's "
                          f"scenarios_dir, not its report or another JSON ({err})") from None
    if cfg.variant:
        sc.variant = cfg.variant
    result = run_scenario(sc)
    for t, text in result.timeline:
        print(f"{t:9.4f}s {text}")
    print(f"variant={sc.variant} seed={sc.seed}: {result.events} events, {result.sim_events} simulation events")
    if result.violation is not None:
        print(f"VIOLATION {result.violation}")
        raise SystemExit(1)
    print("no invariant violated")


if __name__ == "__main__":
    main()
