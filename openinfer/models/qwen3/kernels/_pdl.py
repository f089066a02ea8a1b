"""Programmatic dependent launch (PDL, Hopper+): let the next kernel start while this ends.

A decode step is ~330 small kernels, each a few microseconds, so the launch and ramp of
every kernel is a visible share of the step. Launched with PDL, a kernel may be scheduled
while its predecessor still runs; it must then call ``pdl_wait`` before it touches any
memory an earlier kernel writes or reads (everything but the weights, which no kernel of a
step writes). ``pdl_wait`` waits for the predecessor's completion and memory flush (and so,
transitively, for every earlier kernel), then lets the successor launch: the look-ahead is
one kernel. Off under the interpreter, on pre-Hopper GPUs, and with ``OPENINFER_PDL=0``.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch
import triton
import triton.language as tl

from openinfer.models.qwen3.kernels._interpret import INTERPRET


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@lru_cache(maxsize=None)
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def hopper_or_later(device: torch.device) -> bool:
    """A CUDA device of compute capability 9 or more (PDL, TMA)."""
    if device.type != "cuda":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def pdl_enabled(device: torch.device) -> bool:
    if INTERPRET or os.environ.get("OPENINFER_PDL", "1") == "0":
        return False
    return hopper_or_later(device)


def pdl_args(device: torch.device) -> dict:
    """Keyword arguments of a launch: the kernel's ``PDL`` constexpr and the launch flag."""
    on = pdl_enabled(device)
    return dict(PDL=on, launch_pdl=True) if on else dict(PDL=False)
