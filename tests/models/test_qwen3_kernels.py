"""Every Triton kernel against its torch reference (TRITON_INTERPRET=1 on CPU).

Shapes are small but awkward: odd lengths, prefixes ending mid-page, several sequences
of different lengths in one launch, pages in shuffled order, tiles (BLOCK_N) spanning
several pages, batch padding rows on the padding page, strided inputs as the model
passes them (views of the fused QKV output and of the page-major arena).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from openinfer.errors import ConfigError
from openinfer.models.qwen3 import kernels as K
from openinfer.models.qwen3.kernels import reference as R
from openinfer.models.qwen3.kernels._interpret import interpreting
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.models.qwen3.rope import rope_tables

# the module, which ``K.skinny_linear`` (the function of the same name) hides
S = importlib.import_module("openinfer.models.qwen3.kernels.skinny_linear")

INTERPRET = interpreting()  # set by tests/conftest.py on a machine without a GPU
HQ, HK, D = 4, 2, 16
FP32_ATOL = 1e-5
# bf16: kernels round like torch (<= 1 ulp apart: different sum order), on the GPU and
# under the interpreter alike (kernels/_interpret.py makes its casts round to nearest even;
# truncating, it once needed 4e-2 here).
BF16_TOL = dict(atol=1e-2, rtol=1e-2)


def _arena(device, block_size, num_pages=24, dtype=torch.float32, layers=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = KVArena.allocate(num_pages, layers, block_size, HK, D, dtype, device)
    a.data.copy_(torch.randn(a.data.shape, generator=g).to(dtype))
    return a


def _paged_batch(seqs, block_size, num_pages, device, seed=0, padding_rows=0):
    """(start, q_len) per sequence -> block tables over shuffled pages 1.., lens, qloc."""
    g = torch.Generator().manual_seed(seed)
    free = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()
    need = [-(-(s + q) // block_size) for s, q in seqs]
    width = max(need)
    tables = [[free.pop() for _ in range(n)] + [0] * (width - n) for n in need]
    tables += [[0] * width] * padding_rows        # padding rows: padding page, seq_len 1
    lens = [s + q for s, q in seqs] + [1] * padding_rows
    qlens = [q for _, q in seqs] + [1] * padding_rows
    qloc = torch.tensor([0] + qlens).cumsum(0)
    i32 = dict(dtype=torch.int32, device=device)
    return (torch.tensor(tables, **i32), torch.tensor(lens, **i32), qloc.to(**i32),
            int(qloc[-1]))


@pytest.mark.parametrize("block_size,block_m,block_n", [(4, 16, 16), (16, 16, 32)])
def test_prefill_with_cached_prefix(device, block_size, block_m, block_n):
    # cold (odd length), prefix ending mid-page, page-aligned prefix, 1-token chunk,
    # and a long chunk that needs several BLOCK_M query tiles.
    seqs = [(0, 7), (5, 9), (8, 3), (13, 1), (2, 37)]
    arena = _arena(device, block_size)
    bt, lens, qloc, T = _paged_batch(seqs, block_size, arena.num_pages, device)
    q = torch.randn(T, HQ, D, device=device)
    kc, vc = arena.k(1), arena.v(1)                 # strided views of layer 1
    out = K.prefill_attention(q, kc, vc, bt, lens, qloc, max(s[1] for s in seqs), 0.25,
                              block_m=block_m, block_n=block_n)
    ref = R.paged_attention(q, kc, vc, bt, lens, qloc, 0.25)
    assert (out - ref).abs().max().item() <= FP32_ATOL


def test_prefill_bf16(device):
    seqs = [(5, 9), (0, 3)]
    arena = _arena(device, 4, dtype=torch.bfloat16)
    bt, lens, qloc, T = _paged_batch(seqs, 4, arena.num_pages, device)
    q = torch.randn(T, HQ, D, device=device).to(torch.bfloat16)
    out = K.prefill_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, 9, 0.25,
                              block_m=16, block_n=16)
    ref = R.paged_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, 0.25)
    torch.testing.assert_close(out, ref, **BF16_TOL)


@pytest.mark.parametrize("read_ahead", [True, False])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3, 4])
def test_decode_split_kv_with_padding_rows(device, num_splits, cached, read_ahead):
    # seq lens 5, 17, 33, 1, 11, 70: empty splits, one tile, several tiles a split
    # (70 tokens over 3 or 4 splits of up to 24 tokens, tiles of 16), a length mid-page;
    # the first tile read ahead of the wait or after it
    seqs = [(4, 1), (16, 1), (32, 1), (0, 1), (10, 1), (69, 1)]
    arena = _arena(device, 4, num_pages=48)
    bt, lens, qloc, T = _paged_batch(seqs, 4, arena.num_pages, device, padding_rows=2)
    q = torch.randn(T, HQ, D, device=device)
    kc, vc = arena.k(0), arena.v(0)
    out = K.decode_attention(q, kc, vc, bt, lens, 0.25, num_splits=num_splits, block_n=16,
                             cached_splits=cached, read_ahead=read_ahead)
    ref = R.paged_attention(q, kc, vc, bt, lens, qloc, 0.25)
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max().item() <= FP32_ATOL


def _record_launches(monkeypatch, module, kernel_name: str) -> list:
    """Swap ``module.kernel_name`` for a launcher that records each launch's (grid,
    keyword arguments) before launching it."""
    launches, kernel = [], getattr(module, kernel_name)

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                launches.append((grid, kw))
                return kernel[grid](*args, **kw)
            return launch

    monkeypatch.setattr(module, kernel_name, Recorder())
    return launches


def test_decode_form_follows_the_batch_knob(device, monkeypatch):
    """OPENINFER_DECODE_WAIT_FIRST_ROWS: batches of at least that many rows launch the
    wait-first form with its own tile, smaller ones read their first tile ahead; both
    give the reference's output."""
    mod = importlib.import_module("openinfer.models.qwen3.kernels.decode_attention")
    launches = _record_launches(monkeypatch, mod, "_decode_split_kernel")
    monkeypatch.setattr(mod, "WAIT_FIRST_ROWS", 4)
    monkeypatch.setattr(mod, "BLOCK_N", 16)
    monkeypatch.setattr(mod, "WAIT_FIRST_BLOCK_N", 32)
    arena = _arena(device, 4, num_pages=48)
    for seqs in ([(20, 1), (9, 1), (0, 1)], [(20, 1), (9, 1), (0, 1), (37, 1)]):
        bt, lens, qloc, B = _paged_batch(seqs, 4, arena.num_pages, device)
        q = torch.randn(B, HQ, D, device=device)
        out = K.decode_attention(q, arena.k(0), arena.v(0), bt, lens, 0.25, num_splits=2)
        ref = R.paged_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, 0.25)
        assert (out - ref).abs().max().item() <= FP32_ATOL
    assert [(grid[0], kw["AHEAD"], kw["BLOCK_N"]) for grid, kw in launches] == \
        [(3, True, 16), (4, False, 32)]


