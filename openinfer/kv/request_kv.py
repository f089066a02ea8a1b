"""Per-request KV: the pages of one sequence, and the schedule/apply protocol of a step.

A step is two-phase, as in kvbm: ``schedule_*`` draws the pages the step will write (and
fails the step if the pool cannot supply them), the executor runs, then ``apply_*``
advances the KV position and registers every block whose KV is now complete, so other
requests can match it. ``revert_schedule`` undoes a schedule whose step failed.

Page draws follow kvbm's peak: decode keeps one eager generation page ahead, so a request
with prompt p and max_tokens m > 1 draws at most ``ceil((p + m) / block_size)`` pages, and
one with m = 1 only its prompt's ``ceil(p / block_size)`` (it never decodes). That is
``lifetime_blocks``, the same formula admission reserves, so the scheduler's budget and
the pool's entitlement can never disagree about a request (spec §2.7's caveat).
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from enum import Enum

from openinfer.errors import AccountingError
from openinfer.kv.hashing import BlockHash, block_hashes, compact_tokens, is_compact
from openinfer.kv.pool import BlockPool


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def lifetime_blocks(prompt: int, max_tokens: int, block_size: int) -> int:
    """Pages a request may draw over its life: kvbm's peak (#335)."""
    blocks = ceil_div(prompt if max_tokens <= 1 else prompt + max_tokens, block_size)
    return blocks if blocks > 1 else 1  # max(1, blocks) without a max() call: admission asks per request


_NONE_DRAWN: tuple[int, ...] = ()  # shared "no pages drawn": most steps draw none


class KvState(Enum):
    IDLE = "idle"
    PREFILL_SCHEDULED = "prefill_scheduled"
    DECODE_SCHEDULED = "decode_scheduled"
    RELEASED = "released"


# The states the per-row decode path tests, as plain names: reading an Enum member through
# its class costs ~80 ns on CPython 3.11, and these are read once per row per token.
_IDLE = KvState.IDLE
_DECODE_SCHEDULED = KvState.DECODE_SCHEDULED


class PrefillOverrun(AccountingError):
    """A prefill chunk was scheduled past the end of the prompt."""


