"""The CudaExecutor behind the real Engine + KvStore, on the CPU (reference backend, fp32).

The oracle is direct greedy generation on Qwen3Model with its own arena: whatever the
scheduler does (chunking, unified steps, prefix hits, shuffled pages), the served tokens
must be exactly those.
"""

from __future__ import annotations

import json
import math

import torch
from backend_helpers import BS, cpu_instance, greedy_direct, prompt

from openinfer.backend.executor import DecodeRow, PrefillRow, StepKind, StepPlan
from openinfer.kv import RequestKv, salt_hash
from openinfer.runtime import WallRuntime
from openinfer.scheduler.request import EventKind, GenerateRequest, SamplingParams

LOGPROB_ATOL = 1e-4


def _serve(inst, reqs):
    handles = [inst.engine.submit(r) for r in reqs]
    inst.rt.run(until=inst.rt.all_of([h.done for h in handles]))
    return handles


def _cached(h) -> int:
    return next(e.cached_tokens for e in h.events if e.kind is EventKind.SCHEDULED)


def test_served_tokens_equal_direct_greedy_generation(tiny_model):
    """Chunked prefill (max_prefill_tokens=8 < prompts), unified steps and a shared prefix,
    on wall-clock time: every request's tokens are the direct greedy tokens."""
    inst = cpu_instance(tiny_model, rt=WallRuntime(0), max_prefill_tokens=8)
    shared = prompt(1, 9)
    prompts = [prompt(2, 13), shared + prompt(3, 5), shared + prompt(4, 7), prompt(5, 3)]
    outs = [6, 4, 5, 7]
    handles = _serve(inst, [GenerateRequest(p, n) for p, n in zip(prompts, outs)])
    for h, p, n in zip(handles, prompts, outs):
        assert h.terminal_event().kind is EventKind.FINISHED
        assert h.tokens() == greedy_direct(tiny_model, p, n)[0]
    kinds = {t.kind for t in inst.executor.timings}
    assert {"prefill", "unified", "decode"} <= kinds       # the plan mix was exercised
    inst.rt.run(until=inst.store.flush_saves(0))
    assert inst.store.quiescent(0) == []
    assert all(t.wall_s >= 0 and t.gpu_s is None for t in inst.executor.timings)


