"""Resolve primitives on the pool: probe a prompt, reserve pages for a restore, commit it.

A :class:`PrefixProbe` is the hold behind a ``KvPrefix``: it pins every GPU-radix hit (and,
after a restore, every loaded block) so nothing evicts them while the request waits for
admission. It allocates nothing; a restore takes a :class:`Reservation` of fresh pages
that become named blocks only at commit, after the H2D copy has landed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from openinfer.errors import AccountingError
from openinfer.kv.hashing import BlockHash
from openinfer.kv.pool import BlockPool, PageRefs


@dataclass
class PrefixProbe:
    """Pinned GPU hit of a prompt plus the bookkeeping of a resolve."""

    pool: BlockPool
    seq_hashes: list[BlockHash]
    gpu_hit: int
    cacheable: int
    held: PageRefs

    @property
    def held_blocks(self) -> int:
        return len(self.held)

    def cpu_query_hashes(self) -> list[BlockHash]:
        """The hashes a deeper tier is asked for: after the GPU hit, up to the cap."""
        if self.gpu_hit >= self.cacheable:
            return []
        return self.seq_hashes[self.gpu_hit:self.cacheable]

    def include_final_block(self) -> None:
        """Policy ``full_pages``: the page-aligned last block may be resolved too."""
        self.cacheable = len(self.seq_hashes)

    def truncate_held(self, k: int) -> None:
        """Drop pins past the first ``k`` so pin count equals credit count."""
        if k < len(self.held):
            extra = self.held.pages[k:]
            del self.held.pages[k:]
            self.pool.release_all(extra)

    def release(self) -> None:
        self.held.release()


def probe_prefix(pool: BlockPool, seq_hashes: Sequence[BlockHash], num_tokens: int,
                 respect_floor: bool = False) -> PrefixProbe:
    """Pin the GPU-radix prefix of a prompt. ``cacheable = (n - 1) // block_size`` so that at
    least one prompt token is always forwarded (its logits produce the first token)."""
    held = PageRefs(pool, pool.match(seq_hashes, within_headroom=respect_floor))
    cacheable = max(0, (num_tokens - 1) // pool.block_size)
    return PrefixProbe(pool, list(seq_hashes), len(held), cacheable, held)


@dataclass
class Reservation:
    """Fresh mutable pages reserved for a restore; consumed by commit or released."""

    pool: BlockPool
    pages: list[int] = field(default_factory=list)
    state: str = "reserved"  # reserved -> committed | released

    def __len__(self) -> int:
        return len(self.pages)

    def release(self) -> None:
        if self.state != "reserved":
            raise AccountingError(f"Reservation.release on a {self.state} reservation")
        self.state = "released"
        self.pool.release_all(self.pages)


def reserve_loaded_blocks(pool: BlockPool, n: int) -> Reservation | None:
    """``n`` pages for a restore, or None. With the entitlement floor on, a reservation may
    not take pages that admitted requests are still entitled to draw."""
    if n <= 0:
        raise AccountingError(f"reserve_loaded_blocks({n}): count must be positive")
    if pool.headroom() < n:
        pool.counters.allocation_failures += 1
        return None
    pages = pool.allocate(n)
    return None if pages is None else Reservation(pool, pages)


def commit_loaded_blocks(probe: PrefixProbe, reservation: Reservation, dedupe: bool = True) -> None:
    """Name the restored pages with their hashes and add them to the probe's hold.

    ``dedupe``: where another request registered the same block while this one was being
    restored, hold that primary and return the restored copy. Otherwise the hold pins a
    private duplicate that the request's first chunk will not match (D1): the credit then
    counts pages the request does not use, and the match pulls the primary out of the
    free pool a second time.
    """
    if reservation.state != "reserved":
        raise AccountingError(f"commit of a {reservation.state} reservation (commit without reserve)")
    if reservation.pool is not probe.pool:
        raise AccountingError("commit: reservation and probe belong to different pools")
    start = probe.gpu_hit
    if start + len(reservation) > len(probe.seq_hashes):
        raise AccountingError("commit: more restored pages than the prompt has blocks")
    pool = probe.pool
    for i, page in enumerate(reservation.pages):
        h = probe.seq_hashes[start + i]
        primary = pool.primary_page(h) if dedupe else None
        if primary is not None:
            pool.acquire(primary)
            pool.release(page)  # unnamed: straight back to reset
            probe.held.pages.append(primary)
        else:
            pool.register(page, h)
            probe.held.pages.append(page)
    reservation.state = "committed"
