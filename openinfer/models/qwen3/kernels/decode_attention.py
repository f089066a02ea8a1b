"""Paged decode attention: one query per sequence, flash-decoding split over the KV length.

With a small batch, one program per (sequence, kv head) leaves most SMs idle on long
contexts, so the KV range of each sequence is cut into ``num_splits`` equal chunks that
run in parallel and write a partial (normalised output, log-sum-exp); the last split
program of each sequence and kv head to finish merges them (up to
OPENINFER_DECODE_FUSED_REDUCE_SPLITS splits, 64 by default; a second tiny kernel merges
more, which costs a launch). All ``GROUP`` query heads that share a kv head are
processed together, so K/V is read once per group. Shapes depend only on (batch, heads,
num_splits): no host sync and no data-dependent shapes, so the launches can be captured
in a CUDA graph; ``num_splits`` is a compile-time constant chosen per batch bucket.

Every cached token but the newest (position ``seq_len - 1``) was written before the kernel
this one waits on, so each program reads its page-table entries and its first K/V tile
ahead of the PDL wait and folds the newest token in after it, as one extra row (batches of
at least WAIT_FIRST_ROWS rows wait first, as the kernel of 12-04 did). Given
``QKVParts`` instead of q, the kernel also does what ``qkv_rope`` does for a decode row
(q/k norm + RoPE, the newest K/V into its slot), one launch fewer a layer; it pays at batch
1 and is the default there (results/gpu/decode_from_qkv/).

Tried and measured slower (results/gpu/tiles_attempt/): fixed 64-token tiles dealt
round-robin to the splits. On an H100 it cost 1-2% at batch 1 and 3-16% at batch 32-64, so
every program takes an equal share of the sequence's actual length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._arrivals import arrival_counters
from openinfer.models.qwen3.kernels._interpret import INTERPRET
from openinfer.models.qwen3.kernels._paged_tile import attend_row, attend_tile, kv_tile
from openinfer.models.qwen3.kernels._parts import load_parts
from openinfer.models.qwen3.kernels._pdl import pdl_args, pdl_wait
from openinfer.models.qwen3.kernels._tuning import env_choice
from openinfer.models.qwen3.kernels.prefill_attention import dot_precision
from openinfer.models.qwen3.kernels.qkv_rope import norm_rope_heads


# Launch knobs, from side-by-side runs on an H100 (results/gpu/decode_from_qkv/). Decode
# batches of at most FROM_QKV_ROWS rows do q/k norm + RoPE + KV write inside this kernel
# (``QKVParts``): a batch-1 step was 1.9-3.6% faster. Fused at batch 32/64 it was ~3%
# slower, likely from registers (the fused program: 143 a thread at 4 warps, 106 at 8;
# 114 before), so larger batches keep the separate kernel. The first tile is read ahead of
# the PDL wait into registers, which 32-token tiles keep cheap (64: 168 registers, and
# +3-14% at batch >= 8 even unfused).
FROM_QKV_ROWS = env_choice("OPENINFER_DECODE_FROM_QKV_ROWS", 1, (0, 1, 8, 16, 32, 64, 256),
                           "largest decode batch that does q/k norm + RoPE in the attention")
BLOCK_N = env_choice("OPENINFER_DECODE_BLOCK_N", 32, (16, 32, 64, 128),
                     "tokens per K/V tile of the decode attention")
WARPS = env_choice("OPENINFER_DECODE_WARPS", 0, (0, 1, 2, 4, 8),
                   "warps per decode program (0: 8 with QKVParts, else 4)")
# How the KV length is cut. CACHED_SPLITS=1 cuts the cached tokens only and hands the newest
# to the split whose range it continues (or the last); MAX_SPLITS and MIN_SPLIT_TOKENS bound
# default_num_splits. On an H100, side by side in one call (results/gpu/dec06_splits/),
# graphs captured for 8k tokens as a served instance's are, with 3 GEMM stages too: bs1
# -5.4% at 1k and -6.9% at 4k, bs8 -2.2%, bs32/64 -0.1..-0.7% (64 splits before). 33, not
# 32: at a 4k capture 33 splits already give 32 one-tile splits at 1k, and a 33rd for the
# newest token beats folding it into the 32nd (results/gpu/splits_cached_attempt/).
CACHED_SPLITS = env_choice("OPENINFER_DECODE_CACHED_SPLITS", 1, (0, 1),
                           "1: split the cached tokens, the newest to one split")
MAX_SPLITS = env_choice("OPENINFER_DECODE_MAX_SPLITS", 33, (16, 32, 33, 48, 64),
                        "most KV splits a decode row gets")
MIN_SPLIT_TOKENS = env_choice("OPENINFER_DECODE_MIN_SPLIT_TOKENS", 128, (32, 64, 128),
                              "fewest tokens a split of a full-length context gets")
# The 12-04 form of the kernel: wait first, then WAIT_FIRST_BLOCK_N-token tiles. On the H200
# of 12-06 (results/gpu/dec06_h200/) batch 32 and 64 at 4k took 8.87 and 13.78 ms, against
# 7.89-7.99 and 12.17-12.36 ms in the two 12-04 runs with that form (+11-13%; at 1k +2-5%),
# while on an H100 the read-ahead 32-token form had cost those batches at most 1.3%
# (results/gpu/decode_from_qkv/). Side by side on an H100 (results/gpu/dec07_variants_h100/)
# this form cost batch 32/64 4-16%, and so did 64-token tiles alone, so it is not the fix
# there; the H200 is not measured. Batches of at least WAIT_FIRST_ROWS rows take it; 0 (the
# default) leaves every batch on the read-ahead form.
WAIT_FIRST_ROWS = env_choice("OPENINFER_DECODE_WAIT_FIRST_ROWS", 0, (0, 1, 2, 4, 8, 16, 32, 64),
                             "smallest decode batch that waits before reading K/V (0: none)")
WAIT_FIRST_BLOCK_N = env_choice("OPENINFER_DECODE_WAIT_FIRST_BLOCK_N", 64, (16, 32, 64, 128),
                                "tokens per K/V tile when the kernel waits first")
# The split merge done by the last split program of each (sequence, kv head) to finish
# (it counts arrivals on a per-device counter) instead of a second kernel, for launches of
# at most FUSED_REDUCE_SPLITS splits: a launch fewer a layer. On an H100, side by side
# (results/gpu/dec07_fused_h100/), merging every launch's splits so cost batch 1 (33 splits)
# 6.5-9.3%: one program reads 33 partials of 4 heads after everyone else is done, where
# the reduce kernel spreads them over 32 programs. Batch 8 (8 splits) +0.8-0.9%, batch 32
# (2 splits) -0.8% at 1k and -1.2% at 4k. Those runs merged the 4 heads one after another;
# by the kernels' timestamps (results/gpu/dec07_fused_trigger_h100/) the merge itself was
# the loss, 7-9 us a layer at 1k, and not o_proj's early programs. Since 12-07 the last
# program reads its heads' partials a chunk of heads at a time (``_merge_group_splits``,
# ``merge_chunk``): at batch 1 all four at once, one L2 round trip, in 107 registers as
# unfused; every batch stays one wave (``scripts/kernel_report.py``). That form, side by
# side on an H100 (results/gpu/dec07_fused_group_h100/), was faster or equal at every point:
# batch 1 -0.7% at 1k and -1.3% at 4k, batch 8 -1.5% / -1.3%, batch 32 -0.2% / -0.9%,
# batch 64 (one split) equal; 255 kernels a batch-1 step then instead of 291 (183 since
# the norms moved into the GEMMs' tails, 12-07 19:38). Against the reduce kernel once it
# merged through ``_merge_group_splits`` too (results/gpu/dec07_unfused_h100/): bs1 -1.1% /
# -1.4%, bs8 -2.0% / -1.6%, bs32 -0.8% / -1.0%, bs64 equal. So it is the default for every
# launch of up to 64 splits; 0 brings the reduce kernel back.
FUSED_REDUCE_SPLITS = env_choice("OPENINFER_DECODE_FUSED_REDUCE_SPLITS", 64,
                                 (0, 2, 4, 8, 16, 33, 64),
                                 "most splits the last split program merges (0: never)")


@triton.jit
def _cat_halves(a, b, ROWS: tl.constexpr, HALF: tl.constexpr):
    """``[R, HALF]`` twice -> ``[R, 2 HALF]`` (``a`` first), the layout a head is stored in."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (ROWS, 2 * HALF))


