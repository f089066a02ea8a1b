"""The scheduler's per-request records, one per container stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from openinfer.kv.hashing import BlockHash
from openinfer.kv.prefix import KvPrefix
from openinfer.kv.request_kv import RequestKv
from openinfer.kv.saves import SaveCursor
from openinfer.scheduler.request import GenerateRequest, TokenSink


@dataclass
class PendingRequest:
    """Accepted, not yet decoding: deferred, resolving, or prefilling."""

    id: int
    req: GenerateRequest
    sink: TokenSink
    queued_at: float
    hashes: list[BlockHash]
    kv_prefix: KvPrefix = field(default_factory=KvPrefix.none)
    prefill_pos: int = 0
    step_chunk: int = 0
    cached_tokens: int = 0
    kv: RequestKv | None = None
    cursor: SaveCursor = field(default_factory=SaveCursor)
    adapter_loaded_at_arrival: bool = True
    scheduled_sent: bool = False  # the first chunk's result has been applied
    prefix_adopted: bool = False  # the first chunk matched the cached prefix

    @property
    def prompt_len(self) -> int:
        return len(self.req.prompt)

    def drop_hold(self) -> None:
        """Release the KvPrefix hold if it is still live (first chunk done, or leaving)."""
        if not self.kv_prefix.released:
            self.kv_prefix.release()


@dataclass
class ActiveRequest:
    """Decoding: the first token has been emitted."""

    id: int
    req: GenerateRequest
    sink: TokenSink
    kv: RequestKv
    cursor: SaveCursor
    last_token: int
    generated: int
    queued_at: float
    slot: int = -1  # the decode cohort's slot while it holds this request

    @property
    def prompt_len(self) -> int:
        return len(self.req.prompt)
