"""Variants: which known bugs a run has, as named switches of one code base.

``pr829`` is the pull request as reviewed: the five findings F1–F5, on the skeleton
kv-store it was built on (H1, H4, G7, HC), with H9. ``fixed`` has none.
Any bug can be planted alone on top of ``fixed`` (``fixed+F2``, ``fixed+H16``), which is
how the canaries prove that each bug family is still caught.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from openinfer.errors import ConfigError
from openinfer.kv.config import StoreConfig
from openinfer.scheduler.config import SchedulerSwitches

BUGS: dict[str, str] = {
    "F1": "pinned-hold starvation: holds of deferred requests are never shed",
    "F2": "flush-chain gap: barriers are not chained",
    "F3": "flush without timeout: a stalled barrier withholds Finished forever",
    "F4": "control overtakes a resolving generate: idle ignores resolves in flight",
    "F5": "double-charged pinned pages: admission subtracts pinned_blocks again",
    "H1": "no entitlement floor: a restore reservation takes an admitted request's next page",
    "H4": "untracked restores: teardown cannot drain a DMA still writing the arena",
    "H9": "KV-ready advertised after a failed save or dropped registration, unmarked",
    "H13": "load snapshot ignores resolves in flight: a resolving rank looks idle",
    "H16": "a rejected request keeps its prefix hold: pinned pages leak",
    "G7": "unguarded query: a lease answered after the deadline is never released",
    "G9": "cancellation does not reach inside the resolve: it keeps waiting and drawing pages",
    "C1": "batched controls: every pending control applies before generates that arrived between them",
    "S1": "a failed prefill-only step clears active: decoding requests vanish without an answer",
    "P1": "a resolve probe pins inactive blocks past the entitlement floor of admitted requests",
    "D1": "a restore that lost a registration race holds a private duplicate the first chunk never matches",
    "HC": "hold/credit off-by-one: an aligned, fully cached prompt's hold pins one block it is not credited",
}

PR829_BUGS = frozenset({"F1", "F2", "F3", "F4", "F5", "H1", "H4", "H9", "G7", "HC", "C1", "S1", "P1", "D1"})


@dataclass(frozen=True)
class Variant:
    name: str
    bugs: frozenset[str] = frozenset()
    flush_deadline_s: float = 5.0

    def has(self, bug: str) -> bool:
        return bug in self.bugs

    @property
    def pool_entitlement(self) -> bool:
        """The in-pool entitlement floor (HEAD kv-store); the skeleton has none (H1)."""
        return not self.has("H1")

    def store_config(self, **overrides: object) -> StoreConfig:
        base = StoreConfig(
            chain_flushes=not self.has("F2"),
            flush_deadline_s=None if self.has("F3") else self.flush_deadline_s,
            release_late_leases=not self.has("G7"),
            truncate_holds=not self.has("HC"),
            track_loads=not self.has("H4"),
            observe_cancel=not self.has("G9"),
            probe_respects_floor=not self.has("P1"),
            commit_dedupes=not self.has("D1"),
        )
        return replace(base, **overrides)  # type: ignore[arg-type]

    def scheduler_switches(self) -> SchedulerSwitches:
        return SchedulerSwitches(shed_holds_on_defer=not self.has("F1"),
                                 idle_requires_no_resolves=not self.has("F4"),
                                 subtract_pinned=self.has("F5"),
                                 mark_degraded_kv_ready=not self.has("H9"),
                                 snapshot_counts_resolves=not self.has("H13"),
                                 reject_drops_hold=not self.has("H16"),
                                 controls_in_arrival_order=not self.has("C1"),
                                 failed_prefill_keeps_decodes=not self.has("S1"))

    def with_bug(self, bug: str) -> Variant:
        if bug not in BUGS:
            raise ConfigError("bug", bug, f"one of {', '.join(BUGS)}")
        return replace(self, name=f"{self.name}+{bug}", bugs=self.bugs | {bug})


VARIANTS = {
    "fixed": Variant("fixed"),
    "pr829": Variant("pr829", PR829_BUGS),
}


def variant(name: str) -> Variant:
    """``fixed``, ``pr829``, or ``fixed+F1[+H16...]`` (bugs planted on top of a base).
    ``_`` may stand for ``+`` (``fixed_F2``): a Hydra preset's file name cannot hold a ``+``,
    and one spelling should work in every command."""
    base, *extra = name.replace("_", "+").split("+")
    if base not in VARIANTS:
        raise ConfigError("variant", name, f"fixed, pr829, or fixed+<bug>[+<bug>...] with bugs {', '.join(BUGS)}")
    v = VARIANTS[base]
    for bug in extra:
        v = v.with_bug(bug)
    return v
