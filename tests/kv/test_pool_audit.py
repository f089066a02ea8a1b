"""The incremental pool audit catches a corrupted page at the next event, like the full
check, without walking the pool; each corruption below is one a buggy holder could make."""

from __future__ import annotations

import pytest

from openinfer.errors import AccountingError
from openinfer.kv.hashing import block_hashes
from openinfer.kv.pool import BlockPool
from openinfer.kv.pool_audit import PoolAudit


def _pool_with_cached_block() -> tuple[BlockPool, PoolAudit, int]:
    pool = BlockPool(4, 8)
    audit = PoolAudit(pool)
    (page,) = pool.allocate(1) or []
    pool.register(page, block_hashes([1, 2, 3, 4], 4)[0])
    pool.release(page)  # inactive, matchable
    audit.check_changes()
    return pool, audit, page


def test_clean_history_passes_and_costs_nothing_when_idle() -> None:
    pool, audit, page = _pool_with_cached_block()
    pages = pool.match(block_hashes([1, 2, 3, 4], 4))
    assert pages == [page]
    audit.check_changes()
    pool.release(page)
    audit.check_changes()
    audit.check_all()
    assert pool.take_touched() == (set(), set())


def test_leaked_page_breaks_conservation() -> None:
    pool, audit, _ = _pool_with_cached_block()
    (p,) = pool.allocate(1) or []
    pool._refs[p] = 0  # dropped without returning to a free list
    with pytest.raises(AccountingError, match="reset \\+ inactive \\+ active"):
        audit.check_changes()


def test_referenced_page_left_in_inactive_is_caught() -> None:
    pool, audit, page = _pool_with_cached_block()
    pool._refs[page] = 1  # taken without leaving the inactive pool
    pool._touched.add(page)  # type: ignore[union-attr]
    with pytest.raises(AccountingError):
        audit.check_changes()


def test_stale_radix_entry_is_caught() -> None:
    pool, audit, page = _pool_with_cached_block()
    h = pool.block_hash(page)
    pool.evict_inactive()
    pool._primary[h] = page  # forget() that left the radix pointing at a reset page
    with pytest.raises(AccountingError, match="stale"):
        audit.check_changes()


def test_take_touched_needs_tracking() -> None:
    with pytest.raises(AccountingError, match="track_changes"):
        BlockPool(4, 4).take_touched()
