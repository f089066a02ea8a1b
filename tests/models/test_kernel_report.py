"""``scripts/kernel_report.py`` compiles the decode GEMM for Hopper on a machine without a
GPU, so a change that makes its weight tiles stop being pipelined copies, or makes a
launch spill, is caught here rather than in a GPU call."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kernel_report.py"
LAUNCHES = ("qkv", "o_proj", "gate_up", "down", "lm_head")


def _report(*args: str, size: str = "tiny", **knobs: str) -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPENINFER_") and k != "TRITON_INTERPRET"}
    env.update(knobs)
    out = subprocess.run([sys.executable, str(SCRIPT), "--size", size, *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
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


@pytest.mark.parametrize("args,named", [(["--rows", "17"], "--rows 17"),
                                        (["--size", "5b"], "'5b'"), (["--arch", "80"], "--arch 80")])
def test_an_input_the_report_cannot_take_is_refused_in_one_line(args, named):
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and named in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""                               # refused before the table starts