def _poison_empty(monkeypatch, module) -> None:
    """Give ``module`` a torch whose ``empty`` is NaN-filled: an output no merge wrote, or a
    merge that read splits no program wrote, is not finite (the allocator may otherwise
    hand back an earlier run's buffers, holding the right values)."""
    class NaNEmpty:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*shape, **kw):
            return torch.full(*shape, float("nan"), **kw)

    monkeypatch.setattr(module, "torch", NaNEmpty())


@pytest.mark.parametrize("from_qkv", [False, True])
@pytest.mark.parametrize("num_splits", [2, 5])
def test_fused_split_merge_equals_the_reduce_kernel(device, monkeypatch, num_splits, from_qkv):
    """fused_reduce: the last split program to finish merges the splits, and no reduce
    kernel is launched. Its output is the reduce kernel's (the same sums: bit-identical
    under the interpreter), twice in a row (the counters are back at zero after each
    launch), with splits that are empty (a 1-token row) and a padding row. The interpreter
    runs programs one at a time, split innermost, so this cannot see a race (or a merge by
    a program that is not the last): ``test_fused_split_merge_under_real_concurrency``
    is the GPU's check of that."""
    mod = importlib.import_module("openinfer.models.qwen3.kernels.decode_attention")
    reduces = _record_launches(monkeypatch, mod, "_decode_reduce_kernel")
    _poison_empty(monkeypatch, mod)
    seqs = [(40, 1), (0, 1), (13, 1)]
    arena = _arena(device, 4, num_pages=48)
    bt, lens, qloc, B = _paged_batch(seqs, 4, arena.num_pages, device, padding_rows=1)
    if from_qkv:
        last = (lens - 1).long()
        q = K.QKVParts(torch.randn(1, B, (HQ + 2 * HK) * D, device=device), HQ,
                       torch.ones(D, device=device), torch.ones(D, device=device),
                       *rope_tables(D, 1e6, 128, torch.float32, device), last,
                       torch.full_like(last, -1), 1e-6)
    else:
        q = torch.randn(B, HQ, D, device=device)
    run = functools.partial(K.decode_attention, q, arena.k(0), arena.v(0), bt, lens, 0.25,
                            num_splits=num_splits, block_n=16)
    got = [run(fused_reduce=True) for _ in range(2)]
    assert not reduces
    assert not mod.arrival_counters(arena.k(0).device, B * HK).any()
    want = run(fused_reduce=False)
    assert len(reduces) == 1
    if not from_qkv:    # both forms merge through one function: check it against torch too
        ref = R.paged_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, 0.25)
        assert (want - ref).abs().max().item() <= FP32_ATOL
    for out in got:
        if INTERPRET:
            assert torch.equal(out, want)
        else:   # another program's reduction tree (warps): fp32 rounding apart
            torch.testing.assert_close(out, want, atol=FP32_ATOL, rtol=0)


@pytest.mark.filterwarnings("error::RuntimeWarning")   # a NaN in the interpreter fails
@pytest.mark.parametrize("chunk", [None, 1])
@pytest.mark.parametrize("group", [1, 3])
def test_fused_merge_of_a_group_that_is_not_a_power_of_two(device, monkeypatch, group, chunk):
    """The last split program merges its kv head's query heads padded to a power of two,
    all at once (``merge_chunk``'s choice) or a head at a time (chunk 1): with 3 heads a
    group (a padding head beside them, masked out) and with 1, and a row whose splits are
    all empty but one, the output is the reduce kernel's."""
    mod = importlib.import_module("openinfer.models.qwen3.kernels.decode_attention")
    _poison_empty(monkeypatch, mod)
    if chunk:
        monkeypatch.setattr(mod, "merge_chunk", lambda *_: chunk)
    arena = _arena(device, 4, num_pages=48)
    bt, lens, qloc, B = _paged_batch([(40, 1), (0, 1), (13, 1)], 4, arena.num_pages, device)
    q = torch.randn(B, group * HK, D, device=device)
    run = functools.partial(K.decode_attention, q, arena.k(0), arena.v(0), bt, lens, 0.25,
                            num_splits=5, block_n=16)
    got, want = run(fused_reduce=True), run(fused_reduce=False)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=0)
    ref = R.paged_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, 0.25)
    assert (want - ref).abs().max().item() <= FP32_ATOL


