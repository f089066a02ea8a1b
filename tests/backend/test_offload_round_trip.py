"""The two-act offload test on the real backend (CPU): real bytes through CudaTransfer.

Act 1: a request is served by the engine; its sealed blocks are saved to the CPU tier by
asynchronous copies, and a flush barrier is what makes them visible. Act 2: the GPU copy
is evicted and its arena pages poisoned with NaN; ``resolve_prefix`` restores the prefix
from the CPU tier through CudaTransfer; the next prefill matches every restored block,
the restored pages are byte-identical to what was saved, and its logits are the cold
run's (NaN anywhere a restore missed a byte would break that).
"""

from __future__ import annotations

import torch
from backend_helpers import BS, cold_logits, cpu_instance, greedy_direct, prompt

from openinfer.backend.executor import PrefillRow, StepKind, StepPlan
from openinfer.kv import CacheScope, NeverCancelled, RequestKv, ResolvePolicy, salt_hash
from openinfer.models.qwen3 import SeqInput
from openinfer.scheduler.request import EventKind, GenerateRequest

LOGIT_ATOL = 1e-4
COPY_DELAY_S = 0.002


def test_seal_flush_evict_restore_prefill(tiny_model):
    inst = cpu_instance(tiny_model, cpu_copy_delay_s=COPY_DELAY_S)
    rt, pool, store, host, transfer = inst.rt, inst.pool, inst.store, inst.host, inst.transfer
    first = prompt(51, 6 * BS + 3)                          # 6 complete blocks + a partial one
    second = first + prompt(52, 5)
    blocks = len(first) // BS
    hashes = store.prompt_hashes(0, first, CacheScope())[:blocks]

    # -- act 1: serve, seal (async D2H), flush barrier ---------------------------------
    h = inst.engine.submit(GenerateRequest(first, 2))
    rt.run(until=h.done)
    assert h.terminal_event().kind is EventKind.FINISHED
    assert host.resident_blocks() == 0                     # the D2H copies are still in flight
    assert transfer.pages_in_flight() >= blocks
    saved_pages = [pool.primary_page(x) for x in hashes]
    assert None not in saved_pages
    snapshot = torch.stack([inst.arena.page(p).clone() for p in saved_pages])
    flushed = rt.run(until=store.flush_saves(0))
    assert flushed.ok
    assert host.resident_blocks() >= blocks                # visible only after the barrier
    assert transfer.pages_in_flight() == 0
    assert host.resident_blocks() == transfer.counters["d2h"].pages  # each block copied once
    for h_, page in zip(hashes, saved_pages):              # host bytes == GPU bytes
        assert torch.equal(inst.host_arena.slot(host._slot_of[h_]), inst.arena.page(page))

    # -- evict the GPU copy; poison its pages so a missed restore byte shows -------------
    assert pool.evict_inactive() >= blocks
    assert all(pool.primary_page(x) is None for x in hashes)
    for p in saved_pages:
        inst.arena.page(p).fill_(float("nan"))

    # -- act 2: resolve restores from the CPU tier through CudaTransfer ------------------
    prefix = rt.run(until=store.resolve_prefix(0, "second", second, CacheScope(), ResolvePolicy(),
                                               NeverCancelled()))
    assert prefix.outcome.loaded_blocks == blocks and prefix.outcome.gpu_blocks == 0
    assert prefix.hit_tokens == blocks * BS
    assert transfer.counters["h2d"].pages == blocks
    restored = list(prefix.hold.held.pages)
    for i, page in enumerate(restored):
        assert torch.equal(inst.arena.page(page), snapshot[i])  # byte-identical round trip

    kv = RequestKv(pool, second, 4, salt_hash())
    matched = kv.match_and_add_prefix()
    assert matched == blocks * BS and kv.pages == restored     # every restored block matched
    prefix.release()
    n = len(second) - matched
    assert kv.schedule_prefill(n)
    logits = tiny_model([SeqInput(second[matched:], matched, kv.pages)], inst.arena)[0]
    cold = cold_logits(tiny_model, second)
    assert torch.isfinite(logits).all()
    assert (logits - cold).abs().max().item() <= LOGIT_ATOL
    res = rt.run(until=inst.executor.execute(
        StepPlan(StepKind.PREFILL, [PrefillRow(7, kv, matched, second[matched:], True)])))
    assert res.rows[7].token == greedy_direct(tiny_model, second, 1)[0][0]
    kv.apply_prefill(res.rows[7].token)
    kv.release()
    rt.run(until=store.flush_saves(0))
    assert store.quiescent(0) == []


def test_served_restore_through_the_engine_gives_cold_tokens(tiny_model):
    """The same round trip with the engine's own resolve: a CPU-tier hit is served and its
    tokens equal direct greedy generation."""
    inst = cpu_instance(tiny_model, cpu_copy_delay_s=COPY_DELAY_S)
    rt = inst.rt
    first = prompt(61, 5 * BS + 1)
    second = first + prompt(62, 4)
    rt.run(until=inst.engine.submit(GenerateRequest(first, 3)).done)
    rt.run(until=inst.store.flush_saves(0))
    inst.pool.evict_inactive()
    loads = []
    inst.store.observers.append(lambda kind, d: loads.append(d["blocks"]) if kind == "load_started" else None)
    h = inst.engine.submit(GenerateRequest(second, 5))
    rt.run(until=h.done)
    assert loads == [5]
    assert next(e.cached_tokens for e in h.events if e.kind is EventKind.SCHEDULED) == 5 * BS
    assert h.tokens() == greedy_direct(tiny_model, second, 5)[0]
