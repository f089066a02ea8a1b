"""The shape of a dense decoder, as far as step time and KV size care.

Read from a Hugging Face ``config.json`` (dict or path) so the simulator uses the same
numbers as the real executor's checkpoint, without importing torch (the simulator must run
on a laptop CPU). Only what changes FLOPs or bytes is kept: layers, widths, heads, vocab,
tying, dtype width.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from openinfer.errors import ConfigError, require

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelGeometry:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "dtype_bytes", "kv_dtype_bytes"):
            v = getattr(self, name)
            require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"model.{name}", v,
                    "an int >= 1")
        require(self.num_heads % self.num_kv_heads == 0, "model.num_kv_heads", self.num_kv_heads,
                f"a divisor of num_heads={self.num_heads} (GQA)")
        require(isinstance(self.tie_word_embeddings, bool), "model.tie_word_embeddings",
                self.tie_word_embeddings, "true or false")

    # -- parameters -------------------------------------------------------------------
    @property
    def layer_params(self) -> int:
        """Matmul weights of one layer (q, k, v, o, gate, up, down) plus its norms."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h + 2 * d  # input/post norms + Qwen3's q_norm/k_norm
        return attn + mlp + norms

    @property
    def body_params(self) -> int:
        """Weights every token multiplies through: all layers (embedding lookup is a gather)."""
        return self.num_layers * self.layer_params + self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        emb = self.embedding_params * (1 if self.tie_word_embeddings else 2)
        return self.body_params + emb

    @property
    def weight_bytes(self) -> int:
        """HBM held by the weights."""
        return self.num_params * self.dtype_bytes

    @property
    def weight_read_bytes(self) -> int:
        """Bytes one forward streams: every layer and the LM head (tied or not, read once)."""
        return (self.body_params + self.embedding_params) * self.dtype_bytes

    # -- KV ---------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of all layers for one token (Qwen3-4B: 147 456 B = 144 KiB)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    def kv_bytes_per_block(self, block_size: int) -> int:
        return self.kv_bytes_per_token * block_size

    # -- FLOPs ------------------------------------------------------------------------
    @property
    def dense_flops_per_token(self) -> int:
        """2·params of the body: the context-independent matmul work of one token."""
        return 2 * self.body_params

    @property
    def lm_head_flops_per_row(self) -> int:
        """Logits of one sampled row."""
        return 2 * self.vocab_size * self.hidden_size

    @property
    def attn_flops_per_pair(self) -> int:
        """QK^T plus PV for one (query token, key token) pair, all heads, all layers."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def flops_per_token(self, context: int) -> int:
        """One token attending ``context`` keys, without the LM head."""
        return self.dense_flops_per_token + self.attn_flops_per_pair * context

    # -- construction -----------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path, name: str | None = None) -> ModelGeometry:
        """From an HF ``config.json`` dict, or the path of one (or of its folder)."""
        if not isinstance(config, Mapping):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            try:
                config = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as err:
                raise ConfigError("model.config", str(path), f"a readable HF config.json ({err})") from None
        c = dict(config)
        for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                    "vocab_size"):
            if key not in c:
                raise ConfigError(f"model.{key}", None, "present in config.json")
        heads = c["num_attention_heads"]
        dtype = c.get("torch_dtype") or c.get("dtype") or "bfloat16"
        if dtype not in DTYPE_BYTES:
            raise ConfigError("model.torch_dtype", dtype, f"one of {', '.join(DTYPE_BYTES)}")
        return cls(name=name or str(c.get("_name_or_path") or c.get("model_type") or "model"),
                   num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"], num_heads=heads,
                   num_kv_heads=c.get("num_key_value_heads", heads),
                   head_dim=c.get("head_dim") or c["hidden_size"] // heads,
                   intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"],
                   tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
                   dtype_bytes=DTYPE_BYTES[dtype], kv_dtype_bytes=DTYPE_BYTES[dtype])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _qwen3(name: str, layers: int, hidden: int, heads: int, inter: int, tie: bool) -> ModelGeometry:
    return ModelGeometry(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=8,
                         head_dim=128, intermediate_size=inter, vocab_size=151936, tie_word_embeddings=tie)


# Values of the published config.json files (Qwen/Qwen3-*); spec §1.1 for the 4B.
PRESETS: dict[str, ModelGeometry] = {
    "qwen3-0.6b": _qwen3("qwen3-0.6b", 28, 1024, 16, 3072, True),
    "qwen3-4b": _qwen3("qwen3-4b", 36, 2560, 32, 9728, True),
    "qwen3-8b": _qwen3("qwen3-8b", 36, 4096, 32, 12288, False),
}


def preset(name: str) -> ModelGeometry:
    geo = PRESETS.get(name)
    if geo is None:
        raise ConfigError("model", name, f"one of {', '.join(sorted(PRESETS))}")
    return geo