def test_merge_chunk_keeps_a_threads_partials_bounded():
    """A 4B's group of 4 heads: all at once at batch 1 (8 warps, 33 splits padded to 64),
    two at a time at batch 2 (4 warps, 32 splits), all at once at batch 4 (16 splits); a
    group of 3 is padded to 4 and of 8 halved to fit."""
    mod = importlib.import_module("openinfer.models.qwen3.kernels.decode_attention")
    assert mod.merge_chunk(4, 64, 128, 8) == 4
    assert mod.merge_chunk(4, 32, 128, 4) == 2
    assert mod.merge_chunk(4, 16, 128, 4) == 4
    assert mod.merge_chunk(3, 16, 128, 4) == 4
    assert mod.merge_chunk(8, 64, 128, 8) == 4
    assert mod.merge_chunk(1, 64, 128, 4) == 1


@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                    reason="races need programs that really run at once (a GPU)")
@pytest.mark.parametrize("num_splits", [2, 33])
def test_fused_split_merge_under_real_concurrency(num_splits, monkeypatch):
    """The 4B's shape (8 kv heads of 4 query heads, 128 wide) at 64 rows and 200 launches
    in a row on a GPU, every program of a launch in flight together: each launch's output
    equals the reduce kernel's, and the counters are zero after each. A merge by a program
    that is not the last, or a counter shared across rows or heads, reads a NaN-poisoned
    split or merges twice."""
    g = torch.Generator(device="cuda").manual_seed(0)
    B, hq, hk, d, page = 64, 32, 8, 128, 16
    lens = torch.randint(1, 1500, (B,), generator=g, device="cuda", dtype=torch.int32)
    pages_per_row = 1500 // page + 1
    bt = torch.randperm(B * pages_per_row, generator=g, device="cuda").view(B, -1).to(torch.int32)
    kc = torch.randn(B * pages_per_row, page, hk, d, generator=g, device="cuda")
    vc = torch.randn(B * pages_per_row, page, hk, d, generator=g, device="cuda")
    mod = importlib.import_module("openinfer.models.qwen3.kernels.decode_attention")
    _poison_empty(monkeypatch, mod)
    qloc = torch.arange(B + 1, device="cuda", dtype=torch.int32)
    for i in range(200):
        q = torch.randn(B, hq, d, generator=g, device="cuda")
        want = K.decode_attention(q, kc, vc, bt, lens, 0.088, num_splits=num_splits,
                                  fused_reduce=False)
        if i == 0:      # the reduce kernel merges through the same function: torch's view
            ref = R.paged_attention(q, kc, vc, bt, lens, qloc, 0.088)
            torch.testing.assert_close(want, ref, atol=1e-4, rtol=1e-4)
        # three launches back to back, no sync: each needs the counters the last one reset
        got = [K.decode_attention(q, kc, vc, bt, lens, 0.088, num_splits=num_splits,
                                  fused_reduce=True) for _ in range(3)]
        for out in got:
            torch.testing.assert_close(out, want, atol=FP32_ATOL, rtol=0)
        assert not mod.arrival_counters(kc.device, B * hk).any()


def test_fused_merge_knob_takes_launches_of_few_splits(device, monkeypatch):
    """OPENINFER_DECODE_FUSED_REDUCE_SPLITS=2: a launch of 2 splits merges in the split
    kernel, one of 3 launches the reduce kernel; both give the reference's output."""
    mod = importlib.import_module("openinfer.models.qwen3.kernels.decode_attention")
    reduces = _record_launches(monkeypatch, mod, "_decode_reduce_kernel")
    monkeypatch.setattr(mod, "FUSED_REDUCE_SPLITS", 2)
    arena = _arena(device, 4, num_pages=48)
    bt, lens, qloc, B = _paged_batch([(20, 1), (9, 1)], 4, arena.num_pages, device)
    q = torch.randn(B, HQ, D, device=device)
    ref = R.paged_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, 0.25)
    for splits, launched in ((2, 0), (3, 1)):
        out = K.decode_attention(q, arena.k(0), arena.v(0), bt, lens, 0.25, num_splits=splits)
        assert len(reduces) == launched
        assert (out - ref).abs().max().item() <= FP32_ATOL


def test_arrival_counters_grow_and_keep_the_old_buffer(device, monkeypatch):
    mod = importlib.import_module("openinfer.models.qwen3.kernels._arrivals")
    monkeypatch.setattr(mod, "_ARRIVALS", {})
    dev = torch.device(device)
    small = mod.arrival_counters(dev, 8)
    assert small.numel() >= 8 and not small.any()
    big = mod.arrival_counters(dev, small.numel() + 1)
    assert big.numel() > small.numel() and mod.arrival_counters(dev, 8) is big
    # a graph may still point at the small one
    assert any(t is small for held in mod._ARRIVALS.values() for t in held)
    if dev.type == "cuda":   # "cuda" and "cuda:<current>" name one buffer
        assert mod.arrival_counters(torch.device("cuda", torch.cuda.current_device()), 8) is big
    # another user's kernels get a buffer of their own
    assert mod.arrival_counters(dev, 8, "norm") is not big


