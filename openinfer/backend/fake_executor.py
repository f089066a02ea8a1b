"""A deterministic executor for tests: seeded tokens, step time from the runtime.

Tokens are a pure function of (seed, request id, position), so a run replays exactly and
two runs that differ only in scheduling produce the same text. ``stop_after`` makes a
request emit EOS at a chosen completion index, ``fail_steps`` makes chosen steps error.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import partial
from typing import Any

import numpy as np
from simpy.events import Event

from openinfer.backend.executor import DecodeBatch, RowResult, StepKind, StepPlan, StepResult
from openinfer.runtime import Runtime

StepTime = Callable[[StepPlan], float]
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """A cheap, well-mixed pure function: one per decode row is on the simulator's hot path."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _u64(v: int) -> np.ndarray:
    """``v`` as a 0-d uint64 array: the operand form a ufunc takes without converting it.
    A numpy scalar (``np.uint64(v)``) is converted to an array on every call
    (``PyArray_FromAny``); the per-step arithmetic below makes about a dozen such calls
    on a few dozen rows, so the conversion was a third of each call. Same dtype, same
    wrapping arithmetic, same bits."""
    return np.array(v, dtype=np.uint64)


_SM_C0, _SM_C1, _SM_C2 = _u64(0x9E3779B97F4A7C15), _u64(0xBF58476D1CE4E5B9), _u64(0x94D049BB133111EB)
_U21, _U27, _U30, _U31 = _u64(21), _u64(27), _u64(30), _u64(31)
_ONE = np.array(1, dtype=np.int64)  # a decode row's next position, as a 0-d operand too


