"""Stateful fuzz of BlockPool + RequestKv + probes / reservations / guards (spec §2).

A reference model counts, for every page, the strong references the test itself holds
(request page lists, probe holds, save guards, raw allocations, live reservations, and
the padding page). After every step the pool must agree with it exactly: that catches
leaks, double frees, and pages handed out while someone still holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from openinfer.errors import AccountingError
from openinfer.kv.hashing import BASE_SALT, block_hashes, salt_hash
from openinfer.kv.pool import BlockPool, PageRefs
from openinfer.kv.pool_audit import PoolAudit
from openinfer.kv.probe import PrefixProbe, Reservation, commit_loaded_blocks, probe_prefix, \
    reserve_loaded_blocks
from openinfer.kv.request_kv import KvState, RequestKv, ceil_div

BS = 4
_BASE = [1 + i for i in range(40)]
FAMILIES = [
    _BASE,
    [100 + i for i in range(40)],
    _BASE[:8] + [200 + i for i in range(32)],  # shares two blocks with family 0
]
SALTS = [BASE_SALT, salt_hash("tenant-b")]

MACHINE_SETTINGS = settings(max_examples=120, stateful_step_count=40, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])

idx = st.integers(0, 10_000)


@dataclass
class Req:
    kv: RequestKv
    generated: int = 0
    pre_len: int = 0  # pages before the scheduled step


@dataclass
class Hold:
    """A probe hold, with the hash each pinned page must keep while pinned."""

    probe: PrefixProbe
    names: dict[int, bytes] = field(default_factory=dict)


@dataclass
class Guard:
    refs: PageRefs
    names: dict[int, bytes] = field(default_factory=dict)


class PoolMachine(RuleBasedStateMachine):
    entitlement = False

    @initialize(num_blocks=st.integers(2, 20))
    def setup(self, num_blocks):
        self.pool = BlockPool(BS, num_blocks, entitlement=self.entitlement)
        self.audit = PoolAudit(self.pool)
        self.n = num_blocks
        self.reqs: list[Req] = []
        self.raw: list[list[int]] = []
        self.holds: list[Hold] = []
        self.guards: list[Guard] = []
        self.resv: list[Reservation] = []
        self.dead: list[object] = []  # released owners, for double-release checks
        self.reset_marked: set[int] = set()
        self.tick = 0
        self.inactive_since: dict[int, int] = {}

    # -- model ------------------------------------------------------------------------------
    def expected_refs(self) -> list[int]:
        refs = [0] * self.n
        refs[self.pool.padding_page] += 1
        owners = [r.kv.pages for r in self.reqs] + self.raw + [h.probe.held.pages for h in self.holds] \
            + [g.refs.pages for g in self.guards] + [r.pages for r in self.resv]
        for pages in owners:
            for p in pages:
                refs[p] += 1
        return refs

    def held_by_us(self) -> set[int]:
        return {p for p, c in enumerate(self.expected_refs()) if c > 0}

    def is_inactive(self, p: int) -> bool:
        return self.pool.is_free(p) and self.pool.block_hash(p) is not None

    def observe(self) -> None:
        """Note when each page entered the inactive pool (the LRU order the pool must keep)."""
        self.tick += 1
        for p in range(self.n):
            if self.is_inactive(p):
                self.inactive_since.setdefault(p, self.tick)
            else:
                self.inactive_since.pop(p, None)

    def drawn(self, draw, new_pages=None):
        """Run an allocating call; check it handed out only free pages, evicting LRU first."""
        self.observe()
        protected = self.held_by_us()
        before = dict(self.inactive_since)
        reset = self.pool.reset_blocks()
        pages = draw()
        if new_pages is not None:
            got = new_pages()
        else:
            got = pages if isinstance(pages, list) else (pages.pages if pages is not None else [])
        if got:
            assert len(set(got)) == len(got), f"allocation repeated a page: {got}"
            assert not set(got) & protected, f"handed out held pages {set(got) & protected}"
            assert self.pool.padding_page not in got
            assert all(self.pool.block_hash(p) is None for p in got)
            evicted = [p for p in before if p in got]
            assert len(evicted) == max(0, len(got) - reset), "evicted while reset pages were free"
            kept = [before[p] for p in before if p not in got]
            if evicted and kept:
                assert max(before[p] for p in evicted) <= min(kept), "eviction is not LRU"
        self.observe()
        return pages

    def pick(self, items, i):
        return items[i % len(items)]

    # -- raw allocation -----------------------------------------------------------------------
    @rule(n=st.integers(0, 4))
    def allocate(self, n):
        avail = self.pool.available_blocks()
        pages = self.drawn(lambda: self.pool.allocate(n))
        if avail >= n:
            assert pages is not None and len(pages) == n
            self.raw.append(pages)
        else:
            assert pages is None
            assert self.pool.available_blocks() == avail

    @precondition(lambda self: self.raw)
    @rule(i=idx)
    def release_raw(self, i):
        pages = self.raw.pop(i % len(self.raw))
        self.pool.release_all(pages)

    # -- requests -----------------------------------------------------------------------------
    def _new(self, family, length, max_tokens, salt, match) -> Req:
        kv = RequestKv(self.pool, FAMILIES[family][:length], max_tokens, SALTS[salt])
        assert kv.lifetime_blocks >= 1
        if self.entitlement:
            avail, entitled = self.pool.available_blocks(), self.pool.entitled
            assert kv.try_admit() == (avail >= entitled + kv.remaining_blocks)
        if match:
            cap = (length - 1) // BS
            expected = self.pool.prefix_length(kv.hashes[:cap])
            assert kv.match_and_add_prefix() == expected * BS
            assert kv.prefix_matched_blocks == expected == kv.registered
            for i, p in enumerate(kv.pages):
                assert self.pool.block_hash(p) == kv.hashes[i]
        req = Req(kv)
        self.reqs.append(req)
        return req

    def _schedule(self, req: Req, chunk: int) -> bool | None:
        """Schedule the request's next step; None when it has nothing left to run."""
        kv = req.kv
        avail = self.pool.available_blocks()
        req.pre_len = len(kv.pages)
        if not kv.prefill_done:
            n = min(chunk, kv.num_prompt - kv.prefill_position)
            need = ceil_div(kv.prefill_position + n, BS) - len(kv.pages)
            ok = self.drawn(lambda: kv.schedule_prefill(n), lambda: kv.pages[req.pre_len:])
        elif req.generated < kv.max_tokens:
            n = 1
            need = ceil_div(kv.kv_position + 2, BS) - len(kv.pages)
            ok = self.drawn(kv.schedule_decode, lambda: kv.pages[req.pre_len:])
        else:
            return None
        assert ok == (avail >= need), (ok, avail, need)
        if not ok:
            assert len(kv.pages) == req.pre_len and kv.state is KvState.IDLE
            return False
        assert len(kv.pages) <= kv.lifetime_blocks, "draw beyond lifetime_blocks"
        rows = kv.step_page_indices(n)
        assert len(rows) == ceil_div(kv.kv_position + n, BS)
        assert len(kv.pages) - len(rows) in (0, 1)
        return True

    def _finish(self, req: Req, token: int, revert: bool) -> None:
        kv = req.kv
        if revert:
            kv.revert_schedule()
            assert len(kv.pages) == req.pre_len
        elif kv.state is KvState.PREFILL_SCHEDULED:
            kv.apply_prefill(next_token=token)
            if kv.prefill_done:
                req.generated = 1
        else:
            kv.apply_decode(token)
            req.generated += 1
        assert kv.state is KvState.IDLE
        assert kv.registered == kv.kv_position // BS
        n = kv.registered
        assert kv.hashes[:n] == block_hashes(kv.tokens, BS, kv.salt)[:n]
        self.observe()

    def _mark(self, req: Req) -> None:
        for p in req.kv.pages:
            h = self.pool.block_hash(p)
            if h is not None and self.pool.primary_page(h) == p:
                self.reset_marked.add(p)
        req.kv.mark_reset_on_release()

    def _release(self, req: Req) -> None:
        self.reqs.remove(req)
        req.kv.release()
        assert req.kv.pages == []
        self.dead.append(req.kv)
        self.observe()
        self.check_reset_marked()

    @rule(family=st.integers(0, 2), length=st.integers(1, 40), max_tokens=st.integers(1, 12),
          salt=st.integers(0, 1), match=st.booleans())
    def new_request(self, family, length, max_tokens, salt, match):
        self._new(family, length, max_tokens, salt, match)

    @rule(family=st.integers(0, 2), length=st.integers(1, 24), max_tokens=st.integers(1, 10),
          salt=st.integers(0, 1), match=st.booleans(), chunk=st.integers(1, 12),
          tokens=st.lists(st.integers(0, 3), max_size=10), then=st.sampled_from(["keep", "release", "reset"]))
    def run_request(self, family, length, max_tokens, salt, match, chunk, tokens, then):
        """A whole lifecycle in one rule: prefill in chunks, decode, then maybe finish."""
        req = self._new(family, length, max_tokens, salt, match)
        for token in [0, *tokens]:
            ok = self._schedule(req, chunk)
            if not ok:
                break
            self._finish(req, token, revert=False)
        if then == "reset":
            self._mark(req)
        if then != "keep":
            self._release(req)

    @precondition(lambda self: any(r.kv.state is KvState.IDLE for r in self.reqs))
    @rule(i=idx, chunk=st.integers(1, 10))
    def schedule_step(self, i, chunk):
        idle = [r for r in self.reqs if r.kv.state is KvState.IDLE]
        self._schedule(self.pick(idle, i), chunk)

    @precondition(lambda self: any(r.kv.state in (KvState.PREFILL_SCHEDULED, KvState.DECODE_SCHEDULED)
                                   for r in self.reqs))
    @rule(i=idx, token=st.integers(0, 3), revert=st.booleans())
    def finish_step(self, i, token, revert):
        busy = [r for r in self.reqs if r.kv.state in (KvState.PREFILL_SCHEDULED, KvState.DECODE_SCHEDULED)]
        self._finish(self.pick(busy, i), token, revert)

    @precondition(lambda self: self.reqs)
    @rule(i=idx)
    def mark_reset_on_release(self, i):
        self._mark(self.pick(self.reqs, i))

    @precondition(lambda self: self.reqs)
    @rule(i=idx)
    def release_request(self, i):
        self._release(self.pick(self.reqs, i))

    # -- probes / holds -------------------------------------------------------------------------
    def known_requests(self) -> list[RequestKv]:
        return [r.kv for r in self.reqs] + [d for d in self.dead if isinstance(d, RequestKv)]

    @precondition(lambda self: self.known_requests())
    @rule(i=idx, length=st.integers(1, 40))
    def probe_known_prompt(self, i, length):
        """Probe a namespace some request used, so the probe usually finds GPU hits."""
        kv = self.pick(self.known_requests(), i)
        family = next(f for f, toks in enumerate(FAMILIES) if toks[:kv.num_prompt] == kv.tokens[:kv.num_prompt])
        self.probe(family, length, SALTS.index(kv.salt))

    @rule(family=st.integers(0, 2), length=st.integers(1, 40), salt=st.integers(0, 1))
    def probe(self, family, length, salt):
        tokens = FAMILIES[family][:length]
        hashes = block_hashes(tokens, BS, SALTS[salt])
        expected = self.pool.prefix_length(hashes)
        pr = probe_prefix(self.pool, hashes, length)
        assert pr.gpu_hit == expected == pr.held_blocks
        assert pr.cacheable == (length - 1) // BS
        names = {p: hashes[k] for k, p in enumerate(pr.held.pages)}
        for p, h in names.items():
            assert self.pool.block_hash(p) == h
        self.holds.append(Hold(pr, names))

    @precondition(lambda self: self.holds)
    @rule(i=idx, k=st.integers(0, 6))
    def truncate_hold(self, i, k):
        hold = self.pick(self.holds, i)
        hold.probe.truncate_held(k)
        assert hold.probe.held_blocks <= k
        hold.names = {p: h for p, h in hold.names.items() if p in hold.probe.held.pages}

    @precondition(lambda self: self.holds)
    @rule(i=idx)
    def release_hold(self, i):
        hold = self.holds.pop(i % len(self.holds))
        hold.probe.release()
        self.dead.append(hold.probe.held)

    # -- save guards -------------------------------------------------------------------------------
    @precondition(lambda self: any(self.pool.block_hash(p) is not None for p in range(self.n)))
    @rule(data=st.data())
    def guard(self, data):
        named = [p for p in range(self.n) if self.pool.block_hash(p) is not None]
        pages = data.draw(st.lists(st.sampled_from(named), min_size=1, max_size=3), label="pages")
        names = {p: self.pool.block_hash(p) for p in pages}
        self.guards.append(Guard(PageRefs.guard(self.pool, pages), names))

    @precondition(lambda self: self.guards)
    @rule(i=idx)
    def release_guard(self, i):
        g = self.guards.pop(i % len(self.guards))
        g.refs.release()
        self.dead.append(g.refs)

    # -- restore reservations -------------------------------------------------------------------
    @rule(n=st.integers(1, 5))
    def reserve(self, n):
        headroom = self.pool.headroom()
        r = self.drawn(lambda: reserve_loaded_blocks(self.pool, n))
        assert (r is not None) == (headroom >= n)
        if r is not None:
            assert len(r) == n
            self.resv.append(r)

    @precondition(lambda self: self.resv)
    @rule(i=idx)
    def release_reservation(self, i):
        r = self.resv.pop(i % len(self.resv))
        r.release()
        self.dead.append(r)

    @precondition(lambda self: self.resv and self.holds)
    @rule(i=idx, j=idx)
    def commit(self, i, j):
        r = self.pick(self.resv, i)
        hold = self.pick(self.holds, j)
        pr = hold.probe
        start = pr.gpu_hit
        if start + len(r) > len(pr.seq_hashes):
            try:
                commit_loaded_blocks(pr, r)
            except AccountingError:
                assert r.state == "reserved"
                return
            raise AssertionError("commit past the prompt's blocks was accepted")
        wanted = pr.seq_hashes[start:start + len(r)]
        primaries = [self.pool.primary_page(h) for h in wanted]
        before = len(pr.held.pages)
        commit_loaded_blocks(pr, r)
        self.resv.remove(r)
        self.dead.append(r)
        added = pr.held.pages[before:]
        assert len(added) == len(r)
        for k, (p, h, prim) in enumerate(zip(added, wanted, primaries)):
            assert self.pool.block_hash(p) == h
            # dedupe: a block registered meanwhile is held as its primary, not as a copy
            assert p == (prim if prim is not None else r.pages[k])
            hold.names[p] = h

    # -- pool-wide operations ----------------------------------------------------------------------
    @rule()
    def evict_inactive(self):
        inactive = self.pool.inactive_blocks()
        reset = self.pool.reset_blocks()
        assert self.pool.evict_inactive() == inactive
        assert self.pool.inactive_blocks() == 0
        assert self.pool.reset_blocks() == reset + inactive

    @precondition(lambda self: self.dead)
    @rule(i=idx)
    def double_release_is_refused(self, i):
        owner = self.pick(self.dead, i)
        refs_before = [self.pool.refcount(p) for p in range(self.n)]
        try:
            owner.release()
        except AccountingError:
            pass
        else:
            raise AssertionError(f"second release of {type(owner).__name__} was accepted")
        assert [self.pool.refcount(p) for p in range(self.n)] == refs_before

    # -- invariants ---------------------------------------------------------------------------------
    @invariant()
    def pool_is_consistent(self):
        if not hasattr(self, "pool"):
            return
        pool = self.pool
        self.audit.check_changes()  # the monitors' O(changes) audit agrees with the full check below
        pool.check()
        refs = [pool.refcount(p) for p in range(self.n)]
        assert min(refs) >= 0
        active = sum(1 for c in refs if c > 0)
        assert pool.reset_blocks() + pool.inactive_blocks() + active == pool.total_blocks()
        assert pool.available_blocks() == pool.reset_blocks() + pool.inactive_blocks()
        assert pool.inactive_blocks() == sum(1 for p in range(self.n) if self.is_inactive(p))
        assert refs == self.expected_refs(), "pool refcounts disagree with the holders"
        self.observe()

    @invariant()
    def pinned_pages_keep_their_names(self):
        if not hasattr(self, "pool"):
            return
        for owner in [*self.holds, *self.guards]:
            for p, h in owner.names.items():
                assert self.pool.refcount(p) > 0
                assert self.pool.block_hash(p) == h, f"pinned page {p} lost its block"
        for req in self.reqs:
            for k in range(req.kv.registered):
                assert self.pool.block_hash(req.kv.pages[k]) == req.kv.hashes[k]

    @invariant()
    def entitlement_counter_matches_admitted_requests(self):
        if not hasattr(self, "pool"):
            return
        expected = sum(r.kv.remaining_blocks for r in self.reqs if r.kv.admitted)
        assert self.pool.entitled == expected

    @invariant()
    def padding_page_is_permanent(self):
        if not hasattr(self, "pool"):
            return
        pad = self.pool.padding_page
        assert self.pool.refcount(pad) >= 1
        assert self.pool.block_hash(pad) == BASE_SALT
        assert not self.pool.is_free(pad)

    @invariant()
    def check_reset_marked(self):
        """A page marked reset-on-release never parks in the inactive pool."""
        if not hasattr(self, "pool"):
            return
        for p in list(self.reset_marked):
            if self.pool.refcount(p) == 0:
                assert self.pool.block_hash(p) is None, f"page {p} was marked reset-on-release but parked"
                self.reset_marked.discard(p)


