"""The logical block pool: which page holds which block, and who may still use it.

Every page is in exactly one of three places: the reset pool (empty, free), the inactive
pool (holds a registered block nobody references; free, but still matchable until it is
evicted, LRU first), or active (referenced by a request, a hold or a save guard). Pages
are counted by strong references; a page returns to a pool only when its last reference
is released. ``available_blocks`` = reset + inactive, the number a new allocation can get.

Misuse that would corrupt this accounting (releasing a page twice, registering a page
twice, acquiring a free page) raises :class:`~openinfer.errors.AccountingError` at once
rather than leaving a pool that silently disagrees with itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from openinfer.errors import AccountingError, is_power_of_two, require
from openinfer.kv.hashing import BASE_SALT, BlockHash

MAX_BLOCK_SIZE = 1024


def check_block_size(block_size: int, field: str = "block_size") -> None:
    """The pool's rule (a page must split evenly into warps and tiles), callable before a
    pool exists so a config can be checked at start-up."""
    require(isinstance(block_size, int) and is_power_of_two(block_size) and block_size <= MAX_BLOCK_SIZE,
            field, block_size, f"a power of two <= {MAX_BLOCK_SIZE}")


@dataclass
class PoolCounters:
    """Lifetime counters of a pool; monitors and reports read them."""

    allocations: int = 0
    allocation_failures: int = 0
    evictions: int = 0
    matches: int = 0
    matched_blocks: int = 0


class BlockPool:
    """Reset / inactive (LRU) / active pages with refcounts, a radix of registered hashes,
    the padding page, and (optionally) the entitlement floor of admitted requests."""

    def __init__(self, block_size: int, num_blocks: int, *, entitlement: bool = False) -> None:
        check_block_size(block_size)
        require(isinstance(num_blocks, int) and num_blocks >= 2, "num_blocks", num_blocks,
                "an int >= 2 (one page is the permanent padding page)")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.entitlement_enabled = entitlement
        self.entitled = 0
        self.counters = PoolCounters()
        self._refs = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._primary: dict[BlockHash, int] = {}
        self._reset: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0 first
        self._inactive: OrderedDict[int, None] = OrderedDict()
        self._reset_on_release: set[int] = set()
        # Pages and hashes changed since the last take_touched(); None until an audit
        # asks (PoolAudit), so a pool nobody audits pays one None test per mutation. A
        # reference taken or dropped on a page that stays referenced is not a change here:
        # what an audit checks (the sign of the refcount, the inactive pool, the radix)
        # cannot move with it, and a shared prefix's pages are taken and dropped by every
        # request that matches them.
        self._touched: set[int] | None = None
        self._touched_hashes: set[BlockHash] | None = None
        pad = self.allocate(1)
        assert pad is not None
        self.padding_page = pad[0]
        self.register(self.padding_page, BASE_SALT)  # all-zero hash, referenced forever

    # -- sizes ------------------------------------------------------------------------
    def total_blocks(self) -> int:
        return self.num_blocks

    def available_blocks(self) -> int:
        return len(self._reset) + len(self._inactive)

    def max_request_blocks(self) -> int:
        return self.num_blocks - 1

    def active_blocks(self) -> int:
        return self.num_blocks - self.available_blocks()

    def inactive_blocks(self) -> int:
        return len(self._inactive)

    def reset_blocks(self) -> int:
        return len(self._reset)

    # -- page state -------------------------------------------------------------------
    def refcount(self, page: int) -> int:
        return self._refs[page]

    def block_hash(self, page: int) -> BlockHash | None:
        return self._hash[page]

    def is_free(self, page: int) -> bool:
        return self._refs[page] == 0

    def contains(self, block_hash: BlockHash) -> bool:
        return block_hash in self._primary

    def primary_page(self, block_hash: BlockHash) -> int | None:
        """The matchable page registered under ``block_hash``, if any."""
        return self._primary.get(block_hash)

    # -- allocation -------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh mutable pages (refcount 1 each), or None if fewer are free."""
        if n < 0:
            raise AccountingError(f"allocate({n}): negative count")
        if self.available_blocks() < n:
            self.counters.allocation_failures += 1
            return None
        pages: list[int] = []
        for _ in range(n):
            if self._reset:
                page = self._reset.pop()
            else:
                page, _ = self._inactive.popitem(last=False)  # evict least recently used
                self._forget(page)
                self.counters.evictions += 1
            self._refs[page] = 1
            pages.append(page)
        if self._touched is not None:
            self._touched.update(pages)
        self.counters.allocations += n
        return pages

    def register(self, page: int, block_hash: BlockHash) -> bool:
        """Name a mutable page with its block hash; True if it became the matchable primary.

        Duplication policy Allow: if the hash is already registered the page stays a private
        duplicate (active while held, never matched, reset when released).
        """
        if self._refs[page] < 1:
            raise AccountingError(f"register: page {page} is not held")
        if self._hash[page] is not None:
            raise AccountingError(f"register: page {page} is already registered")
        self._hash[page] = block_hash
        if self._touched is not None:
            self._touched.add(page)
        if block_hash in self._primary:
            return False
        self._primary[block_hash] = page
        return True

    def acquire(self, page: int) -> None:
        """Take one more strong reference to a registered or already-held page."""
        self.acquire_all((page,))

    def acquire_all(self, pages: Iterable[int]) -> None:
        """``acquire`` each page in turn (a failure leaves the earlier ones taken). The one
        implementation: a prefix match takes tens of pages at once, so the loop is here."""
        refs, inactive, touched = self._refs, self._inactive, self._touched
        for page in pages:
            r = refs[page]
            if r == 0:
                if page not in inactive:
                    raise AccountingError(f"acquire: page {page} is free (reset)")
                del inactive[page]
                if touched is not None:  # only a change of sign is news to an audit
                    touched.add(page)
            refs[page] = r + 1

    def release(self, page: int) -> None:
        """Drop one strong reference; the last one returns the page to a pool."""
        self.release_all((page,))

    def release_all(self, pages: Iterable[int]) -> None:
        """``release`` each page in turn. The one implementation: a finished request, a
        dropped hold or a landed save returns many pages at once, so the loop is here."""
        refs, touched, padding = self._refs, self._touched, self.padding_page
        page_hash, primary, inactive = self._hash, self._primary, self._inactive
        reset_on_release = self._reset_on_release
        for page in pages:
            r = refs[page]
            if r > 1:  # still referenced: one less, nothing else moves
                refs[page] = r - 1
                continue
            # the last reference (or none): the rare checks only here
            if r <= 0:
                raise AccountingError(f"release: page {page} has no reference (double release)")
            if page == padding:
                raise AccountingError("release: the padding page is referenced forever")
            refs[page] = 0
            if touched is not None:
                touched.add(page)
            h = page_hash[page]
            if h is not None and primary.get(h) == page and page not in reset_on_release:
                inactive[page] = None  # most recently used end
                continue
            self._forget(page)
            self._reset.append(page)

    def _forget(self, page: int) -> None:
        h = self._hash[page]
        if self._touched is not None:
            self._touched.add(page)
            if h is not None:
                self._touched_hashes.add(h)  # type: ignore[union-attr]
        if h is not None and self._primary.get(h) == page:
            del self._primary[h]
        self._hash[page] = None
        self._reset_on_release.discard(page)

    # -- prefix matching --------------------------------------------------------------
    def match(self, hashes: Sequence[BlockHash], within_headroom: bool = False) -> list[int]:
        """Strong refs to the longest contiguous registered prefix of ``hashes``.

        ``within_headroom``: stop before an inactive block whose pinning would eat into
        the entitlement floor (an unadmitted probe must not take an admitted draw's page).
        """
        pages: list[int] = []
        primary = self._primary
        if within_headroom:
            # headroom() read once and counted down: taking an inactive page (refcount 0)
            # lowers it by one and nothing else in this loop moves it (the floor does not).
            # A page met twice is taken once from the inactive pool, so it is counted once,
            # exactly as acquiring page by page would count it.
            refs = self._refs
            headroom = self.headroom()
            taken_inactive: set[int] = set()
            for h in hashes:
                page = primary.get(h)
                if page is None:
                    break
                if refs[page] == 0 and page not in taken_inactive:
                    if headroom < 1:
                        break
                    headroom -= 1
                    taken_inactive.add(page)
                pages.append(page)
        else:
            for h in hashes:
                page = primary.get(h)
                if page is None:
                    break
                pages.append(page)
        self.acquire_all(pages)  # acquiring never changes the radix: find the prefix, then take it
        self.counters.matches += 1
        self.counters.matched_blocks += len(pages)
        return pages

    def prefix_length(self, hashes: Sequence[BlockHash]) -> int:
        """Length of the registered prefix of ``hashes``, without taking references."""
        n = 0
        for h in hashes:
            if h not in self._primary:
                break
            n += 1
        return n

    def evict_inactive(self) -> int:
        """Drain the whole inactive pool to reset; active pages are untouched."""
        n = len(self._inactive)
        while self._inactive:
            page, _ = self._inactive.popitem(last=False)
            self._forget(page)
            self._reset.append(page)
        self.counters.evictions += n
        return n

    def mark_reset_on_release(self, pages: Iterable[int]) -> None:
        """Make the final release of these primaries go to reset, not inactive (#681)."""
        for page in pages:
            h = self._hash[page]
            if h is not None and self._primary.get(h) == page:
                self._reset_on_release.add(page)

    # -- entitlement (HEAD kv-store; optional) ----------------------------------------
    def entitle(self, delta: int) -> None:
        self.entitled += delta
        if self.entitled < 0:
            raise AccountingError(f"entitlement went negative ({self.entitled})")

    def headroom(self) -> int:
        """Pages an opportunistic reservation may take without starving admitted draws."""
        floor = self.entitled if self.entitlement_enabled else 0
        return self.available_blocks() - floor

    # -- checks -----------------------------------------------------------------------
    def track_changes(self) -> None:
        """Start recording touched pages and hashes for :meth:`take_touched`."""
        if self._touched is None:
            self._touched, self._touched_hashes = set(), set()

    def take_touched(self) -> tuple[set[int], set[BlockHash]]:
        """Pages and forgotten hashes changed since the last call (tracking must be on)."""
        if self._touched is None or self._touched_hashes is None:
            raise AccountingError("take_touched: call track_changes() first")
        pages, hashes = self._touched, self._touched_hashes
        self._touched, self._touched_hashes = set(), set()
        return pages, hashes

    def check(self) -> None:
        """Assert the pool's internal invariants (O(pages); monitors run it periodically,
        with PoolAudit's O(changes) check after every event).

        Each test is first made in bulk (``map`` over the pool's lists, ``count``: C loops,
        since an H200-sized pool has ~50k pages) and only a failing one walks the pages to
        name the first culprit, with the message the walk has always given."""
        refs, page_hash, primary = self._refs, self._hash, self._primary
        reset = set(self._reset)
        # The inactive pages in the dict's own storage order (``dict.keys``), not the LRU
        # order (an OrderedDict walks its linked list: ~5x slower over 50k pages); the bulk
        # tests below do not depend on order, and a failing one walks ``self._inactive``
        # itself, so the culprit it names is the one the LRU-order walk has always named.
        inactive = list(dict.keys(self._inactive))
        if len(reset) != len(self._reset):
            raise AccountingError("pool: a page is in the reset pool twice")
        if not reset.isdisjoint(inactive):
            raise AccountingError("pool: a page is both reset and inactive")
        negative = 0 if min(refs) >= 0 else sum(1 for r in refs if r < 0)  # never empty: the padding page
        active = self.num_blocks - refs.count(0) - negative
        if len(reset) + len(inactive) + active != self.num_blocks:
            raise AccountingError("pool: reset + inactive + active != total")
        get_ref = refs.__getitem__
        free_refs = list(map(get_ref, reset)) + list(map(get_ref, inactive))
        if free_refs.count(0) != len(free_refs):
            for q in (*reset, *self._inactive):
                if refs[q] != 0:
                    raise AccountingError(f"pool: free page {q} has refcount {refs[q]}")
        entry_pages = list(primary.values())  # walked once, read three times
        radix_ok = list(map(page_hash.__getitem__, entry_pages)) == list(primary) \
            and reset.isdisjoint(entry_pages)
        # With every radix entry naming its page back, "q's hash has q as its primary" is
        # "q is some entry's page": a set test instead of a dict lookup per page.
        if not (radix_ok and set(entry_pages).issuperset(inactive)):
            for q in self._inactive:
                h = page_hash[q]
                if h is None or primary.get(h) != q:
                    raise AccountingError(f"pool: inactive page {q} is not a registered primary")
        if not radix_ok:
            for h, q in primary.items():
                if page_hash[q] != h or q in reset:
                    raise AccountingError(f"pool: radix entry for page {q} is stale")
        if self.entitlement_enabled and self.entitled < 0:
            raise AccountingError("pool: negative entitlement")


@dataclass(slots=True)
class PageRefs:
    """Strong references owned by one holder (a prefix hold, a save guard, a reservation).

    Released exactly once; a second release raises, because in the Rust original the
    owner is dropped once and a double drop would be a double free. Slotted: every save
    guards its pages with one.
    """

    pool: BlockPool
    pages: list[int] = field(default_factory=list)
    released: bool = False

    def __len__(self) -> int:
        return len(self.pages)

    def release(self) -> None:
        if self.released:
            raise AccountingError("PageRefs released twice")
        self.released = True
        self.pool.release_all(self.pages)
        self.pages = []

    @classmethod
    def guard(cls, pool: BlockPool, pages: Sequence[int]) -> PageRefs:
        """Take a new strong reference to each page (a KvBlockGuard per page); all or none."""
        if len(pages) == 1:  # a decode step's save: all or none is the one acquire
            pool.acquire_all(pages)
            return cls(pool, list(pages))
        taken: list[int] = []
        try:
            for page in pages:
                pool.acquire_all((page,))  # one at a time: on a failure, ``taken`` is exact
                taken.append(page)
        except AccountingError:
            pool.release_all(taken)
            raise
        return cls(pool, list(pages))