def splitmix64_array(x: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """:func:`_splitmix64` over a uint64 array, in place (numpy's uint64 arithmetic wraps
    mod 2^64, as the Python version's masks do). ``scratch``: a uint64 array of x's shape
    for the shifted terms, so a caller that runs this every step (the decode rows' tokens)
    does not allocate three temporaries per call (numpy's per-call cost, not the
    arithmetic, is what a step's few dozen rows pay for)."""
    if scratch is None:
        scratch = np.empty_like(x)
    shift = np.right_shift
    x += _SM_C0
    x ^= shift(x, _U30, out=scratch)
    x *= _SM_C1
    x ^= shift(x, _U27, out=scratch)
    x *= _SM_C2
    x ^= shift(x, _U31, out=scratch)
    return x


def fixed_step_time(prefill_s_per_token: float = 43e-6, decode_s: float = 0.006) -> StepTime:
    def step_time(plan: StepPlan) -> float:
        t = plan.prefill_tokens * prefill_s_per_token + (decode_s if plan.decode else 0.0)
        return t if t > 0 else decode_s
    return step_time


class FakeExecutor:
    """Computes nothing; answers seeded tokens after a modelled step time."""

    # Answers a DecodeBatch plan with one token array (StepResult.decode_tokens): the
    # scheduler may then keep its decode rows as a cohort of arrays (no row objects).
    vector_decode = True

    def __init__(self, rt: Runtime, *, vocab_size: int = 151936, eos_token: int = 151645,
                 step_time: StepTime | None = None, seed: int = 0, max_loras: int = 1,
                 keep_log: bool = True) -> None:
        self.rt = rt
        self.vocab_size = vocab_size
        self.eos_token = eos_token
        self.step_time = step_time or fixed_step_time()
        self.seed = seed
        self.max_loras = max_loras
        self.stop_after: dict[int, int] = {}   # req_id -> completion index that is EOS
        self.fail_steps: set[int] = set()      # step numbers that raise a step error
        self.step_failure: Callable[[StepPlan], str | None] | None = None
        self.steps = 0
        self.busy_until = 0.0   # when the step in flight (the last one started) ends
        self._adapters: list[str] = []
        # (t, kind, prefill tokens, decode rows) of every step, for tests that read the
        # step sequence; ``keep_log=False`` (a long simulation: one tuple a step, kept
        # for the whole run) keeps none.
        self.log: list[tuple[float, StepKind, int, int]] = []
        self.keep_log = keep_log
        self._high_for: np.ndarray | None = None  # decode_tokens' cache: ids -> seed/id bits
        self._high: np.ndarray | None = None
        self._scratch: np.ndarray | None = None   # decode_tokens' splitmix scratch, per id array
        self._vocab_u64 = _u64(vocab_size)

    def token(self, req_id: int, position: int) -> int:
        tok = _splitmix64((self.seed << 42) ^ (req_id << 21) ^ position) % self.vocab_size
        return tok if tok != self.eos_token else (tok + 1) % self.vocab_size

    def execute(self, plan: StepPlan) -> Event:
        """The step's answer, ``step_time(plan)`` from now.

        A step is a sleep and then the answer, so it needs no process of its own: one
        runtime timer that computes the answer when it fires (one event a step instead of
        a process's three and its generator; a long simulation runs one step per few
        requests' tokens). An executor that spends the step's time differently (overrides
        ``_spend``, as sim.host_thread's host-holding one does) runs it as a process."""
        if type(self)._spend is not FakeExecutor._spend:
            return self.rt.spawn(self._execute(plan))
        rt = self.rt
        started = rt.now()
        self.steps += 1
        step = self.steps
        dt = self.step_time(plan)
        self.busy_until = started + dt
        return rt.later(dt, partial(self._result, plan, started, step))  # no lambda frame a step

    def _execute(self, plan: StepPlan) -> Generator[Event, Any, StepResult]:
        rt = self.rt
        started = rt.now()
        self.steps += 1
        step = self.steps
        dt = self.step_time(plan)
        self.busy_until = started + dt
        yield from self._spend(dt)
        return self._result(plan, started, step)

    def compute_free_at(self) -> float:
        """When the device is done with every step launched so far (a copy ordered after
        them starts then at the earliest: ``sim.copy_engine``'s ``after_compute``)."""
        return self.busy_until

    def _spend(self, seconds: float) -> Generator[Event, Any, None]:
        """Let the step's time pass: here, sleep through it (the host is free meanwhile)."""
        yield self.rt.sleep(seconds)

    def _result(self, plan: StepPlan, started: float, step: int) -> StepResult:
        """The step's answer once its time has passed: an injected failure, or every row's
        token. Shared by executors that spend the step's time differently."""
        if self.keep_log:
            self.log.append((started, plan.kind, plan.prefill_tokens, len(plan.decode)))
        error = "injected step failure" if step in self.fail_steps else None
        if error is None and self.step_failure is not None:
            error = self.step_failure(plan)
        if error is not None:
            return StepResult({}, error=error, started_at=started, finished_at=self.rt.now())
        rows: dict[int, RowResult] = {}
        for p in plan.prefill:
            if p.is_final:
                rows[p.req_id] = RowResult(self._next(p.req_id, p.kv.num_prompt, 0), logprob=-1.0)
            else:
                rows[p.req_id] = RowResult(None)
        decode = plan.decode
        if isinstance(decode, DecodeBatch):
            return StepResult(rows, started_at=started, finished_at=self.rt.now(),
                              decode_tokens=self.decode_tokens(decode))
        # The decode rows are a simulation's hot loop (one per row per token): ``_next`` and
        # ``token`` unrolled, same arithmetic.
        # _splitmix64 is inlined too: a call per row cost more than its arithmetic.
        stop, eos, vocab, high = self.stop_after, self.eos_token, self.vocab_size, self.seed << 42
        for d in plan.decode:
            rid = d.req_id
            position = d.position + 1
            if stop and stop.get(rid) == position - d.kv.num_prompt:
                tok = eos
            else:
                x = ((high ^ (rid << 21) ^ position) + 0x9E3779B97F4A7C15) & _MASK64
                x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
                x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
                tok = (x ^ (x >> 31)) % vocab
                if tok == eos:
                    tok = (tok + 1) % vocab
            rows[rid] = RowResult(tok, -1.0)
        return StepResult(rows, started_at=started, finished_at=self.rt.now())

    def decode_tokens(self, batch: DecodeBatch) -> np.ndarray:
        """Every row's token at once (int64, row order): the per-row formula of ``_result``
        (and ``token``/``_next``), EOS avoidance and ``stop_after`` included."""
        rids = batch.req_ids
        if rids is not self._high_for:  # the cohort keeps one id array until its rows change
            self._high_for = rids
            self._high = _u64((self.seed << 42) & _MASK64) ^ (rids.astype(np.uint64) << _U21)
            self._scratch = np.empty(len(rids), dtype=np.uint64)
        position = batch.positions + _ONE
        x = splitmix64_array(self._high ^ position.view(np.uint64), self._scratch)
        x %= self._vocab_u64
        tok = x.view(np.int64)
        eos = self.eos_token
        # count_nonzero of the mask: a third of the cost of ``eos in tok`` (which reduces
        # the same mask with ``any``, numpy's general reduction machinery)
        if eos < self.vocab_size and np.count_nonzero(tok == eos):
            tok[tok == eos] = (eos + 1) % self.vocab_size
        stop = self.stop_after
        if stop:
            completion = (position - batch.num_prompt).tolist()
            get = stop.get
            eos_rows = [i for i, (rid, c) in enumerate(zip(rids.tolist(), completion)) if get(rid) == c]
            if eos_rows:
                tok[eos_rows] = eos
        return tok

    def _next(self, req_id: int, position: int, completion: int) -> int:
        if self.stop_after.get(req_id) == completion:
            return self.eos_token
        return self.token(req_id, position)

    # -- LoRA -------------------------------------------------------------------------
    def load_adapter(self, name: str) -> str | None:
        if name in self._adapters:
            return f"adapter {name!r} is already loaded"
        if len(self._adapters) >= self.max_loras:
            return f"max_loras={self.max_loras} adapters already loaded"
        self._adapters.append(name)
        return None

    def unload_adapter(self, name: str) -> str | None:
        if name not in self._adapters:
            return f"adapter {name!r} is not loaded"
        self._adapters.remove(name)
        return None

    def adapters(self) -> list[str]:
        return list(self._adapters)
