"""An incremental audit of a :class:`BlockPool`: the invariants of ``check`` after every
event, at a cost that follows what the event changed rather than the pool's size.

A full ``check`` walks every page. On an H200-sized pool (tens of thousands of pages) that
costs tens of milliseconds, so a monitor could afford it only every N passes, and a broken
page was caught late, far from the event that broke it. This audit keeps its own count of
active pages and, after each event, re-checks only the pages and hashes the pool reports
as touched (allocated, registered, forgotten, or whose refcount went to or from zero: a
reference more or less on a page that stays referenced cannot change what is checked):

- per touched page: refcount >= 0; an active page is not in the inactive pool; an inactive
  page is its hash's matchable primary;
- per touched hash (registered or forgotten): its primary, if any, names it back and is
  not sitting free outside the inactive pool (a stale radix entry);
- globally, O(1): reset + inactive + active == total, entitlement >= 0.

What it cannot see locally (a page both in reset and elsewhere whose counts cancel) the
periodic and end-of-run full ``check`` still catches. Any finding is reported with the
full check's own message when that check agrees, so both audits speak one language.
"""

from __future__ import annotations

from openinfer.errors import AccountingError
from openinfer.kv.pool import BlockPool


class PoolAudit:
    """Checks one pool after each event (``check_changes``) and in full (``check_all``)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        pool.track_changes()
        pool.take_touched()
        refs = pool._refs  # the audit reads the pool's fields on purpose: it is the pool's own check
        self._active = bytearray(r > 0 for r in refs)
        self._n_active = sum(self._active)

    def check_changes(self) -> None:
        pool = self.pool
        pages, hashes = pool.take_touched()
        refs, page_hash, primary, inactive = pool._refs, pool._hash, pool._primary, pool._inactive
        primary_of = primary.get
        active = self._active
        n_active = self._n_active
        add_hash = hashes.add
        problem = None
        for p in pages:  # the monitors run this after every event: one branch per refcount sign
            r = refs[p]
            h = page_hash[p]
            # A touched page is mostly its hash's primary; then the radix check of that
            # hash (below) is about this very page, and is made here from what is already
            # read: its entry names it back (h is its hash), so it is stale only if the
            # page is free outside the inactive pool. Any other hash waits for the loop.
            own = h is not None and primary_of(h) == p
            if r > 0:
                if p in inactive:
                    problem = f"pool: page {p} is inactive with refcount {r}"
                if not active[p]:
                    active[p] = 1
                    n_active += 1
            else:
                if r < 0:
                    problem = f"pool: page {p} has refcount {r}"
                elif p in inactive:
                    if not own:
                        problem = f"pool: inactive page {p} is not a registered primary"
                elif own:
                    problem = f"pool: radix entry for page {p} is stale"
                if active[p]:
                    active[p] = 0
                    n_active -= 1
            if h is not None and not own:
                add_hash(h)
        self._n_active = n_active
        stale = [q for h in hashes if (q := primary_of(h)) is not None
                 and (page_hash[q] != h or (refs[q] == 0 and q not in inactive))]
        if stale:   # the lowest page, not whichever the set's hash order visits last
            problem = f"pool: radix entry for page {min(stale)} is stale"
        if problem is None and len(pool._reset) + len(inactive) + n_active != pool.num_blocks:
            problem = "pool: reset + inactive + active != total"
        if problem is None and pool.entitlement_enabled and pool.entitled < 0:
            problem = "pool: negative entitlement"
        if problem is not None:
            pool.check()  # raises with its own message when it sees the same fault
            raise AccountingError(problem)

    def check_all(self) -> None:
        """The full O(pages) ``check`` (and a resync of the active count it vouches for)."""
        self.check_changes()
        self.pool.check()
