"""``scripts/kernel_report.py`` compiles the decode GEMM and attention for Hopper on a
machine without a GPU, so a change that makes the GEMM's weight tiles stop being pipelined
copies, makes a launch spill, or takes the attention to a second wave of programs, is
caught here rather than in a GPU call."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kernel_report.py"
LAUNCHES = ("qkv", "o_proj", "gate_up", "down", "lm_head")


def _run(*args: str, size: str = "tiny", **knobs: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPENINFER_") and k != "TRITON_INTERPRET"}
    env.update(knobs)
    out = subprocess.run([sys.executable, str(SCRIPT), "--size", size, *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _attention(stdout: str) -> dict[str, dict]:
    """The decode attention table: kernel -> grid, threads, registers, spill, fit, waves."""
    rows = {}
    for line in stdout[stdout.index("decode attention"):].splitlines():
        m = re.match(r"(split|reduce)\s+([\dx]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+[\d.]+\s+(\d+)"
                     r"\s+(\d+)$", line)
        if m:
            rows[m[1]] = dict(grid=tuple(map(int, m[2].split("x"))), threads=int(m[3]),
                              registers=int(m[4]), spill=int(m[5]), fit=int(m[6]),
                              waves=int(m[7]))
    return rows


def _report(*args: str, size: str = "tiny", **knobs: str) -> dict[str, dict]:
    return _gemms(_run(*args, size=size, **knobs))


def _gemms(stdout: str) -> dict[str, dict]:
    """The GEMM table: launch -> registers, spill, shared KB, fit, wait>copy, ops."""
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"(\w+)\s+(\d+)x(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+(\d+)"
                     r"\s+(\{.*\})$", line)
        if m:
            rows[m[1]] = dict(registers=int(m[4]), spill=int(m[5]), shared_kb=float(m[6]),
                              fit=int(m[7]), before_copy=int(m[8]), ops=ast.literal_eval(m[9]))
    return rows


@pytest.mark.parametrize("size,rows", [("tiny", "1"), ("tiny", "8"), ("4b", "1"), ("4b", "8")])
def test_every_decode_gemm_pipelines_its_weights_without_spilling(size, rows):
    """The 4B's launches too: split K, balanced rows and the LM head's wide tiles. Its LM
    head at batch 8 (three 64 x 256 tiles held in registers before the wait) spills 96
    bytes, the one known spill; its cost is not measured."""
    report = _report("--rows", rows, size=size)
    assert set(report) == set(LAUNCHES)
    for name, r in report.items():
        known = (size, rows, name) == ("4b", "8", "lm_head")
        assert r["spill"] == (96 if known else 0), name
        assert r["ops"].get("cp.async.cg", 0) > 0, name          # W streamed by async copies
        assert r["ops"].get("griddepcontrol.wait") == 1, name   # one PDL wait a program
        assert r["fit"] >= 2, name           # two programs an SM: the step's one wave fits


def test_the_tma_knob_turns_weight_tiles_into_bulk_copies():
    plain, tma = _report(), _report(OPENINFER_SKINNY_TMA="1")
    for name in LAUNCHES:
        assert "cp.async.bulk.tensor" not in plain[name]["ops"]
        assert tma[name]["ops"].get("cp.async.bulk.tensor", 0) > 0, name


def test_wait_to_copy_counts_the_pre_wait_products():
    """The wait>copy column counts what a program does between the PDL wait and its first
    async copy: the x reads and the products of the tiles read before the wait, 20 PTX
    loads and MMAs a tile in a 4B's batch-1 plain GEMMs (OPENINFER_SKINNY_PRE=1; the
    default 3 makes 60), not everything after the wait."""
    three = _report("--rows", "1", size="4b")
    one = _report("--rows", "1", size="4b", OPENINFER_SKINNY_PRE="1")
    for name in ("qkv", "o_proj", "down"):
        assert (one[name]["before_copy"], three[name]["before_copy"]) == (20, 60), name


def test_the_attention_table_shows_the_launches_a_decode_step_makes():
    """The 4B at batch 1 over a 4k graph: 8 kv heads x 33 splits, from the QKV parts (8
    warps), the splits merged by the last program of each kv head (no reduce launch, the
    default since 12-07); with the merge unfused, a reduce kernel over the 32 query heads.
    Each runs in one wave without spilling. Batch 64 has one split and no reduce, and above
    16 rows the GEMM table says cuBLAS runs the projections."""
    fused = _attention(_run("--rows", "1", size="4b"))
    assert set(fused) == {"split"}
    assert fused["split"]["grid"] == (1, 8, 33) and fused["split"]["threads"] == 256
    unfused = _attention(_run("--rows", "1", size="4b", OPENINFER_DECODE_FUSED_REDUCE_SPLITS="0"))
    assert unfused["split"]["grid"] == (1, 8, 33) and unfused["reduce"]["grid"] == (1, 32)
    for r in (*fused.values(), *unfused.values()):
        assert r["spill"] == 0 and r["waves"] == 1
    wide = _run("--rows", "64", size="4b")
    assert "cuBLAS" in wide and _gemms(wide) == {}
    assert set(_attention(wide)) == {"split"} and _attention(wide)["split"]["grid"] == (64, 8, 1)


def test_waves_follow_what_an_sm_holds():
    """The 12-04 form (wait first, 64-token tiles) at batch 32: more registers a thread,
    fewer programs an SM, and the grid of 512 takes a second wave."""
    today = _attention(_run("--rows", "32", size="4b"))["split"]
    old = _attention(_run("--rows", "32", size="4b",
                          OPENINFER_DECODE_WAIT_FIRST_ROWS="32"))["split"]
    assert today["grid"] == old["grid"] == (32, 8, 2)
    assert old["registers"] > today["registers"] and old["fit"] < today["fit"]
    for r in (today, old):
        assert r["waves"] == -(-512 // (r["fit"] * 132))
    assert (today["waves"], old["waves"]) == (1, 2)


@pytest.mark.parametrize("args,named", [(["--rows", "257"], "--rows 257"),
                                        (["--context", "0"], "--context 0"),
                                        (["--size", "5b"], "'5b'"),
                                        (["--arch", "80"], "--arch 80")])
def test_an_input_the_report_cannot_take_is_refused_in_one_line(args, named):
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and named in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""                               # refused before the table starts


@pytest.mark.parametrize("rows", ["1", "2"])
def test_the_fused_merge_keeps_the_split_kernel_in_one_wave(rows):
    """The fused merge holds a chunk of heads' partials in registers (``merge_chunk``): a
    4B's split kernel must still not spill and must still run as one wave of programs, at
    batch 1 (4 heads at once) and batch 2 (where 4 at once took two waves)."""
    stdout = _run("--rows", rows, size="4b", OPENINFER_DECODE_FUSED_REDUCE_SPLITS="64")
    table = _attention(stdout)
    assert "reduce" not in table
    assert table["split"]["spill"] == 0 and table["split"]["waves"] == 1


def test_a_vector_load_is_one_kind_whatever_its_cache_hint(monkeypatch):
    """The fused tails read other programs' stores through L2 (``ld.global.cg.v4``); those
    are vector loads like any other, not scalar ones, and so are loads with other cache or
    eviction qualifiers."""
    # the script pops TRITON_INTERPRET when imported; the monkeypatch puts it back after
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "0"))
    spec = importlib.util.spec_from_file_location("kernel_report_under_test", SCRIPT)
    report = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, report)     # its dataclasses look it up
    spec.loader.exec_module(report)
    ptx = """
        griddepcontrol.wait;
        ld.global.cg.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
        ld.global.v4.b32 { %r5, %r6, %r7, %r8 }, [ %rd2 + 0 ];
        ld.global.cg.b32 %r9, [ %rd3 + 0 ];
        ld.global.b16 %rs1, [ %rd4 + 0 ];
        ld.global.L1::evict_last.v4.b32 { %r12, %r13, %r14, %r15 }, [ %rd6 + 0 ];
        ld.global.nc.v4.b32 { %r16, %r17, %r18, %r19 }, [ %rd7 + 0 ];
        ld.global.v2.b32 { %r20, %r21 }, [ %rd8 + 0 ];
        cp.async.cg.shared.global [ %r10 + 0 ], [ %rd5 + 0 ], 0x10, %r11;
    """
    assert report.ptx_ops(ptx) == ["griddepcontrol.wait", "ld.global.v4", "ld.global.v4",
                                   "ld.global", "ld.global", "ld.global.v4", "ld.global.v4",
                                   "ld.global.v2", "cp.async.cg"]
    assert report.ops_before_first_copy(report.ptx_ops(ptx)) == 7
