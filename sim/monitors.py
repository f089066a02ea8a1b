"""Monitors: generic invariants checked while a run goes, and at its end.

None of these knows a scenario. Each is a property any correct scheduler + store must
keep; a violation raises :class:`InvariantViolation` from inside the event that broke it,
which stops the run with the invariant's name. The names are the hunter's report keys.

Safety (every scheduler tick): ``page_conservation``, ``held_page_integrity``,
``single_terminal_event``, ``admitted_draw_never_fails``, ``kv_ready_after_registration``,
``barrier_covers_prior_saves``,
``control_linearizability``, ``single_charge_admission``, ``load_snapshot_counts_resolves``,
``resolve_observes_cancel``. Liveness (only once every fault has healed):
``admission_liveness``, ``bounded_terminal_event``, ``progress_at_one_instant`` (any time). End of run: ``quiescence``,
``no_lease_leak``, ``teardown_drains_loads``, ``teardown_drains_saves``. At the copy engines (``sim/copy_ledger.py``, on
every submitted copy): ``copy_exclusive``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass
from typing import Any

from openinfer.kv.pool_audit import PoolAudit
from openinfer.kv.prefix import KvPrefix
from openinfer.kv.probe import PrefixProbe
from openinfer.errors import AccountingError, require
from openinfer.kv.store import KvStore
from openinfer.kv.request_kv import lifetime_blocks
from openinfer.scheduler.admission import AdmissionResult, credit, future_draws
from openinfer.scheduler.engine import KV_ALLOCATION_FAILED, Engine
from openinfer.scheduler.records import PendingRequest
from openinfer.scheduler.request import EventKind
from sim.invariant import InvariantViolation

INVARIANTS = (
    "page_conservation", "held_page_integrity", "single_terminal_event", "admitted_draw_never_fails",
    "kv_ready_after_registration", "barrier_covers_prior_saves", "control_linearizability", "single_charge_admission",
    "load_snapshot_counts_resolves", "resolve_observes_cancel", "admission_liveness",
    "bounded_terminal_event", "progress_at_one_instant", "quiescence", "no_lease_leak", "teardown_drains_loads",
    "teardown_drains_saves", "copy_exclusive",
)


_MIN_SAVES_PRUNE = 1024  # the save list is pruned when it doubles, and not below this
TIMELINE_TAIL = 4096     # entries a run that reads only the timeline's tail keeps

Timeline = MutableSequence[tuple[float, str]]


DRAIN_POLL_S = 0.001   # how often the end-of-run drain looks whether the engines are idle
DRAIN_MAX_S = 60.0     # simulated seconds the drain waits at most; then quiescence judges


def engines_drained(rt: Any, engines: Sequence[Engine]) -> Any:
    """An event that fires once no engine has work left, or None when none has any now.

    The client counts a request as ended when it aborts it, but the engine sees the abort
    at its next pass, and a request whose prefix resolved just before may sit in the
    resolve hub until the next poll, its hold taken: judging quiescence at the client's
    ``all_done`` would report those pages as leaked. A run with nothing left spawns
    nothing here, so its report (events included) is what it was."""
    if not any(e.has_work() for e in engines):
        return None

    def wait() -> Any:
        waited = 0.0
        while waited < DRAIN_MAX_S and any(e.has_work() for e in engines):
            yield rt.sleep(DRAIN_POLL_S)
            waited += DRAIN_POLL_S

    return rt.spawn(wait())


def timeline_tail(maxlen: int = TIMELINE_TAIL) -> Timeline:
    """A timeline that keeps its last ``maxlen`` entries. A monitor notes every step, so a
    long run's full timeline grows by one entry a step; a run that reports only the
    entries before a violation (the world and cluster runners) needs just the tail. The
    hunter, whose small runs read the whole timeline, passes a list."""
    return deque(maxlen=maxlen)


@dataclass
class MonitorConfig:
    liveness_ticks: int = 50          # scheduler passes with nothing admitted before F1-style alarm
    terminal_bound_s: float = 30.0    # after max(arrival, last heal): resolve 15 s + flush 5 s + slack
    check_pool_every: int = 1         # full pool.check() every N passes (O(pages)); the
                                      # incremental PoolAudit runs on every pass regardless
    max_passes_per_instant: int = 10_000

    def __post_init__(self) -> None:
        for name in ("liveness_ticks", "check_pool_every", "max_passes_per_instant"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, f"monitor.{name}", value, "an int >= 1")
        require(self.terminal_bound_s > 0, "monitor.terminal_bound_s", self.terminal_bound_s,
                "a number > 0 (seconds)")


@dataclass(slots=True)
class _Req:
    """What the monitor remembers of one request. ``pending`` (prompt, hashes, sink and its
    whole event stream) is let go at the first terminal event: afterwards only the id, the
    times and whether the client went away (``closed``, the sink's abort cell) are read, so
    a long run keeps a few bytes per finished request instead of every token event."""

    id: int
    pending: PendingRequest | None
    closed: Callable[[], bool]
    accepted_at: float
    adapter_loaded_at_arrival: bool = True
    terminals: int = 0
    terminal_at: float | None = None
    engine_done: bool = False


class Monitor:
    """Watches one engine, its store rank and tier."""

    def __init__(self, engine: Engine, store: KvStore, heal_s: float, config: MonitorConfig | None = None,
                 timeline: Timeline | None = None) -> None:
        self.engine = engine
        self.store = store
        self.rank = store.rank(engine.rank)
        self.pool = engine.pool
        self.audit = PoolAudit(engine.pool)
        self.heal_s = heal_s
        self.cfg = config or MonitorConfig()
        self.timeline = timeline if timeline is not None else []
        self.reqs: dict[int, _Req] = {}
        self.by_resolve_id: dict[str, _Req] = {}
        self._stalled_ticks = 0
        # Per request that joined the queue with a live prefix hold: its prefix and hold.
        self._holders: dict[int, tuple[KvPrefix, PrefixProbe]] = {}
        self._ticks = 0
        self._last_note = ""
        self._saves: list[Any] = []
        self._prune_saves_at = _MIN_SAVES_PRUNE
        self._instant = -1.0
        self._at_instant = 0
        self._repeats = 0
        self._handlers: dict[str, Callable[[dict[str, Any]], None] | None] = {}
        engine.observers.append(self.on_engine)
        store.observers.append(self.on_store)

    @property
    def rt(self) -> Any:
        return self.engine.rt

    def fail(self, name: str, detail: str) -> None:
        raise InvariantViolation(name, self.rt.now(), detail)

    def note(self, text: str) -> None:
        """Append to the readable timeline; a run of identical entries folds into one."""
        entry = f"{self.engine.name}: {text}"
        if self.timeline and self._last_note == entry:
            self._repeats += 1
            t0, _ = self.timeline[-1]
            self.timeline[-1] = (t0, f"{entry} (x{self._repeats})")
            return
        self._last_note = entry
        self._repeats = 1
        self.timeline.append((self.rt.now(), entry))

    # -- engine events ----------------------------------------------------------------
    def on_engine(self, kind: str, data: dict[str, Any]) -> None:
        try:
            handler = self._handlers[kind]
        except KeyError:  # first event of this kind: look its handler up once
            handler = self._handlers[kind] = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(data)

    def _on_accepted(self, d: dict[str, Any]) -> None:
        p: PendingRequest = d["req"]
        r = _Req(p.id, p, p.sink.abort_cell.is_closed, self.rt.now(), p.adapter_loaded_at_arrival)
        self.reqs[p.id] = r
        self.by_resolve_id[str(p.id)] = r
        self.note(f"accept r{p.id} prompt={p.prompt_len} max={p.req.max_tokens}"
                  + (f" lora={p.req.lora}" if p.req.lora else ""))

    def _on_tick(self, d: dict[str, Any]) -> None:
        self._ticks += 1
        now = self.rt.now()
        if now == self._instant:
            self._at_instant += 1
            if self._at_instant > self.cfg.max_passes_per_instant:
                self.fail("progress_at_one_instant",
                          f"{self._at_instant} scheduler passes without simulated time advancing (a hot spin)")
        else:
            self._instant, self._at_instant = now, 0
        try:
            if self._ticks % self.cfg.check_pool_every == 0:
                self.audit.check_all()
            else:
                self.audit.check_changes()
        except AccountingError as err:
            self.fail("page_conservation", str(err))
        self._check_holds()
        self._check_snapshot()
        self._check_liveness()

    def _on_queued(self, d: dict[str, Any]) -> None:
        for p in d["reqs"]:
            pre = p.kv_prefix
            if not pre.released and pre.hold is not None:
                self._holders[p.id] = (pre, pre.hold)

    def _check_holds(self) -> None:
        """held_page_integrity: every page a queued request's prefix hold pins is still
        referenced and still holds its block.

        Only the requests that joined the queue with a live hold (``_holders``) are looked
        at, not the whole queue every pass: a hold is taken before its request queues and,
        once released, stays released; a request's entry goes at its terminal event too. A
        broken one among them sends the queue through the walk that names the first broken
        queued hold, in queue order, as every pass once did; if that walk finds none, the
        broken ones have left the queue for good (nothing that leaves the waiting and
        prefilling queues comes back) and are forgotten."""
        holders = self._holders
        if not holders:
            return
        broken = []
        for rid, (pre, hold) in list(holders.items()):
            if pre.released:
                del holders[rid]
            elif self._broken_page(hold) is not None:
                broken.append(rid)
        if not broken:
            return
        self._fail_first_broken_hold()
        for rid in broken:
            del holders[rid]

    def _broken_page(self, hold: PrefixProbe) -> tuple[int, int] | None:
        """(block, page) of the hold's first page that is free or holds another block."""
        pool = self.pool
        for i, page in enumerate(hold.held.pages):
            if pool.refcount(page) < 1 or pool.block_hash(page) != hold.seq_hashes[i]:
                return i, page
        return None

    def _fail_first_broken_hold(self) -> None:
        e = self.engine
        for queue in (e.deferred, e.prefilling):
            for p in queue:
                pre = p.kv_prefix
                if pre.released or pre.hold is None:
                    continue
                bad = self._broken_page(pre.hold)
                if bad is not None:
                    self.fail("held_page_integrity",
                              f"r{p.id}'s held page {bad[1]} (block {bad[0]}) was evicted or reused")

    def _check_snapshot(self) -> None:
        e = self.engine
        owed = len(e.deferred) + e.hub.in_flight()
        if not owed:  # nothing the snapshot must count as waiting
            return
        snap = e.snapshot()
        if snap.waiting < owed:
            self.fail("load_snapshot_counts_resolves",
                      f"waiting={snap.waiting} but {len(e.deferred)} deferred + {e.hub.in_flight()} resolving")

    def _check_liveness(self) -> None:
        e = self.engine
        # Pages may legitimately be out of the pool while saves are in flight (guards), a
        # restore DMA is landing, or a resolve still waits on its (deadline-bounded) query.
        if self.rt.now() < self.heal_s or e.active or e.prefilling or not e.deferred or e.hub.in_flight() \
                or self.store.pinned_blocks(e.rank) or getattr(self.rank.tier, "loads_in_flight", 0):
            self._stalled_ticks = 0
            return
        usable = self.pool.max_request_blocks()
        bs = self.pool.block_size
        if not any(lifetime_blocks(p.prompt_len, p.req.max_tokens, bs) <= usable for p in e.deferred):
            self._stalled_ticks = 0
            return
        self._stalled_ticks += 1
        if self._stalled_ticks > self.cfg.liveness_ticks:
            held = sum(p.kv_prefix.held_blocks for p in e.deferred)
            self.fail("admission_liveness",
                      f"nothing running, {len(e.deferred)} deferred request(s) fit an empty pool of {usable} "
                      f"pages, none admitted for {self._stalled_ticks} passes; available="
                      f"{self.pool.available_blocks()}, pages held by queued holds={held}")

    def _on_admission(self, d: dict[str, Any]) -> None:
        res: AdmissionResult = d["result"]
        for p in res.admitted:
            self.note(f"admit r{p.id} credit={credit(p, self.pool.block_size)}")
        for p in res.shed:
            self.note(f"shed hold of r{p.id}")
        if res.admitted or d.get("lost"):
            self._stalled_ticks = 0
        self._check_single_charge(res)

    def _check_single_charge(self, res: AdmissionResult) -> None:
        if not res.budget_deferred:
            return
        e = self.engine
        bs = self.pool.block_size
        first = res.budget_deferred[0]
        admitted = {p.id for p in res.admitted}
        prefilling_before = [p for p in e.prefilling if p.id not in admitted]
        budget = self.pool.available_blocks() - future_draws(e.active, prefilling_before, bs)
        for p in res.considered:
            if p is first:
                break
            if p.id in admitted:
                budget -= lifetime_blocks(p.prompt_len, p.req.max_tokens, bs) - credit(p, bs)
        fresh = lifetime_blocks(first.prompt_len, first.req.max_tokens, bs) - credit(first, bs)
        if fresh <= budget:
            self.fail("single_charge_admission",
                      f"r{first.id} needs {fresh} fresh pages, {budget} are free after every admitted "
                      f"request's future draws (pinned={self.store.pinned_blocks(e.rank)}), yet it was deferred")

    def _on_step_start(self, d: dict[str, Any]) -> None:
        plan = d["plan"]
        # ``_value_``: the member's value itself; ``.value`` is a descriptor call a step
        self.note(f"step {plan.kind._value_} prefill={[(r.req_id, len(r.tokens)) for r in plan.prefill]} "
                  f"decode={len(plan.decode)}")

    def _on_step_failed(self, d: dict[str, Any]) -> None:
        self.note(f"step failed: {d['error']}")
        if d["error"] == KV_ALLOCATION_FAILED:
            self.fail("admitted_draw_never_fails", "an admitted request's page draw failed: the step errored")

    def _on_terminal(self, d: dict[str, Any]) -> None:
        ev = d["event"]
        r = self.reqs.get(ev.req_id)
        self.note(f"{ev.kind._value_} r{ev.req_id}" + (f" ({ev.message})" if ev.message else "")
                  + (" kv_degraded" if ev.kv_degraded else ""))
        self._holders.pop(ev.req_id, None)   # out of every queue for good (H16 leaks its hold)
        if r is None:
            return
        r.terminals += 1
        r.terminal_at = self.rt.now()
        if r.terminals > 1:
            self.fail("single_terminal_event", f"r{ev.req_id} got a second terminal event ({ev.kind.value})")
        assert r.pending is not None  # let go just below, at the first terminal event
        r.adapter_loaded_at_arrival = r.pending.adapter_loaded_at_arrival
        r.pending = None
        if ev.kind is EventKind.REJECTED and ev.message and "LoRA adapter is not loaded" in ev.message \
                and r.adapter_loaded_at_arrival:
            self.fail("control_linearizability",
                      f"r{ev.req_id} was accepted while its adapter was loaded, then rejected for it")

    def _on_control_applied(self, d: dict[str, Any]) -> None:
        pc = d["control"]
        self.note(f"control {pc.command.op} {pc.command.adapter or ''} -> ok={d['response'].ok}")
        for r in self.reqs.values():
            if r.id <= pc.after_request and r.terminals == 0 and not r.engine_done \
                    and not r.closed():
                self.fail("control_linearizability",
                          f"control #{pc.seq} applied while r{r.id}, which arrived before it, is unfinished")

    def _on_barrier_started(self, d: dict[str, Any]) -> None:
        """The engine is done with these requests; only their answer waits for the barrier."""
        self.note(f"barrier for {[f.event.req_id for f in d['finishes']]}")
        for f in d["finishes"]:
            r = self.reqs.get(f.event.req_id)
            if r is not None:
                r.engine_done = True

    def _on_finished_released(self, d: dict[str, Any]) -> None:
        now = self.rt.now()
        for f in d["finishes"]:
            if f.event.kv_degraded:
                continue
            for whose, recs in (("a sealed", f.cursor.records), ("its reused prefix's", f.cursor.inherited)):
                for rec in recs:
                    if rec.registered_at is None or rec.registered_at > now:
                        self.fail("kv_ready_after_registration",
                                  f"r{f.event.req_id}'s Finished left while {whose} save of {len(rec.hashes)} "
                                  f"blocks was not visible and registered (and it was not marked degraded)")

    # -- store events -----------------------------------------------------------------
    def on_store(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "save_submitted":
            self._saves.append(data["record"])
            if len(self._saves) >= self._prune_saves_at:
                # Without barriers (a mixed or decode role) nothing else prunes the list;
                # dropping the saves already visible or failed keeps it to those in flight.
                self._prune_saves()
                self._prune_saves_at = max(_MIN_SAVES_PRUNE, 2 * len(self._saves))
        elif kind == "barrier_done":
            self._check_barrier(data["outcome"])
        elif kind == "load_started":
            r = self.by_resolve_id.get(data["req_id"])
            if r is not None and r.closed():
                self.fail("resolve_observes_cancel",
                          f"r{r.id}'s resolve started a {data['blocks']}-block load after its cancel")

    def _prune_saves(self) -> None:
        """Keep only the saves a later barrier could still wrongly vouch for."""
        self._saves = [r for r in self._saves if r.registered_at is None and not r.failed]

    def _check_barrier(self, outcome: Any) -> None:
        """A barrier that says ok vouches for every save submitted before it started."""
        self._prune_saves()
        if not outcome.ok:
            return
        late = [r for r in self._saves if r.submitted_at <= outcome.started_at]
        if late:
            self.fail("barrier_covers_prior_saves",
                      f"a flush barrier started at {outcome.started_at:.4f}s reported ok while {len(late)} "
                      f"earlier save(s) were not visible and registered")

    # -- end of run -------------------------------------------------------------------
    def check_end(self, end_s: float) -> None:
        """Full pool audit, terminal bounds, then quiescence; call after the run has settled."""
        try:
            self.audit.check_all()
        except AccountingError as err:
            self.fail("page_conservation", str(err))
        for r in self.reqs.values():
            if r.closed():
                continue
            bound = max(r.accepted_at, self.heal_s) + self.cfg.terminal_bound_s
            if r.terminal_at is None and end_s >= bound:
                self.fail("bounded_terminal_event",
                          f"r{r.id} (accepted at {r.accepted_at:.3f}s) has no terminal event by "
                          f"{end_s:.3f}s; faults healed at {self.heal_s:.3f}s")
            if r.terminal_at is not None and r.terminal_at > bound:
                self.fail("bounded_terminal_event",
                          f"r{r.id}'s terminal event came at {r.terminal_at:.3f}s, after {bound:.3f}s")
        tier = self.rank.tier
        if tier is not None and tier.open_leases():
            self.fail("no_lease_leak", f"{tier.open_leases()} tier lease(s) still pin host blocks at the end")
        issues = [i for i in self.store.quiescent(self.engine.rank) if not i.startswith("open_leases")]
        if self.engine.has_work():   # queued, running, resolving or settled in the hub
            issues.append("requests still queued")
        if issues:
            self.fail("quiescence", "; ".join(issues))

    def loads_now(self) -> set[int]:
        return set(getattr(self.rank.tier, "active_loads", ()))

    def check_teardown(self, began_with: set[int]) -> None:
        """Loads in flight when the teardown barrier began must all have landed."""
        still = began_with & self.loads_now()
        if still:
            self.fail("teardown_drains_loads",
                      f"flush_loads returned while {len(still)} restore DMA(s) still write GPU pages")

    def check_teardown_saves(self, reading: int) -> None:
        """A teardown whose save flush said drained: no save it began with may still read
        GPU pages (``reading``: those still in flight, from the copy ledger)."""
        if reading:
            self.fail("teardown_drains_saves",
                      f"the teardown's flush_saves reported drained while {reading} save D2H(s) "
                      "it began with still read GPU pages")
