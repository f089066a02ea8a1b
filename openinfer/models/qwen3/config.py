"""Qwen3 geometry, read from (and written as) a Hugging Face ``config.json``.

One frozen record so every other module (weights, arena, kernels) derives its shapes from
the same validated numbers. Validation raises :class:`~openinfer.errors.ConfigError`
naming the field and the accepted range, because a bad geometry otherwise surfaces much
later as an opaque shape mismatch deep inside a matmul or a kernel.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from openinfer.errors import ConfigError, require

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Qwen3Config:
    """The fields of an HF Qwen3 config that change the computation."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "vocab_size",
                     "max_position_embeddings"):
            v = getattr(self, name)
            require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, v,
                    "an int >= 1")
        require(isinstance(self.head_dim, int) and 2 <= self.head_dim <= 512
                and self.head_dim % 2 == 0, "head_dim", self.head_dim,
                "an even int in [2, 512] (RoPE rotates pairs)")
        require(self.num_attention_heads % self.num_key_value_heads == 0,
                "num_key_value_heads", self.num_key_value_heads,
                f"a divisor of num_attention_heads={self.num_attention_heads} (GQA)")
        require(isinstance(self.rms_norm_eps, (int, float)) and 0 < self.rms_norm_eps <= 0.1,
                "rms_norm_eps", self.rms_norm_eps, "a float in (0, 0.1]")
        require(isinstance(self.rope_theta, (int, float)) and self.rope_theta > 1,
                "rope_theta", self.rope_theta, "a float > 1")
        require(isinstance(self.tie_word_embeddings, bool), "tie_word_embeddings",
                self.tie_word_embeddings, "true or false")
        require(self.torch_dtype in DTYPES, "torch_dtype", self.torch_dtype,
                f"one of {sorted(DTYPES)}")

    # -- derived sizes ----------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.torch_dtype]

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def num_kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * i
        layer += 2 * h + 2 * self.head_dim
        return v * h * (1 if self.tie_word_embeddings else 2) + h + self.num_hidden_layers * layer

    # -- HF config.json -----------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> Qwen3Config:
        """Accepts both the transformers 4.x layout (``rope_theta``, ``torch_dtype``) and
        the 5.x one (``rope_parameters``, ``dtype``); rejects features this model lacks."""
        _reject_unsupported(d)
        rope = d.get("rope_parameters") or {}
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "vocab_size") if k not in d]
        if missing:
            raise ConfigError(missing[0], None, "present in config.json")
        heads = d["num_attention_heads"]
        return cls(
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            vocab_size=d["vocab_size"],
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=d.get("rope_theta", rope.get("rope_theta", 1_000_000.0)),
            max_position_embeddings=d.get("max_position_embeddings", 40960),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "bfloat16"),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> Qwen3Config:
        """Read ``path`` (a config.json, or a checkpoint directory holding one)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        return cls.from_hf_dict(json.loads(p.read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF Qwen3 layout, as the released checkpoints ship it."""
        d: dict[str, Any] = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
        d.update(asdict(self))
        d.update(hidden_act="silu", attention_bias=False, attention_dropout=0.0,
                 rope_scaling=None, use_sliding_window=False, sliding_window=None,
                 max_window_layers=self.num_hidden_layers, use_cache=True,
                 initializer_range=0.02)
        if self.vocab_size > 151645:
            d.update(bos_token_id=151643, eos_token_id=151645)
        return d


def _reject_unsupported(d: dict[str, Any]) -> None:
    if d.get("model_type", "qwen3") != "qwen3":
        raise ConfigError("model_type", d.get("model_type"), "'qwen3'")
    if d.get("hidden_act", "silu") != "silu":
        raise ConfigError("hidden_act", d.get("hidden_act"), "'silu'")
    if d.get("attention_bias", False):
        raise ConfigError("attention_bias", d["attention_bias"], "false")
    if d.get("use_sliding_window", False):
        raise ConfigError("use_sliding_window", d["use_sliding_window"], "false")
    for key in ("rope_scaling", "rope_parameters"):
        rope = d.get(key) or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise ConfigError(f"{key}.rope_type", kind, "'default' (no RoPE scaling)")


_BASE = dict(vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
             max_position_embeddings=40960, head_dim=128, num_key_value_heads=8)

PRESETS: dict[str, Qwen3Config] = {
    "tiny": Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        vocab_size=256, tie_word_embeddings=True),
    "0.6b": Qwen3Config(**_BASE, hidden_size=1024, intermediate_size=3072,
                        num_hidden_layers=28, num_attention_heads=16,
                        tie_word_embeddings=True),
    "1.7b": Qwen3Config(**_BASE, hidden_size=2048, intermediate_size=6144,
                        num_hidden_layers=28, num_attention_heads=16,
                        tie_word_embeddings=True),
    "4b": Qwen3Config(**_BASE, hidden_size=2560, intermediate_size=9728,
                      num_hidden_layers=36, num_attention_heads=32,
                      tie_word_embeddings=True),
    "8b": Qwen3Config(**_BASE, hidden_size=4096, intermediate_size=12288,
                      num_hidden_layers=36, num_attention_heads=32,
                      tie_word_embeddings=False),
}


def preset(size: str, **overrides: Any) -> Qwen3Config:
    """The geometry of a released Qwen3 size (or ``tiny`` for tests), optionally tweaked."""
    require(size in PRESETS, "size", size, f"one of {list(PRESETS)}")
    return replace(PRESETS[size], **overrides)
