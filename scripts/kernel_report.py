"""What the decode GEMM and attention compile to on Hopper, read on any machine (no GPU needed).

    python3 scripts/kernel_report.py [--size 4b] [--rows 1] [--context 4096] [--arch 90]

Device time is scarce and a GPU run says how fast, not why. This compiles the skinny
decode GEMM (``kernels/skinny_linear.py``) for every projection of a model size, as the
launch ``skinny_linear`` / ``skinny_gated`` make under the current ``OPENINFER_SKINNY_*``
knobs, for ``sm_<arch>`` with Triton's own compiler and ptxas, and prints per launch:
registers a thread, shared memory a program, how many programs fit an SM by each, how
many loads and MMAs come between the PDL wait and the first asynchronous copy after it,
and the memory instructions in the PTX (``cp.async`` pipelined copies, TMA bulk copies,
global loads into registers by vector width whatever their cache qualifiers: the tiles
read before the PDL wait, and a fused tail's reads of other programs' stores). A launch
that spills, or whose W tiles stop being asynchronous copies, shows here before any GPU
call.

A second table does the same for the decode attention's launches (``kernels/
decode_attention.py``) at that batch over a graph captured for ``--context`` tokens, as
the bench's is: the split kernel and the reduce kernel, with the programs an SM holds and
the waves the grid takes on 132 SMs.

Both tables record their launches by calling the kernels' own Python entry points on meta
tensors shaped like the model's (132 SMs; weights that fit TMA, as on Hopper), so grids,
configs and arguments are the launch's own, and specialise every argument with the JIT's
own routine (pointers and sizes that are multiples of 16 marked so, an int equal to 1 made
a constant), which is what makes the loads vector loads; the weights' and arena's
addresses are taken as 16-byte aligned, as the model's are.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)      # compile for the GPU, not the interpreter
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REGISTERS_PER_SM = 65536
SHARED_PER_SM = 228 * 1024
THREADS_PER_SM = 2048
PROGRAMS_PER_SM = 32
PTX_OPS = re.compile(r"\b(cp\.async\.bulk\.tensor|cp\.async\.cg|ld\.global(?:\.[\w:]+)*"
                     r"|mma\.sync|wgmma|griddepcontrol\.wait)")
_VECTOR = re.compile(r"\.v[248]\b")


@dataclass
class LaunchReport:
    name: str
    grid: tuple[int, ...]
    threads: int
    registers: int
    spill_bytes: int
    shared_bytes: int
    ops: dict[str, int]   # memory and MMA instructions in the PTX, by kind
    before_copy: int      # loads and MMAs between the PDL wait and the first async copy

    @property
    def programs_per_sm(self) -> int:
        """Programs an SM can hold, by registers, shared memory and threads (the least)."""
        by_regs = REGISTERS_PER_SM // max(1, self.registers * self.threads)
        by_smem = SHARED_PER_SM // max(1, self.shared_bytes)
        by_threads = THREADS_PER_SM // self.threads
        return min(by_regs, by_smem, by_threads, PROGRAMS_PER_SM)

    def waves(self, sms: int) -> int:
        """Rounds of programs the grid takes when every SM holds ``programs_per_sm``."""
        return math.ceil(math.prod(self.grid) / max(1, self.programs_per_sm * sms))


@dataclass
class RecordedLaunch:
    name: str
    kernel: object           # the @triton.jit function
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def patched(module, **attrs):
    """Within: ``module``'s ``attrs`` set to the given values, restored on the way out
    (an exception included)."""
    saved = {attr: getattr(module, attr) for attr in attrs}
    try:
        for attr, value in attrs.items():
            setattr(module, attr, value)
        yield
    finally:
        for attr, value in saved.items():
            setattr(module, attr, value)


@contextlib.contextmanager
def recording(module, kernels: dict[str, str]):
    """Within: each ``module.<attr>[grid](...)`` launch of ``kernels`` (name -> attribute)
    is recorded, not run, with the PDL wait on as on Hopper; yields the list it fills."""
    launches: list[RecordedLaunch] = []

    class Recorder:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kw):
                launches.append(RecordedLaunch(self.name, self.kernel, tuple(grid), args,
                                               dict(kw, PDL=True)))
            return launch

    recorders = {attr: Recorder(name, getattr(module, attr)) for name, attr in kernels.items()}
    with patched(module, **recorders):
        yield launches


def gemm_launches(size: str, rows: int) -> list[RecordedLaunch]:
    """The decode GEMM launches of a step at ``rows`` rows, named by projection, recorded
    on meta tensors from ``skinny_linear`` / ``skinny_gated`` as ``ops.py`` calls them, so
    their configs, grids and arguments are the launch's own (132 SMs; the weights taken to
    fit TMA, as the model's do on Hopper)."""
    import torch

    from openinfer.models.qwen3.config import preset
    from openinfer.models.qwen3.kernels import skinny_linear as _  # noqa: F401
    S = sys.modules["openinfer.models.qwen3.kernels.skinny_linear"]
    c, meta, bf16 = preset(size), torch.device("meta"), torch.bfloat16

    def t(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=bf16, device=meta)

    h, i = c.hidden_size, c.intermediate_size
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    def then_norm(x: torch.Tensor, w: torch.Tensor) -> object:
        """o_proj / down_proj as the model launches them: with the add + RMSNorm in the
        GEMM's tail where OPENINFER_SKINNY_FUSED_NORM_ROWS covers the batch."""
        if S.norm_in_tail(rows):
            return S.skinny_linear_add_rms_norm(x, w, t(rows, h), t(h), 1e-6)
        return S.skinny_linear(x, w)

    calls = dict(qkv=lambda: S.skinny_linear(t(rows, h), t(qkv, h)),
                 o_proj=lambda: then_norm(t(rows, c.q_size), t(h, c.q_size)),
                 gate_up=lambda: S.skinny_gated(t(rows, h), t(2 * i, h)),
                 down=lambda: then_norm(t(rows, i), t(h, i)),
                 lm_head=lambda: S.skinny_linear(t(rows, h), t(c.vocab_size, h),
                                                 out_dtype=torch.float32))
    launches = []
    with patched(S, tma_fits=lambda w: True):
        for name, call in calls.items():
            with recording(S, {name: "_skinny_kernel"}) as got:
                call()
            launches += got
    return launches


