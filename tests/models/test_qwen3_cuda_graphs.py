"""CUDA-graph decode (GPU only; skipped on CPU): replay == eager forward, padding rows inert."""

from __future__ import annotations

import pytest
import torch

from openinfer.models.qwen3 import Qwen3Model, SeqInput
from openinfer.models.qwen3.kernels._interpret import interpreting

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreting(),
    reason="needs a CUDA GPU with compiled Triton kernels")


def test_graph_replay_matches_eager(tiny_ckpt):
    from openinfer.models.qwen3.cuda_graphs import DecodeGraphs

    model = Qwen3Model.from_pretrained(tiny_ckpt, device="cuda", backend="triton")
    arena = model.make_arena(64, 16)
    graphs = DecodeGraphs(model, arena, max_pages_per_seq=8, buckets=[1, 2, 4, 8])
    graphs.capture()
    g = torch.Generator().manual_seed(0)
    lens = [5, 17, 33]
    seqs = [(torch.randint(0, 256, (n,), generator=g).tolist(), [1 + 8 * i + j for j in range(8)])
            for i, n in enumerate(lens)]
    model([SeqInput(ids[:-1], 0, t) for ids, t in seqs], arena)
    before = arena.data[0].clone()
    step = [SeqInput(ids[-1:], len(ids) - 1, t) for ids, t in seqs]
    batch = model.make_batch(step, arena, max_pages=8)
    replayed = graphs.run(batch).clone()             # bucket 4: one padding row
    from_seqs = graphs.run_seqs(step).clone()        # the executor's two-copy path
    eager = model.forward(batch, arena)
    # The reference backend launches no Triton kernel (no PDL, no skinny GEMM): a race in
    # the replayed graph could not hide behind the same race in the eager run.
    reference = Qwen3Model(model.cfg, model.w, "reference").forward(batch, arena)
    assert graphs.bucket_for(3) == 4
    assert (replayed - eager).abs().max().item() <= 1e-4
    assert (replayed - reference).abs().max().item() <= 1e-4
    assert torch.equal(from_seqs, replayed)
    assert torch.equal(arena.data[0], before)        # the padding page was not written