def test_decode_bf16(device):
    seqs = [(6, 1), (20, 1), (0, 1)]
    arena = _arena(device, 4, dtype=torch.bfloat16)
    bt, lens, qloc, T = _paged_batch(seqs, 4, arena.num_pages, device, padding_rows=1)
    q = torch.randn(T, HQ, D, device=device).to(torch.bfloat16)
    out = K.decode_attention(q, arena.k(0), arena.v(0), bt, lens, 0.25, num_splits=2,
                             block_n=16)
    ref = R.paged_attention(q, arena.k(0), arena.v(0), bt, lens, qloc, 0.25)
    torch.testing.assert_close(out, ref, **BF16_TOL)


@pytest.mark.parametrize("read_ahead", [True, False])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("dtype,parts,num_splits", [(torch.float32, 1, 1), (torch.float32, 3, 3),
                                                     (torch.float32, 1, 4), (torch.bfloat16, 2, 3)])
def test_decode_from_qkv_parts(device, dtype, parts, num_splits, cached, read_ahead):
    """The decode attention that does q/k norm + RoPE + KV write itself equals the two
    reference steps (qkv_norm_rope_write, then paged attention): outputs, and the arena
    after it, where only the newest token's slot of each real row changed. The newest slot
    holds NaN before the call, so a result that read it instead of folding in the computed
    K/V would not be finite. Rows: empty splits, several tiles a split (70 tokens, tiles of
    16), the newest token mid-page and in a split's later tile, two padding rows."""
    seqs = [(4, 1), (16, 1), (32, 1), (0, 1), (10, 1), (69, 1)]
    arena = _arena(device, 4, num_pages=48, dtype=dtype)
    bt, lens, qloc, B = _paged_batch(seqs, 4, arena.num_pages, device, padding_rows=2)
    last = (lens - 1).long()
    real = torch.arange(B, device=device) < len(seqs)
    slots = torch.where(real, bt.long().gather(1, (last // 4)[:, None])[:, 0] * 4 + last % 4, -1)
    for kv in (0, 1):
        arena.data[slots[real] // 4, 1, kv, slots[real] % 4] = float("nan")
    qkv = _split_parts(torch.randn(B, (HQ + 2 * HK) * D, device=device).to(dtype), parts)
    wq = (1 + 0.1 * torch.randn(D, device=device)).to(dtype)
    wk = (1 + 0.1 * torch.randn(D, device=device)).to(dtype)
    cos, sin = rope_tables(D, 1e6, 128, dtype, device)
    got, want = arena.data.clone(), arena.data.clone()
    src = K.QKVParts(qkv, HQ, wq, wk, cos, sin, last, slots, 1e-6)
    out = K.decode_attention(src, got[:, 1, 0], got[:, 1, 1], bt, lens, 0.25,
                             num_splits=num_splits, block_n=16, cached_splits=cached,
                             read_ahead=read_ahead)
    q = R.qkv_norm_rope_write(qkv, wq, wk, cos, sin, last, 1e-6, want[:, 1, 0], want[:, 1, 1],
                              slots, HQ)
    ref = R.paged_attention(q, want[:, 1, 0], want[:, 1, 1], bt, lens, qloc, 0.25)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **_tol(dtype))
    torch.testing.assert_close(got, want, **_tol(dtype), equal_nan=True)
    changed = ~(got == arena.data) & ~(got.isnan() & arena.data.isnan())
    assert changed.flatten(3).any(-1).sum().item() == 2 * len(seqs)   # K and V, one slot a row


def test_default_num_splits_static(monkeypatch):
    import importlib
    mod = importlib.import_module("openinfer.models.qwen3.kernels.decode_attention")
    monkeypatch.setattr(mod, "MAX_SPLITS", 33)        # the knobs' defaults, whatever the env
    monkeypatch.setattr(mod, "MIN_SPLIT_TOKENS", 128)
    assert K.default_num_splits(1, 8, 40960) == 33   # a long graph at bs 1: capped
    assert K.default_num_splits(1, 8, 8208) == 33    # a served instance's 8k graph
    assert K.default_num_splits(1, 8, 4112) == 33    # bs 1 at 4k: ~125 tokens a split
    assert K.default_num_splits(1, 8, 1040) == 9     # bs 1 at 1k: 128 tokens a split at least
    assert K.default_num_splits(8, 8, 4112) == 8
    assert K.default_num_splits(256, 8, 40960) == 1
    assert K.default_num_splits(1, 8, 64) == 1       # short contexts are not split
    # the launch knobs' bounds (OPENINFER_DECODE_MAX_SPLITS, _MIN_SPLIT_TOKENS)
    assert K.default_num_splits(1, 8, 40960, max_splits=64) == 64
    assert K.default_num_splits(1, 8, 16400, max_splits=32) == 32
    assert K.default_num_splits(1, 8, 16400, max_splits=33) == 33
    assert K.default_num_splits(1, 8, 1040, min_tokens=32) == 33
    assert K.default_num_splits(1, 8, 1040, max_splits=32, min_tokens=32) == 32


@pytest.mark.parametrize("n", [64, 48])
def test_rms_norm_and_fused_residual(device, n):
    x, res = torch.randn(5, n, device=device), torch.randn(5, n, device=device)
    w = 1 + 0.1 * torch.randn(n, device=device)
    out, none = K.rms_norm(x, w, 1e-6)
    assert none is None and (out - R.rms_norm(x, w, 1e-6)).abs().max() <= FP32_ATOL
    out, new_res = K.rms_norm(x, w, 1e-6, residual=res)
    ref, ref_res = R.add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(new_res, ref_res) and (out - ref).abs().max() <= FP32_ATOL


def test_rms_norm_bf16(device):
    x = torch.randn(5, 64, device=device).to(torch.bfloat16)
    res = torch.randn(5, 64, device=device).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(64, device=device)).to(torch.bfloat16)
    out, new_res = K.rms_norm(x, w, 1e-6, residual=res)
    ref, ref_res = R.add_rms_norm(x, res, w, 1e-6)
    torch.testing.assert_close(new_res, ref_res, **BF16_TOL)
    torch.testing.assert_close(out, ref, **BF16_TOL)


def _tol(dtype):
    return dict(atol=FP32_ATOL, rtol=1e-5) if dtype == torch.float32 else BF16_TOL


def _split_parts(full, splits, seed=0):
    """``full [T, N]`` as ``splits`` fp32 partial sums (random split, exact total in fp32
    up to rounding), the layout the skinny GEMM leaves for its consumers."""
    if splits == 1:
        return full[None]
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn((splits - 1,) + tuple(full.shape), generator=g).to(full.device)
    return torch.cat([noise, (full.float() - noise.sum(0))[None]])


@pytest.mark.parametrize("dtype,splits", [(torch.float32, 1), (torch.bfloat16, 1),
                                          (torch.float32, 3)])
def test_qkv_norm_rope_write(device, dtype, splits):
    """Fused head norm + RoPE + KV write vs the reference composition: odd token count,
    slots crossing a page edge, and padding rows (slot -1) that must write nothing."""
    T = 9
    qkv = _split_parts(torch.randn(T, (HQ + 2 * HK) * D, device=device).to(dtype), splits)
    wq = (1 + 0.1 * torch.randn(D, device=device)).to(dtype)
    wk = (1 + 0.1 * torch.randn(D, device=device)).to(dtype)
    cos, sin = rope_tables(D, 1e6, 512, dtype, device)
    pos = torch.tensor([0, 1, 2, 3, 77, 78, 300, 301, 511], device=device)
    slots = torch.tensor([5, 6, -1, 7, 8, 41, -1, 42, 13], device=device)
    arena = _arena(device, 4, dtype=dtype)
    got, want = arena.data.clone(), arena.data.clone()
    q_got = K.qkv_norm_rope_write(qkv, wq, wk, cos, sin, pos, 1e-6, got[:, 1, 0], got[:, 1, 1],
                                  slots, HQ)
    q_want = R.qkv_norm_rope_write(qkv, wq, wk, cos, sin, pos, 1e-6, want[:, 1, 0],
                                   want[:, 1, 1], slots, HQ)
    torch.testing.assert_close(q_got, q_want, **_tol(dtype))
    torch.testing.assert_close(got, want, **_tol(dtype))
    written = (got != arena.data).flatten(2).any(-1)          # [pages, layers] touched
    assert written[:, 1].sum() > 0 and not written[:, 0].any() and not written[0].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,split,pre", [(1, 50, 70, 1, 1), (5, 64, 96, 3, 1), (16, 33, 40, 2, 1),
                                             (2, 40, 16, 1, 1), (1, 50, 70, 1, 3), (5, 64, 96, 3, 4),
                                             (2, 40, 16, 1, 2)])
