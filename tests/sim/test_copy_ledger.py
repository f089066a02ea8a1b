"""The simulator refuses overlapping copies, as the real backend does on the GPU."""

from __future__ import annotations

import pytest

from openinfer.runtime import SimRuntime
from sim.copy_engine import LinkSpec, ModeledTransfer
from sim.copy_ledger import CopyLedger
from sim.copy_queue import QueuedTransfer
from sim.monitors import InvariantViolation

PAGE_BYTES = 1 << 20


@pytest.fixture(params=[ModeledTransfer, QueuedTransfer])
def transfer(request):
    rt = SimRuntime(seed=0)
    link = LinkSpec(bandwidth_gib_s=1.0, latency_s=0.0)   # 1 MiB: ~1 ms a page
    tr = request.param(rt, PAGE_BYTES, d2h=link, h2d=link)
    tr.ledger = CopyLedger(rt, "sim0")
    return tr


def test_a_save_into_a_slot_a_restore_still_reads_is_refused(transfer):
    transfer.h2d([3], [7])
    with pytest.raises(InvariantViolation, match="D2H save writes slot 3 on sim0") as err:
        transfer.d2h([9], [3])
    assert err.value.name == "copy_exclusive"


def test_a_restore_into_a_page_a_save_still_reads_is_refused(transfer):
    transfer.d2h([5], [0])
    with pytest.raises(InvariantViolation, match="H2D load writes page 5"):
        transfer.h2d([1], [5])


def test_a_save_of_a_page_a_restore_still_writes_is_refused(transfer):
    transfer.h2d([1], [5])
    with pytest.raises(InvariantViolation, match="D2H save reads page 5"):
        transfer.d2h([5], [2])


def test_copies_that_only_share_what_they_read_are_fine(transfer):
    transfer.d2h([5], [0])
    transfer.d2h([5], [1])            # the same page saved twice, into two slots
    transfer.h2d([8], [6])            # a slot read by two restores at once
    transfer.h2d([8], [7])


def test_once_a_copy_has_landed_its_page_and_slot_are_free_again(transfer):
    rt = transfer.rt
    lands = transfer.h2d([3], [7])
    rt.run(until=lands)
    transfer.d2h([9], [3])            # the slot the restore read
    transfer.h2d([4], [7])            # the page it wrote


def test_a_peer_read_owns_its_destination_slots_until_it_lands(transfer):
    transfer.peer_read("p1", [0, 1], [10, 11])
    with pytest.raises(InvariantViolation, match="H2D load reads slot 11"):
        transfer.h2d([11], [2])


def test_the_ledger_adds_no_event_to_a_run():
    """Same seed with and without the ledger: the same simulated events, so checking
    copies cannot change what a run does."""
    from sim.workloads import RandomWorkload
    from sim.arrivals import ArrivalSpec
    from sim.world import WorldConfig, build_world, run_world

    def events(ledger: bool) -> tuple[int, float]:
        w = build_world(WorldConfig(num_blocks=64, host_tier_gib=0.5, seed=3))
        assert w.transfer.ledger is not None
        if not ledger:
            w.transfer.ledger = None
        r = run_world(w, RandomWorkload(40, 256, 16, 0.5, 128, ArrivalSpec(20.0)))
        assert r["transfer"]["d2h"]["copies"] > 0 and r["outcomes"]["finished"] == 40
        return r["sim"]["events_processed"], r["metrics"]["mean_ttft_ms"]

    assert events(True) == events(False)


def test_landed_copies_are_forgotten_so_the_ledger_stays_small():
    """Every page of a 50k-page pool saved once would otherwise leave 50k landed events."""
    from sim.copy_ledger import _MIN_SWEEP
    rt = SimRuntime(seed=0)
    link = LinkSpec(bandwidth_gib_s=1000.0, latency_s=0.0)
    tr = QueuedTransfer(rt, PAGE_BYTES, d2h=link, h2d=link)
    tr.ledger = ledger = CopyLedger(rt)
    for page in range(20_000):
        rt.run(until=tr.d2h([page], [page % 7]))
    kept = sum(len(t) for t in (*ledger._readers.values(), *ledger._writers.values()))
    assert kept <= 2 * _MIN_SWEEP
