"""Shared scaffolding of the real-backend tests: the direct-generation oracle and a small
CPU instance."""

from __future__ import annotations

from typing import Any

import torch

from openinfer.backend.instance import RealConfig, RealInstance, build_real_instance
from openinfer.models.qwen3 import Qwen3Model, SeqInput
from openinfer.runtime import Runtime, SimRuntime

BS = 4


def greedy_direct(model: Qwen3Model, prompt: list[int], n: int, block_size: int = BS
                  ) -> tuple[list[int], torch.Tensor]:
    """Greedy generation straight on the model (own arena, no scheduler): the oracle.
    Returns the tokens and the logits that produced the first one."""
    pages = -(-(len(prompt) + n) // block_size) + 1
    arena = model.make_arena(pages + 1, block_size)
    table = list(range(1, pages + 1))
    logits = model([SeqInput(prompt, 0, table)], arena)
    first = logits[0].clone()
    toks = [int(logits[0].argmax())]
    for i in range(n - 1):
        logits = model([SeqInput([toks[-1]], len(prompt) + i, table)], arena)
        toks.append(int(logits[0].argmax()))
    return toks, first


def cold_logits(model: Qwen3Model, prompt: list[int], block_size: int = BS) -> torch.Tensor:
    """Logits of the last prompt token computed from scratch on a fresh arena."""
    pages = -(-len(prompt) // block_size)
    arena = model.make_arena(pages + 1, block_size)
    return model([SeqInput(prompt, 0, list(range(1, pages + 1)))], arena)[0]


def cpu_instance(model: Qwen3Model, rt: Runtime | None = None, **overrides: Any) -> RealInstance:
    base: dict[str, Any] = dict(device="cpu", num_blocks=96, block_size=BS, host_slots=64,
                                max_context_tokens=256, max_prefill_tokens=64, max_decode_batch=16)
    base.update(overrides)
    return build_real_instance(model, RealConfig(**base), rt=rt or SimRuntime(0))


def prompt(seed: int, n: int, vocab: int = 256) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()