def test_skinny_linear(device, dtype, m, n, k, split, pre):
    """Odd N and K (masked tiles), K ranges that do not divide evenly, 1..16 rows, a K
    range of exactly the first (pre-wait) tile; several tiles read before the wait, more
    of them than a K range holds included."""
    x = torch.randn(m, k, device=device).to(dtype)
    w = torch.randn(n, k, device=device).to(dtype)
    cfg = K.SkinnyConfig(block_n=16, block_k=16, split_k=split, pre_tiles=pre)
    parts = K.skinny_linear(x, w, cfg=cfg)
    assert parts.shape == (split, m, n)
    assert parts.dtype == (torch.float32 if split > 1 else dtype)
    torch.testing.assert_close(R.merge_parts(parts, dtype), F.linear(x, w), **_tol(dtype))
    if pre > 1:   # the same tiles summed in the same order: bit for bit the one-tile result
        one = K.skinny_linear(x, w, cfg=K.SkinnyConfig(block_n=16, block_k=16, split_k=split))
        assert torch.equal(parts, one)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,split,rows", [(1, 50, 70, 1, 0), (5, 64, 96, 3, 11),
                                              (16, 33, 40, 2, 0), (2, 80, 512, 4, 13)])
def test_gemm_with_the_norm_in_its_tail_gives_gemm_then_norm(device, monkeypatch, dtype, m, n,
                                                             k, split, rows):
    """``skinny_linear_add_rms_norm`` (the last program does the add + RMSNorm) returns
    what the GEMM and then the norm kernel return: bit for bit in the interpreter, where
    both sum in one order; odd N (a masked norm row), splits of K, balanced rows, 1..16
    rows. Its arrival counter is back at zero after each launch. The interpreter runs the
    programs one after another, so the ordering (the barrier, the acq_rel arrival, the
    tail by the last program only) is the GPU test's below."""
    arrivals = importlib.import_module("openinfer.models.qwen3.kernels._arrivals")
    _poison_empty(monkeypatch, S)
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    res = torch.randn(m, n, generator=g).to(device, dtype)
    nw = (1 + 0.1 * torch.randn(n, generator=g)).to(device, dtype)
    cfg = K.SkinnyConfig(block_n=16, block_k=16, split_k=split, pre_tiles=2, rows=rows)
    want = K.rms_norm(K.skinny_linear(x, w, cfg=cfg), nw, 1e-6, residual=res)
    for _ in range(2):
        got = K.skinny_linear_add_rms_norm(x, w, res, nw, 1e-6, cfg=cfg)
        for a, b in zip(got, want):
            if INTERPRET:
                assert torch.equal(a, b)
            else:   # another program's reduction tree: a rounding apart
                torch.testing.assert_close(a, b, **_tol(dtype))
        assert not arrivals.arrival_counters(x.device, 1, "norm").any()


