"""The decode cohort: the running decode requests as arrays, one step at a time.

A long simulation spends most of its time on decode rows that do nothing but advance by a
token: no page drawn, no block completed, not finished, nobody watching the stream. The
cohort knows, per running request, the next decode step at which that changes (its next
page draw, its next completed block, its last token: all follow from its KV position), and
per step

* schedules only the rows due (``schedule_decode`` of every other row would only flip its
  state), and hands the executor a :class:`DecodeBatch` of the rows' ids and positions;
* applies the step's token array: the rows due, the rows that hit EOS, and the rows whose
  stream is watched, closed or relayed (``on_event``, a ``next_event`` waiter, an abort)
  go through the engine's per-row path, in row order and with exactly its effects; every
  other row's token goes into a (step, slot) buffer with the step's time.

A row's buffered tokens are delivered — appended to its ``RequestKv.tokens`` with its KV
position moved past them (exactly what that many ``apply_decode`` calls that complete no
block do), sent to its sink at their times, its ``ActiveRequest`` fields updated — before
the row next goes through the per-row path (at the latest at its next block boundary:
every row completes a block every ``block_size`` tokens), before the buffer wraps, before
anything reads or watches its stream (``TokenSink.pending``), before admission reads
``generated``, and before a failed step drops it. So everything outside sees what the
per-row path would have left, at every point where it looks.

The engine uses the cohort only with an executor that answers a DecodeBatch with a token
array (``vector_decode``, the fake/simulated executors); others (the CUDA executor) keep
the per-row path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from openinfer.backend.executor import DecodeBatch, DecodeRow, StepPlan
from openinfer.kv.request_kv import KvState
from openinfer.scheduler.records import ActiveRequest

_IDLE = KvState.IDLE
WINDOW = 128  # buffered steps before every row's tokens are delivered
# 0-d int64 operands for the per-step array arithmetic: a Python int operand is converted
# to an array on every ufunc call, about half the cost of a call on a few dozen rows
_ONE = np.array(1, dtype=np.int64)


class DecodeCohort:
    """Rows in ``engine.active`` order. Per slot (stable while a request decodes): its
    request, the buffer step from which its tokens are not yet delivered, the decode step
    at which it next needs the per-row path (``due``: a page draw, a completed block, its
    last token), and whether it always does (``sticky``: a watched or relayed stream).
    Per row, in row order (rebuilt when the membership changes): request ids, prompt
    lengths, KV positions and buffer slots, the arrays a DecodeBatch hands the executor."""

    def __init__(self, block_size: int, eos_token: int) -> None:
        self.bs = block_size
        self.eos = eos_token
        # the EOS test's operand; a token id beyond int64 (none is) stays a Python int
        self._eos_operand = np.array(eos_token, dtype=np.int64) if -2**63 <= eos_token < 2**63 else eos_token
        self.step = 0                  # decode steps applied
        self.k = 0                     # buffer row of the next applied step
        self.req: list[ActiveRequest | None] = []
        self.sync_k: list[int] = []
        self.gen0: list[int] = []      # ActiveRequest.generated as of sync_k
        self.due: dict[int, list[ActiveRequest]] = {}   # decode step -> requests due then
        self.sticky: set[int] = set()
        self._free: list[int] = []
        self.order: list[int] = []     # slots in row order
        self.index_of: list[int] = []  # slot -> row index
        self.rids = self.positions = self.nprompt = self.slots = np.zeros(0, dtype=np.int64)
        # sum(positions), kept as rows come, go and advance: a step model reads it every
        # step (DecodeBatch.position_sum), where summing the array cost a tolist and a sum
        self.position_sum = 0
        self._eos_rows = 0             # rows without ignore_eos
        self._scheduled: list[int] = []
        self.tok_buf = np.zeros((WINDOW, 0), dtype=np.int64)
        self.time_buf = np.zeros(WINDOW, dtype=np.float64)

    # -- membership -------------------------------------------------------------------
    def _slot(self) -> int:
        if not self._free:
            cap = max(64, 2 * len(self.req))
            old = len(self.req)
            buf = np.zeros((WINDOW, cap), dtype=np.int64)
            buf[:, :old] = self.tok_buf
            self.tok_buf = buf
            self.req.extend([None] * (cap - old))
            self.sync_k.extend([0] * (cap - old))
            self.gen0.extend([0] * (cap - old))
            self.index_of.extend([-1] * (cap - old))
            self._free.extend(range(cap - 1, old - 1, -1))
        return self._free.pop()

    def _schedule_due(self, slot: int, a: ActiveRequest) -> None:
        """File the slot under the next decode step that needs the per-row path: the one
        whose schedule draws a page, whose apply completes a block, or its last token."""
        kv, bs = a.kv, self.bs
        p = kv.kv_position
        # min(next block end, end of the drawn pages, last token), at least one step on;
        # as comparisons, not min()/max() calls: this runs once per row per block
        j = (kv.registered + 1) * bs - p
        k = len(kv.pages) * bs - p
        if k < j:
            j = k
        k = kv.max_tokens - a.generated
        if k < j:
            j = k
        step = self.step + (j if j > 1 else 1)
        bucket = self.due.get(step)
        if bucket is None:
            self.due[step] = [a]
        else:
            bucket.append(a)

    def extend(self, promoted: list[ActiveRequest]) -> None:
        """Requests that start decoding (appended to the engine's active list)."""
        if not promoted:
            return
        new = []
        for a in promoted:
            slot = self._slot()
            new.append(slot)
            self.req[slot] = a
            a.slot = slot
            self.sync_k[slot] = self.k
            self.gen0[slot] = a.generated
            sink = a.sink
            if sink.on_event is not None or sink._waiters or sink.is_closed():
                self.sticky.add(slot)
            else:
                sink.pending = lambda s=slot: self._watch(s)
                self._schedule_due(slot, a)
            if not a.req.params.ignore_eos:
                self._eos_rows += 1
        n0 = len(self.order)
        for i, slot in enumerate(new):
            self.index_of[slot] = n0 + i
        self.order.extend(new)
        self.rids = np.concatenate([self.rids, np.array([a.id for a in promoted], dtype=np.int64)])
        new_positions = [a.kv.kv_position for a in promoted]
        self.position_sum += sum(new_positions)
        self.positions = np.concatenate([self.positions, np.array(new_positions, dtype=np.int64)])
        self.nprompt = np.concatenate([self.nprompt, np.array([a.kv.num_prompt for a in promoted], dtype=np.int64)])
        self.slots = np.concatenate([self.slots, np.array(new, dtype=np.int64)])

    def _leave(self, slot: int) -> None:
        a = self.req[slot]
        assert a is not None
        a.sink.pending = None
        a.slot = -1
        self.req[slot] = None
        self.sticky.discard(slot)
        if not a.req.params.ignore_eos:
            self._eos_rows -= 1
        self._free.append(slot)  # a stale ``due`` entry for it is skipped

    def _drop_rows(self, dropped: list[int]) -> None:
        """Remove the rows at ``dropped`` (ascending row indices: a step drops a row or two
        of dozens, so the lists lose them by ``del`` and only the rows after the first
        dropped one are renumbered)."""
        if not dropped:
            return
        keep = np.ones(len(self.order), dtype=np.bool_)
        keep[dropped] = False
        order, index_of = self.order, self.index_of
        for i in reversed(dropped):
            del order[i]
        for i in range(dropped[0], len(order)):
            index_of[order[i]] = i
        self.position_sum -= sum(self.positions[dropped].tolist())
        self.rids, self.positions = self.rids[keep], self.positions[keep]
        self.nprompt, self.slots = self.nprompt[keep], self.slots[keep]

    def clear(self) -> None:
        """The engine dropped every active request (a failed step)."""
        for slot in self.order:
            self._leave(slot)
        self._drop_rows(list(range(len(self.order))))
        self.due.clear()

    # -- delivery ---------------------------------------------------------------------
    def sync(self, slot: int) -> None:
        """Deliver the slot's buffered tokens: KV, stream and ActiveRequest as the per-row
        path would have left them."""
        k0, k = self.sync_k[slot], self.k
        if k > k0:
            a = self.req[slot]
            assert a is not None
            toks = self.tok_buf[k0:k, slot].tolist()
            kv = a.kv
            kv.tokens.extend(toks)          # = (k - k0) apply_decode calls completing no block
            kv.kv_position += k - k0
            a.sink.send_tokens(self.time_buf[k0:k].tobytes(), toks)
            self.gen0[slot] += k - k0
            a.generated = self.gen0[slot]
            a.last_token = toks[-1]
            self.sync_k[slot] = k

    def _watch(self, slot: int) -> None:
        """Someone reads, watches or closes the stream: deliver, and go per-row."""
        self.sync(slot)
        self.sticky.add(slot)

    def sync_all(self) -> None:
        for slot in self.order:
            self.sync(slot)

    def refresh_generated(self, active: list[ActiveRequest]) -> None:
        """``generated`` of every row, for admission (which reads nothing else of them)."""
        k, sync_k, gen0 = self.k, self.sync_k, self.gen0
        for a in active:
            a.generated = gen0[a.slot] + k - sync_k[a.slot]

    # -- schedule ---------------------------------------------------------------------
    def _due_rows(self, step: int) -> list[int]:
        """Row indices due at ``step`` or sticky, in row order."""
        bucket = self.due.pop(step, None)
        if not bucket and not self.sticky:
            return []
        rows = set()
        req, index_of = self.req, self.index_of
        if bucket:
            for a in bucket:
                slot = a.slot
                if slot >= 0 and req[slot] is a:
                    rows.add(index_of[slot])
        for slot in self.sticky:
            rows.add(index_of[slot])
        return sorted(rows)

    def schedule(self, plan: StepPlan, active: Sequence[ActiveRequest]) -> bool:
        """The decode part of ``plan``: schedule_decode of every row due (in row order; the
        others' would only flip their state; stops at the first that cannot draw), and a
        DecodeBatch of all rows."""
        rows = self._due_rows(self.step + 1)
        self._scheduled = rows
        for n, i in enumerate(rows):
            a = active[i]
            self.sync(self.order[i])
            if not a.kv.schedule_decode():
                # as the per-row loop leaves it: the rows before the failing one
                self.sync_all()
                plan.decode = [DecodeRow(x.id, x.kv, x.last_token, x.kv.kv_position, x.req.lora)
                               for x in active[:i]]
                for j in rows[n + 1:]:  # not scheduled: due again when a step is retried
                    self._schedule_due(self.order[j], active[j])
                return False
        pos = self.positions.copy()
        rows_now = list(active)
        # a partial, not a lambda: no cells for pos and rows_now made on every step
        plan.decode = DecodeBatch(self.rids, pos, self.nprompt, partial(self._rows, rows_now, pos),
                                  self.position_sum)
        return True

    def _rows(self, active: list[ActiveRequest], pos: np.ndarray) -> list[DecodeRow]:
        """The plan's rows as objects (its requests' KV brought up to date first)."""
        for a in active:
            if a.slot >= 0 and self.req[a.slot] is a:
                self.sync(a.slot)
        return [DecodeRow(a.id, a.kv, a.last_token, p, a.req.lora) for a, p in zip(active, pos.tolist())]

    # -- apply ------------------------------------------------------------------------
    def apply(self, active: list[ActiveRequest], tokens: np.ndarray, now: float,
              per_row: Callable[[ActiveRequest, int, float, list[Any]], bool],
              finishes: list[Any]) -> list[ActiveRequest]:
        """Apply the step's tokens (row order); ``per_row(a, tok, now, finishes)`` is the
        engine's per-row path (True: the request stays active), passed with its arguments
        rather than closed over them: a closure would be one more call per due row. The
        active list after the step."""
        if self.k == WINDOW:
            self.sync_all()
            self.k = 0
            for slot in self.order:
                self.sync_k[slot] = 0
        self.step += 1
        rows = self._scheduled
        self._scheduled = []
        # watched during the step (mostly none: no comprehension, a call of its own, then)
        late = [self.index_of[s] for s in self.sticky] if self.sticky else []
        if self._eos_rows:
            eos_hit = tokens == self._eos_operand
            if np.count_nonzero(eos_hit):  # = eos_hit.any(), a third of its cost
                late.extend(i for i in np.flatnonzero(eos_hit).tolist() if not active[i].req.params.ignore_eos)
        if late:
            rows = sorted(set(rows).union(late))
        k = self.k
        self.tok_buf[k][self.slots] = tokens  # through the row's view: a third of [k, slots]
        self.time_buf[k] = now
        self.positions += _ONE
        self.position_sum += len(self.order)
        dropped: list[int] = []
        if rows:
            # a few rows: item() each, not an index array built from the list (nor a list
            # of them first: a comprehension is a call of its own on 3.11)
            token_at = tokens.item
            order, sync_k, sticky = self.order, self.sync_k, self.sticky
            for i in rows:
                tok = token_at(i)
                a = active[i]
                slot = order[i]
                if sync_k[slot] < k:  # most due rows were delivered when they were scheduled
                    self.sync(slot)
                kv = a.kv
                if kv.state is _IDLE:
                    kv.schedule_decode()  # draws nothing (the row was not due): the state flip
                if per_row(a, tok, now, finishes):
                    sync_k[slot] = k + 1
                    self.gen0[slot] = a.generated
                    if slot not in sticky:
                        self._schedule_due(slot, a)
                else:
                    dropped.append(i)
                    self._leave(slot)
        self.k = k + 1
        if not dropped:
            return active
        self._drop_rows(dropped)
        kept = active.copy()  # a new list (the caller's is its own), less the dropped rows
        for i in reversed(dropped):
            del kept[i]
        return kept