class RequestKv:
    """Pages of one sequence: block i of the sequence lives in ``pages[i]``."""

    def __init__(self, pool: BlockPool, prompt: Sequence[int], max_tokens: int,
                 salt: BlockHash, prompt_hashes: Sequence[BlockHash] | None = None) -> None:
        if max_tokens < 1:
            raise AccountingError(f"RequestKv: max_tokens={max_tokens} must be >= 1")
        self.pool = pool
        self.block_size = pool.block_size
        # a compact prompt stays compact (a copy at C speed; made a list of ints it cost an
        # admitted 1k-token prompt ~12 us, and the offline batch 4-5% at 100k); the answer's
        # tokens append to it either way
        self.tokens: MutableSequence[int] = (compact_tokens(prompt) if is_compact(prompt)
                                             else list(prompt))
        self.num_prompt = len(prompt)
        self.max_tokens = max_tokens
        self.salt = salt
        self.lifetime_blocks = lifetime_blocks(self.num_prompt, max_tokens, self.block_size)
        self.hashes: list[BlockHash] = list(prompt_hashes) if prompt_hashes is not None else \
            block_hashes(self.tokens, self.block_size, salt)
        self.pages: list[int] = []
        self.registered = 0          # pages[:registered] are named blocks
        self.kv_position = 0         # tokens whose KV is written
        self.prefill_position = 0
        self.prefix_matched_blocks = 0
        self.admitted = False
        self.state = KvState.IDLE
        self._scheduled_tokens = 0
        self._drawn: Sequence[int] = _NONE_DRAWN  # pages drawn by the scheduled step, for revert

    # -- sizes ------------------------------------------------------------------------
    @property
    def resident_blocks(self) -> int:
        return len(self.pages)

    @property
    def remaining_blocks(self) -> int:
        rem = self.lifetime_blocks - len(self.pages)
        return rem if rem > 0 else 0

    @property
    def prefill_done(self) -> bool:
        return self.prefill_position >= self.num_prompt

    def registered_blocks(self) -> list[tuple[int, BlockHash]]:
        """(page, hash) of every named block, in sequence order."""
        return [(self.pages[i], self.hashes[i]) for i in range(self.registered)]

    def step_page_indices(self, new_tokens: int) -> list[int]:
        """Exactly the pages a kernel may touch for a step writing ``new_tokens`` (#291)."""
        return self.pages[:ceil_div(self.kv_position + new_tokens, self.block_size)]

    # -- prefix -----------------------------------------------------------------------
    def match_and_add_prefix(self) -> int:
        """Adopt the cached prefix of the prompt (at most (n-1)//bs blocks); cached tokens."""
        self._expect(KvState.IDLE)
        if self.pages or self.kv_position:
            raise AccountingError("match_and_add_prefix on a request that already has KV")
        cap = max(0, (self.num_prompt - 1) // self.block_size)
        with self._settle():
            matched = self.pool.match(self.hashes[:cap])
            self.pages = matched
        self.registered = len(matched)
        self.prefix_matched_blocks = len(matched)
        self.kv_position = self.prefill_position = len(matched) * self.block_size
        return self.kv_position

    # -- prefill ----------------------------------------------------------------------
    def schedule_prefill(self, n: int) -> bool:
        """Draw pages for the next ``n`` prompt tokens; False if the pool cannot."""
        self._expect(KvState.IDLE)
        if n <= 0 or self.prefill_position + n > self.num_prompt:
            raise PrefillOverrun(f"prefill of {n} tokens at {self.prefill_position}/{self.num_prompt}")
        if not self._draw(ceil_div(self.prefill_position + n, self.block_size)):
            return False
        self._scheduled_tokens = n
        self.state = KvState.PREFILL_SCHEDULED
        return True

    def apply_prefill(self, next_token: int | None = None) -> None:
        """Mark the scheduled chunk written; on the final chunk, append the first token."""
        self._expect(KvState.PREFILL_SCHEDULED)
        self.kv_position += self._scheduled_tokens
        self.prefill_position += self._scheduled_tokens
        self._register_complete()
        if self.prefill_done:
            if next_token is None:
                raise AccountingError("final prefill chunk applied without its first token")
            self.tokens.append(next_token)
        self._finish_step()

    # -- decode -----------------------------------------------------------------------
    def schedule_decode(self) -> bool:
        """Draw pages for one decode row (one eager generation page ahead).

        Runs once per row per token in a simulation, so the common case (the eager page is
        already drawn) is inline; the checks are the same as the generic path's."""
        if self.state is not _IDLE:
            self._expect(_IDLE)
        pos = self.kv_position
        if len(self.tokens) != pos + 1:
            raise AccountingError("schedule_decode needs exactly one token without KV")
        if (pos + 1) // self.block_size + 1 > len(self.pages):  # ceil((pos + 2) / bs) pages
            if not self._draw(-(-(pos + 2) // self.block_size)):  # ceil_div, inline
                return False
        else:
            self._drawn = _NONE_DRAWN
        self._scheduled_tokens = 1
        self.state = _DECODE_SCHEDULED
        return True

    def apply_decode(self, next_token: int) -> bool:
        """Write the scheduled row's KV and append its token; True if that completed (and
        registered) a block, the only case in which a seal has anything to save."""
        if self.state is not _DECODE_SCHEDULED:
            self._expect(_DECODE_SCHEDULED)
        pos = self.kv_position = self.kv_position + 1
        self.tokens.append(next_token)
        completed = pos // self.block_size > self.registered
        if completed:  # a block completed: name it
            self._register_complete()
        self._scheduled_tokens = 0
        self._drawn = _NONE_DRAWN
        self.state = _IDLE
        return completed

    def revert_schedule(self) -> None:
        """Return the pages the failed step drew, last drawn first."""
        if self.state not in (KvState.PREFILL_SCHEDULED, KvState.DECODE_SCHEDULED):
            raise AccountingError(f"revert_schedule in state {self.state.value}")
        with self._settle():
            for page in reversed(self._drawn):
                self.pages.pop()
                self.pool.release(page)
        self._finish_step()

    # -- release ----------------------------------------------------------------------
    def release(self) -> None:
        """Return every page; refunds the entitlement remainder first."""
        if self.state is KvState.RELEASED:
            raise AccountingError("RequestKv released twice")
        if self.admitted:
            self.pool.entitle(-self.remaining_blocks)
            self.admitted = False
        pages, self.pages = self.pages, []
        self.pool.release_all(pages)
        self.state = KvState.RELEASED

    def mark_reset_on_release(self) -> None:
        self.pool.mark_reset_on_release(self.pages)

    # -- entitlement ------------------------------------------------------------------
    def try_admit(self, credited: int = 0) -> bool:
        """Entitle the remaining draw if the pool can cover it (idempotent)."""
        pool = self.pool
        if self.admitted or not pool.entitlement_enabled:
            return True
        if pool.available_blocks() + credited < pool.entitled + self.remaining_blocks:
            return False
        self.admitted = True
        pool.entitle(self.remaining_blocks)
        return True

    # -- internals --------------------------------------------------------------------
    def _draw(self, target_pages: int) -> bool:
        need = target_pages - len(self.pages)
        self._drawn = _NONE_DRAWN
        if need <= 0:
            return True
        before = len(self.pages)  # as ``with self._settle()``, without its object: a draw
        pages = self.pool.allocate(need)  # runs once per page per request (n > 0: no raise)
        if pages is not None:
            self.pages.extend(pages)
        if self.admitted:
            self._settle_entitlement(before)
        if pages is None:
            return False
        self._drawn = pages
        return True

    def _register_complete(self) -> None:
        complete = self.kv_position // self.block_size
        hashes = self.hashes
        if complete > len(hashes):
            hashes.extend(block_hashes(self.tokens, self.block_size, self.salt, start=len(hashes),
                                       parent=hashes[-1] if hashes else None))
        registered = self.registered
        if complete > registered:
            register, pages = self.pool.register, self.pages
            for i in range(registered, complete):
                register(pages[i], hashes[i])
            self.registered = complete

    def _finish_step(self) -> None:
        self._scheduled_tokens = 0
        self._drawn = _NONE_DRAWN
        self.state = KvState.IDLE

    def _expect(self, state: KvState) -> None:
        if self.state is not state:
            raise AccountingError(f"RequestKv in state {self.state.value}, expected {state.value}")

    def _settle(self) -> _Settle:
        return _Settle(self)

    def _settle_entitlement(self, before: int) -> None:
        """An admitted request's resident pages went from ``before`` to now: move the
        entitlement counter by the change in its remaining draw (never below zero: the
        eager page can overshoot)."""
        life = self.lifetime_blocks  # comparisons, not max() calls: once per page drawn
        before_rem = life - before if life > before else 0
        after = len(self.pages)
        after_rem = life - after if life > after else 0
        self.pool.entitle(after_rem - before_rem)


class _Settle:
    """Moves the entitlement counter by the change in resident pages of an admitted request."""

    __slots__ = ("kv", "before")

    def __init__(self, kv: RequestKv) -> None:
        self.kv = kv
        self.before = 0

    def __enter__(self) -> None:
        self.before = self.kv.resident_blocks

    def __exit__(self, *exc: object) -> None:
        if self.kv.admitted:
            self.kv._settle_entitlement(self.before)