@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                    reason="races need programs that really run at once (a GPU)")
@pytest.mark.parametrize("rows", [1, 8])
def test_gemm_norm_tail_under_real_concurrency(monkeypatch, rows):
    """A 4B's down_proj at batch 1 (396 programs, K in 4 splits) and 8, 200 times, three
    launches back to back without a sync: every one equals the GEMM + norm kernel pair. A
    tail run by a program that is not the last reads a part still NaN, or a counter left
    non-zero makes a later launch skip its tail."""
    g = torch.Generator(device="cuda").manual_seed(0)
    h, i = 2560, 9728
    w = (torch.randn(h, i, generator=g, device="cuda") / i ** 0.5).to(torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(h, generator=g, device="cuda")).to(torch.bfloat16)
    cfg = S.launch_config(torch.empty(rows, i, device="cuda", dtype=torch.bfloat16), w, False,
                          True)
    assert cfg.split_k > 1
    _poison_empty(monkeypatch, S)
    for _ in range(200):
        x = torch.randn(rows, i, generator=g, device="cuda").to(torch.bfloat16)
        res = torch.randn(rows, h, generator=g, device="cuda").to(torch.bfloat16)
        want = K.rms_norm(K.skinny_linear(x, w, cfg=cfg), nw, 1e-6, residual=res)
        got = [K.skinny_linear_add_rms_norm(x, w, res, nw, 1e-6, cfg=cfg) for _ in range(3)]
        for pair in got:
            for a, b in zip(pair, want):
                torch.testing.assert_close(a, b, **_tol(torch.bfloat16))


@pytest.mark.parametrize("gated,rows,split", [(False, 11, 1), (False, 9, 3), (True, 13, 1)])
def test_skinny_fewer_rows_than_the_tile(device, gated, rows, split):
    """A program owning fewer output rows than its tile (``SkinnyConfig.rows``, the
    balanced launch) still covers every row once: N = 50 is not a multiple of the rows."""
    x = torch.randn(3, 70, device=device)
    w = torch.randn(2 * 50 if gated else 50, 70, device=device)
    cfg = K.SkinnyConfig(block_n=16, block_k=16, split_k=split, rows=rows)
    if gated:
        got, want = K.skinny_gated(x, w, cfg=cfg), R.silu_mul(F.linear(x, w))
    else:
        got, want = R.merge_parts(K.skinny_linear(x, w, cfg=cfg), x.dtype), F.linear(x, w)
    torch.testing.assert_close(got, want, **_tol(torch.float32))


@pytest.mark.parametrize("block_k", [128, 256])
@pytest.mark.parametrize("knob,m", [("BLOCK_K", 8), ("BLOCK_K_ONE_ROW", 1)])
def test_block_k_knobs_move_the_plain_gemms_of_their_batches(monkeypatch, block_k, knob, m):
    """OPENINFER_SKINNY_BLOCK_K (batches of 2+ rows) and _BLOCK_K_ONE_ROW (batch 1): the
    plain decode GEMMs of a 4B at that batch take the knob's W tile width with the splits
    of the default (QKV 2, o_proj and down 4), the other batch keeps its own knob's; the
    gated GEMM keeps 128 (its stage holds three tiles) and the LM head its own 256."""
    other = S.BLOCK_K_ONE_ROW if knob == "BLOCK_K" else S.BLOCK_K
    monkeypatch.setattr(S, knob, block_k)
    shapes = dict(qkv=(6144, 2560), o_proj=(2560, 4096), down=(2560, 9728))
    for rows, width in ((m, block_k), (9 - m, other)):    # 9 - m: the other batch
        plain = {name: S.default_config(n, k, False, True, 132, m=rows)
                 for name, (n, k) in shapes.items()}
        assert {name: (c.block_k, c.split_k) for name, c in plain.items()} == dict(
            qkv=(width, 2), o_proj=(width, 4), down=(width, 4))
    assert S.default_config(9728, 2560, True, False, 132, m=m).block_k == 128
    assert S.default_config(151936, 2560, False, False, 132, m=m).block_k == 256