def test_e2e_bench_generation_matches_eager_greedy(tiny_ckpt):
    """validate's end-to-end benchmark drives a decode graph's static inputs directly: its
    greedy tokens must be the eager model's (this broke once, unnoticed on the CPU)."""
    from experiments.validate.bench import ours_generate
    from openinfer.models.qwen3.cuda_graphs import DecodeGraphs

    model = Qwen3Model.from_pretrained(tiny_ckpt, device="cuda", backend="triton")
    B, L, N, bs = 3, 21, 7, 16
    pps = -(-(L + N) // bs)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 256, (B, L), generator=g).tolist()
    arena = model.make_arena(1 + B * pps, bs)
    graphs = DecodeGraphs(model, arena, max_pages_per_seq=pps, buckets=[B])
    graphs.capture()
    ours = ours_generate(model, graphs, arena, prompts, N, pps, bs).cpu()

    eager_arena = model.make_arena(1 + B * pps, bs)
    tables = [list(range(1 + r * pps, 1 + (r + 1) * pps)) for r in range(B)]
    tok = model([SeqInput(p, 0, t) for p, t in zip(prompts, tables)], eager_arena).argmax(-1)
    eager = [tok.cpu()]
    for k in range(1, N):
        step = [SeqInput([int(tok[r])], L + k - 1, tables[r]) for r in range(B)]
        tok = model(step, eager_arena).argmax(-1)
        eager.append(tok.cpu())
    assert torch.equal(ours, torch.stack(eager, 1))


def _check(out, ref, ref32, dtype):
    """fp32: <= 1e-4 from the reference. bf16: the kernel's error against the fp32 truth
    is at most twice the bf16 reference's own (the FlashAttention test criterion), since
    the two round P at different points (unnormalised tiles vs normalised rows)."""
    if dtype == torch.float32:
        assert (out - ref).abs().max().item() <= 1e-4
    else:
        ref_err = (ref.float() - ref32).abs().max().item()
        assert (out.float() - ref32).abs().max().item() <= 2 * ref_err + 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernels_at_qwen3_4b_attention_geometry(dtype):
    """32 q heads / 8 kv heads / head_dim 128 / 16-token pages, long contexts, on the GPU."""
    from openinfer.models.qwen3 import kernels as K
    from openinfer.models.qwen3.kernels import reference as R
    from openinfer.models.qwen3.kv_arena import KVArena

    g = torch.Generator(device="cuda").manual_seed(0)
    arena = KVArena.allocate(600, 1, 16, 8, 128, dtype, "cuda")
    arena.data.copy_(torch.randn(arena.data.shape, generator=g, device="cuda").to(dtype))
    pages = torch.randperm(599, generator=torch.Generator().manual_seed(0)) + 1
    starts, qlens = [0, 1000, 2001, 7], [333, 300, 1, 64]
    need = [-(-(s + q) // 16) for s, q in zip(starts, qlens)]
    bt = torch.zeros(len(need), max(need), dtype=torch.int32)
    o = 0
    for i, n in enumerate(need):
        bt[i, :n] = pages[o:o + n]
        o += n
    bt = bt.cuda()
    lens = torch.tensor([s + q for s, q in zip(starts, qlens)], dtype=torch.int32, device="cuda")
    qloc = torch.tensor([0] + qlens).cumsum(0).to(torch.int32).cuda()
    q = torch.randn(int(qloc[-1]), 32, 128, generator=g, device="cuda").to(dtype)
    out = K.prefill_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, max(qlens), 128 ** -0.5)
    ref = R.paged_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, 128 ** -0.5)
    k32, v32 = arena.k(0).float(), arena.v(0).float()
    ref32 = R.paged_attention(q.float(), k32, v32, bt, lens, qloc, 128 ** -0.5)
    _check(out, ref, ref32, dtype)
    qd = torch.randn(4, 32, 128, generator=g, device="cuda").to(dtype)
    dloc = torch.arange(5, dtype=torch.int32, device="cuda")
    ref = R.paged_attention(qd, arena.k(0), arena.v(0), bt, lens, dloc, 128 ** -0.5)
    ref32 = R.paged_attention(qd.float(), k32, v32, bt, lens, dloc, 128 ** -0.5)
    for splits in (None, 1, 7):
        out = K.decode_attention(qd, arena.k(0), arena.v(0), bt, lens, 128 ** -0.5, splits)
        _check(out, ref, ref32, dtype)


def test_prefill_graph_replay_matches_eager(tiny_ckpt):
    """A unified step (two prompt chunks behind cached prefixes + a decode row) replayed in
    a padded (tokens, seqs) bucket gives the eager step's logits and K/V, and leaves the
    padding page alone; a step past the largest bucket has none."""
    from openinfer.models.qwen3.prefill_graphs import PrefillGraphs

    model = Qwen3Model.from_pretrained(tiny_ckpt, device="cuda", backend="triton")
    arena = model.make_arena(64, 16)
    graphs = PrefillGraphs(model, arena, max_pages_per_seq=8, token_buckets=[32, 64],
                           seq_buckets=[1, 4])
    graphs.capture()
    g = torch.Generator().manual_seed(0)
    lens = [20, 37, 9]
    seqs = [(torch.randint(0, 256, (n,), generator=g).tolist(), [1 + 8 * i + j for j in range(8)])
            for i, n in enumerate(lens)]
    model([SeqInput(ids[:5], 0, t) for ids, t in seqs], arena)
    step = [SeqInput(seqs[0][0][5:], 5, seqs[0][1]), SeqInput(seqs[1][0][5:], 5, seqs[1][1]),
            SeqInput(seqs[2][0][5:6], 5, seqs[2][1])]          # 15 + 32 + 1 = 48 tokens, 3 seqs
    key = graphs.bucket_for(48, 3)
    assert key == (64, 4) and graphs.bucket_for(65, 1) is None and graphs.bucket_for(8, 5) is None
    before = arena.data.clone()
    replayed = graphs.run(step, key).clone()
    after_graph = arena.data.clone()
    arena.data.copy_(before)
    eager = model(step, arena)
    assert (replayed - eager).abs().max().item() <= 1e-4
    assert (after_graph - arena.data).abs().max().item() <= 1e-5   # the same K/V written
    assert torch.equal(after_graph[0], before[0])                  # padding page untouched
