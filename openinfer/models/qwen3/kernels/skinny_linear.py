"""Skinny GEMM for decode: ``x @ W^T`` for a few rows of ``x`` (at most ``MAX_ROWS``).

A decode step multiplies one to a few rows by every weight matrix, so its time is the
time to stream W from memory once. Each program owns ``BLOCK_N`` rows of W (output
columns) and, with split-K, one range of K; it streams its W tiles through ``tl.dot``
(``x`` padded to 16 rows, which costs tensor-core time only) so Triton pipelines the
loads with ``num_stages``, and enough programs are launched to keep every SM reading.

Outputs are *parts* ``[S, M, N]``: with ``S == 1`` the product rounded once to the weight
dtype (or an ``out_dtype`` such as fp32 for the logits, rounded through the weight dtype
first so the values equal ``F.linear(x, W).float()`` up to summation order); with split-K
``S > 1`` fp32 partial sums that the consumer kernel (the fused residual-add + RMSNorm,
or the fused q/k norm + RoPE + KV write) adds up in a fixed order before rounding: no
extra launch and no atomic adds of data, so a step stays bitwise reproducible.

``gated``: W is ``[gate; up]`` ``[2I, K]`` and the result is ``silu(x W_g^T) * (x W_u^T)``
``[M, I]``, each intermediate rounded where HF's ``act(gate(x)) * up(x)`` rounds it.

``skinny_linear_add_rms_norm`` (batches of at most ``FUSED_NORM_ROWS`` rows): the program
that finishes last adds the parts to the residual and applies the RMSNorm after the
projection (``_arrivals``), the norm kernel's work without its launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from openinfer.errors import require
from openinfer.models.qwen3.kernels._arrivals import arrival_counters
from openinfer.models.qwen3.kernels._dot import mma
from openinfer.models.qwen3.kernels._interpret import INTERPRET
from openinfer.models.qwen3.kernels._pdl import hopper_or_later, pdl_args, pdl_wait
from openinfer.models.qwen3.kernels._tuning import env_choice
from openinfer.models.qwen3.kernels.norm import add_rms_norm_row
from openinfer.models.qwen3.kernels.prefill_attention import dot_precision

MAX_ROWS = 16   # tl.dot's smallest M: up to this many rows cost one pass over W
MAX_PRE_TILES = 4


# W tiles read before the PDL wait (OPENINFER_SKINNY_PRE / _GATED override them).
# Measured on an H200 (results/gpu/pre_tiles/): 3 tiles before the wait take bs1 decode
# from 3.054 to 2.980 ms at 1k context; the gated GEMM (two tiles per step, gate and up)
# does best with 1 (3 there: 2.992 ms; 4 everywhere: slower, 3.218 ms).
_PRE_RANGE = range(1, MAX_PRE_TILES + 1)
PRE_TILES = env_choice("OPENINFER_SKINNY_PRE", 3, _PRE_RANGE, "W tiles read before the PDL wait")
PRE_TILES_GATED = env_choice("OPENINFER_SKINNY_PRE_GATED", 1, _PRE_RANGE,
                             "W tiles read before the PDL wait, gated GEMM")
# Rows per program chosen so that every SM holds the same number of programs (1) or one
# tile's rows (0). The step's GEMMs run as one wave, and an SM holding 3 programs where most
# hold 2 finishes last: in a bs1 step on an H100 (scripts/decode_ablation.py,
# results/gpu/fold_norms_attempt/) o_proj cost 1.25x its bytes over copy bandwidth, down
# 1.36x and gate/up 1.19x, close to their 3 / 2.42 and 3 / 2.30 programs-per-SM ratios,
# while QKV (2.91 a SM) cost 1.06x. Balanced (results/gpu/balanced_rows/, two H100 calls):
# gate/up 1.03x, down 1.15x, o_proj 1.19x; bs1 decode -1.2 to -1.5% at 1k and 4k, bs8 -0.8
# to -1.9%, bs32/64 equal.
BALANCE = env_choice("OPENINFER_SKINNY_BALANCE", 1, (0, 1),
                     "1: rows per program that fill every SM evenly")
# Output rows per program of the gated (gate/up) GEMM: its 2 x 9,728 rows at a 4B make 304
# programs of 32, 608 of 16. 16 was timed as a fuller last wave and was slower: bs1 decode
# +12.6% on an H100 (results/gpu/tiles_attempt/), so 32 stays.
GATED_BLOCK_N = env_choice("OPENINFER_SKINNY_GATED_BN", 32, (16, 32, 64),
                           "output rows per program of the gated GEMM")
# Pipeline stages (W tiles in flight through shared memory) of the decode GEMMs. A stage
# takes 12 KB of shared memory (20 KB gated: gate, up and x tiles), and an SM can make the
# next kernel's programs resident (PDL) only where the running ones leave room: three
# gate/up programs at 4 stages hold 186 of the SM's 228 KB, so one down_proj program of the
# next kernel fits beside them, at 3 stages (126 KB) two. 3 for the plain GEMMs: bs1 -0.4 to
# -0.85% in three H100 calls, products bit-identical; the gated one stays at 4 (3 was slower).
STAGES = env_choice("OPENINFER_SKINNY_STAGES", 3, (2, 3, 4, 5),
                    "pipeline stages of the decode GEMM")
STAGES_GATED = env_choice("OPENINFER_SKINNY_STAGES_GATED", 4, (2, 3, 4, 5),
                          "pipeline stages of the gated decode GEMM")
# K per W tile of the plain decode GEMMs (the gated one keeps 128: its stage holds gate, up
# and x tiles), at batch 1 and at larger batches. On an H100, 256 everywhere took bs1
# 1.5-1.6% faster and bs8 4.8-6.5% slower (results/gpu/dec07_variants_h100/); 256 at batch 1
# alone, in a second call, bs1 -1.8% (1k) / -1.5% (4k) with every larger batch within 0.12%
# (results/gpu/dec07_block_k_one_row_h100/), each against the same call's 128. The H200 is
# not yet measured. The tile does not change how many splits K gets (``_SPLIT_UNIT``).
BLOCK_K = env_choice("OPENINFER_SKINNY_BLOCK_K", 128, (64, 128, 256),
                     "K per W tile of the plain decode GEMMs, batches of 2 or more rows")
BLOCK_K_ONE_ROW = env_choice("OPENINFER_SKINNY_BLOCK_K_ONE_ROW", 256, (64, 128, 256),
                             "K per W tile of the plain decode GEMMs at batch 1")
# W tiles fetched by the tensor-memory accelerator (one bulk copy a tile, Hopper) instead
# of every thread's 16-byte asynchronous copies, to test a third explanation of the H200's
# larger time beyond its bytes: that a program's outstanding copy instructions, not its
# bytes, cap what an SM has in flight (4 stages instead of 3 raised the bytes by half and
# gained nothing there, results/gpu/dec06_h200/). On an H100 it was 1.1-1.2% slower at bs1
# than the same whole-tile launch without it (results/gpu/dec07_variants_h100/), so it is
# off; the H200 is not measured. A TMA box is a power-of-two tile and cannot be masked, so
# a program owns its whole tile (no balanced rows) and a split whole tiles (no
# EVEN_SPLITS), and a weight whose rows are not 16-byte aligned keeps the plain loads.
TMA = env_choice("OPENINFER_SKINNY_TMA", 0, (0, 1), "1: W tiles by TMA bulk copies (Hopper)")
# K split in 128-column units instead of whole tiles, so that a split's columns are even
# (a 4B's batch-1 down_proj, K = 9,728 in 4 splits of 256-wide tiles: 2,432 columns each
# instead of 2,560 for three splits and 2,048 for the last; a 0.6B's, 8 splits: eight of
# 384 instead of six of 512 and two empty ones). Slower on an H100 (2026-12-07,
# results/gpu/dec07_splits_h100/): bs1 +0.7% at 1k and +0.8% at 4k against whole tiles in
# the same call. The long splits' trip count is the same either way (ten tiles, the last
# one half masked), and the short split's grows from eight to ten, so evening the bytes
# gains nothing if a program's time is its trips (not profiled). TMA boxes cannot be
# masked: not with OPENINFER_SKINNY_TMA. The same call found multiplying the pre-wait
# tiles after the loop (instead of right after the wait) 6% slower at bs1; that knob is
# gone.
EVEN_SPLITS = env_choice("OPENINFER_SKINNY_EVEN_SPLITS", 0, (0, 1),
                         "1: split K in 128-column units, not whole tiles")
require(not (EVEN_SPLITS and TMA), "OPENINFER_SKINNY_EVEN_SPLITS", EVEN_SPLITS,
        "0 with OPENINFER_SKINNY_TMA=1 (a TMA box cannot be masked, so splits are whole tiles)")
# The residual add + RMSNorm after o_proj and down_proj done by the GEMM's last program to
# finish (``skinny_linear_add_rms_norm``) for batches of at most this many rows, instead of
# by a norm kernel: 72 launches fewer a step. The norms' marginal cost in an H100's bs1
# step was 2.8-3.4 us a launch with almost no bytes (results/gpu/dec07_ablation_h100/),
# taken here to be mostly the kernel boundary: the tail keeps the norm's work but not its
# launch. Folding the norm into the GEMM *after* it was 15% slower
# (results/gpu/fold_norms_attempt/: x computed in registers is not pipelined). At batch 1 a
# 4B's GEMM keeps its registers (168, scripts/kernel_report.py); at 2-16 rows the tail's
# row takes them from 92-104 to 136-138. Timed on an H100 (results/gpu/dec07_fused_norm_h100/,
# one call, medians of 30 graph replays): bs1 3.317 -> 3.239 ms at 1k (-2.3%) and 3.490 ->
# 3.422 ms at 4k (-2.0%); bs8 with the tail (=16) 3.868 -> 4.670 ms at 1k (+21%) and 5.040
# -> 5.857 ms at 4k (+16%), the rows run one after another in one program. So batch 1 only.
FUSED_NORM_ROWS = env_choice("OPENINFER_SKINNY_FUSED_NORM_ROWS", 1, (0, 1, 2, 4, 8, 16),
                             "largest decode batch whose GEMM does the add + RMSNorm after it")


def norm_in_tail(rows: int, limit: int = FUSED_NORM_ROWS) -> bool:
    """Whether a projection of ``rows`` rows does the add + RMSNorm after it in its own
    tail (``skinny_linear_add_rms_norm``): 1 to ``limit`` rows, within ``MAX_ROWS``."""
    return 0 < rows <= min(MAX_ROWS, limit)
# K is split in steps of this many columns whatever the tile width when choosing how many
# splits K gets, so a tile knob changes the tile alone (at 256, smaller models would
# otherwise take half the splits at batch 1); with EVEN_SPLITS also where they end.
_SPLIT_UNIT = 128


@triton.jit
def _w_tile(w_rows, w_desc, row0, N, K, up_offset, k0, k_hi, n_mask, BLOCK_K: tl.constexpr,
            GATED: tl.constexpr, TMA: tl.constexpr):
    """The W tile at ``k0`` (and its up-projection twin when ``GATED``; else the same tile
    again). By TMA the box is read whole, and rows and columns past the matrix come back
    zero without being read; a tile at or past ``k_hi`` (a pre-wait tile beyond a short
    split, which a box cannot mask) is moved past the matrix's last column, so it reads
    nothing. Rows of a gate box past N are up rows, dropped at the store."""
    if TMA:
        kk = tl.where(k0 < k_hi, k0, K)
        w = w_desc.load([row0, kk])
        w_up = w
        if GATED:
            w_up = w_desc.load([N + row0, kk])
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w_mask = n_mask[:, None] & (offs_k < k_hi)[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=w_mask, other=0.0)
        w_up = w
        if GATED:
            w_up = tl.load(w_rows + up_offset + offs_k[None, :], mask=w_mask, other=0.0)
    return w, w_up


@triton.jit
def _mma_tile(acc, acc_up, x_rows, offs_k, k_hi, m_mask, w, w_up, GATED: tl.constexpr,
              DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & (offs_k < k_hi)[None, :],
                other=0.0)
    acc += mma(x, tl.trans(w), DOT_PREC, UPCAST)
    if GATED:
        acc_up += mma(x, tl.trans(w_up), DOT_PREC, UPCAST)
    return acc, acc_up


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, w_desc, y_ptr, M, N, K, k_per_split, s_xm, s_wn, s_ys, s_ym,
                   r_ptr, nw_ptr, xo_ptr, ro_ptr, arrivals_ptr, s_r, s_xo, s_ro, eps,
                   GATED: tl.constexpr, ROUND: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRE: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                   TMA: tl.constexpr, NORM: tl.constexpr, NUM_PARTS: tl.constexpr,
                   NORM_BLOCK: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * ROWS + tl.arange(0, BLOCK_N)    # a program owns ROWS <= BLOCK_N rows
    m_mask = offs_m < M
    n_mask = (tl.arange(0, BLOCK_N) < ROWS) & (offs_n < N)
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    x_rows = x_ptr + offs_m[:, None] * s_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * s_wn
    up = N * s_wn
    row0 = pid_n * ROWS
    # The first PRE W tiles are read before waiting on the previous kernel (weights are
    # never written during a step), so the stream of W starts while that kernel drains:
    # with PDL this kernel is resident from the previous one's start. (Names differ from
    # the loop's so that no tile becomes a loop-carried value.)
    offs_k0 = k_lo + tl.arange(0, BLOCK_K)
    w0, u0 = _w_tile(w_rows, w_desc, row0, N, K, up, k_lo, k_hi, n_mask, BLOCK_K, GATED, TMA)
    if PRE >= 2:
        w1, u1 = _w_tile(w_rows, w_desc, row0, N, K, up, k_lo + BLOCK_K, k_hi, n_mask,
                         BLOCK_K, GATED, TMA)
    if PRE >= 3:
        w2, u2 = _w_tile(w_rows, w_desc, row0, N, K, up, k_lo + 2 * BLOCK_K, k_hi, n_mask,
                         BLOCK_K, GATED, TMA)
    if PRE >= 4:
        w3, u3 = _w_tile(w_rows, w_desc, row0, N, K, up, k_lo + 3 * BLOCK_K, k_hi, n_mask,
                         BLOCK_K, GATED, TMA)
    pdl_wait(PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc, acc_up = _mma_tile(acc, acc_up, x_rows, offs_k0, k_hi, m_mask, w0, u0, GATED,
                            DOT_PREC, UPCAST)
    if PRE >= 2:
        acc, acc_up = _mma_tile(acc, acc_up, x_rows, offs_k0 + BLOCK_K, k_hi, m_mask, w1, u1,
                                GATED, DOT_PREC, UPCAST)
    if PRE >= 3:
        acc, acc_up = _mma_tile(acc, acc_up, x_rows, offs_k0 + 2 * BLOCK_K, k_hi, m_mask, w2,
                                u2, GATED, DOT_PREC, UPCAST)
    if PRE >= 4:
        acc, acc_up = _mma_tile(acc, acc_up, x_rows, offs_k0 + 3 * BLOCK_K, k_hi, m_mask, w3,
                                u3, GATED, DOT_PREC, UPCAST)
    # The loop loads x before W, which ``_mma_tile`` after ``_w_tile`` would not: that order
    # compiles differently (a 4B's batch-1 gate/up GEMM: 92 registers instead of 80).
    for k0 in range(k_lo + PRE * BLOCK_K, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_hi
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)
        w, w_up = _w_tile(w_rows, w_desc, row0, N, K, up, k0, k_hi, n_mask, BLOCK_K, GATED,
                          TMA)
        acc += mma(x, tl.trans(w), DOT_PREC, UPCAST)
        if GATED:
            acc_up += mma(x, tl.trans(w_up), DOT_PREC, UPCAST)
    dt = w_ptr.dtype.element_ty
    if GATED:
        gate = acc.to(dt).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
        out = (act * acc_up.to(dt).to(tl.float32)).to(dt)
    elif ROUND:
        out = acc.to(dt)
    else:
        out = acc
    tl.store(y_ptr + split * s_ys + offs_m[:, None] * s_ym + offs_n[None, :],
             out.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])
    if NORM:
        # Every thread's share is stored (barrier) before one thread's acq_rel arrival
        # releases it at GPU scope; the program that arrives last acquires all the others'
        # and does the norm kernel's work, row by row. It resets the counter, which no
        # program touches again before this grid ends.
        tl.debug_barrier()
        programs = tl.num_programs(0) * tl.num_programs(1)
        if tl.atomic_add(arrivals_ptr, 1, sem="acq_rel") == programs - 1:
            cols = tl.arange(0, NORM_BLOCK)
            c_mask = cols < N
            nw = tl.load(nw_ptr + cols, mask=c_mask, other=0.0)
            for m in range(0, M):
                add_rms_norm_row(y_ptr + m * s_ym, s_ys, r_ptr + m * s_r, nw, xo_ptr + m * s_xo,
                                 ro_ptr + m * s_ro, cols, c_mask, N, eps, True, NUM_PARTS,
                                 ro_ptr.dtype.element_ty, ".cg")
            tl.store(arrivals_ptr, 0)


@dataclass(frozen=True)
class SkinnyConfig:
    """Tile sizes and launch shape; all static, so a captured graph keeps one choice."""

    block_n: int = 32
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    pre_tiles: int = 1    # W tiles each program reads before waiting on the previous kernel
    rows: int = 0         # output rows a program owns (<= block_n; 0: block_n)
    tma: bool = False     # W tiles by TMA bulk copies (a Hopper GPU, or the interpreter)
    even_splits: bool = False  # split K in _SPLIT_UNIT columns, not whole tiles

    def __post_init__(self) -> None:
        require(1 <= self.pre_tiles <= MAX_PRE_TILES, "pre_tiles", self.pre_tiles,
                f"1..{MAX_PRE_TILES} W tiles read before the PDL wait")
        require(0 <= self.rows <= self.block_n, "rows", self.rows,
                f"0..block_n ({self.block_n}) output rows per program")
        require(not self.tma or self.rows in (0, self.block_n), "rows", self.rows,
                f"0 with tma (a TMA box is the whole {self.block_n}-row tile)")
        require(not (self.tma and self.even_splits), "even_splits", self.even_splits,
                "False with tma (a TMA box cannot be masked, so a split is whole tiles)")

    @property
    def rows_per_program(self) -> int:
        return self.rows or self.block_n

    def grid(self, n: int) -> tuple[int, int]:
        """Programs along the ``n`` output rows, and K splits."""
        return triton.cdiv(n, self.rows_per_program), self.split_k


@lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """SMs of ``device``; 132 (an H100/H200) where there is no GPU (interpreter runs)."""
    if device.type != "cuda":
        return 132
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def tma_fits(w: torch.Tensor) -> bool:
    """Whether ``w``'s tiles can be TMA boxes: a Hopper GPU (or the interpreter) and rows
    that start on 16-byte boundaries."""
    if not (INTERPRET or hopper_or_later(w.device)):
        return False
    return (w.stride(-1) == 1 and w.data_ptr() % 16 == 0
            and w.stride(0) * w.element_size() % 16 == 0)


def default_config(n: int, k: int, gated: bool, may_split: bool, sms: int, *, m: int,
                   tma: bool = False) -> SkinnyConfig:
    """32-row tiles; split K until there are >= 2 programs per SM (QKV: 2 splits, o_proj
    and down_proj of a 4B: 4) where the consumer takes parts; a gated product cannot split
    (its epilogue is nonlinear). The LM head (N ~ 152k) takes wider tiles. Chosen from a
    sweep on an H200 (``scripts/device_decode_bench.py --sweep``). With ``BALANCE`` a
    program owns ``balanced_rows`` of its tile's rows, so that every SM gets as many;
    ``tma`` (a weight that ``tma_fits``) reads W by TMA, each program its whole tile.
    ``m``: the rows of ``x`` (a graph bucket's batch); one row takes BLOCK_K_ONE_ROW."""
    if n >= 256 * sms:
        return SkinnyConfig(block_n=64, block_k=256, num_stages=3, pre_tiles=PRE_TILES,
                            tma=tma)
    block_n, block_k = (GATED_BLOCK_N, 128) if gated else (
        32, BLOCK_K_ONE_ROW if m == 1 else BLOCK_K)
    blocks = triton.cdiv(n, block_n)
    split = 1
    if may_split and not gated:
        while blocks * split < 2 * sms and split < 8 and k // (2 * split) >= 2 * _SPLIT_UNIT:
            split *= 2
    return SkinnyConfig(block_n=block_n, block_k=block_k, split_k=split,
                        num_stages=STAGES_GATED if gated else STAGES,
                        pre_tiles=PRE_TILES_GATED if gated else PRE_TILES,
                        rows=balanced_rows(n, block_n, split, sms) if BALANCE and not tma else 0,
                        tma=tma, even_splits=bool(EVEN_SPLITS))


def launch_config(x: torch.Tensor, w: torch.Tensor, gated: bool, may_split: bool) -> SkinnyConfig:
    """The launch ``skinny_linear`` / ``skinny_gated`` make for ``x`` and ``w`` given no
    config (the GPU's SMs, the batch's rows, TMA where the knob asks and ``w`` allows)."""
    n = w.shape[0] // 2 if gated else w.shape[0]
    return default_config(n, w.shape[1], gated, may_split, sm_count(x.device), m=x.shape[0],
                          tma=bool(TMA) and tma_fits(w))


def balanced_rows(n: int, block_n: int, split: int, sms: int) -> int:
    """Output rows per program (half a tile to a whole one) that minimise the rows of the
    busiest SM, ``ceil(programs / sms) * rows``, all programs running as one wave of equal
    work each: the widest within 3% of that minimum (more, smaller programs cost ramp time
    the count ignores). A 4B at 132 SMs: o_proj and down_proj 26 rows (396 programs, 3 on
    every SM; 32 rows make 320, 3 on some SMs and 2 on most), gate/up 25 (390), QKV stays
    at 32 (384, where 19 rows would save 1%)."""
    def busiest(rows: int) -> int:
        return triton.cdiv(triton.cdiv(n, rows) * split, sms) * rows
    candidates = range(block_n, block_n // 2, -1)
    least = min(busiest(r) for r in candidates)
    return next(r for r in candidates if busiest(r) <= 1.03 * least)


def columns_per_split(k: int, cfg: SkinnyConfig) -> int:
    """K columns of each split but the last (which takes the rest): whole tiles, or with
    ``even_splits`` steps of ``_SPLIT_UNIT`` (or of the tile, if narrower), where a split's
    last tile may be partial and the loads mask it (``EVEN_SPLITS`` says what each gives)."""
    unit = min(cfg.block_k, _SPLIT_UNIT) if cfg.even_splits else cfg.block_k
    return triton.cdiv(triton.cdiv(k, cfg.split_k), unit) * unit


def kernel_constants(cfg: SkinnyConfig, gated: bool, dtype: torch.dtype, n: int = 0,
                     norm: bool = False) -> dict:
    """The kernel's compile-time arguments for ``cfg`` and a weight of ``dtype`` (all but
    ``PDL``); ``norm``: with the fused add + RMSNorm over ``n`` outputs. One list for the
    launch and for ``scripts/kernel_report.py``'s compile, so that the report compiles
    what a launch runs."""
    return dict(GATED=gated, ROUND=cfg.split_k == 1, BLOCK_M=MAX_ROWS, BLOCK_N=cfg.block_n,
                ROWS=cfg.rows_per_program, BLOCK_K=cfg.block_k, PRE=cfg.pre_tiles,
                DOT_PREC=dot_precision(dtype), UPCAST=INTERPRET, TMA=cfg.tma, NORM=norm,
                NUM_PARTS=cfg.split_k if norm else 1,
                NORM_BLOCK=triton.next_power_of_2(n) if norm else 1)


@dataclass(frozen=True)
class NormTail:
    """What the fused add + RMSNorm reads and writes: ``res_out = residual + product``,
    ``out = rms_norm(res_out) * weight``."""

    residual: torch.Tensor   # [M, N]
    weight: torch.Tensor     # [N]
    eps: float
    out: torch.Tensor
    res_out: torch.Tensor


def _launch(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, n: int, gated: bool,
            cfg: SkinnyConfig, tail: NormTail | None = None) -> None:
    M, K = x.shape
    assert M <= MAX_ROWS and x.stride(-1) == 1 and w.stride(-1) == 1 and w.shape[1] == K
    per_split = columns_per_split(K, cfg)
    w_desc = w
    if cfg.tma:
        require(tma_fits(w), "tma", True, "false for this weight: TMA needs a Hopper GPU "
                "(or the interpreter) and rows on 16-byte boundaries")
        w_desc = TensorDescriptor(w, list(w.shape), [w.stride(0), 1], [cfg.block_n, cfg.block_k])
    if tail is None:
        norm_args = (y, y, y, y, y, 0, 0, 0, 0.0)     # not read without NORM
    else:
        norm_args = (tail.residual, tail.weight, tail.out, tail.res_out,
                     arrival_counters(x.device, 1, "norm"), tail.residual.stride(0),
                     tail.out.stride(0), tail.res_out.stride(0), tail.eps)
    _skinny_kernel[cfg.grid(n)](x, w, w_desc, y, M, n, K, per_split, x.stride(0), w.stride(0),
                                y.stride(0), y.stride(1), *norm_args,
                                **kernel_constants(cfg, gated, w.dtype, n, tail is not None),
                                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                                **pdl_args(x.device))


def _parts_buffer(x: torch.Tensor, n: int, cfg: SkinnyConfig, dtype: torch.dtype) -> torch.Tensor:
    """The launch's output ``[S, M, n]``: fp32 partial sums with split-K, else ``dtype``."""
    return torch.empty((cfg.split_k, x.shape[0], n),
                       dtype=torch.float32 if cfg.split_k > 1 else dtype, device=x.device)


def skinny_linear(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None,
                  cfg: SkinnyConfig | None = None) -> torch.Tensor:
    """``x [M, K]`` (M <= 16), ``w [N, K]`` -> parts ``[S, M, N]`` (module docstring).
    An ``out_dtype`` (the logits' fp32) asks for the finished product: no split-K."""
    N = w.shape[0]
    cfg = cfg or launch_config(x, w, False, out_dtype is None)
    assert out_dtype is None or cfg.split_k == 1, "out_dtype asks for a finished product"
    y = _parts_buffer(x, N, cfg, out_dtype or w.dtype)
    _launch(x, w, y, N, False, cfg)
    return y


def skinny_linear_add_rms_norm(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor,
                               norm_weight: torch.Tensor, eps: float,
                               cfg: SkinnyConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = residual + x @ w^T`` and ``(rms_norm(s) * norm_weight, s)``, in one launch:
    what ``rms_norm(skinny_linear(x, w), norm_weight, eps, residual=residual)`` returns,
    rounded alike."""
    M, N = x.shape[0], w.shape[0]
    assert residual.shape == (M, N) and residual.stride(-1) == 1 and norm_weight.is_contiguous()
    cfg = cfg or launch_config(x, w, False, True)
    y = _parts_buffer(x, N, cfg, w.dtype)
    out = torch.empty((M, N), dtype=residual.dtype, device=x.device)
    res_out = torch.empty((M, N), dtype=residual.dtype, device=x.device)
    tail = NormTail(residual, norm_weight, eps, out, res_out)
    _launch(x, w, y, N, False, cfg, tail)
    return tail.out, tail.res_out


def skinny_gated(x: torch.Tensor, w: torch.Tensor,
                 cfg: SkinnyConfig | None = None) -> torch.Tensor:
    """``x [M, K]`` (M <= 16), ``w = [gate; up] [2I, K]`` -> ``silu(x g^T) * (x u^T)``
    ``[M, I]`` in the weight dtype."""
    assert w.shape[0] % 2 == 0
    n = w.shape[0] // 2
    cfg = cfg or launch_config(x, w, True, False)
    assert cfg.split_k == 1, "a gated product cannot split K"
    y = torch.empty((1, x.shape[0], n), dtype=w.dtype, device=x.device)
    _launch(x, w, y, n, True, cfg)
    return y[0]
