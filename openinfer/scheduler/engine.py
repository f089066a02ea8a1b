"""The Qwen3 scheduler loop over the KvStore (spec §5, the PR's version, with switches).

One process per engine. Each pass: publish load, take intake, collect settled resolves,
apply control commands when idle, reject unknown adapters, admit, cut prefill chunks,
plan, run the step, apply its effects. Both submit variants (plain, LoRA-control) are
this one loop; the difference is whether control commands exist.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from simpy.events import Event

from openinfer.backend.executor import Executor, StepKind, StepPlan, StepResult
from openinfer.errors import ConfigError
from openinfer.kv.hashing import block_hashes, is_compact, salt_hash, token_bytes
from openinfer.kv.prefix import ResolvePolicy
from openinfer.kv.flush import FlushOutcome, kv_ready
from openinfer.kv.saves import SaveClass, SaveCursor
from openinfer.kv.store import KvStore
from openinfer.scheduler.admission import admit, credit
from openinfer.scheduler.chunking import take_prefill_chunks
from openinfer.scheduler.cohort import DecodeCohort
from openinfer.scheduler.config import Role, SchedulerConfig
from openinfer.scheduler.control import (ControlCommand, ControlOp, ControlResponse, PendingControl,
                                         malformed)
from openinfer.scheduler.records import ActiveRequest, PendingRequest
from openinfer.scheduler.request import (EventKind, FinishReason, GenerateRequest, RequestEvent,
                                         RequestHandle, TokenSink)
from openinfer.scheduler.resolve_hub import ResolveHub
from openinfer.scheduler.step_builder import build_step, choose_kind, ensure_kv, revert_step

Observer = Callable[[str, dict[str, Any]], None]
KV_ALLOCATION_FAILED = "KV allocation failed while scheduling the step"
SHUT_DOWN = "the engine is shut down"
_CACHEABLE = SaveClass.CACHEABLE  # read per completed block: a plain name, not an Enum attribute


def _token_ids(prompt: Sequence[int], vocab: int) -> bytes | None:
    """The prompt as int64 bytes if it is not empty and every token is exactly an int (not
    a bool, not a numpy scalar) in [0, vocab), else None. The types are counted in a list
    (``count`` compares by identity first: half the time of adding each to a set), unless
    the prompt is compact (an int32 array, ints by construction); the range is read off
    the converted array by one numpy reduction (a Python ``min``/``max`` over a 1k-token
    prompt costs more than the hashing): read as uint64, a negative id is above 2^63, so
    "the largest is below ``vocab``" is exactly "every id is in [0, vocab)"."""
    if not prompt or (not is_compact(prompt)
                      and list(map(type, prompt)).count(int) != len(prompt)):
        return None
    try:
        raw = token_bytes(prompt)
    except OverflowError:  # beyond int64: out of range
        return None
    return raw if np.frombuffer(raw, dtype=np.uint64).max() < vocab else None


@dataclass
class Finish:
    """A Finished event waiting for release, with the saves it vouches for."""

    sink: TokenSink
    event: RequestEvent
    cursor: SaveCursor


@dataclass
class LoadSnapshot:
    """What a router sees: pages used, requests running, requests waiting (resolves too)."""

    used_blocks: int
    total_blocks: int
    running: int
    waiting: int
    resolving: int


class Engine:
    """One serving instance: scheduler loop + its rank of the KvStore + an executor."""

    def __init__(self, rt: Any, store: KvStore, executor: Executor, config: SchedulerConfig | None = None,
                 *, rank: int = 0, name: str = "engine") -> None:
        self.rt = rt
        self.store = store
        self.executor = executor
        self.cfg = config or SchedulerConfig()
        self.rank = rank
        self.name = name
        self.pool = store.pool(rank)
        policy = ResolvePolicy(wait_for_full_hit=self.cfg.role is Role.DECODE and self.cfg.decode_full_hit)
        self.hub = ResolveHub(rt, store, rank, policy)
        self.deferred: list[PendingRequest] = []
        # The head of ``deferred`` a pass has seen: its first ``_vetted`` requests passed the
        # adapter check against ``_vetted_adapters`` and admission's static checks; arrivals
        # join behind them (see _reject_unknown_adapters and _admit).
        self._vetted = 0
        self._vetted_adapters: set[str] = set()
        self._clients_left = False   # a client left since the last admission pass (TokenSink.on_abort)
        self.prefilling: list[PendingRequest] = []
        self.active: list[ActiveRequest] = []
        self.pending_control: list[PendingControl] = []
        self.post_control_deferred: list[PendingRequest] = []
        self.observers: list[Observer] = []
        self.ticks = 0
        self.steps = 0
        self.closed = False
        self._intake: list[PendingRequest | PendingControl] = []
        self._wake: Event | None = None
        self._next_id = 1
        self._control_seq = 0
        # Chosen once: the cohort needs an executor that answers a DecodeBatch with tokens.
        self.cohort = DecodeCohort(self.pool.block_size, executor.eos_token) \
            if self.cfg.decode_cohort and getattr(executor, "vector_decode", False) else None
        self.process = rt.spawn(self._loop())

    # -- client API -------------------------------------------------------------------
    def submit(self, req: GenerateRequest, on_event: Callable[[RequestEvent], None] | None = None
               ) -> RequestHandle:
        """Queue a request; its events arrive on the returned handle's stream. After
        ``shutdown`` no new work is taken: it is rejected at once (the loop ends once the
        work it has is done, and would never answer it)."""
        rid = self._next_id
        self._next_id += 1
        sink = TokenSink(rid, self.rt, on_event)
        now = self.rt.now()
        p = PendingRequest(rid, req, sink, now, hashes=[])
        if self.closed:
            self._terminal(sink, EventKind.REJECTED, now, message=SHUT_DOWN)
        else:
            self._push(p)
        return RequestHandle(rid, sink, req, submitted_at=now)

    def control(self, command: ControlCommand) -> Event:
        """Queue a LoRA control command; the event's value is its ControlResponse (failed at
        once after ``shutdown``, which takes no new work)."""
        self._control_seq += 1
        pc = PendingControl(self._control_seq, command, self.rt.event(), self.rt.now(),
                            after_request=self._next_id - 1)
        if self.closed:
            pc.response.succeed(ControlResponse(False, SHUT_DOWN, applied_at=self.rt.now()))
        else:
            self._push(pc)
        return pc.response

    def shutdown(self) -> None:
        self.closed = True
        self._notify()

    def snapshot(self) -> LoadSnapshot:
        resolving = self.hub.in_flight() if self.cfg.switches.snapshot_counts_resolves else 0
        return LoadSnapshot(self.pool.total_blocks() - self.pool.available_blocks(), self.pool.total_blocks(),
                            len(self.active) + len(self.prefilling),
                            len(self.deferred) + len(self.post_control_deferred) + resolving + self.hub.ready_count()
                            + (sum(isinstance(x, PendingRequest) for x in self._intake) if self._intake else 0),
                            self.hub.in_flight())

    def has_work(self) -> bool:
        return bool(self.active or self.prefilling or self.deferred or self.post_control_deferred
                    or self.hub.in_flight() or self.hub.ready_count() or self._intake or self.pending_control)

    def _push(self, item: PendingRequest | PendingControl) -> None:
        self._intake.append(item)
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _emit(self, kind: str, **data: Any) -> None:
        for obs in self.observers:
            obs(kind, data)

    # -- the loop ---------------------------------------------------------------------
    def _loop(self) -> Generator[Event, Any, None]:
        while True:
            self.ticks += 1
            self._emit("tick", tick=self.ticks)
            self._take_intake()
            self._enqueue(self.hub.drain())
            if not (self.active or self.deferred or self.prefilling):
                if self.pending_control and self._idle_for_control():
                    self._apply_controls()
                    continue
                if self.closed and not self.hub.in_flight() and not self._intake:
                    return
                yield from self._park()
                continue
            self._reject_unknown_adapters()
            self._admit()
            chunks = take_prefill_chunks(self.prefilling, self.cfg.max_prefill_tokens,
                                         self.cfg.request_local_chunks)
            kind = choose_kind(chunks, self.active)
            if kind is None:
                yield self.rt.sleep(self.cfg.idle_tick_s)  # the Rust loop spins here
                continue
            yield from self._run_step(kind, chunks)

    def _park(self) -> Generator[Event, Any, None]:
        if self.hub.in_flight():
            yield self.rt.sleep(self.cfg.resolve_poll_interval_s)  # PR: poll both channels
            return
        self._wake = self.rt.event()
        if self._intake:
            return
        yield self._wake

    # -- intake -----------------------------------------------------------------------
    def _take_intake(self) -> None:
        items, self._intake = self._intake, []
        for item in items:
            if isinstance(item, PendingControl):
                self._accept_control(item)
            else:
                self._accept(item)

    def _accept(self, p: PendingRequest) -> None:
        problem, raw = self._validate(p.req)
        if problem is not None:
            self._reject(p, problem)
            return
        p.hashes = block_hashes(p.req.prompt, self.pool.block_size, salt_hash(p.req.cache_salt, p.req.lora),
                                raw=raw)
        p.adapter_loaded_at_arrival = p.req.lora is None or p.req.lora in self.executor.adapters()
        self._emit("accepted", req=p)
        p.sink.on_abort = self._note_abort
        if self.pending_control:
            self.post_control_deferred.append(p)  # behind the control in arrival order
            return
        self._route(p)

    def _route(self, p: PendingRequest) -> None:
        if self.cfg.prefix_cache and not p.req.echo:
            self.hub.route(p)
        else:
            self._enqueue([p])

    def _enqueue(self, reqs: list[PendingRequest]) -> None:
        """Requests join the waiting queue, behind it; "queued" tells observers which, so
        that one watching queued requests need not walk the whole queue to find them."""
        if reqs:
            self.deferred.extend(reqs)
            self._emit("queued", reqs=reqs)

    def _validate(self, req: GenerateRequest) -> tuple[str | None, bytes | None]:
        """(the first problem of the request or None, its prompt as int64 bytes when valid)."""
        if not req.prompt:
            return str(ConfigError("prompt", req.prompt, "a non-empty list of token ids")), None
        if not isinstance(req.max_tokens, int) or req.max_tokens < 1:
            return str(ConfigError("max_tokens", req.max_tokens, "an int >= 1")), None
        vocab = self.executor.vocab_size
        prompt = req.prompt
        raw = _token_ids(prompt, vocab)
        if raw is None:
            i, t = next((i, t) for i, t in enumerate(prompt) if type(t) is not int or not 0 <= t < vocab)
            return str(ConfigError(f"prompt[{i}]", t, f"a token id in [0, {vocab})")), None
        return req.params.problems(), raw

    # -- control ----------------------------------------------------------------------
    def _accept_control(self, pc: PendingControl) -> None:
        problem = malformed(pc.command)
        if problem is None and not self.cfg.lora_control:
            problem = "control commands need the LoRA-control engine (scheduler.lora_control=true)"
        if problem is not None:
            pc.response.succeed(ControlResponse(False, problem, applied_at=self.rt.now()))
            return
        self.pending_control.append(pc)

    def _idle_for_control(self) -> bool:
        if self.cfg.switches.idle_requires_no_resolves and self.hub.in_flight():
            return False
        return not (self.active or self.deferred or self.prefilling)

    def _apply_controls(self) -> None:
        """Apply pending controls in arrival order. Generates that arrived between two
        controls are released after the first; with ``controls_in_arrival_order`` the next
        control then waits until they drain (C1: the PR applied every pending control first)."""
        while self.pending_control:
            pc = self.pending_control.pop(0)
            resp = self._apply_control(pc.command)
            resp.applied_at = self.rt.now()
            self._emit("control_applied", control=pc, response=resp)
            pc.response.succeed(resp)
            if not self.cfg.switches.controls_in_arrival_order:
                continue
            limit = self.pending_control[0].after_request if self.pending_control else None
            released = [p for p in self.post_control_deferred if limit is None or p.id <= limit]
            if released:
                self._release_post_control(released)
                return
        self._release_post_control(list(self.post_control_deferred))

    def _release_post_control(self, released: list[PendingRequest]) -> None:
        ids = {p.id for p in released}
        self.post_control_deferred = [p for p in self.post_control_deferred if p.id not in ids]
        for p in released:
            p.adapter_loaded_at_arrival = p.req.lora is None or p.req.lora in self.executor.adapters()
            self._route(p)

    def _apply_control(self, cmd: ControlCommand) -> ControlResponse:
        op = cmd.op.value if isinstance(cmd.op, ControlOp) else cmd.op
        if op == "list":
            return ControlResponse(True, adapters=self.executor.adapters())
        assert cmd.adapter is not None
        if op == "load":
            if cmd.load_inplace and cmd.adapter in self.executor.adapters():
                return ControlResponse(True, adapters=self.executor.adapters())
            err = self.executor.load_adapter(cmd.adapter)
        else:
            err = self.executor.unload_adapter(cmd.adapter)
        return ControlResponse(err is None, err, adapters=self.executor.adapters())

    def _reject_unknown_adapters(self) -> None:
        """Reject waiting requests whose adapter is not loaded. A request that passed against
        the same loaded set passes again, so while that set stays only the arrivals behind
        the vetted head are checked, and the queue is rebuilt only when one is rejected."""
        if not self.deferred:  # every pass asks; most have nobody waiting
            return
        loaded = set(self.executor.adapters())
        start = self._vetted if loaded == self._vetted_adapters else 0
        rejected = [i for i in range(start, len(self.deferred))
                    if self.deferred[i].req.lora is not None and self.deferred[i].req.lora not in loaded]
        self._vetted_adapters = loaded
        if not rejected:
            return
        for i in rejected:
            p = self.deferred[i]
            self._reject(p, f"LoRA adapter is not loaded: {p.req.lora}")
        gone = set(rejected)
        self._vetted -= sum(i < self._vetted for i in rejected)
        self.deferred = [p for i, p in enumerate(self.deferred) if i not in gone]

    def _note_abort(self) -> None:
        self._clients_left = True

    # -- admission --------------------------------------------------------------------
    def _admit(self) -> None:
        if not self.deferred:
            return
        if self.cohort is not None:
            self.cohort.refresh_generated(self.active)
        res = admit(self.deferred, self.active, self.prefilling, self.pool,
                    self.store.pinned_blocks(self.rank), self.cfg, vetted=self._vetted,
                    clients_left=self._clients_left)
        self._clients_left = False
        for p, _reason, message in res.rejected:
            self._reject(p, message)
        for p in res.cancelled:   # no answer: nobody is listening; the pages go back
            self._drop_pending(p)
        lost: list[PendingRequest] = []
        for p in res.admitted:
            kv = ensure_kv(p, self.pool)
            if kv.try_admit(credit(p, self.pool.block_size)):  # entitlement floor, when on
                self.prefilling.append(p)
            else:  # a resolve reservation won the race: retry next tick
                kv.release()
                p.kv = None
                lost.append(p)
        res.requeue(self.deferred, lost)
        self._vetted = len(self.deferred)  # every request left passed this pass's checks
        self._emit("admission", result=res, lost=lost)

    # -- steps ------------------------------------------------------------------------
    def _run_step(self, kind: StepKind, chunks: list[PendingRequest]) -> Generator[Event, Any, None]:
        plan, ok = build_step(kind, chunks, self.active, self.pool, self.cfg.prefix_cache, self.cohort)
        self.steps += 1
        if not ok:
            self._fail_step(plan, chunks, KV_ALLOCATION_FAILED)
            return
        self._emit("step_start", plan=plan)
        result: StepResult = yield self.executor.execute(plan)
        if result.error is not None:
            revert_step(plan)
            self._fail_step(plan, chunks, result.error)
            return
        self._apply(plan, chunks, result)
        self._emit("step_end", plan=plan, result=result)

    def _fail_step(self, plan: StepPlan, chunks: list[PendingRequest], error: str) -> None:
        """§5.8: every target of the step gets Error and is dropped. The Rust loop then
        clears ``active`` unconditionally, which after a forced prefill-only step drops
        decoding requests that were not in it (S1); fixed keeps them decoding."""
        self._emit("step_failed", plan=plan, error=error)
        if self.cohort is not None:
            self.cohort.sync_all()  # the rows' tokens so far, before they are dropped
        targets_prefill = chunks
        targets_active = list(self.active) if plan.kind is not StepKind.PREFILL else []
        for p in targets_prefill:
            self.prefilling.remove(p)
            self._terminal(p.sink, EventKind.ERROR, p.queued_at, message=error)
            self._drop_pending(p)
        for a in targets_active:
            self._terminal(a.sink, EventKind.ERROR, a.queued_at, message=error,
                           completion=a.generated)
            self._drop_active(a)
        if targets_active or not self.cfg.switches.failed_prefill_keeps_decodes:
            self.active.clear()  # S1 when nothing was failed: decodes vanish, pages leak
            if self.cohort is not None:
                self.cohort.clear()

    def _apply(self, plan: StepPlan, chunks: list[PendingRequest], result: StepResult) -> None:
        finishes: list[Finish] = []
        eos = self.executor.eos_token
        by_id = {p.id: p for p in chunks} if chunks else {}  # read only by prefill rows
        promoted: list[ActiveRequest] = []
        for row in plan.prefill:
            p = by_id[row.req_id]
            first = not p.scheduled_sent
            tok = result.rows[row.req_id].token if row.is_final else None
            p.kv.apply_prefill(tok)
            p.prefill_pos = p.kv.prefill_position
            self.store.seal(self.rank, p.kv, p.cursor, SaveClass.CACHEABLE)
            if first:
                p.scheduled_sent = True
                p.sink.send(RequestEvent(EventKind.SCHEDULED, p.id, self.rt.now(), cached_tokens=p.cached_tokens,
                                         queued_at=p.queued_at))
                p.drop_hold()
            if not row.is_final:
                if p.sink.is_closed():
                    self.prefilling.remove(p)
                    self._drop_pending(p)
                continue
            self.prefilling.remove(p)
            assert tok is not None
            if p.req.echo:
                p.sink.send(RequestEvent(EventKind.PROMPT_TOKENS, p.id, self.rt.now()))
            if tok == eos and not p.req.params.ignore_eos:
                finishes.append(Finish(p.sink, self._finished(p.id, FinishReason.STOP, 0, p.queued_at), p.cursor))
                self._drop_pending(p)
            elif p.req.max_tokens <= 1:
                p.sink.send_token(self.rt.now(), tok)
                finishes.append(Finish(p.sink, self._finished(p.id, FinishReason.LENGTH, 1, p.queued_at), p.cursor))
                self._drop_pending(p)
            elif not p.sink.send_token(self.rt.now(), tok):
                self._drop_pending(p)  # client gone: no terminal event
            else:
                assert p.kv is not None
                promoted.append(ActiveRequest(p.id, p.req, p.sink, p.kv, p.cursor, tok, 1, p.queued_at))
        cohort = self.cohort
        if plan.decode:
            if cohort is not None:
                now = self.rt.now()
                self.active = cohort.apply(self.active, result.decode_tokens, now, self._decode_row, finishes)
            else:
                keep: list[ActiveRequest] = []
                self._apply_decode(plan, result, finishes, keep)
                self.active = keep
        self.active.extend(promoted)
        if cohort is not None:
            cohort.extend(promoted)
        if finishes:
            self._release_finished(finishes)

    def _apply_decode(self, plan: StepPlan, result: StepResult, finishes: list[Finish],
                      keep: list[ActiveRequest]) -> None:
        """The decode rows of a step, one at a time (the executors without ``vector_decode``,
        e.g. CUDA; with it, the decode cohort sends only its due rows through ``_decode_row``).

        Same effects, in the same order, as one row at a time through the generic path;
        only the bookkeeping is cheaper: time is read once (it cannot move inside a pass),
        rows pair with ``self.active`` by position when build_step made them in that order
        (checked per row, else looked up by id), and ``seal`` is called only when the row's
        decode completed a block (``apply_decode`` says so) — seal saves
        ``kv.pages[cursor.saved_blocks:kv.registered]`` and every earlier seal of this
        request left ``saved_blocks >= registered``, so with ``registered`` unchanged it
        would return 0 without touching anything. ``kv.max_tokens`` is the request's.
        """
        now = self.rt.now()
        rows = result.rows
        active = self.active
        paired = len(active) == len(plan.decode)
        active_by_id: dict[int, ActiveRequest] | None = None
        decode_row = self._decode_row
        for i, row in enumerate(plan.decode):
            rid = row.req_id
            if paired and active[i].id == rid:
                a = active[i]
            else:
                if active_by_id is None:
                    active_by_id = {x.id: x for x in active}
                a = active_by_id[rid]
            tok = rows[rid].token
            assert tok is not None
            if decode_row(a, tok, now, finishes):
                keep.append(a)

    def _decode_row(self, a: ActiveRequest, tok: int, now: float, finishes: list[Finish]) -> bool:
        """One decode row's effects (its KV scheduled): True if the request stays active."""
        kv = a.kv
        if kv.apply_decode(tok):
            self.store.seal(self.rank, kv, a.cursor, _CACHEABLE)
        completion = a.generated + 1
        if tok == self.executor.eos_token and not a.req.params.ignore_eos:
            finishes.append(Finish(a.sink, self._finished(a.id, FinishReason.STOP, completion, a.queued_at),
                                   a.cursor))
            self._drop_active(a)
            return False
        if completion >= kv.max_tokens:
            a.sink.send_token(now, tok)
            finishes.append(Finish(a.sink, self._finished(a.id, FinishReason.LENGTH, completion, a.queued_at),
                                   a.cursor))
            self._drop_active(a)
            return False
        if not a.sink.send_token(now, tok):
            self._drop_active(a)
            return False
        a.generated = completion
        a.last_token = tok
        return True

    def _finished(self, rid: int, reason: FinishReason, completion: int, queued_at: float) -> RequestEvent:
        return RequestEvent(EventKind.FINISHED, rid, self.rt.now(), reason=reason,
                            completion_tokens=completion, queued_at=queued_at)

    def _release_finished(self, finishes: list[Finish]) -> None:
        """Default: send now. Prefill role: only once the flush barrier says KV is visible;
        with ``mark_degraded_kv_ready`` a Finished whose KV is not all registered (its
        barrier timed out, a save failed, a registration was dropped) says so instead of
        lying (``kv_ready``)."""
        if not self.cfg.flush_on_finish:
            for f in finishes:
                self._send_terminal(f.sink, f.event)
            return

        def release(outcome: FlushOutcome) -> None:
            for f in finishes:
                f.event.time = self.rt.now()
                if self.cfg.switches.mark_degraded_kv_ready and not kv_ready(f.cursor):
                    f.event.kv_degraded = True
                self._send_terminal(f.sink, f.event)
            self._emit("finished_released", finishes=finishes, outcome=outcome)
        self._emit("barrier_started", finishes=finishes)
        self.store.flush_saves_then(self.rank, release)

    # -- leaving ----------------------------------------------------------------------
    def _terminal(self, sink: TokenSink, kind: EventKind, queued_at: float, message: str | None = None,
                  completion: int = 0) -> None:
        self._send_terminal(sink, RequestEvent(kind, sink.req_id, self.rt.now(), message=message,
                                               completion_tokens=completion, queued_at=queued_at))

    def _send_terminal(self, sink: TokenSink, ev: RequestEvent) -> None:
        if sink.send(ev):
            self._emit("terminal", event=ev)

    def _reject(self, p: PendingRequest, message: str) -> None:
        if self.cfg.switches.reject_drops_hold:
            p.drop_hold()
        self._terminal(p.sink, EventKind.REJECTED, p.queued_at, message=message)

    def _retire_class(self) -> SaveClass:
        return SaveClass.HANDOFF if self.cfg.flush_on_finish else SaveClass.CACHEABLE

    def _drop_pending(self, p: PendingRequest) -> None:
        p.drop_hold()
        if p.kv is not None:
            if not self.cfg.prefix_cache:
                p.kv.mark_reset_on_release()
            self.store.retire(self.rank, p.kv, p.cursor, self._retire_class())
            p.kv = None

    def _drop_active(self, a: ActiveRequest) -> None:
        if not self.cfg.prefix_cache:
            a.kv.mark_reset_on_release()
        self.store.retire(self.rank, a.kv, a.cursor, self._retire_class())
