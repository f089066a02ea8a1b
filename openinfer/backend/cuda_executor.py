"""The real executor: a step plan run by Qwen3Model over the paged KVArena.

Why it is shaped like this:

* The scheduler owns every page decision; pool page ids ARE arena page ids (the arena is
  sized from the pool, page for page), so a row's page table is just ``row.kv.pages`` and
  the pool's padding page is the arena page that padding rows and table padding point at.
* A prefill chunk maps to ``SeqInput(tokens, start, pages)``, a decode row to
  ``SeqInput([token], position, pages)``; one forward serves prefill, decode and unified
  steps. Pure decode steps on CUDA replay a captured CUDA graph (``DecodeGraphs``);
  everything else runs eagerly (the reference backend on CPU, so CI runs this path).
* The step plan carries no sampling parameters, so by default every row is GREEDY.
  ``observe(engine)`` subscribes to the engine's "accepted" events to learn each
  request's ``SamplingParams``; rows of requests with ``temperature > 0`` are then drawn
  with temperature/top-k/top-p from a generator seeded by (request seed, position), so a
  request's tokens do not depend on what else was batched with it.
* The result comes back as a runtime event: on CUDA a kernel stores the sampled ids into
  pinned host memory (``readback``: not through the copy engine, where KV saves would
  delay it), the host records a CUDA event and polls it via ``rt.sleep(poll_s)``, so
  copies and resolves keep making progress while the GPU computes. Nothing in a step's
  launch waits for the GPU (inputs go up through pinned memory, ``batch.upload``). No
  clock is read here: device time comes from CUDA events (``gpu_s``), wall time from
  ``rt.now()`` (``wall_s``).
* Each step leaves a :class:`StepTiming` record with the plan-derived counts the
  simulator's step models use, for calibration (``write_timings_jsonl``).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from simpy.events import Event

from openinfer.backend.buckets import GRAPH_BUCKETS
from openinfer.backend.executor import RowResult, StepKind, StepPlan, StepResult
from openinfer.backend.fake_executor import _MASK64, _splitmix64
from openinfer.backend.jsonl import write_jsonl
from openinfer.models.qwen3.batch import ForwardBatch, SeqInput, upload
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.models.qwen3.model import Qwen3Model
from openinfer.models.qwen3.sampling import SamplingParams as ModelSampling
from openinfer.models.qwen3.sampling import SamplingTensors, sample
from openinfer.runtime import Runtime

QWEN3_EOS = 151645  # <|im_end|>

# Steps run once before serving, each a tuple of (new tokens, cached tokens) per sequence:
# between them they reach every kernel specialisation a served run does (Triton compiles
# one per row count that is 1, a multiple of 16 or neither, and per path: the skinny GEMM
# up to 16 rows, cuBLAS beyond; with or without a cached prefix; prefill, eager decode and
# unified steps). Compiling one takes ~1 s, which in a served run shows up as a one-token
# step of a second.
WARM_UP_STEPS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((1, 0),), ((1, 17),), ((5, 0),), ((5, 21),), ((16, 0),), ((16, 32),), ((37, 0),),
    ((37, 19),), ((200, 40),),
    ((1, 20), (1, 33)), ((1, 20),) * 16, ((1, 20),) * 17,
    ((24, 8), (1, 40), (1, 50)), ((3, 0), (2, 9)),
)


def _mix(*xs: int) -> int:
    """splitmix64 chained over the arguments: a replayable seed per (request seed, position)."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = _splitmix64(h ^ (x & _MASK64))
    return h & ((1 << 63) - 1)


@dataclass
class StepTiming:
    """One executed step. Counts are plan-derived (what sim.step_features reduces a plan
    to can be recomputed from them); times in seconds."""

    step: int                       # 1-based step index of this executor
    kind: str                       # prefill / decode / unified
    started_at: float               # rt.now() when execute() was called
    prefill_tokens: int
    prefill: list[tuple[int, int, bool, bool]]  # per chunk: (start, n, is_final, all_logits)
    decode_positions: list[int]     # per decode row: the position of its input token
    decode_rows: int
    decode_rows_padded: int         # rows actually run: the graph bucket, else decode_rows
    graph: bool                     # replayed a decode CUDA graph
    gpu_s: float | None = None      # CUDA-event time of forward + sampling (None on CPU)
    wall_s: float = 0.0             # rt.now() from execute() to the result
    error: str | None = None
    prefill_graph: tuple[int, int] | None = None  # (tokens, seqs) bucket of the prefill graph replayed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Rows:
    seqs: list[SeqInput] = field(default_factory=list)
    req_ids: list[int] = field(default_factory=list)
    final: list[bool] = field(default_factory=list)
    next_pos: list[int] = field(default_factory=list)  # position of the token being sampled
    all_logits: bool = False
    write_pages: list[int] = field(default_factory=list)
    read_pages: list[int] = field(default_factory=list)


