"""What a resolve hands back: a KvPrefix and the hold that keeps its pages resident."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from openinfer.errors import AccountingError
from openinfer.kv.probe import PrefixProbe
from openinfer.kv.stats import DegradeReason


class CancelProbe(Protocol):
    def is_cancelled(self) -> bool: ...


class NeverCancelled:
    def is_cancelled(self) -> bool:
        return False


@dataclass(frozen=True)
class CacheScope:
    """The cache namespace of a request: its cache salt and LoRA adapter name."""

    cache_salt: str | None = None
    lora: str | None = None


@dataclass(frozen=True)
class ResolvePolicy:
    """``wait_for_full_hit``: Miss means "producer not registered yet", keep asking until
    the deadline. ``full_pages``: the page-aligned last block may be resolved too."""

    wait_for_full_hit: bool = False
    full_pages: bool = False


@dataclass
class ResolveOutcome:
    """The one terminal outcome of a resolve, for monitors and reports."""

    gpu_blocks: int = 0
    loaded_blocks: int = 0
    degraded: DegradeReason | None = None
    queries: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0


@dataclass
class KvPrefix:
    """``hit_tokens`` resolved for a request, pinned by ``hold`` until it is released.

    Release it after the request's first prefill chunk has re-pinned the blocks (or when
    the request leaves without running). Releasing without matching returns the blocks to
    the inactive pool, where they stay matchable until evicted ("shedding").
    """

    hit_tokens: int = 0
    hold: PrefixProbe | None = None
    rank: int | None = None
    outcome: ResolveOutcome = field(default_factory=ResolveOutcome)
    released: bool = False

    @classmethod
    def none(cls, outcome: ResolveOutcome | None = None) -> KvPrefix:
        return cls(outcome=outcome or ResolveOutcome())

    @property
    def held_blocks(self) -> int:
        return self.hold.held_blocks if self.hold is not None and not self.released else 0

    def credit_blocks(self, block_size: int) -> int:
        """Blocks admission may credit: ``hit_tokens // block_size`` while the hold lives."""
        return 0 if self.released else self.hit_tokens // block_size

    def release(self) -> None:
        if self.released:
            raise AccountingError("KvPrefix released twice")
        self.released = True
        if self.hold is not None:
            self.hold.release()
