"""Hardware presets and HF-config geometry: validated, and the spec §1.1 numbers."""

from __future__ import annotations

import json

import pytest

from openinfer.errors import ConfigError
from sim.hardware import HardwareSpec, preset as hw_preset
from sim.model_geometry import ModelGeometry, preset as model_preset

QWEN3_4B_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 2560, "intermediate_size": 9728,
                   "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                   "vocab_size": 151936, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def test_qwen3_4b_kv_geometry_matches_spec() -> None:
    g = model_preset("qwen3-4b")
    assert g.kv_bytes_per_token == 147_456
    assert g.kv_bytes_per_block(16) == 2_359_296  # 2.25 MiB
    assert model_preset("qwen3-8b").kv_bytes_per_block(16) == 2_359_296  # same KV geometry
    assert 3.9e9 < g.num_params < 4.1e9
    assert 7.5e9 < g.weight_bytes < 8.3e9  # spec: ~7.67 GB bf16


def test_geometry_from_hf_config_dict_and_path(tmp_path) -> None:
    assert ModelGeometry.from_hf_config(QWEN3_4B_CONFIG, name="qwen3-4b") == model_preset("qwen3-4b")
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B_CONFIG))
    assert ModelGeometry.from_hf_config(tmp_path, name="qwen3-4b") == model_preset("qwen3-4b")


def test_geometry_errors_name_the_field() -> None:
    bad = dict(QWEN3_4B_CONFIG, num_key_value_heads=5)
    with pytest.raises(ConfigError, match="model.num_kv_heads"):
        ModelGeometry.from_hf_config(bad)
    with pytest.raises(ConfigError, match="model.hidden_size"):
        ModelGeometry.from_hf_config({k: v for k, v in QWEN3_4B_CONFIG.items() if k != "hidden_size"})
    with pytest.raises(ConfigError, match="model"):
        model_preset("llama")


def test_hardware_presets_and_dict_loading() -> None:
    h = hw_preset("h200")
    assert h.hbm_bandwidth_tb_s == 4.8 and h.bf16_tflops == 989.0
    r = HardwareSpec.from_dict({"preset": "rtx5090", "step_overhead_s": 0.001})
    assert r.name == "rtx5090" and r.step_overhead_s == 0.001 and r.hbm_bandwidth_tb_s == 1.792
    assert HardwareSpec.from_dict(h.to_dict()) == h


@pytest.mark.parametrize("field,value", [("matmul_efficiency", 1.5), ("hbm_bandwidth_tb_s", 0),
                                         ("copy_engines", 0), ("d2h_gib_s", 999.0), ("step_overhead_s", -1)])
def test_hardware_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"hardware.{field}"):
        HardwareSpec.from_dict({field: value})


def test_unknown_hardware_key_is_named() -> None:
    with pytest.raises(ConfigError, match="hardware.bandwith"):
        HardwareSpec.from_dict({"bandwith": 3})
