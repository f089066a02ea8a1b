"""``LatestSaves``: the index a request's reused prefix is judged by (spec H9). For any
sequence of saves and outcomes, and whatever the GPU radix holds when the index prunes
itself, asking for blocks the radix still holds gives exactly the unregistered latest
saves of those blocks, the answer of a list that never forgets anything."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from openinfer.kv.hashing import BlockHash, block_hashes
from openinfer.kv.saves import LatestSaves
from openinfer.kv.tier import OK, OpResult, SaveRecord

HASHES = block_hashes(list(range(4 * 12)), 4)  # 12 distinct block names


@dataclass
class _Done:
    """What ``SaveRecord.failed`` reads of a settled save's process."""

    value: OpResult | None = None

    @property
    def triggered(self) -> bool:
        return self.value is not None


@dataclass
class _Radix:
    held: set[BlockHash] = field(default_factory=set)

    def contains(self, block_hash: BlockHash) -> bool:
        return block_hash in self.held


# one step: the radix evicts all but these blocks, a request computes and saves these,
# then an earlier save settles (registered, failed, its registration dropped) or not. A
# block comes back to the radix only by being computed again, which saves it again (a
# restore from a tier brings back a block whose save landed).
STEPS = st.lists(st.tuples(st.lists(st.integers(0, len(HASHES) - 1), min_size=1, max_size=4, unique=True),
                           st.integers(0, 1000), st.sampled_from(["registered", "failed", "dropped", "flight"]),
                           st.sets(st.integers(0, len(HASHES) - 1))), max_size=40)


@settings(max_examples=300, deadline=None)
@given(steps=STEPS, prune_at=st.integers(1, 8))
def test_blocks_the_radix_holds_are_judged_by_their_latest_unregistered_save(steps, prune_at) -> None:
    index = LatestSaves(prune_at=prune_at)
    radix = _Radix()
    records: list[SaveRecord] = []
    for t, (names, pick, outcome, kept) in enumerate(steps):
        rec = SaveRecord([HASHES[i] for i in names], _Done(), float(t))  # type: ignore[arg-type]
        records.append(rec)
        radix.held = {h for h in radix.held if HASHES.index(h) in kept} | set(rec.hashes)
        index.add(rec, radix)
        assert len(index.latest) < index.prune_at  # pruned whenever it reaches the mark
        settled = records[pick % len(records)]
        if settled.registered_at is None and not settled.failed:
            if outcome == "registered":
                settled.done.value, settled.registered_at = OK, float(t)  # type: ignore[attr-defined]
            elif outcome == "failed":
                settled.done.value = OpResult(False, "copy engine error")  # type: ignore[attr-defined]
            elif outcome == "dropped":
                settled.done.value, settled.registration_error = OK, "dropped"  # type: ignore[attr-defined]
        asked = sorted(radix.held)
        latest = {h: r for r in records for h in r.hashes}
        expected = {id(latest[h]) for h in asked if h in latest and latest[h].registered_at is None}
        found = index.unsettled(asked)
        assert {id(r) for r in found} == expected
        assert len(found) == len(expected)  # each save once, however many of its blocks asked