@triton.jit
def _decode_split_kernel(q_ptr, kc_ptr, vc_ptr, o_ptr, part_ptr, lse_ptr, bt_ptr, seq_lens_ptr,
                         qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, eps,
                         sm_scale, s_qs, s_qt, s_qh, s_ot, s_oh, s_kp, s_ko, s_kh, s_vp, s_vo,
                         s_vh, s_bt, s_pb, s_ph, s_ps, s_lb, s_lh, s_c,
                         HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr,
                         NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
                         UPCAST: tl.constexpr, FROM_QKV: tl.constexpr, HQ: tl.constexpr,
                         HK: tl.constexpr, NUM_PARTS: tl.constexpr, CACHED: tl.constexpr,
                         AHEAD: tl.constexpr, arrivals_ptr, FUSED: tl.constexpr,
                         MERGE_CHUNK: tl.constexpr, BLOCK_S: tl.constexpr,
                         PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    # Step inputs (lengths, page table, positions, slots) and every cached token but the
    # newest were written before the kernel this one waits on, so they are read ahead of
    # the wait (with AHEAD, the first K/V tile too); the newest token (position
    # seq_len - 1) is folded in after it.
    seq_len = tl.load(seq_lens_ptr + b)
    last = seq_len - 1
    if CACHED:
        # The splits share the cached tokens [0, last); the newest goes to the split whose
        # range it continues, the last one if it lies past them all.
        per_split = tl.maximum(tl.cdiv(last, NUM_SPLITS), 1)
        lo = split * per_split
        hi = tl.minimum(lo + per_split, last)
        owns_newest = split == tl.minimum(last // per_split, NUM_SPLITS - 1)
    else:
        per_split = tl.cdiv(seq_len, NUM_SPLITS)
        lo = split * per_split
        hi = tl.minimum(lo + per_split, seq_len)
        owns_newest = (lo <= last) & (last < hi)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    bt_row = bt_ptr + b * s_bt
    if AHEAD:
        k, v, n_mask = kv_tile(kc_ptr, vc_ptr, bt_row, lo, hi, last, kvh, s_kp, s_ko, s_kh,
                               s_vp, s_vo, s_vh, offs_d, d_mask, PAGE, BLOCK_N)
    dt = kc_ptr.dtype.element_ty
    if FROM_QKV:
        # q/k norm + RoPE + KV write of the newest token, done here instead of by a kernel
        # of its own (qkv_rope.py): q_ptr holds the QKV projection's parts.
        HALF: tl.constexpr = HEAD_DIM // 2
        pos = tl.load(pos_ptr + b)
        slot = tl.load(slot_ptr + b)
        c = tl.load(cos_ptr + pos * s_c + tl.arange(0, HALF))[None, :].to(tl.float32)
        s = tl.load(sin_ptr + pos * s_c + tl.arange(0, HALF))[None, :].to(tl.float32)
        pdl_wait(PDL)
        row = q_ptr + b * s_qt
        q1, q2 = norm_rope_heads(row + heads[:, None] * HEAD_DIM, s_qs, qw_ptr, c, s, eps,
                                 g_mask[:, None], NUM_PARTS, HALF, dt)
        q = _cat_halves(q1, q2, BLOCK_G, HALF)
        one = tl.full([1, 1], 0, tl.int32)
        k1, k2 = norm_rope_heads(row + (HQ + kvh) * HEAD_DIM + one, s_qs, kw_ptr, c, s, eps,
                                 one == 0, NUM_PARTS, HALF, dt)
        k_new = _cat_halves(k1, k2, 1, HALF)
        v_new = load_parts(row + (HQ + HK + kvh) * HEAD_DIM + offs_d[None, :], s_qs, 0,
                           d_mask[None, :], NUM_PARTS, dt)
        # The program that owns the newest token writes it (slot < 0: a padding
        # row, nothing is written and the cache's own value is used, as the split kernel
        # would read it).
        mine = owns_newest & (slot >= 0)
        page = tl.where(slot >= 0, slot // PAGE, 0)
        off = tl.where(slot >= 0, slot % PAGE, 0)
        w_mask = d_mask[None, :] & mine
        tl.store(kc_ptr + page * s_kp + off * s_ko + kvh * s_kh + offs_d[None, :], k_new,
                 mask=w_mask)
        tl.store(vc_ptr + page * s_vp + off * s_vo + kvh * s_vh + offs_d[None, :], v_new,
                 mask=w_mask)
        if slot < 0:
            k_new, v_new, _ = kv_tile(kc_ptr, vc_ptr, bt_row, last, last + 1, -1, kvh, s_kp,
                                      s_ko, s_kh, s_vp, s_vo, s_vh, offs_d, d_mask, PAGE, 1)
    else:
        pdl_wait(PDL)
        q = tl.load(q_ptr + b * s_qt + heads[:, None] * s_qh + offs_d[None, :],
                    mask=g_mask[:, None] & d_mask[None, :], other=0.0)
        k_new, v_new, _ = kv_tile(kc_ptr, vc_ptr, bt_row, last, last + 1, -1, kvh, s_kp, s_ko,
                                  s_kh, s_vp, s_vo, s_vh, offs_d, d_mask, PAGE, 1)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    first = lo
    if AHEAD:
        m_i, l_i, acc = attend_tile(q, k, v, n_mask[None, :], m_i, l_i, acc, sm_scale,
                                    DOT_PREC, UPCAST)
        first = lo + BLOCK_N
    for start in range(first, hi, BLOCK_N):
        k, v, n_mask = kv_tile(kc_ptr, vc_ptr, bt_row, start, hi, last, kvh, s_kp, s_ko,
                               s_kh, s_vp, s_vo, s_vh, offs_d, d_mask, PAGE, BLOCK_N)
        m_i, l_i, acc = attend_tile(q, k, v, n_mask[None, :], m_i, l_i, acc, sm_scale,
                                    DOT_PREC, UPCAST)
    if owns_newest:
        m_i, l_i, acc = attend_row(q, k_new, v_new, m_i, l_i, acc, sm_scale)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        tl.store(o_ptr + b * s_ot + heads[:, None] * s_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask)
    else:
        lse = tl.where(l_i > 0.0, m_i + tl.log(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
        tl.store(part_ptr + b * s_pb + heads[:, None] * s_ph + split * s_ps + offs_d[None, :],
                 out, mask=mask)
        tl.store(lse_ptr + b * s_lb + heads * s_lh + split, lse, mask=g_mask)
        if FUSED:
            # Every thread's partial is stored (barrier) before one thread's acq_rel
            # arrival releases them at GPU scope; the program that arrives last acquires
            # all the others' and merges the group's heads. It resets the counter, which
            # no program touches again before this grid ends.
            tl.debug_barrier()
            counter = arrivals_ptr + b * HK + kvh
            if tl.atomic_add(counter, 1, sem="acq_rel") == NUM_SPLITS - 1:
                _merge_group_splits(part_ptr, lse_ptr, o_ptr, b, kvh * GROUP, s_pb, s_ph, s_ps,
                                    s_lb, s_lh, s_ot, s_oh, HEAD_DIM, NUM_SPLITS, GROUP,
                                    MERGE_CHUNK, BLOCK_S, BLOCK_D, ".cg")
                tl.store(counter, 0)


@triton.jit
def _merge_group_splits(part_ptr, lse_ptr, o_ptr, b, h0, s_pb, s_ph, s_ps, s_lb, s_lh, s_ot,
                        s_oh, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                        GROUP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_S: tl.constexpr,
                        BLOCK_D: tl.constexpr, CACHE: tl.constexpr):
    """The ``GROUP`` heads from ``h0`` of row ``b`` from their splits' (normalised output,
    log-sum-exp): by the last split program of a kv head, or by a reduce kernel's program
    for one head (``GROUP == CHUNK == 1``). ``CHUNK`` heads (a power of two; the last
    chunk's heads past ``GROUP`` masked) are merged at a time: their loads go out
    together, so the merge takes ``GROUP / CHUNK`` L2 round trips (rounded up), not one
    per head. Merged a head at a time, the four heads of a 4B made the fused kernel 7-9 us
    a layer slower than split + reduce on an H100 (results/gpu/dec07_fused_trigger_h100/).
    ``CHUNK`` (``merge_chunk``) keeps the partials of a chunk from costing the kernel
    registers. In the split kernel the reads go through L2 (``CACHE=".cg"``): the partials
    were written from other SMs during this launch; the reduce kernel reads them after the
    launch that wrote them, with plain loads."""
    offs_c = tl.arange(0, CHUNK)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM
    for c0 in tl.static_range(0, GROUP, CHUNK):
        heads = h0 + c0 + offs_c
        h_mask = c0 + offs_c < GROUP
        lse = tl.load(lse_ptr + b * s_lb + heads[:, None] * s_lh + offs_s[None, :],
                      mask=h_mask[:, None] & s_mask[None, :], other=float("-inf"),
                      cache_modifier=CACHE)
        part = tl.load(part_ptr + b * s_pb + heads[:, None, None] * s_ph
                       + offs_s[None, :, None] * s_ps + offs_d[None, None, :],
                       mask=h_mask[:, None, None] & s_mask[None, :, None]
                       & d_mask[None, None, :], other=0.0, cache_modifier=CACHE)
        lse = tl.where(h_mask[:, None], lse, 0.0)   # a padding head: finite, never stored
        w = tl.exp(lse - tl.max(lse, axis=1)[:, None])  # split 0 is never empty
        out = tl.sum(w[:, :, None] * part, axis=1) / tl.sum(w, axis=1)[:, None]
        tl.store(o_ptr + b * s_ot + heads[:, None] * s_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=h_mask[:, None] & d_mask[None, :])


@triton.jit
def _decode_reduce_kernel(part_ptr, lse_ptr, o_ptr, s_pb, s_ph, s_ps, s_lb, s_lh, s_ot, s_oh,
                          HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                          BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pdl_wait(PDL)
    _merge_group_splits(part_ptr, lse_ptr, o_ptr, b, h, s_pb, s_ph, s_ps, s_lb, s_lh, s_ot,
                        s_oh, HEAD_DIM, NUM_SPLITS, 1, 1, BLOCK_S, BLOCK_D, "")


def merge_chunk(group: int, block_s: int, block_d: int, num_warps: int) -> int:
    """Heads the fused merge reads at once: all of a kv head's (padded to a power of two),
    halved while a thread would hold more than 16 fp32 partials per warp of the program.
    That bound is fitted to what ptxas makes of the split kernel for sm_90 (triton 3.6.0,
    ``scripts/kernel_report.py``): a 4B's batch 1 (8 warps, 64 x 128 partials a head) takes
    4 heads at once in 107 registers, as unfused; its batch 2 (4 warps, 32 x 128) took 150
    registers with 4, two waves of programs instead of one, and takes 119 with 2 (one
    wave)."""
    threads = 32 * num_warps
    chunk = triton.next_power_of_2(group)
    while chunk > 1 and chunk * block_s * block_d > 16 * num_warps * threads:
        chunk //= 2
    return chunk


def default_num_splits(batch: int, num_kv_heads: int, max_context: int,
                       max_splits: int | None = None, min_tokens: int | None = None) -> int:
    """About 512 programs (~4 per SM of a 132-SM H200), at most ``max_splits``
    (MAX_SPLITS), without cutting a full-length context into splits under ``min_tokens``
    (MIN_SPLIT_TOKENS); depends only on static sizes, so it is fixed per graph bucket. From
    a sweep on an H200 at bs 1 and 8, 1k and 4k context (``scripts/device_decode_bench.py
    --sweep``): bs 1 wants ~32 splits, bs 8 ~8."""
    max_splits = MAX_SPLITS if max_splits is None else max_splits
    min_tokens = MIN_SPLIT_TOKENS if min_tokens is None else min_tokens
    want = triton.cdiv(512, batch * num_kv_heads)
    return max(1, min(max_splits, want, triton.cdiv(max_context, min_tokens)))


def can_take_qkv(head_dim: int) -> bool:
    """Whether the kernel can do q/k norm + RoPE itself: a head is two power-of-two halves
    of at least 8 (its tile is exactly one head wide)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


@dataclass(frozen=True)
class QKVParts:
    """The query side of a decode attention that also does the q/k norm + RoPE + KV write
    of ``qkv_norm_rope_write`` (same arguments): one kernel fewer a layer, and the cached
    K/V is read while the QKV projection still runs (the wait is on that GEMM)."""

    qkv: torch.Tensor            # the QKV projection's parts [S, B, (Hq + 2 Hk) D]
    num_q_heads: int
    q_norm: torch.Tensor         # [D]
    k_norm: torch.Tensor         # [D]
    cos: torch.Tensor            # RoPE tables [max_pos, D] (HF's, halves repeated)
    sin: torch.Tensor
    positions: torch.Tensor      # [B], seq_len - 1 of each row
    slot_mapping: torch.Tensor   # [B], that position's arena slot; < 0: write nothing
    eps: float


def decode_attention(q: torch.Tensor | QKVParts, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     num_splits: int | None = None, block_n: int | None = None,
                     num_warps: int | None = None, cached_splits: bool | None = None,
                     read_ahead: bool | None = None,
                     fused_reduce: bool | None = None) -> torch.Tensor:
    """q ``[B, Hq, D]`` (one token per sequence, its K/V already written), or the QKV
    projection as ``QKVParts`` (its K/V is written here); caches ``[pages, block, Hk, D]``,
    ``seq_lens[b] >= 1`` -> out ``[B, Hq, D]``. Padding rows: seq_len 1 on a padding page
    (and slot -1). ``cached_splits`` (default CACHED_SPLITS): how the KV length is cut;
    ``read_ahead`` (default: below WAIT_FIRST_ROWS rows): whether the first K/V tile is
    read before the PDL wait, in ``block_n``-token tiles (default BLOCK_N, or
    WAIT_FIRST_BLOCK_N when waiting first); ``fused_reduce`` (default: at most
    FUSED_REDUCE_SPLITS splits): the last split program merges the splits instead of a
    second kernel. The same result every way."""
    Hk, D, page = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    if isinstance(q, QKVParts):
        src, parts, Hq = q, q.qkv, q.num_q_heads
        S, B, width = parts.shape
        assert width == (Hq + 2 * Hk) * D and parts.stride(-1) == 1
        assert can_take_qkv(D), \
            "q/k norm + RoPE in the decode attention needs a power-of-two head_dim >= 16"
        assert src.cos.stride() == src.sin.stride() and src.cos.stride(-1) == 1
        q_ptr, s_qs, s_qt, s_qh = parts, parts.stride(0), parts.stride(1), D
        rope = (src.q_norm, src.k_norm, src.cos, src.sin, src.positions, src.slot_mapping,
                src.eps)
        dtype = k_cache.dtype
    else:
        B, Hq, _ = q.shape
        S = 1
        assert q.stride(-1) == 1 and q.shape[2] == D
        q_ptr, s_qs, s_qt, s_qh = q, 0, q.stride(0), q.stride(1)
        rope = (q, q, q, q, seq_lens, seq_lens, 0.0)      # not read without FROM_QKV
        dtype = q.dtype
    assert Hq % Hk == 0
    if read_ahead is None:
        read_ahead = not (WAIT_FIRST_ROWS and B >= WAIT_FIRST_ROWS)
    if block_n is None:
        block_n = BLOCK_N if read_ahead else WAIT_FIRST_BLOCK_N
    assert block_n >= 16
    if num_warps is None:
        num_warps = WARPS or (8 if isinstance(q, QKVParts) else 4)
    if num_splits is None:
        num_splits = default_num_splits(B, Hk, block_tables.shape[1] * page)
    out = torch.empty((B, Hq, D), dtype=dtype, device=k_cache.device)
    part = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=k_cache.device)
    lse = torch.empty((B, Hq, num_splits), dtype=torch.float32, device=k_cache.device)
    block_d = max(16, triton.next_power_of_2(D))
    block_s = triton.next_power_of_2(num_splits)
    group = Hq // Hk
    if fused_reduce is None:
        fused_reduce = num_splits <= FUSED_REDUCE_SPLITS
    fused = num_splits > 1 and fused_reduce
    arrivals = arrival_counters(k_cache.device, B * Hk) if fused else lse
    _decode_split_kernel[(B, Hk, num_splits)](
        q_ptr, k_cache, v_cache, out, part, lse, block_tables, seq_lens, *rope, scale,
        s_qs, s_qt, s_qh, out.stride(0), out.stride(1), *k_cache.stride()[:3],
        *v_cache.stride()[:3], block_tables.stride(0), *part.stride()[:3], *lse.stride()[:2],
        rope[2].stride(0), HEAD_DIM=D, GROUP=group, PAGE=page, NUM_SPLITS=num_splits,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_PREC=dot_precision(dtype), UPCAST=INTERPRET, FROM_QKV=isinstance(q, QKVParts),
        HQ=Hq, HK=Hk, NUM_PARTS=S,
        CACHED=bool(CACHED_SPLITS if cached_splits is None else cached_splits),
        AHEAD=bool(read_ahead), arrivals_ptr=arrivals, FUSED=bool(fused),
        MERGE_CHUNK=merge_chunk(group, block_s, block_d, num_warps), BLOCK_S=block_s,
        num_warps=num_warps, **pdl_args(k_cache.device))
    if num_splits > 1 and not fused:
        _decode_reduce_kernel[(B, Hq)](
            part, lse, out, *part.stride()[:3], *lse.stride()[:2], out.stride(0), out.stride(1),
            HEAD_DIM=D, NUM_SPLITS=num_splits, BLOCK_S=block_s, BLOCK_D=block_d,
            **pdl_args(k_cache.device))
    return out
