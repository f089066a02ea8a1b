"""The transfer interface: page copies between GPU pages, host slots and peers.

The tiers decide WHAT moves and when it becomes visible; a TransferEngine only moves
(or, in the simulator, only takes the time to move). The simulator's copy engines model
bandwidth and queueing and move nothing; the real backend copies bytes on side streams
and completes the event when the CUDA event recorded after the copy has fired.
"""

from __future__ import annotations

from typing import Protocol

from simpy.events import Event


class TransferEngine(Protocol):
    def d2h(self, pages: list[int], slots: list[int]) -> Event:
        """Copy GPU pages into host slots; the event fires when the copy has landed."""
        ...

    def h2d(self, slots: list[int], pages: list[int]) -> Event:
        """Copy host slots into GPU pages."""
        ...

    def peer_read(self, peer: str, src_slots: list[int], dst_slots: list[int]) -> Event:
        """One-sided read of a peer's host slots into local host slots (RDMA)."""
        ...


class InstantTransfer:
    """Moves nothing and takes no time: for logic tests where only the order matters."""

    def __init__(self, rt) -> None:  # type: ignore[no-untyped-def]
        self.rt = rt
        self.pages_d2h = 0
        self.pages_h2d = 0
        self.pages_peer = 0

    def d2h(self, pages: list[int], slots: list[int]) -> Event:
        self.pages_d2h += len(pages)
        return self.rt.done()

    def h2d(self, slots: list[int], pages: list[int]) -> Event:
        self.pages_h2d += len(pages)
        return self.rt.done()

    def peer_read(self, peer: str, src_slots: list[int], dst_slots: list[int]) -> Event:
        self.pages_peer += len(src_slots)
        return self.rt.done()
