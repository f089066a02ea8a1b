"""Load Qwen3 weights from safetensors files that use the Hugging Face tensor names.

The loader streams one tensor at a time (``safe_open``) straight to the target device and
dtype, so host memory never holds the whole checkpoint. Q/K/V and gate/up are fused into
one matrix each at load time: one GEMM instead of three (two) per layer. Any missing,
unexpected or mis-shaped tensor raises :class:`WeightError` naming it, because a silently
half-loaded model produces plausible-looking garbage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from openinfer.models.qwen3.config import Qwen3Config

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
_LAYER_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                "input_layernorm", "post_attention_layernorm",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class WeightError(ValueError):
    """A checkpoint tensor is missing, unexpected or has the wrong shape."""


def layer_name(i: int, part: str) -> str:
    return f"model.layers.{i}.{part}.weight"


def expected_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of an HF Qwen3 checkpoint with its shape, in file order."""
    h, d = cfg.hidden_size, cfg.head_dim
    per_layer = {
        "self_attn.q_proj": (cfg.q_size, h), "self_attn.k_proj": (cfg.kv_size, h),
        "self_attn.v_proj": (cfg.kv_size, h), "self_attn.o_proj": (h, cfg.q_size),
        "self_attn.q_norm": (d,), "self_attn.k_norm": (d,),
        "input_layernorm": (h,), "post_attention_layernorm": (h,),
        "mlp.gate_proj": (cfg.intermediate_size, h), "mlp.up_proj": (cfg.intermediate_size, h),
        "mlp.down_proj": (h, cfg.intermediate_size)}
    shapes: dict[str, tuple[int, ...]] = {EMBED: (cfg.vocab_size, h)}
    for i in range(cfg.num_hidden_layers):
        for part in _LAYER_PARTS:
            shapes[layer_name(i, part)] = per_layer[part]
    shapes[FINAL_NORM] = (h,)
    if not cfg.tie_word_embeddings:
        shapes[LM_HEAD] = (cfg.vocab_size, h)
    return shapes


@dataclass
class LayerWeights:
    """One decoder layer, with Q/K/V and gate/up fused along the output dimension."""

    input_norm: torch.Tensor      # [hidden]
    qkv_proj: torch.Tensor        # [q_size + 2 * kv_size, hidden]
    q_norm: torch.Tensor          # [head_dim]
    k_norm: torch.Tensor          # [head_dim]
    o_proj: torch.Tensor          # [hidden, q_size]
    post_norm: torch.Tensor       # [hidden]
    gate_up_proj: torch.Tensor    # [2 * intermediate, hidden]
    down_proj: torch.Tensor       # [hidden, intermediate]


@dataclass
class Qwen3Weights:
    embed_tokens: torch.Tensor    # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor            # [hidden]
    lm_head: torch.Tensor         # [vocab, hidden]; the same storage as embed_tokens if tied


def _checkpoint_files(ckpt_dir: Path) -> list[Path]:
    files = sorted(ckpt_dir.glob("*.safetensors"))
    if not files:
        raise WeightError(f"no *.safetensors file in {ckpt_dir}")
    return files


def load_weights(ckpt_dir: str | Path, cfg: Qwen3Config, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None) -> Qwen3Weights:
    """Read every tensor of ``expected_shapes(cfg)`` from ``ckpt_dir`` (one or several
    safetensors shards). ``lm_head.weight`` is ignored when the embeddings are tied."""
    dtype = dtype or cfg.dtype
    want = expected_shapes(cfg)
    got: dict[str, torch.Tensor] = {}
    for path in _checkpoint_files(Path(ckpt_dir)):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith("rotary_emb.inv_freq") or (
                        name == LM_HEAD and cfg.tie_word_embeddings):
                    continue
                if name not in want:
                    raise WeightError(f"unexpected tensor {name!r} in {path.name} "
                                      f"(not part of a Qwen3 with this config)")
                shape = tuple(f.get_slice(name).get_shape())
                if shape != want[name]:
                    raise WeightError(f"tensor {name!r} in {path.name} has shape {shape}, "
                                      f"expected {want[name]}")
                got[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    missing = [n for n in want if n not in got]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightError(f"missing tensor {missing[0]!r}{more} in {ckpt_dir}")
    return _assemble(cfg, got)


def _assemble(cfg: Qwen3Config, t: dict[str, torch.Tensor]) -> Qwen3Weights:
    layers = []
    for i in range(cfg.num_hidden_layers):
        g = lambda part: t.pop(layer_name(i, part))  # noqa: E731
        qkv = torch.cat([g("self_attn.q_proj"), g("self_attn.k_proj"), g("self_attn.v_proj")])
        gate_up = torch.cat([g("mlp.gate_proj"), g("mlp.up_proj")])
        layers.append(LayerWeights(
            input_norm=g("input_layernorm"), qkv_proj=qkv, q_norm=g("self_attn.q_norm"),
            k_norm=g("self_attn.k_norm"), o_proj=g("self_attn.o_proj"),
            post_norm=g("post_attention_layernorm"), gate_up_proj=gate_up,
            down_proj=g("mlp.down_proj")))
    embed = t.pop(EMBED)
    lm_head = embed if cfg.tie_word_embeddings else t.pop(LM_HEAD)
    return Qwen3Weights(embed_tokens=embed, layers=layers, norm=t.pop(FINAL_NORM),
                        lm_head=lm_head)