class EntitlementMachine(RuleBasedStateMachine):
    """entitlement=True: admitted requests vs. opportunistic restore reservations."""

    @initialize(num_blocks=st.integers(2, 16))
    def setup(self, num_blocks):
        self.pool = BlockPool(BS, num_blocks, entitlement=True)
        self.reqs: list[Req] = []
        self.resv: list[Reservation] = []
        self.holds: list[PrefixProbe] = []
        self.salt_counter = 0

    @rule(family=st.integers(0, 2), length=st.integers(1, 30), max_tokens=st.integers(1, 16),
          match=st.booleans(), fill=st.booleans())
    def admit(self, family, length, max_tokens, match, fill):
        if fill:  # size the request to take exactly the remaining headroom
            headroom = self.pool.available_blocks() - self.pool.entitled
            max_tokens = max(2, headroom * BS - length)
        kv = RequestKv(self.pool, FAMILIES[family][:length], max_tokens, BASE_SALT)
        avail, entitled = self.pool.available_blocks(), self.pool.entitled
        ok = kv.try_admit()
        assert ok == (avail >= entitled + kv.remaining_blocks)
        if not ok:
            assert self.pool.entitled == entitled and not kv.admitted
            kv.release()
            assert self.pool.entitled == entitled
            return
        assert kv.try_admit() and self.pool.entitled == entitled + kv.lifetime_blocks  # idempotent
        if match:
            kv.match_and_add_prefix()
        self.reqs.append(Req(kv))

    @rule(family=st.integers(0, 2), length=st.integers(4, 30))
    def finished_request_leaves_inactive_blocks(self, family, length):
        """An admitted prompt-only request runs its prefill and leaves: its blocks go inactive."""
        kv = RequestKv(self.pool, FAMILIES[family][:length], 1, BASE_SALT)
        if not kv.try_admit():
            kv.release()
            return
        kv.match_and_add_prefix()
        assert kv.schedule_prefill(length - kv.prefill_position), "an admitted prefill draw failed"
        kv.apply_prefill(next_token=0)
        kv.release()

    @precondition(lambda self: self.reqs)
    @rule(i=idx, chunk=st.integers(1, 10), token=st.integers(0, 3), revert=st.booleans())
    def step(self, i, chunk, token, revert):
        req = self.reqs[i % len(self.reqs)]
        kv = req.kv
        if not kv.prefill_done:
            n = min(chunk, kv.num_prompt - kv.prefill_position)
            assert kv.schedule_prefill(n), "an admitted prefill draw failed"
        elif req.generated < kv.max_tokens:
            assert kv.schedule_decode(), "an admitted decode draw failed"
        else:
            return
        assert kv.resident_blocks <= kv.lifetime_blocks
        if revert:
            kv.revert_schedule()
        elif kv.state is KvState.PREFILL_SCHEDULED:
            kv.apply_prefill(next_token=token)
            if kv.prefill_done:
                req.generated = 1
        else:
            kv.apply_decode(token)
            req.generated += 1

    @rule(n=st.integers(1, 6))
    def reserve(self, n):
        avail, entitled = self.pool.available_blocks(), self.pool.entitled
        r = reserve_loaded_blocks(self.pool, n)
        assert (r is not None) == (avail - entitled >= n)
        if r is not None:
            self.resv.append(r)

    @precondition(lambda self: self.resv)
    @rule(i=idx, commit=st.booleans(), family=st.integers(0, 2))
    def settle_reservation(self, i, commit, family):
        r = self.resv.pop(i % len(self.resv))
        if not commit:
            r.release()
            return
        # a restore into a fresh namespace: the probe itself pins nothing
        self.salt_counter += 1
        tokens = FAMILIES[family][: BS * len(r) + 1]
        pr = probe_prefix(self.pool, block_hashes(tokens, BS, salt_hash(f"r{self.salt_counter}")),
                          len(tokens))
        assert pr.held_blocks == 0
        commit_loaded_blocks(pr, r)
        self.holds.append(pr)

    @rule(family=st.integers(0, 2), length=st.integers(1, 30))
    def probe_respecting_the_floor(self, family, length):
        """A resolve's probe of the GPU radix may pin inactive blocks only above the floor."""
        tokens = FAMILIES[family][:length]
        pr = probe_prefix(self.pool, block_hashes(tokens, BS, BASE_SALT), length, respect_floor=True)
        self.holds.append(pr)

    @precondition(lambda self: self.holds)
    @rule(i=idx)
    def release_hold(self, i):
        self.holds.pop(i % len(self.holds)).release()

    @precondition(lambda self: self.reqs)
    @rule(i=idx)
    def release_request(self, i):
        self.reqs.pop(i % len(self.reqs)).kv.release()

    @rule()
    def evict_inactive(self):
        self.pool.evict_inactive()

    @invariant()
    def entitled_is_the_undrawn_remainder(self):
        if not hasattr(self, "pool"):
            return
        self.pool.check()
        expected = sum(max(0, r.kv.lifetime_blocks - r.kv.resident_blocks) for r in self.reqs)
        assert self.pool.entitled == expected
        assert self.pool.available_blocks() >= self.pool.entitled, "the entitlement floor was breached"

    def teardown(self):
        if not hasattr(self, "pool"):
            return
        for r in self.reqs:
            r.kv.release()
        for r in self.resv:
            r.release()
        for h in self.holds:
            h.release()
        assert self.pool.entitled == 0
        assert self.pool.available_blocks() == self.pool.max_request_blocks()


class EntitledPoolMachine(PoolMachine):
    """The full machine with the floor on: requests are admitted when they fit, the counter
    follows every draw/revert/match/release, and reservations must respect headroom()."""

    entitlement = True


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = MACHINE_SETTINGS
TestEntitlementMachine = EntitlementMachine.TestCase
TestEntitlementMachine.settings = MACHINE_SETTINGS
TestEntitledPoolMachine = EntitledPoolMachine.TestCase
TestEntitledPoolMachine.settings = settings(MACHINE_SETTINGS, max_examples=40)