@pytest.mark.parametrize("pre", [1, 3])
def test_even_splits_mask_a_tile_that_straddles_a_split_end(device, monkeypatch, pre):
    """Splits are whole tiles by default; OPENINFER_SKINNY_EVEN_SPLITS cuts K in
    _SPLIT_UNIT columns instead, so a tile wider than that may straddle a split's end: the
    loads mask it, W as well as x (a NaN in the next split's columns does not reach this
    split's part), and the parts add up to the product, whether the straddling tile is the
    loop's (pre 1) or read before the wait (pre 3). A 4B's down_proj at batch 1 (256-wide
    tiles, 4 splits of its 9,728 columns): 2,560 columns a split (the last 2,048) in whole
    tiles, 2,432 even; TMA boxes cannot take even splits."""
    down = S.default_config(2560, 9728, False, True, 132, m=1)
    assert not down.even_splits and S.columns_per_split(9728, down) == 2560
    monkeypatch.setattr(S, "EVEN_SPLITS", 1)                 # the knob reaches the launch
    even = S.default_config(2560, 9728, False, True, 132, m=1)
    assert even == dataclasses.replace(down, even_splits=True)
    assert S.columns_per_split(9728, even) == 2432
    with pytest.raises(ConfigError, match="even_splits"):
        dataclasses.replace(down, rows=0, tma=True, even_splits=True)
    monkeypatch.setattr(S, "_SPLIT_UNIT", 16)
    x = torch.randn(3, 160, device=device)
    w = torch.randn(40, 160, device=device)
    cfg = K.SkinnyConfig(block_n=16, block_k=32, split_k=2, pre_tiles=pre, even_splits=True)
    assert S.columns_per_split(160, cfg) == 80          # split 0's tile [64, 96) straddles
    parts = K.skinny_linear(x, w, cfg=cfg)
    torch.testing.assert_close(parts[0], F.linear(x[:, :80], w[:, :80]), **_tol(x.dtype))
    torch.testing.assert_close(parts[1], F.linear(x[:, 80:], w[:, 80:]), **_tol(x.dtype))
    w[:, 80:] = float("nan")
    assert torch.equal(K.skinny_linear(x, w, cfg=cfg)[0], parts[0])


def _skip_without_tma(device: str) -> None:
    if device == "cuda" and not S.tma_fits(torch.empty(16, 16, device=device)):
        pytest.skip("TMA needs a Hopper GPU")