class CudaExecutor:
    """Executor protocol on a real Qwen3 (CUDA, or CPU with the reference backend)."""

    def __init__(self, rt: Runtime, model: Qwen3Model, arena: KVArena, *, padding_page: int = 0,
                 max_pages_per_seq: int | None = None, cuda_graphs: bool | None = None,
                 graph_buckets: Sequence[int] | None = None, eos_token: int | None = None,
                 poll_s: float = 2e-5, seed: int = 0, transfer: Any = None,
                 prefill_graphs: bool | None = None) -> None:
        self.rt = rt
        self.model = model
        self.arena = arena
        self.padding_page = padding_page
        self.block_size = arena.block_size
        self.max_pages_per_seq = max_pages_per_seq or arena.num_pages
        self.vocab_size = model.cfg.vocab_size
        self.eos_token = eos_token if eos_token is not None else (
            QWEN3_EOS if QWEN3_EOS < self.vocab_size else self.vocab_size)  # never sampled
        self.poll_s = poll_s
        self.seed = seed
        self.transfer = transfer  # optional CudaTransfer: checks steps against copies in flight
        self.device = model.device
        self.on_cuda = self.device.type == "cuda"
        want_graphs = self.on_cuda and model.ops.name == "triton" if cuda_graphs is None else cuda_graphs
        self.graph_buckets = list(graph_buckets) if graph_buckets is not None else None
        self.graphs: Any = None
        self._want_graphs = bool(want_graphs)
        self._want_prefill_graphs = self._want_graphs if prefill_graphs is None else bool(prefill_graphs)
        self.prefill_graphs: Any = None
        self.params: dict[int, Any] = {}  # req_id -> scheduler SamplingParams (via observe)
        self.steps = 0
        self.timings: list[StepTiming] = []

    def _on_device(self) -> AbstractContextManager[Any]:
        """The model's GPU as the current device: events record, Triton launches and
        graphs capture on the current device's stream, so on ``cuda:1`` without this they
        would go to device 0 (an end event that fires at once, a readback read early)."""
        return torch.cuda.device(self.device) if self.on_cuda else nullcontext()

    # -- set-up ------------------------------------------------------------------------
    def capture_graphs(self) -> None:
        """Capture the decode buckets (slow: compile + warm-up per bucket), once; and the
        prefill buckets when asked for (``prefill_graphs``)."""
        with self._on_device():
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        if self._want_graphs and self.graphs is None:
            from openinfer.models.qwen3.cuda_graphs import DecodeGraphs
            buckets = self.graph_buckets or list(GRAPH_BUCKETS)
            self.graphs = DecodeGraphs(self.model, self.arena, self.max_pages_per_seq, buckets,
                                       padding_page=self.padding_page)
            self.graphs.capture()
        if self._want_prefill_graphs and self.prefill_graphs is None:
            from openinfer.models.qwen3.prefill_graphs import PrefillGraphs
            self.prefill_graphs = PrefillGraphs(self.model, self.arena, self.max_pages_per_seq,
                                                padding_page=self.padding_page)
            self.prefill_graphs.capture()

    @torch.inference_mode()
    def warm_up(self, steps: Sequence[tuple[tuple[int, int], ...]] = WARM_UP_STEPS) -> int:
        """Run each of ``steps`` once, eagerly, so every kernel is compiled before serving
        rather than during a step. Call before the pool hands out pages: it writes only
        pages other than the padding page and zeroes them afterwards. Returns the number of
        steps run (a step that needs more pages than the arena has is left out)."""
        with self._on_device():
            return self._warm_up(steps)

    def _warm_up(self, steps: Sequence[tuple[tuple[int, int], ...]]) -> int:
        from openinfer.backend.readback import to_host  # Triton: imported when first needed
        bs = self.block_size
        free = [p for p in range(self.arena.num_pages) if p != self.padding_page]
        touched = 0
        ran = 0
        for step in steps:
            need = [-(-(new + cached) // bs) for new, cached in step]
            if sum(need) > len(free) or max(need) > self.max_pages_per_seq:
                continue
            seqs, used = [], 0
            for (new, cached), n in zip(step, need):
                seqs.append(SeqInput([1] * new, cached, free[used:used + n]))
                used += n
            batch = ForwardBatch.from_seqs(seqs, bs, self.device, padding_page=self.padding_page)
            logits = self.model.forward(batch, self.arena)
            to_host(logits.argmax(-1), logits.logsumexp(-1))  # compiles it too; it keeps its buffers
            touched = max(touched, used)
            ran += 1
        if self.on_cuda:
            torch.cuda.synchronize(self.device)
        if touched:
            self.arena.data[torch.tensor(free[:touched], device=self.device)] = 0
        return ran

    def observe(self, engine: Any) -> None:
        """Learn each request's sampling parameters from the engine's intake."""
        def on_event(kind: str, data: dict[str, Any]) -> None:
            if kind == "accepted":
                p = data["req"]
                self.params[p.id] = p.req.params
            elif kind == "terminal":
                self.params.pop(data["event"].req_id, None)
        engine.observers.append(on_event)

    # -- LoRA: not supported by this model ---------------------------------------------
    def load_adapter(self, name: str) -> str | None:
        return f"LoRA adapters are not supported by the CUDA Qwen3 executor ({name!r})"

    def unload_adapter(self, name: str) -> str | None:
        return f"adapter {name!r} is not loaded"

    def adapters(self) -> list[str]:
        return []

    # -- the step ----------------------------------------------------------------------
    def execute(self, plan: StepPlan) -> Event:
        return self.rt.spawn(self._execute(plan))

    def _rows(self, plan: StepPlan) -> _Rows:
        rows = _Rows()
        bs = self.block_size
        for p in plan.prefill:
            n = len(p.tokens)
            pages = list(p.kv.pages)
            rows.seqs.append(SeqInput(p.tokens, p.start, pages))
            rows.req_ids.append(p.req_id)
            rows.final.append(p.is_final)
            rows.next_pos.append(p.start + n)
            rows.all_logits |= p.all_logits
            rows.write_pages += pages[p.start // bs:-(-(p.start + n) // bs)]
            rows.read_pages += pages[:-(-(p.start + n) // bs)]
        for d in plan.decode:
            pages = list(d.kv.pages)
            rows.seqs.append(SeqInput([d.token], d.position, pages))
            rows.req_ids.append(d.req_id)
            rows.final.append(True)
            rows.next_pos.append(d.position + 1)
            rows.write_pages.append(pages[d.position // bs])
            rows.read_pages += pages[:d.position // bs + 1]
        return rows

    def _timing(self, plan: StepPlan, started: float) -> StepTiming:
        return StepTiming(self.steps, plan.kind.value, started, plan.prefill_tokens,
                          [(r.start, len(r.tokens), r.is_final, r.all_logits) for r in plan.prefill],
                          [r.position for r in plan.decode], len(plan.decode), len(plan.decode), False)

    def _execute(self, plan: StepPlan) -> Generator[Event, Any, StepResult]:
        started = self.rt.now()
        self.steps += 1
        timing = self._timing(plan, started)
        self.timings.append(timing)
        rows = self._rows(plan)
        if not rows.seqs:
            timing.error = "empty step plan"
            return StepResult({}, error=timing.error, started_at=started, finished_at=started)
        if self.transfer is not None:  # an invariant, not a step error: raise loudly
            self.transfer.check_step(rows.read_pages, rows.write_pages)
        try:
            with self._on_device():
                launched = self._launch(plan, rows, timing)
        except Exception as err:  # noqa: BLE001 - a failed step is reported, the engine reacts
            timing.error = f"{type(err).__name__}: {err}"
            timing.wall_s = self.rt.now() - started
            return StepResult({}, error=timing.error, started_at=started, finished_at=self.rt.now())
        tok_host, lp_host, prompt_lp, events = launched
        if events is not None:
            start_ev, end_ev = events
            while not end_ev.query():
                yield self.rt.sleep(self.poll_s)
            timing.gpu_s = start_ev.elapsed_time(end_ev) / 1e3
        tokens = tok_host.tolist()
        logprobs = lp_host.tolist()
        out: dict[int, RowResult] = {}
        j = 0
        for i, rid in enumerate(rows.req_ids):
            if rows.final[i]:
                out[rid] = RowResult(int(tokens[j]), logprob=float(logprobs[j]),
                                     prompt_logprobs=prompt_lp.get(i))
                j += 1
            else:
                out[rid] = RowResult(None, prompt_logprobs=prompt_lp.get(i))
        timing.wall_s = self.rt.now() - started
        return StepResult(out, started_at=started, finished_at=self.rt.now())

    @torch.inference_mode()
    def _launch(self, plan: StepPlan, rows: _Rows, timing: StepTiming
                ) -> tuple[torch.Tensor, torch.Tensor, dict[int, list[float]], Any]:
        """Enqueue forward + sampling; host tensors (filled once the events fire)."""
        events = None
        if self.on_cuda:
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        logits, last = self._forward(plan, rows, timing)
        final_idx = [i for i, f in enumerate(rows.final) if f]
        if len(final_idx) == len(rows.final) and last is None:
            sel = logits                            # one logits row per row, all final
        elif final_idx:
            pick = upload(final_idx, torch.int64, self.device)
            sel = logits.index_select(0, pick if last is None else last.index_select(0, pick))
        else:
            sel = logits[:0]
        tokens = self._sample(sel, [rows.req_ids[i] for i in final_idx],
                              [rows.next_pos[i] for i in final_idx])
        logprobs = (sel.gather(1, tokens[:, None])[:, 0] - sel.logsumexp(-1)) if final_idx \
            else sel.new_zeros(0)
        prompt_lp = self._prompt_logprobs(plan, logits) if rows.all_logits else {}
        from openinfer.backend.readback import to_host  # Triton: imported when first needed
        tok_host, lp_host = to_host(tokens, logprobs)
        if events is not None:
            events[1].record()
        return tok_host, lp_host, prompt_lp, events

    def _forward(self, plan: StepPlan, rows: _Rows, timing: StepTiming
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits and, per row, the logits row of its last new token (``None``: row i's
        is row i)."""
        pure_decode = plan.kind is StepKind.DECODE and not plan.prefill
        graphs = self.graphs
        if pure_decode and graphs is not None and len(rows.seqs) <= graphs.buckets[-1]:
            need = max(-(-(s.start + 1) // self.block_size) for s in rows.seqs)
            if need <= self.max_pages_per_seq:
                timing.graph = True
                timing.decode_rows_padded = graphs.bucket_for(len(rows.seqs))
                return graphs.run_seqs(rows.seqs), None
        pg = self.prefill_graphs
        if pg is not None and not pure_decode and not rows.all_logits:
            key = pg.bucket_for(sum(len(s.token_ids) for s in rows.seqs), len(rows.seqs))
            if key is not None:
                timing.prefill_graph = key
                return pg.run(rows.seqs, key), None
        batch = ForwardBatch.from_seqs(rows.seqs, self.block_size, self.device,
                                       padding_page=self.padding_page)
        logits = self.model.forward(batch, self.arena, all_logits=rows.all_logits)
        if rows.all_logits:
            return logits, batch.last_token_index
        return logits, None

    def _sample(self, logits: torch.Tensor, req_ids: list[int], positions: list[int]) -> torch.Tensor:
        """Greedy, except rows whose request asked for temperature > 0."""
        tokens = logits.argmax(dim=-1)
        for j, (rid, pos) in enumerate(zip(req_ids, positions)):
            sp = self.params.get(rid)
            if sp is None or sp.temperature <= 0:
                continue
            base = sp.seed if sp.seed is not None else _mix(self.seed, rid)
            gen = torch.Generator(device=self.device).manual_seed(_mix(base, pos))
            st = SamplingTensors.from_params([ModelSampling(sp.temperature, sp.top_k, sp.top_p)],
                                             self.device)
            tokens[j] = sample(logits[j:j + 1], st, gen)[0]
        return tokens

    def _prompt_logprobs(self, plan: StepPlan, logits: torch.Tensor) -> dict[int, list[float]]:
        """Echo + logprobs chunks: log p(prompt[t + 1] | prompt[:t + 1]) for each position
        t of the chunk that has a next prompt token (host sync: only echo requests pay it)."""
        out: dict[int, list[float]] = {}
        row0 = 0
        for i, p in enumerate(plan.prefill):
            n = len(p.tokens)
            if p.all_logits:
                prompt = p.kv.tokens[:p.kv.num_prompt]
                targets = prompt[p.start + 1:p.start + n + 1]
                if targets:
                    lp = logits[row0:row0 + len(targets)].log_softmax(-1)
                    idx = torch.tensor(targets, device=logits.device)[:, None]
                    out[i] = lp.gather(1, idx)[:, 0].tolist()
                else:
                    out[i] = []
            row0 += n
        return out

    # -- reports -------------------------------------------------------------------------
    def timing_summary(self) -> dict[str, Any]:
        by_kind: dict[str, dict[str, float | int]] = {}
        for t in self.timings:
            k = by_kind.setdefault(t.kind, dict(steps=0, graph_steps=0, gpu_s=0.0, wall_s=0.0, errors=0))
            k["steps"] += 1
            k["graph_steps"] += int(t.graph)
            k["gpu_s"] += t.gpu_s or 0.0
            k["wall_s"] += t.wall_s
            k["errors"] += int(t.error is not None)
        return {k: {n: round(v, 6) if isinstance(v, float) else v for n, v in d.items()}
                for k, d in by_kind.items()}

    def write_timings_jsonl(self, path: str | Path) -> Path:
        """One JSON object per step (``StepTiming`` fields)."""
        return write_jsonl(path, (t.as_dict() for t in self.timings))