def compile_launch(launch: RecordedLaunch, arch: int) -> LaunchReport:
    compiled = compile_recorded(launch.kernel, launch.args, launch.kwargs, arch)
    ptx = compiled.asm["ptx"]
    registers, spill = _ptxas_usage(ptx, arch)
    sequence = ptx_ops(ptx)
    ops = dict(sorted(collections.Counter(sequence).items()))
    return LaunchReport(launch.name, launch.grid, 32 * compiled.metadata.num_warps, registers,
                        spill, compiled.metadata.shared, ops, ops_before_first_copy(sequence))


def ptx_ops(ptx: str) -> list[str]:
    """The ops of ``PTX_OPS`` in program order. A global load is ``ld.global`` or
    ``ld.global.v2`` / ``.v4`` / ``.v8`` by its width alone: its cache and eviction
    qualifiers (``.cg`` for the fused tails' reads through L2, ``.L1::evict_last``, ``.nc``)
    do not make it another kind."""
    ops = []
    for m in PTX_OPS.finditer(ptx):
        op = m.group(1)
        if op.startswith("ld.global"):
            width = _VECTOR.search(op)
            op = "ld.global" + (width.group(0) if width else "")
        ops.append(op)
    return ops


def compile_recorded(fn, args: tuple, kwargs: dict, arch: int):
    """Compile ``fn`` for ``sm_<arch>`` as a launch with these arguments would: each
    argument specialised by the JIT's own routine (pinned triton 3.6.0; on meta tensors,
    whose address is 0, every pointer counts as 16-byte aligned), constexprs as given;
    keywords that are not parameters (``num_warps``, ``maxnreg``) are compile options, and
    the launch is a PDL launch."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    values = dict(zip(fn.arg_names, args))
    values.update({k: v for k, v in kwargs.items() if k in fn.arg_names})
    options = {k: v for k, v in kwargs.items() if k not in fn.arg_names and k != "launch_pdl"}
    constexpr_names = {fn.arg_names[p.num] for p in fn.params if p.is_constexpr}
    signature, constants, aligned = {}, {}, []
    for name in fn.arg_names:
        if name in constexpr_names:
            signature[name], constants[name] = "constexpr", values[name]
            continue
        kind, spec = native_specialize_impl(BaseBackend, values[name], False, True, True)
        if kind == "constexpr":                  # an int equal to 1
            signature[name], constants[name] = "constexpr", spec
        else:
            signature[name] = kind
            if spec == "D":                      # divisible by 16
                aligned.append(name)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn=fn, signature=signature, attrs=attrs,
                    constexprs={(fn.arg_names.index(c),): v for c, v in constants.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(options, launch_pdl=True))


def attention_launches(size: str, rows: int, context: int) -> list[RecordedLaunch]:
    """Each launch a decode attention of ``rows`` rows makes (the model's batch-1 form takes
    the QKV projection's parts), recorded on meta tensors, with the PDL wait on as on
    Hopper."""
    import torch

    from openinfer.models.qwen3.config import preset
    from openinfer.models.qwen3.kernels import decode_attention as _  # noqa: F401
    from openinfer.models.qwen3.kv_arena import KVArena
    A = sys.modules["openinfer.models.qwen3.kernels.decode_attention"]
    c, page, meta = preset(size), 16, torch.device("meta")
    pages = -(-(context + 1) // page)
    arena = KVArena.allocate(rows * pages + 1, c.num_hidden_layers, page,
                             c.num_key_value_heads, c.head_dim, torch.bfloat16, meta)
    tables = torch.empty(rows, pages, dtype=torch.int32, device=meta)
    lens = torch.empty(rows, dtype=torch.int32, device=meta)
    hq, d = c.num_attention_heads, c.head_dim
    if rows <= A.FROM_QKV_ROWS and A.can_take_qkv(d):
        width = (hq + 2 * c.num_key_value_heads) * d
        vec = torch.empty(d, dtype=torch.bfloat16, device=meta)
        table = torch.empty(context + 1, d, dtype=torch.bfloat16, device=meta)
        positions = torch.empty(rows, dtype=torch.int64, device=meta)    # and slots
        q = A.QKVParts(torch.empty(1, rows, width, dtype=torch.bfloat16, device=meta), hq,
                       vec, vec, table, table, positions, positions, c.rms_norm_eps)
    else:
        q = torch.empty(rows, hq, d, dtype=torch.bfloat16, device=meta)
    kernels = dict(split="_decode_split_kernel", reduce="_decode_reduce_kernel")
    with recording(A, kernels) as launches:
        A.decode_attention(q, arena.k(0), arena.v(0), tables, lens, d ** -0.5)
    return launches


def compile_attention(size: str, rows: int, context: int, arch: int) -> list[LaunchReport]:
    return [compile_launch(launch, arch) for launch in attention_launches(size, rows, context)]


def ops_before_first_copy(sequence: list[str]) -> int:
    """Loads and MMAs a program issues after ``griddepcontrol.wait`` before its first
    asynchronous copy (the loop's x or W tiles, ``cp.async`` or a TMA bulk copy), in PTX
    order: until then HBM has nothing new of this program's in flight, so each is latency
    at the kernel boundary."""
    after = sequence[sequence.index("griddepcontrol.wait") + 1:]
    copies = [i for i, op in enumerate(after) if op.startswith("cp.async")]
    return copies[0] if copies else len(after)


def _ptxas_usage(ptx: str, arch: int) -> tuple[int, int]:
    """Registers a thread and spill bytes, from the ptxas that Triton ships."""
    from triton.backends.nvidia.compiler import get_ptxas
    ptxas = get_ptxas(arch).path
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        info = subprocess.run([ptxas, f"-arch=sm_{arch}{suffix}", "-v", str(src), "-o",
                               str(Path(tmp) / "k.cubin")], capture_output=True, text=True,
                              check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", info).group(1))
    spill = sum(int(b) for b in re.findall(r"(\d+) bytes spill (?:stores|loads)", info))
    return registers, spill


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from openinfer.models.qwen3.config import PRESETS
    ap.add_argument("--size", default="4b", choices=list(PRESETS), help="a model preset")
    ap.add_argument("--rows", type=int, default=1,
                    help="decode batch (1..256; the GEMM table only up to 16)")
    ap.add_argument("--context", type=int, default=4096,
                    help="tokens the attention's graph is captured for (its split count)")
    ap.add_argument("--arch", type=int, default=90,
                    help="compute capability: 90 (Hopper, whose per-SM limits fit/SM uses)")
    a = ap.parse_args(argv)
    if not 1 <= a.rows <= 256:
        ap.error(f"--rows {a.rows}: a decode batch is 1..256 rows (the largest graph bucket)")
    if a.context < 1:
        ap.error(f"--context {a.context}: a decode step needs at least 1 cached token")
    if a.arch != 90:
        ap.error(f"--arch {a.arch}: the report compiles the Hopper launch (the PDL wait, TMA "
                 "and Hopper's per-SM limits); use 90")
    from openinfer.models.qwen3.kernels._tuning import knobs_set
    from openinfer.models.qwen3.kernels.skinny_linear import MAX_ROWS
    knobs = knobs_set("OPENINFER_SKINNY")
    print(f"skinny GEMM, {a.size}, batch {a.rows}, sm_{a.arch}; knobs: {knobs or 'defaults'}")
    if a.rows > MAX_ROWS:
        print(f"(above {MAX_ROWS} rows the projections run cuBLAS: nothing to compile here)")
    else:
        print(f"{'launch':8} {'grid':>10} {'regs':>5} {'spill':>5} {'smem KB':>8} "
              f"{'fit/SM':>6} {'wait>copy':>9}  ops")
        for launch in gemm_launches(a.size, a.rows):
            r = compile_launch(launch, a.arch)
            grid = f"{r.grid[0]}x{r.grid[1]}"
            print(f"{r.name:8} {grid:>10} {r.registers:>5} {r.spill_bytes:>5} "
                  f"{r.shared_bytes / 1024:>8.1f} {r.programs_per_sm:>6} {r.before_copy:>9}  "
                  f"{r.ops}")
    sms = 132                                   # an H100 SXM's and an H200's
    attention_knobs = knobs_set("OPENINFER_DECODE")
    print(f"\ndecode attention, {a.size}, batch {a.rows}, graph for {a.context} tokens, "
          f"sm_{a.arch}, {sms} SMs; knobs: {attention_knobs or 'defaults'}")
    print(f"{'kernel':8} {'grid':>10} {'thr':>4} {'regs':>5} {'spill':>5} {'smem KB':>8} "
          f"{'fit/SM':>6} {'waves':>5}")
    for r in compile_attention(a.size, a.rows, a.context, a.arch):
        grid = "x".join(map(str, r.grid))
        print(f"{r.name:8} {grid:>10} {r.threads:>4} {r.registers:>5} {r.spill_bytes:>5} "
              f"{r.shared_bytes / 1024:>8.1f} {r.programs_per_sm:>6} {r.waves(sms):>5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