def test_prefix_hit_from_the_gpu_radix_gives_the_cold_next_token(tiny_model):
    inst = cpu_instance(tiny_model, host_slots=0)          # no CPU tier: a hit is a GPU hit
    base = prompt(7, 21)
    (first,) = _serve(inst, [GenerateRequest(base, 3)])
    follow = base + prompt(8, 6)
    (second,) = _serve(inst, [GenerateRequest(follow, 4)])
    hit = _cached(second)
    assert hit == (len(base) // BS) * BS and hit > 0      # every complete block of the first prompt
    toks, logits = greedy_direct(tiny_model, follow, 4)
    assert second.tokens() == toks
    step = next(t for t in reversed(inst.executor.timings) if t.prefill)
    assert step.prefill == [(hit, len(follow) - hit, True, False)]   # only the suffix was computed
    # the logprob the executor reports for the first token is the cold run's
    plan_lp = torch.log_softmax(logits, -1)[toks[0]].item()
    kv = RequestKv(inst.pool, follow, 2, salt_hash())
    again = kv.match_and_add_prefix()                     # now the second prompt's blocks too
    assert again > hit
    assert kv.schedule_prefill(len(follow) - again)
    ev = inst.executor.execute(StepPlan(StepKind.PREFILL, [PrefillRow(99, kv, again, follow[again:], True)]))
    res = inst.rt.run(until=ev)
    assert res.rows[99].token == toks[0]
    assert abs(res.rows[99].logprob - plan_lp) <= LOGPROB_ATOL
    kv.revert_schedule()
    kv.release()


def test_step_timing_records_mirror_the_plans(tiny_model, tmp_path):
    inst = cpu_instance(tiny_model, max_prefill_tokens=8)
    plans = []
    inst.engine.observers.append(lambda kind, d: plans.append(d["plan"]) if kind == "step_start" else None)
    _serve(inst, [GenerateRequest(prompt(11, 10), 3), GenerateRequest(prompt(12, 5), 2)])
    recs = inst.executor.timings
    assert len(recs) == len(plans) == inst.engine.steps
    for i, (rec, plan) in enumerate(zip(recs, plans)):
        assert rec.step == i + 1 and rec.kind == plan.kind.value
        assert rec.prefill_tokens == plan.prefill_tokens
        assert rec.prefill == [(r.start, len(r.tokens), r.is_final, r.all_logits) for r in plan.prefill]
        assert rec.decode_positions == [r.position for r in plan.decode]
        assert rec.decode_rows_padded == rec.decode_rows and not rec.graph  # eager on CPU
    path = inst.executor.write_timings_jsonl(tmp_path / "steps.jsonl")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == len(recs) and lines[0]["kind"] == recs[0].kind
    from experiments.serve_real import step_features
    from sim.step_features import step_features as plan_features
    for line, plan in zip(lines, plans):  # the records carry everything the step models read
        assert step_features(line) == plan_features(plan)


def test_sampling_params_are_honoured_and_replayable(tiny_model):
    """temperature > 0 draws from a per-(seed, position) generator: two runs agree, the
    draw differs from greedy somewhere, and a greedy request beside it stays greedy."""
    p = prompt(21, 9)
    hot = SamplingParams(temperature=5.0, seed=123)
    runs = []
    for _ in range(2):
        inst = cpu_instance(tiny_model)
        hs = _serve(inst, [GenerateRequest(p, 12, hot), GenerateRequest(p, 12)])
        runs.append([h.tokens() for h in hs])
    assert runs[0] == runs[1]
    greedy = greedy_direct(tiny_model, p, 12)[0]
    assert runs[0][1] == greedy
    assert runs[0][0] != greedy


def test_a_failing_forward_is_a_step_error_not_a_crash(tiny_model):
    inst = cpu_instance(tiny_model)
    kv = RequestKv(inst.pool, [1, 2, 3], 2, salt_hash())
    assert kv.schedule_prefill(3)
    bad = StepPlan(StepKind.PREFILL, [PrefillRow(1, kv, 0, [1, 2, 10_000], True)])  # id >= vocab
    res = inst.rt.run(until=inst.executor.execute(bad))
    assert res.error is not None and res.rows == {}
    assert inst.executor.timings[-1].error == res.error
    kv.revert_schedule()
    kv.release()


def test_decode_rows_use_the_request_page_table(tiny_model):
    """A decode row on pages drawn out of order still reads its own KV (page ids are arena ids)."""
    inst = cpu_instance(tiny_model)
    decoy = inst.pool.allocate(5)                           # push the request onto later pages
    p = prompt(31, 10)
    kv = RequestKv(inst.pool, p, 3, salt_hash())
    assert kv.schedule_prefill(len(p))
    r1 = inst.rt.run(until=inst.executor.execute(StepPlan(StepKind.PREFILL, [PrefillRow(1, kv, 0, p, True)])))
    kv.apply_prefill(r1.rows[1].token)
    assert kv.schedule_decode()
    assert min(kv.pages) > max(decoy)
    r2 = inst.rt.run(until=inst.executor.execute(
        StepPlan(StepKind.DECODE, decode=[DecodeRow(1, kv, r1.rows[1].token, len(p))])))
    assert [r1.rows[1].token, r2.rows[1].token] == greedy_direct(tiny_model, p, 2)[0]
    assert math.isfinite(r2.rows[1].logprob) and r2.rows[1].logprob <= 0
    kv.apply_decode(r2.rows[1].token)
    kv.release()
    inst.pool.release_all(decoy)


def test_lora_is_refused_cleanly(tiny_model):
    inst = cpu_instance(tiny_model)
    assert inst.executor.load_adapter("a") is not None and inst.executor.adapters() == []
    (h,) = _serve(inst, [GenerateRequest(prompt(1, 5), 2, lora="a")])
    assert h.terminal_event().kind is EventKind.REJECTED



def test_the_real_executor_captures_the_simulators_buckets(tiny_model):
    """One bucket list (spec §1.4, 20 included) for the simulator's padding and the real
    executor's graphs, cut at the instance's decode batch cap."""
    from openinfer.backend.buckets import GRAPH_BUCKETS, buckets_up_to
    from sim.step_features import padded_batch

    assert GRAPH_BUCKETS[:9] == (1, 2, 4, 8, 16, 20, 24, 32, 40) and GRAPH_BUCKETS[-1] == 256
    assert buckets_up_to(20) == (1, 2, 4, 8, 16, 20) and buckets_up_to(22) == (1, 2, 4, 8, 16, 20, 22)
    assert buckets_up_to(256) == GRAPH_BUCKETS and buckets_up_to(1) == (1,)
    inst = cpu_instance(tiny_model, max_decode_batch=24)
    assert inst.executor.graph_buckets == [1, 2, 4, 8, 16, 20, 24]
    assert [padded_batch(n) for n in (17, 21)] == [20, 24]


def test_warm_up_runs_every_step_shape_and_leaves_no_trace(tiny_model):
    """The pre-serving warm-up (every kernel variant compiled before the first request)
    runs its steps on pages the pool has not handed out and zeroes them again: the arena,
    the pool and the served tokens are as if it never ran."""
    inst = cpu_instance(tiny_model)
    free_before = inst.pool.available_blocks()
    assert inst.executor.warm_up() > 0
    assert not inst.arena.data.any()
    assert inst.pool.available_blocks() == free_before
    p = prompt(3, 11)
    (h,) = _serve(inst, [GenerateRequest(p, 4)])
    assert h.tokens() == greedy_direct(tiny_model, p, 4)[0]


def test_sampling_seeds_are_splitmix64_of_request_seed_and_position():
    """_mix chains the one splitmix64 (fake_executor's); pinned values keep replays stable."""
    from openinfer.backend.cuda_executor import _mix
    from openinfer.backend.fake_executor import _splitmix64
    assert (_mix(0, 1), _mix(7, 123456789), _mix(2**64 + 5, 3)) == (
        6728581669027343264, 4202399297928674382, 8600489457864245151)
    assert _mix(9) == _splitmix64(0x9E3779B97F4A7C15 ^ 9) & ((1 << 63) - 1)
