"""Variants: which of the PR's behaviours a run has, as named switches of one code base.

``pr829`` is the pull request as reviewed (all five findings, on the skeleton store);
``fixed`` applies every fix. Each finding can also be switched on alone on top of
``fixed`` (``fixed+F2``), which is how the canaries prove each one is still caught.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from openinfer.errors import ConfigError
from openinfer.kv.config import StoreConfig
from openinfer.scheduler.config import SchedulerSwitches

FINDINGS = {
    "F1": "pinned-hold starvation: holds of deferred requests are never shed",
    "F2": "flush-chain gap: barriers are not chained",
    "F3": "flush without timeout: a stalled barrier withholds Finished forever",
    "F4": "control overtakes a resolving generate: idle ignores resolves in flight",
    "F5": "double-charged pinned pages: admission subtracts pinned_blocks again",
}


@dataclass(frozen=True)
class Variant:
    name: str
    f1_no_shedding: bool = False
    f2_unchained_flush: bool = False
    f3_unbounded_flush: bool = False
    f4_idle_ignores_resolves: bool = False
    f5_double_charge: bool = False
    skeleton_store: bool = False   # the #825 store: no guarded query, no truncation, untracked loads
    flush_deadline_s: float = 5.0

    def store_config(self, **overrides: object) -> StoreConfig:
        base = StoreConfig.pr829() if self.skeleton_store else StoreConfig()
        base = replace(base, chain_flushes=not self.f2_unchained_flush,
                       flush_deadline_s=None if self.f3_unbounded_flush else self.flush_deadline_s)
        return replace(base, **overrides)  # type: ignore[arg-type]

    def scheduler_switches(self) -> SchedulerSwitches:
        return SchedulerSwitches(shed_holds_on_defer=not self.f1_no_shedding,
                                 idle_requires_no_resolves=not self.f4_idle_ignores_resolves,
                                 subtract_pinned=self.f5_double_charge)

    def with_finding(self, finding: str) -> Variant:
        field_name = _FINDING_FIELDS.get(finding)
        if field_name is None:
            raise ConfigError("finding", finding, f"one of {', '.join(FINDINGS)}")
        return replace(self, name=f"{self.name}+{finding}", **{field_name: True})


_FINDING_FIELDS = {"F1": "f1_no_shedding", "F2": "f2_unchained_flush", "F3": "f3_unbounded_flush",
                   "F4": "f4_idle_ignores_resolves", "F5": "f5_double_charge"}

VARIANTS = {
    "fixed": Variant("fixed"),
    "pr829": Variant("pr829", True, True, True, True, True, skeleton_store=True),
}


def variant(name: str) -> Variant:
    """``fixed``, ``pr829``, or ``fixed+F1`` style (one or more findings on top of fixed)."""
    base, *extra = name.split("+")
    if base not in VARIANTS:
        raise ConfigError("variant", name, "fixed, pr829, or fixed+F<n>[+F<m>...]")
    v = VARIANTS[base]
    for finding in extra:
        v = v.with_finding(finding)
    return v
