"""Random checkpoints (writer + CLI) and the safetensors weight loader."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from openinfer.errors import ConfigError
from openinfer.models.qwen3.checkpoint import write_random_checkpoint
from openinfer.models.qwen3.config import Qwen3Config, preset
from openinfer.models.qwen3.weights import (
    EMBED, LM_HEAD, WeightError, expected_shapes, load_weights)


def test_streamed_file_is_valid_safetensors(tiny_ckpt):
    cfg = Qwen3Config.from_json(tiny_ckpt)
    want = expected_shapes(cfg)
    with safe_open(str(tiny_ckpt / "model.safetensors"), framework="pt") as f:
        assert list(f.keys()) == sorted(want)   # safetensors lists keys sorted
        for name in f.keys():
            t = f.get_tensor(name)
            assert tuple(t.shape) == want[name] and t.dtype == torch.float32
    hf = json.loads((tiny_ckpt / "config.json").read_text())
    assert hf["architectures"] == ["Qwen3ForCausalLM"] and hf["model_type"] == "qwen3"
    assert LM_HEAD not in want  # tiny is tied


def test_random_weights_are_seeded_and_shaped_sanely(tmp_path):
    cfg = preset("tiny")
    a = load_file(write_random_checkpoint(cfg, tmp_path / "a", seed=3) / "model.safetensors")
    b = load_file(write_random_checkpoint(cfg, tmp_path / "b", seed=3) / "model.safetensors")
    c = load_file(write_random_checkpoint(cfg, tmp_path / "c", seed=4) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a[EMBED], c[EMBED])
    assert a[EMBED].dtype == torch.bfloat16
    norm = a["model.layers.0.input_layernorm.weight"].float()
    assert 0.9 < norm.mean() < 1.1 and 0.05 < norm.std() < 0.15      # 1 + 0.1 N(0, 1)
    q = a["model.layers.0.self_attn.q_proj.weight"].float()
    assert q.std() == pytest.approx(cfg.hidden_size ** -0.5, rel=0.1)  # N(0, 1/fan_in)


def test_loader_ties_lm_head_to_embeddings(tiny_ckpt):
    cfg = Qwen3Config.from_json(tiny_ckpt)
    w = load_weights(tiny_ckpt, cfg)
    assert w.lm_head is w.embed_tokens
    assert len(w.layers) == 2
    assert w.layers[0].qkv_proj.shape == (cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
    assert w.layers[0].gate_up_proj.shape == (2 * cfg.intermediate_size, cfg.hidden_size)


def test_loader_untied_reads_lm_head(tmp_path):
    cfg = preset("tiny", tie_word_embeddings=False)
    write_random_checkpoint(cfg, tmp_path, dtype="float32")
    w = load_weights(tmp_path, cfg)
    assert w.lm_head is not w.embed_tokens and not torch.equal(w.lm_head, w.embed_tokens)
    assert w.lm_head.shape == (cfg.vocab_size, cfg.hidden_size)


def _rewrite(src, dst, edit):
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    dst.mkdir()
    save_file(tensors, dst / "model.safetensors")


def test_missing_tensor_is_named(tiny_ckpt, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    _rewrite(tiny_ckpt, tmp_path / "x", lambda t: t.pop(name))
    with pytest.raises(WeightError, match=f"missing tensor '{name}'"):
        load_weights(tmp_path / "x", preset("tiny"))


def test_misshaped_tensor_is_named(tiny_ckpt, tmp_path):
    name = "model.layers.0.self_attn.k_norm.weight"
    _rewrite(tiny_ckpt, tmp_path / "x", lambda t: t.update({name: torch.ones(8)}))
    with pytest.raises(WeightError, match=rf"'{name}'.*shape \(8,\), expected \(16,\)"):
        load_weights(tmp_path / "x", preset("tiny"))


def test_unexpected_tensor_is_named(tiny_ckpt, tmp_path):
    _rewrite(tiny_ckpt, tmp_path / "x", lambda t: t.update({"model.layers.2.foo": torch.ones(1)}))
    with pytest.raises(WeightError, match="unexpected tensor 'model.layers.2.foo'"):
        load_weights(tmp_path / "x", preset("tiny"))


def _cli():
    pytest.importorskip("omegaconf")
    from experiments import make_checkpoint
    return make_checkpoint


def test_cli_writes_checkpoint(tmp_path, capsys):
    make_checkpoint_main = _cli().main
    out = tmp_path / "ck"
    assert make_checkpoint_main(["size=tiny", f"out={out}", "seed=1", "dtype=float32"]) == 0
    cfg = Qwen3Config.from_json(out)
    assert cfg == preset("tiny", torch_dtype="float32")
    assert load_weights(out, cfg).embed_tokens.dtype == torch.float32
    assert "wrote tiny" in capsys.readouterr().out


@pytest.mark.parametrize("argv,field", [
    (["size=tiny", "out=/x", "bogus=1"], "bogus"),
    (["size=13b", "out=/x"], "size"),
    (["size=tiny"], "out"),
    (["size=tiny", "out="], "out"),
    (["size=tiny", "out=/x", "dtype=int8"], "dtype"),
    (["size=tiny", "out=/x", "seed=-1"], "seed"),
    (["size=tiny", "out=/x", "seed=true"], "seed"),          # not taken as seed 1
    (["size=tiny", "out.x=1"], "out.x"),                     # not a folder named {'x': 1}
])
def test_cli_rejects_bad_args(argv, field):
    cli = _cli()
    with pytest.raises(ConfigError) as e:
        cli.parse_args(argv)
    assert e.value.field == field
    assert cli.main(argv) == 2


def test_cli_help_marks_size_and_out_required(capsys):
    """--help tells a user which keys they must give, not a default of None."""
    cli = _cli()
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(["--help"])
    assert stop.value.code == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith("  ")}
    assert lines["size"].endswith("required") and lines["out"].endswith("required")
    assert lines["seed"].endswith("default 0")


def test_cli_names_a_missing_size_before_anything_runs(tmp_path):
    cli = _cli()
    with pytest.raises(ConfigError) as e:
        cli.parse_args([f"out={tmp_path}"])
    assert e.value.field == "size" and "required" in str(e.value)
    assert not any(tmp_path.iterdir())
