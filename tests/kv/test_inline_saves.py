"""A save without a process (``HostTier(inline_saves=True)``, what a simulated world with
a free host uses) is the process save's twin: for any sequence of saves, issued by a
process that yields between them, each save lands at the same time with the same outcome,
and the tier ends with the same blocks in the same slots and the same counters."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from openinfer.kv.hashing import block_hashes
from openinfer.kv.host_tier import HostTier
from openinfer.kv.pool import BlockPool, PageRefs
from openinfer.runtime.sim import SimRuntime
from sim.copy_engine import LinkSpec
from sim.copy_queue import QueuedTransfer

HASHES = block_hashes(list(range(16 * 24)), 16)  # 24 distinct block names

MAX_SAVES, MAX_BLOCKS = 25, 5
SAVES = st.lists(st.tuples(st.lists(st.integers(0, len(HASHES) - 1), min_size=1, max_size=MAX_BLOCKS, unique=True),
                           st.sampled_from([0.0, 0.0, 1e-4, 3e-3])), max_size=MAX_SAVES)


def run(saves: list[tuple[list[int], float]], inline: bool, capacity: int) -> Any:
    rt = SimRuntime(seed=0)
    pool = BlockPool(16, 1 + MAX_SAVES * MAX_BLOCKS)  # every save's pages can be in flight at once
    link = LinkSpec(1.0, 1e-5, 2)
    tier = HostTier(rt, capacity, QueuedTransfer(rt, 1 << 20, d2h=link, h2d=link), inline_saves=inline)
    records = []

    def client() -> Generator[Any, Any, None]:
        for names, wait in saves:
            pages = pool.allocate(len(names))
            assert pages is not None
            records.append(tier.save(pages, [HASHES[i] for i in names], PageRefs.guard(pool, pages)))
            pool.release_all(pages)  # the request lets go; the guards hold them until the copy lands
            yield rt.sleep(wait)
        yield rt.all_of([r.done for r in records])
    rt.run_process(client())
    return ([(r.submitted_at, r.visible_at, r.done.value.ok, r.done.value.error) for r in records],
            dict(tier._slot_of), dict(tier.counters), pool.available_blocks())


@settings(max_examples=60, deadline=None)
@given(saves=SAVES, capacity=st.sampled_from([0, 3, 8, 64]))
def test_inline_saves_land_as_process_saves_do(saves: list[tuple[list[int], float]], capacity: int) -> None:
    assert run(saves, True, capacity) == run(saves, False, capacity)
