"""The Executor side of the Backend protocol: run one step plan, return per-row results.

The scheduler owns every page decision (it schedules and applies each request's KV); an
executor only computes. That keeps one implementation of KV accounting for the fake
executor, the SimPy GPU model and the real CUDA Qwen3, which differ only in how long a
step takes and where its tokens come from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from simpy.events import Event

from openinfer.kv.request_kv import RequestKv


class StepKind(Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    UNIFIED = "unified"


@dataclass(slots=True)
class PrefillRow:
    """One prompt chunk: tokens [start, start + len(tokens)) of a request."""

    req_id: int
    kv: RequestKv
    start: int
    tokens: list[int]
    is_final: bool
    lora: str | None = None
    all_logits: bool = False  # echo + logprobs: every position's logits are needed


@dataclass(slots=True)
class DecodeRow:
    """One decode row: the request's dangling token at ``position``."""

    req_id: int
    kv: RequestKv
    token: int
    position: int
    lora: str | None = None


class DecodeBatch:
    """The decode rows of a step as arrays (the scheduler's decode cohort), in row order.

    A sequence of :class:`DecodeRow`: iterating or indexing it builds the rows once (an
    executor that needs row objects, as the CUDA one does, gets exactly what a list
    would hold), while a vectorised executor reads ``req_ids`` / ``positions`` /
    ``num_prompt`` (numpy int64 arrays) and a step model ``position_sum`` without
    building any. ``make_rows`` builds the rows (the scheduler brings the requests' KV
    up to date first)."""

    __slots__ = ("req_ids", "positions", "num_prompt", "_make_rows", "_rows", "_position_sum")

    def __init__(self, req_ids: Any, positions: Any, num_prompt: Any,
                 make_rows: Callable[[], list[DecodeRow]], position_sum: int | None = None) -> None:
        self.req_ids = req_ids
        self.positions = positions
        self.num_prompt = num_prompt
        self._make_rows = make_rows
        self._rows: list[DecodeRow] | None = None
        self._position_sum = position_sum  # sum(positions) when the maker keeps it (the cohort)

    def rows(self) -> list[DecodeRow]:
        if self._rows is None:
            self._rows = self._make_rows()
        return self._rows

    def __len__(self) -> int:
        return len(self.req_ids)

    def __bool__(self) -> bool:
        return len(self.req_ids) > 0

    def __iter__(self) -> Iterator[DecodeRow]:
        return iter(self.rows())

    def __getitem__(self, i: int) -> DecodeRow:
        return self.rows()[i]

    @property
    def position_sum(self) -> int:
        if self._position_sum is not None:
            return self._position_sum
        # summed as Python ints: for a step's few dozen rows, ``tolist`` + ``sum`` costs
        # half of numpy's reduction (exact either way: int64 positions cannot overflow here)
        return sum(self.positions.tolist())


@dataclass
class StepPlan:
    kind: StepKind
    prefill: list[PrefillRow] = field(default_factory=list)
    decode: list[DecodeRow] | DecodeBatch = field(default_factory=list)

    @property
    def prefill_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.prefill)

    @property
    def touched(self) -> list[int]:
        return [r.req_id for r in self.prefill] + [r.req_id for r in self.decode]


@dataclass(slots=True)
class RowResult:
    token: int | None  # None for a non-final prefill chunk
    logprob: float | None = None
    prompt_logprobs: list[float] | None = None


@dataclass
class StepResult:
    rows: dict[int, RowResult]
    error: str | None = None
    started_at: float = 0.0
    finished_at: float = 0.0
    # A DecodeBatch plan answered by a vectorised executor: every decode row's token, in
    # row order (numpy int64), instead of one ``rows`` entry per decode row.
    decode_tokens: Any = None


class Executor(Protocol):
    vocab_size: int
    eos_token: int

    def execute(self, plan: StepPlan) -> Event:
        """Run the step; the event's value is a :class:`StepResult`."""
        ...

    def load_adapter(self, name: str) -> str | None:
        """Load a LoRA adapter; an error message, or None on success."""
        ...

    def unload_adapter(self, name: str) -> str | None: ...

    def adapters(self) -> list[str]: ...