@pytest.mark.parametrize("gated,m,n,k,split,pre", [
    (False, 1, 50, 96, 1, 1), (False, 5, 64, 96, 3, 3), (False, 2, 40, 16, 1, 2),
    (True, 1, 24, 40, 1, 1), (True, 7, 24, 48, 1, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skinny_tma_tiles_give_the_plain_loads_result(device, dtype, gated, m, n, k, split, pre):
    """OPENINFER_SKINNY_TMA: W read as whole TMA boxes (rows and columns past the matrix
    zero-filled, a pre-wait tile past a split's K range met by zeros of x) sums the same
    products in the same order as the masked loads: equal bit for bit. Partial row and K
    tiles, several splits, pre-wait tiles beyond a K range, and the gated form's gate box
    reaching into the up rows of a partial last tile."""
    _skip_without_tma(device)
    x = torch.randn(m, k, device=device).to(dtype)
    w = torch.randn(2 * n if gated else n, k, device=device).to(dtype)
    cfgs = [K.SkinnyConfig(block_n=16, block_k=16, split_k=split, pre_tiles=pre, tma=tma)
            for tma in (False, True)]
    if gated:
        plain, boxed = (K.skinny_gated(x, w, cfg=c) for c in cfgs)
    else:
        plain, boxed = (K.skinny_linear(x, w, cfg=c) for c in cfgs)
    assert torch.equal(boxed, plain)


def test_a_tma_tile_past_a_short_split_reads_nothing(device):
    """With more pre-wait tiles than a split's K range holds, the extra TMA boxes are moved
    past the matrix, not onto the next split's columns: a NaN there (or any value) cannot
    reach this split's part, which equals the masked loads' bit for bit."""
    _skip_without_tma(device)
    x = torch.randn(1, 64, device=device)
    w = torch.randn(16, 64, device=device)
    w[:, 16:] = float("nan")                       # every column after split 0's one tile
    parts = [K.skinny_linear(x, w, cfg=K.SkinnyConfig(block_n=16, block_k=16, split_k=4,
                                                      pre_tiles=3, tma=tma))
             for tma in (False, True)]
    assert torch.isfinite(parts[1][0]).all()
    assert torch.equal(parts[1][0], parts[0][0])


def test_the_default_launch_is_chosen_for_the_batch_it_runs(device, monkeypatch):
    """skinny_linear and skinny_gated size their launch for the rows of x: batch 1 gets
    the batch-1 tile width, and K is split the same way whatever the tile."""
    seen = []
    real = S.default_config

    def spy(*args, **kwargs):
        cfg = real(*args, **kwargs)
        seen.append((kwargs["m"], cfg))
        return cfg
    monkeypatch.setattr(S, "default_config", spy)
    w = torch.randn(40, 64, device=device)
    for rows in (1, 3):
        K.skinny_linear(torch.randn(rows, 64, device=device), w)
        K.skinny_gated(torch.randn(rows, 64, device=device), w)
    assert [m for m, _ in seen] == [1, 1, 3, 3]
    plain_one, plain_three = seen[0][1], seen[2][1]
    assert (plain_one.block_k, plain_three.block_k) == (S.BLOCK_K_ONE_ROW, S.BLOCK_K)
    assert S.default_config(1024, 2048, False, True, 132, m=1).split_k == \
        S.default_config(1024, 2048, False, True, 132, m=2).split_k


def test_tma_is_refused_for_unaligned_rows_and_skipped_by_the_knob(device, monkeypatch):
    """A weight whose rows do not start on 16-byte boundaries (K = 70 fp32) cannot be read
    in TMA boxes: asked for by name it is a ConfigError, while the knob leaves such a
    weight on plain loads (and the default launch of an aligned one takes whole tiles)."""
    x, w = torch.randn(1, 70, device=device), torch.randn(50, 70, device=device)
    assert not S.tma_fits(w)
    with pytest.raises(ConfigError, match="tma"):
        K.skinny_linear(x, w, cfg=K.SkinnyConfig(block_n=16, block_k=16, tma=True))
    monkeypatch.setattr(S, "TMA", 1)
    torch.testing.assert_close(R.merge_parts(K.skinny_linear(x, w), x.dtype), F.linear(x, w),
                               **_tol(torch.float32))
    assert S.default_config(2560, 9728, False, True, 132, m=1, tma=True).rows_per_program == 32
    with pytest.raises(ConfigError, match="rows"):
        K.SkinnyConfig(block_n=32, rows=26, tma=True)


def test_balanced_rows_fill_the_sms_evenly():
    """The 4B decode shapes at 132 SMs: o_proj/down 26 rows (396 programs, 3 a SM), gate/up
    25 (390), QKV keeps its 32 (384); rows outside (block_n / 2, block_n] are refused."""
    from openinfer.models.qwen3.kernels.skinny_linear import balanced_rows
    assert balanced_rows(2560, 32, 4, 132) == 26
    assert balanced_rows(9728, 32, 1, 132) == 25
    assert balanced_rows(6144, 32, 2, 132) == 32
    with pytest.raises(ConfigError, match="rows"):
        K.SkinnyConfig(block_n=16, rows=17)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 200_000), split=st.integers(1, 8), sms=st.integers(1, 200),
       block_n=st.sampled_from([16, 32, 64]))
def test_balanced_rows_is_near_the_least_busy_sm(n, split, sms, block_n):
    from openinfer.models.qwen3.kernels.skinny_linear import balanced_rows

    def busiest(rows):
        return -(-(-(-n // rows) * split) // sms) * rows
    rows = balanced_rows(n, block_n, split, sms)
    assert block_n // 2 < rows <= block_n
    assert busiest(rows) <= 1.03 * min(busiest(r) for r in range(block_n // 2 + 1, block_n + 1))


def test_skinny_logits_fp32(device):
    """The fp32 logits equal the bf16 product cast up (rounded through bf16)."""
    x = torch.randn(3, 48, device=device).to(torch.bfloat16)
    w = torch.randn(40, 48, device=device).to(torch.bfloat16)
    got = K.skinny_linear(x, w, out_dtype=torch.float32, cfg=K.SkinnyConfig(16, 16))[0]
    assert got.dtype == torch.float32
    assert torch.equal(got, got.to(torch.bfloat16).float())
    torch.testing.assert_close(got, F.linear(x, w).float(), **BF16_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,pre", [(1, 1), (7, 1), (7, 4)])
def test_skinny_gated(device, dtype, m, pre):
    x = torch.randn(m, 40, device=device).to(dtype)
    w = torch.randn(2 * 24, 40, device=device).to(dtype)        # I = 24: a partial tile
    got = K.skinny_gated(x, w, cfg=K.SkinnyConfig(block_n=16, block_k=16, pre_tiles=pre))
    torch.testing.assert_close(got, R.silu_mul(F.linear(x, w)), **_tol(dtype))


def test_skinny_pre_tiles_out_of_range_is_refused():
    with pytest.raises(ConfigError, match="pre_tiles"):
        K.SkinnyConfig(pre_tiles=0)


def test_even_splits_with_tma_knobs_is_refused_at_import():
    """Both knobs set is a start-up error naming the one to change, not a silent choice;
    either alone imports."""
    import subprocess
    import sys

    def imports(**knobs: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "import openinfer.models.qwen3.kernels"],
                              env=dict(os.environ, **knobs), capture_output=True, text=True,
                              timeout=120)
    out = imports(OPENINFER_SKINNY_TMA="1", OPENINFER_SKINNY_EVEN_SPLITS="1")
    assert out.returncode != 0
    assert "OPENINFER_SKINNY_EVEN_SPLITS" in out.stderr and "OPENINFER_SKINNY_TMA" in out.stderr
    for knob in ("OPENINFER_SKINNY_TMA", "OPENINFER_SKINNY_EVEN_SPLITS"):
        alone = imports(**{knob: "1"})
        assert alone.returncode == 0, alone.stderr[-1000:]


@pytest.mark.parametrize("splits", [1, 4])
def test_add_rms_norm_takes_parts(device, splits):
    h, res = torch.randn(5, 48, device=device), torch.randn(5, 48, device=device)
    w = 1 + 0.1 * torch.randn(48, device=device)
    parts = _split_parts(h, splits)
    out, new_res = K.rms_norm(parts, w, 1e-6, residual=res)
    ref, ref_res = R.add_rms_norm(R.merge_parts(parts, res.dtype), res, w, 1e-6)
    assert (new_res - ref_res).abs().max() <= FP32_ATOL
    assert (out - ref).abs().max() <= FP32_ATOL


def test_tuning_knob_names_the_variable_and_its_choices(monkeypatch):
    from openinfer.models.qwen3.kernels._tuning import env_choice
    monkeypatch.delenv("OPENINFER_TEST_KNOB", raising=False)
    assert env_choice("OPENINFER_TEST_KNOB", 4, (1, 2, 4), "warps") == 4
    monkeypatch.setenv("OPENINFER_TEST_KNOB", "2")
    assert env_choice("OPENINFER_TEST_KNOB", 4, (1, 2, 4), "warps") == 2
    for bad in ("3", "four", ""):
        monkeypatch.setenv("OPENINFER_TEST_KNOB", bad)
        with pytest.raises(ConfigError, match=r"OPENINFER_TEST_KNOB.*one of 1, 2, 4 \(warps\)"):
            env_choice("OPENINFER_TEST_KNOB", 4, (1, 2, 4), "warps")
