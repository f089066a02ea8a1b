"""Token sampling: greedy, temperature, top-k and top-p, per row, from a passed-in generator.

Randomness only ever comes from the ``torch.Generator`` the caller hands in, so a run is
replayable from its seed and two engines never share hidden RNG state. The draw uses the
exponential-race trick (``argmax(p / E)``, ``E ~ Exp(1)``), which samples exactly from
``p`` without ``torch.multinomial``'s host sync; everything is per-row tensors so one call
serves a batch of requests with different parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from openinfer.errors import require
from openinfer.models.qwen3.batch import upload


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # <= 0: greedy
    top_k: int = 0            # <= 0: off
    top_p: float = 1.0        # 1.0: off

    def __post_init__(self) -> None:
        require(self.temperature >= 0, "temperature", self.temperature, "a float >= 0")
        require(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", self.top_k,
                "an int >= 0 (0 disables)")
        require(0 < self.top_p <= 1, "top_p", self.top_p, "a float in (0, 1]")


@dataclass
class SamplingTensors:
    temperature: torch.Tensor  # [B] fp32
    top_k: torch.Tensor        # [B] int64
    top_p: torch.Tensor        # [B] fp32

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams],
                    device: str | torch.device = "cpu") -> SamplingTensors:
        # through pinned memory: torch.tensor(..., device="cuda") would wait for the whole
        # forward queued on the stream before the step could even launch its sampling
        return cls(upload([p.temperature for p in params], torch.float32, device),
                   upload([p.top_k for p in params], torch.int64, device),
                   upload([p.top_p for p in params], torch.float32, device))


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


def filtered_logits(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Temperature-scaled logits with everything outside top-k / top-p set to -inf."""
    V = logits.shape[-1]
    temp = torch.where(st.temperature > 0, st.temperature, torch.ones_like(st.temperature))
    scaled = logits.float() / temp[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    k = torch.where(st.top_k > 0, st.top_k.clamp(max=V), torch.full_like(st.top_k, V))
    drop = torch.arange(V, device=logits.device)[None, :] >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    top_p = st.top_p[:, None]
    drop |= ((probs.cumsum(dim=-1) - probs) > top_p) & (top_p < 1)  # the top token stays
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)


def sample(logits: torch.Tensor, st: SamplingTensors,
           generator: torch.Generator) -> torch.Tensor:
    """Next token ids ``[B]``; rows with temperature <= 0 are greedy and draw nothing
    random of their own (the batch draws one noise tensor regardless of the mix)."""
    probs = filtered_logits(logits, st).softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    drawn = (probs / noise).argmax(dim=-1)
    return torch.where(st.temperature > 0, drawn, greedy(logits))
