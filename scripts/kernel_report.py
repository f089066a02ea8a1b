"""What the decode GEMM compiles to on Hopper, read on any machine (no GPU needed).

    python3 scripts/kernel_report.py [--size 4b] [--rows 1] [--arch 90]

Device time is scarce and a GPU run says how fast, not why. This compiles the skinny
decode GEMM (``kernels/skinny_linear.py``) for every projection of a model size, with the
launch that ``default_config`` picks under the current ``OPENINFER_SKINNY_*`` knobs, for
``sm_<arch>`` with Triton's own compiler and ptxas, and prints per launch: registers a
thread, shared memory a program, how many programs fit an SM by each, how many loads and
MMAs come between the PDL wait and the first asynchronous copy after it, and the memory
instructions in the PTX (``cp.async`` pipelined copies, TMA bulk copies, plain vector
loads taken into registers before the PDL wait). A launch that spills, or whose W tiles
stop being asynchronous copies, shows here before any GPU call.

Arguments are specialised as the JIT specialises them on a GPU (pointers and sizes that
are multiples of 16 marked so), which is what makes the loads vector loads; the weights'
addresses are assumed 16-byte aligned, as the model's are.
"""

from __future__ import annotations

import argparse
import collections
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
PTX_OPS = re.compile(r"\b(cp\.async\.bulk\.tensor|cp\.async\.cg|ld\.global\.v4|ld\.global\b"
                     r"|mma\.sync|wgmma|griddepcontrol\.wait)")


@dataclass
class LaunchReport:
    name: str
    grid: tuple[int, int]
    threads: int
    registers: int
    spill_bytes: int
    shared_bytes: int
    ops: dict[str, int]
    before_copy: int      # loads and MMAs between the PDL wait and the first async copy

    @property
    def programs_per_sm(self) -> int:
        """Programs an SM can hold, by registers and by shared memory (the lesser)."""
        by_regs = REGISTERS_PER_SM // max(1, self.registers * self.threads)
        by_smem = SHARED_PER_SM // max(1, self.shared_bytes)
        return min(by_regs, by_smem)


def projections(size: str) -> dict[str, tuple[int, int, bool, bool]]:
    """name -> (N, K, gated, may_split) of a decode step's GEMMs, as ops.py launches them."""
    from openinfer.models.qwen3.config import preset
    c = preset(size)
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    return dict(qkv=(qkv, c.hidden_size, False, True),
                o_proj=(c.hidden_size, c.q_size, False, True),
                gate_up=(c.intermediate_size, c.hidden_size, True, False),
                down=(c.hidden_size, c.intermediate_size, False, True),
                lm_head=(c.vocab_size, c.hidden_size, False, False))


def compile_launch(name: str, n: int, k: int, gated: bool, may_split: bool, rows: int,
                   arch: int, sms: int = 132) -> LaunchReport:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import torch

    from openinfer.models.qwen3.kernels import skinny_linear as _  # noqa: F401
    S = sys.modules["openinfer.models.qwen3.kernels.skinny_linear"]
    cfg = S.default_config(n, k, gated, may_split, sms, m=rows, tma=bool(S.TMA))
    fn = S._skinny_kernel
    split = cfg.split_k > 1
    out_ty = "*fp32" if split or name == "lm_head" else "*bf16"
    desc = f"tensordesc<bf16[{cfg.block_n}, {cfg.block_k}]>" if cfg.tma else "*bf16"
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "w_desc": desc, "y_ptr": out_ty,
                 "M": "i32", "N": "i32", "K": "i32", "k_per_split": "i32", "s_xm": "i32",
                 "s_wn": "i32", "s_ys": "i32", "s_ym": "i32"}
    per_split = S.columns_per_split(k, cfg)
    values = dict(M=rows, N=n, K=k, k_per_split=per_split, s_xm=k, s_wn=k, s_ys=rows * n,
                  s_ym=n)
    constants = dict(S.kernel_constants(cfg, gated, torch.bfloat16), PDL=True)
    if rows == 1:                   # the JIT makes an int argument equal to 1 a constant
        signature["M"] = "constexpr"
        constants["M"] = 1
    aligned = ["x_ptr", "w_ptr", "y_ptr"] + ([] if cfg.tma else ["w_desc"])
    aligned += [a for a, v in values.items() if a in signature and signature[a] == "i32"
                and v % 16 == 0]
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    signature.update({c: "constexpr" for c in constants})
    src = ASTSource(fn=fn, signature=signature, attrs=attrs,
                    constexprs={(fn.arg_names.index(c),): v for c, v in constants.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                                         launch_pdl=True))
    ptx = kernel.asm["ptx"]
    registers, spill = _ptxas_usage(ptx, arch)
    sequence = [m.group(1) for m in PTX_OPS.finditer(ptx)]
    ops = dict(sorted(collections.Counter(sequence).items()))
    return LaunchReport(name, cfg.grid(n), 32 * cfg.num_warps, registers, spill,
                        kernel.metadata.shared, ops, ops_before_first_copy(sequence))


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
    ap.add_argument("--rows", type=int, default=1, help="decode batch (1..16)")
    ap.add_argument("--arch", type=int, default=90,
                    help="compute capability: 90 (Hopper, whose per-SM limits fit/SM uses)")
    a = ap.parse_args(argv)
    if not 1 <= a.rows <= 16:
        ap.error(f"--rows {a.rows}: the skinny GEMM takes 1..16 rows")
    if a.arch != 90:
        ap.error(f"--arch {a.arch}: the report compiles the Hopper launch (the PDL wait, TMA "
                 "and Hopper's per-SM limits); use 90")
    from openinfer.models.qwen3.kernels._tuning import knobs_set
    knobs = knobs_set("OPENINFER_SKINNY")
    print(f"skinny GEMM, {a.size}, batch {a.rows}, sm_{a.arch}; knobs: {knobs or 'defaults'}")
    print(f"{'launch':8} {'grid':>10} {'regs':>5} {'spill':>5} {'smem KB':>8} {'fit/SM':>6} "
          f"{'wait>copy':>9}  ops")
    for name, (n, k, gated, may_split) in projections(a.size).items():
        r = compile_launch(name, n, k, gated, may_split, a.rows, a.arch)
        grid = f"{r.grid[0]}x{r.grid[1]}"
        print(f"{name:8} {grid:>10} {r.registers:>5} {r.spill_bytes:>5} "
              f"{r.shared_bytes / 1024:>8.1f} {r.programs_per_sm:>6} {r.before_copy:>9}  {r.ops}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
