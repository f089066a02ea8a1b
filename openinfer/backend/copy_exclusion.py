"""Which copies may run at once over the same GPU page or host slot: the one rule.

A copy (or a step) may not write a page or slot that a copy in flight reads or writes, nor
read one that a copy in flight writes. On a GPU a breach corrupts KV silently: the DMA
engine and the compute stream do not order themselves. Two checkers enforce the rule with
different bookkeeping, and both ask this module, so they cannot drift apart:

* the real backend (``cuda_transfer.CudaTransfer``) counts copies in flight with
  :class:`InFlightCounts`, since it sees each copy complete;
* the simulator's ``sim.copy_ledger.CopyLedger`` counts the pending landing events it
  keeps, since it may add nothing to a run's events.

Both name a clash with :func:`race_message`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

PAGE, SLOT = "page", "slot"    # a GPU arena page; a host slot of this instance's tier
READS, WRITES = "reads", "writes"


@dataclass(frozen=True)
class Race:
    """The first page or slot a new access would race on, and the copies it races with."""

    index: int
    readers: int     # copies in flight reading it (counted only against a write)
    writers: int     # copies in flight writing it


def first_race(ids: Iterable[int], verb: str, readers: Callable[[int], int],
               writers: Callable[[int], int]) -> Race | None:
    """The rule itself: a write races with every copy in flight that reads or writes the
    same id, a read only with those that write it."""
    for i in ids:
        w = writers(i)
        r = readers(i) if verb == WRITES else 0
        if w or r:
            return Race(i, r, w)
    return None


def race_message(what: str, verb: str, kind: str, race: Race, where: str = "") -> str:
    """'a D2H save writes slot 3 on sim0 while 1 copy in flight reads it'."""
    held = [f"{n} cop{'y' if n == 1 else 'ies'} in flight {v}{'s' if n == 1 else ''} it"
            for n, v in ((race.readers, "read"), (race.writers, "write")) if n]
    return f"{_article(what)} {what} {verb} {kind} {race.index}{where} while {' and '.join(held)}"


def _article(what: str) -> str:
    """'an H2D load', 'a D2H save', 'a step': an initialism takes the sound of its letter's name."""
    word = what.split()[0]
    vowel_sound = word[0] in "AEFHILMNORSX" if word.isupper() else word[0].lower() in "aeiou"
    return "an" if vowel_sound else "a"


class InFlightCounts:
    """Per kind and id, how many copies in flight read and write it; a copy is added when
    it is submitted and removed when its completion is observed."""

    def __init__(self) -> None:
        self._reading: dict[str, Counter] = {PAGE: Counter(), SLOT: Counter()}
        self._writing: dict[str, Counter] = {PAGE: Counter(), SLOT: Counter()}

    def race(self, kind: str, ids: Iterable[int], verb: str) -> Race | None:
        return first_race(ids, verb, self._reading[kind].__getitem__, self._writing[kind].__getitem__)

    def add(self, kind: str, ids: Iterable[int], verb: str, delta: int) -> None:
        table = (self._reading if verb == READS else self._writing)[kind]
        for i in ids:
            table[i] += delta
            if table[i] <= 0:
                del table[i]

    def busy(self, kind: str) -> int:
        """How many distinct ids of ``kind`` a copy in flight uses."""
        return len(self._reading[kind].keys() | self._writing[kind].keys())
