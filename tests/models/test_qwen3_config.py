"""Qwen3Config: presets match the released geometries; bad values name their field."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from openinfer.errors import ConfigError
from openinfer.models.qwen3.config import PRESETS, Qwen3Config, preset

# (layers, hidden, q heads, kv heads, head_dim, intermediate, tied, params in billions)
RELEASED = {
    "0.6b": (28, 1024, 16, 8, 128, 3072, True, 0.596),
    "1.7b": (28, 2048, 16, 8, 128, 6144, True, 1.721),
    "4b": (36, 2560, 32, 8, 128, 9728, True, 4.022),
    "8b": (36, 4096, 32, 8, 128, 12288, False, 8.191),
}


@pytest.mark.parametrize("size", sorted(RELEASED))
def test_presets_match_released_qwen3(size):
    c = preset(size)
    layers, hidden, q, kv, hd, inter, tied, params = RELEASED[size]
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.intermediate_size, c.tie_word_embeddings) == (
                layers, hidden, q, kv, hd, inter, tied)
    assert (c.vocab_size, c.rope_theta, c.rms_norm_eps) == (151936, 1_000_000.0, 1e-6)
    assert c.num_parameters() / 1e9 == pytest.approx(params, abs=1e-3)


def test_tiny_preset():
    c = PRESETS["tiny"]
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.vocab_size, c.intermediate_size) == (2, 64, 4, 2, 16, 256, 128)


@pytest.mark.parametrize("field,value,accepted", [
    ("hidden_size", 0, ">= 1"),
    ("num_hidden_layers", -3, ">= 1"),
    ("head_dim", 15, "even int in [2, 512]"),
    ("num_key_value_heads", 3, "divisor of num_attention_heads=4"),
    ("rms_norm_eps", 0.0, "(0, 0.1]"),
    ("rope_theta", 0.5, "> 1"),
    ("torch_dtype", "int8", "one of"),
    ("tie_word_embeddings", "yes", "true or false"),
])
def test_validation_names_field_and_range(field, value, accepted):
    with pytest.raises(ConfigError) as e:
        replace(PRESETS["tiny"], **{field: value})
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}=") and accepted in str(e.value)


def test_hf_json_round_trip_both_layouts(tmp_path):
    c = preset("4b")
    d = c.to_hf_dict()
    assert d["architectures"] == ["Qwen3ForCausalLM"] and d["model_type"] == "qwen3"
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert Qwen3Config.from_json(tmp_path) == c
    # transformers 5.x layout: rope_parameters + dtype instead of rope_theta + torch_dtype
    d5 = {k: v for k, v in d.items() if k not in ("rope_theta", "torch_dtype")}
    d5.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, dtype="bfloat16")
    assert Qwen3Config.from_hf_dict(d5) == c


@pytest.mark.parametrize("key,value,field", [
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling.rope_type"),
    ("attention_bias", True, "attention_bias"),
    ("hidden_act", "gelu", "hidden_act"),
    ("use_sliding_window", True, "use_sliding_window"),
    ("model_type", "llama", "model_type"),
])
def test_unsupported_hf_features_are_rejected(key, value, field):
    d = preset("tiny").to_hf_dict() | {key: value}
    with pytest.raises(ConfigError) as e:
        Qwen3Config.from_hf_dict(d)
    assert e.value.field == field


def test_missing_field_is_named():
    d = preset("tiny").to_hf_dict()
    del d["intermediate_size"]
    with pytest.raises(ConfigError, match="intermediate_size"):
        Qwen3Config.from_hf_dict(d)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="size='70b'"):
        preset("70b")
