"""Which GPU pages and host slots the copies in flight read and write.

The real backend refuses a copy that would write a page another copy still reads or
writes (``openinfer/backend/cuda_transfer.py``): on a GPU that race corrupts KV silently.
The simulator moves no bytes, so without this ledger the same race would pass unseen: a
tier that hands a slot to a new save while a restore still reads it, or a restore that
writes a page a save is still reading, produces the right timings and the wrong KV.

The rule is the real backend's (``openinfer/backend/copy_exclusion.py``): a new copy may
not write a page or slot that a copy in flight reads or writes, nor read one that a copy
in flight writes; a clash raises :class:`InvariantViolation` ``copy_exclusive`` from inside
the operation that submitted it. A copy is in flight until its landing event has
triggered or its callbacks have begun (a tier frees what a copy used in those callbacks, or
in the compute of a runtime ``Timer``, which runs before the value is set). Nothing is
added to the copy's event, so runs with and without the ledger process the same events.
A peer read's source slots are the peer's and are not tracked here.
"""

from __future__ import annotations

from simpy.events import Event

from openinfer.backend.copy_exclusion import PAGE, READS, SLOT, WRITES, first_race, race_message
from openinfer.runtime import Runtime
from sim.invariant import InvariantViolation

KINDS = (PAGE, SLOT)
_MIN_SWEEP = 4096          # entries added between two sweeps of the landed ones, at least


class CopyLedger:
    def __init__(self, rt: Runtime, name: str = "") -> None:
        self.rt = rt
        self.name = name
        # kind -> id -> landing events of the copies that read / write it (pruned as seen)
        self._readers: dict[str, dict[int, list[Event]]] = {k: {} for k in KINDS}
        self._writers: dict[str, dict[int, list[Event]]] = {k: {} for k in KINDS}
        # Landed copies are dropped when their page or slot is next looked at, and all of
        # them once this many entries have been added since the last sweep: a pool of 50k
        # pages, each saved once, would otherwise keep 50k landed events (~13 MB).
        self._added = 0
        self._sweep_at = _MIN_SWEEP

    def submit(self, what: str, read_kind: str, reads: list[int], write_kind: str, writes: list[int],
               lands: Event) -> None:
        """Record a copy submitted now that lands with ``lands``; refuse a clash first.
        Called for every copy of a run (every sealed block is one), so it stays lean."""
        assert _in_flight(lands), "a copy's landing event must be pending when it is submitted"
        self._refuse(what, write_kind, writes, WRITES)
        self._refuse(what, read_kind, reads, READS)
        _add(self._readers[read_kind], reads, lands)
        _add(self._writers[write_kind], writes, lands)
        self._added += len(reads) + len(writes)
        if self._added >= self._sweep_at:
            self._sweep()

    def _refuse(self, what: str, kind: str, ids: list[int], verb: str) -> None:
        readers, writers = self._readers[kind], self._writers[kind]
        race = first_race(ids, verb, lambda i: _live(readers, i), lambda i: _live(writers, i))
        if race is not None:
            where = f" on {self.name}" if self.name else ""
            raise InvariantViolation("copy_exclusive", self.rt.now(),
                                     race_message(what, verb, kind, race, where))

    def in_flight(self, kind: str, verb: str) -> set[Event]:
        """Landing events of the copies in flight that read (or write) a ``kind``: what a
        teardown must wait for before the memory goes."""
        table = (self._readers if verb == READS else self._writers)[kind]
        return {e for events in table.values() for e in events if _in_flight(e)}

    @staticmethod
    def still_in_flight(events: set[Event]) -> int:
        return sum(_in_flight(e) for e in events)

    def _sweep(self) -> None:
        live = 0
        for table in (*self._readers.values(), *self._writers.values()):
            for i in list(table):
                live += _live(table, i)
        self._added = 0
        self._sweep_at = max(_MIN_SWEEP, 2 * live)


def _live(table: dict[int, list[Event]], i: int) -> int:
    """How many copies in flight use ``i``."""
    events = table.get(i)
    if not events:
        return 0
    live = [e for e in events if _in_flight(e)]
    if live:
        table[i] = live
    else:
        del table[i]
    return len(live)


def _in_flight(e: Event) -> bool:
    """Not landed: not triggered (a Process that returned is), and its callbacks not begun
    (a Timer's compute, where a tier frees slots, runs with callbacks already None)."""
    return not e.triggered and e.callbacks is not None


def _add(table: dict[int, list[Event]], ids: list[int], lands: Event) -> None:
    for i in ids:
        events = table.get(i)
        if events is None:
            table[i] = [lands]
        else:   # drop the landed ones here too: a page saved a thousand times keeps one
            events[:] = [e for e in events if _in_flight(e)]
            events.append(lands)
