"""Time for the hunter to find each review finding, over several master seeds.

    python -m experiments.hunt_bench [variant=pr829] [seeds=5] [budget_s=60] [report=PATH]

For each master seed the hunter runs until every finding's invariant is found (or the
budget ends); prints, per finding, the median wall time to find (shrinking included, as
reported) and the median run count, and the escapes. Then runs ``fixed`` for
``fixed_runs`` runs (10,000 by default) to report its violations and runs per second.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from experiments.cli import main_guard, parse_overrides, write_report
from experiments.hunt import HuntConfig, hunt
from openinfer.errors import require
from openinfer.variants import variant as parse_variant

FINDING_INVARIANTS = {
    "F1": "admission_liveness", "F2": "kv_ready_after_registration", "F3": "bounded_terminal_event",
    "F4": "control_linearizability", "F5": "single_charge_admission",
}


@dataclass
class HuntBenchConfig:
    variant: str = "pr829"
    seeds: int = 5
    budget_s: float = 60.0
    fixed_runs: int = 10_000
    report: str | None = None

    def __post_init__(self) -> None:
        require(self.seeds >= 1, "seeds", self.seeds, "an int >= 1")
        require(self.budget_s > 0, "budget_s", self.budget_s, "a number > 0 (seconds a seed may hunt)")
        require(self.fixed_runs >= 1, "fixed_runs", self.fixed_runs,
                "an int >= 1 (the clean variant's run count; it has no time budget)")
        parse_variant(self.variant)


def _shown(x: float | None) -> str:
    """A median of two times is their mean (3.3945000000000003): printed to 4 significant
    digits; the report keeps the exact value."""
    return "-" if x is None else f"{x:.4g}"


@main_guard
def main(argv: list[str]) -> None:
    cfg = parse_overrides(HuntBenchConfig, argv)
    wanted = ",".join(sorted(set(FINDING_INVARIANTS.values())))
    per: dict[str, list[tuple[float, int]]] = {f: [] for f in FINDING_INVARIANTS}
    escapes: dict[str, int] = {f: 0 for f in FINDING_INVARIANTS}
    for seed in range(cfg.seeds):
        rep = hunt(HuntConfig(variant=cfg.variant, budget_s=cfg.budget_s, seed=seed, until_found=wanted,
                              quiet=True, scenarios_dir=f"outputs/hunt_bench/{seed}"))
        for f, inv in FINDING_INVARIANTS.items():
            v = rep["violations"].get(inv)
            if v is None:
                escapes[f] += 1
            else:
                per[f].append((v["reported_after_s"], v["runs_to_find"]))
        print(f"seed {seed}: {rep['runs']} runs in {rep['elapsed_s']} s", flush=True)
    rows = {}
    print(f"\ntime to find (shrunk and reported), variant={cfg.variant}, {cfg.seeds} master seeds")
    for f, inv in FINDING_INVARIANTS.items():
        times = [t for t, _ in per[f]]
        runs = [r for _, r in per[f]]
        rows[f] = dict(invariant=inv, median_s=statistics.median(times) if times else None,
                       max_s=max(times) if times else None,
                       median_runs=statistics.median(runs) if runs else None, escapes=escapes[f])
        print(f"  {f} {inv:28s} median {_shown(rows[f]['median_s'])} s, "
              f"max {_shown(rows[f]['max_s'])} s, median runs {_shown(rows[f]['median_runs'])}, "
              f"escaped {escapes[f]}/{cfg.seeds}")
    fixed = hunt(HuntConfig(variant="fixed", budget_s=3600, max_runs=cfg.fixed_runs, seed=1000, quiet=True))
    print(f"fixed: {fixed['runs']} runs in {fixed['elapsed_s']} s ({fixed['runs_per_s']} runs/s), "
          f"violations: {sorted(fixed['violations']) or 'none'}")
    write_report(cfg.report, dict(findings=rows, fixed=dict(runs=fixed["runs"], elapsed_s=fixed["elapsed_s"],
                                                            runs_per_s=fixed["runs_per_s"],
                                                            violations=sorted(fixed["violations"]))))


if __name__ == "__main__":
    main()
