"""Fixtures for the real-backend tests: a tiny random Qwen3 on the CPU, reference backend.

The backend tests exercise the real executor and transfer code paths without a GPU; the
model is float32 so served tokens can be compared with direct greedy generation exactly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # backend_helpers

from openinfer.models.qwen3 import Qwen3Model, preset, write_random_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    return write_random_checkpoint(preset("tiny"), tmp_path_factory.mktemp("tiny_backend"), seed=0,
                                   dtype="float32")


@pytest.fixture(scope="session")
def tiny_model(tiny_ckpt) -> Qwen3Model:
    return Qwen3Model.from_pretrained(tiny_ckpt, device="cpu", backend="reference")

