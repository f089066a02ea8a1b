"""KvStore settings, including the named switches that reproduce the PR's store bugs.

Each switch is one behaviour of the single implementation in :mod:`openinfer.kv.store`,
named after what it does. ``StoreConfig()`` is the corrected store; the skeleton kv-store
the pull request was built on is ``variant("pr829").store_config()`` (``openinfer.variants``
names which bug turns off which switch, so there is one definition of it).
"""

from __future__ import annotations

from dataclasses import dataclass

from openinfer.errors import require


@dataclass(frozen=True)
class StoreConfig:
    requery_interval_s: float = 0.005
    resolve_deadline_s: float = 15.0
    # F3: bound every flush barrier (predecessor wait + saves + registrations); None = no bound.
    flush_deadline_s: float | None = 5.0
    # F2: each barrier first waits for the previous one, so it covers handles that one drained.
    chain_flushes: bool = True
    # Guarded query: a lease that arrives after the resolve stopped waiting is released.
    release_late_leases: bool = True
    # Hold truncation: the hold pins exactly the blocks admission credits.
    truncate_holds: bool = True
    # Restores are tracked so flush_loads can drain them before arenas are freed.
    track_loads: bool = True
    # Cancellation is observed before every tier operation and pool draw of a resolve.
    observe_cancel: bool = True
    # P1 (found by the hunter): a probe pins an inactive block only while that leaves the
    # entitlement floor of admitted requests intact (pinning one makes it unavailable).
    probe_respects_floor: bool = True
    # D1 (found by the hunter): a restore committed under a hash that another request
    # registered meanwhile holds that primary, not a private duplicate.
    commit_dedupes: bool = True

    def __post_init__(self) -> None:
        require(self.requery_interval_s > 0, "store.requery_interval_s", self.requery_interval_s,
                "a number > 0 (seconds)")
        require(self.resolve_deadline_s > 0, "store.resolve_deadline_s", self.resolve_deadline_s,
                "a number > 0 (seconds)")
        require(self.flush_deadline_s is None or self.flush_deadline_s > 0, "store.flush_deadline_s",
                self.flush_deadline_s, "a number > 0 (seconds) or null for no deadline")
