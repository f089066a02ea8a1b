"""Sampling: greedy, temperature / top-k / top-p per row, only from the passed generator."""

from __future__ import annotations

import pytest
import torch

from openinfer.errors import ConfigError
from openinfer.models.qwen3.sampling import (
    SamplingParams, SamplingTensors, filtered_logits, greedy, sample)

N = 4000


def _rows(logits, params, n=N):
    return logits.expand(n, -1), SamplingTensors.from_params([params] * n)


def _freqs(tokens, V):
    return torch.bincount(tokens, minlength=V).float() / tokens.numel()


def test_greedy_and_temperature_zero_rows():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    st = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * 3
                                     + [SamplingParams(temperature=1.0)] * 2)
    out = sample(logits, st, torch.Generator().manual_seed(1))
    assert torch.equal(out[:3], greedy(logits)[:3]) and torch.equal(greedy(logits),
                                                                     logits.argmax(-1))


def test_seeded_and_never_global_rng():
    logits = torch.randn(64, 1000)
    st = SamplingTensors.from_params([SamplingParams(temperature=1.0)] * 64)
    state = torch.get_rng_state()
    a = sample(logits, st, torch.Generator().manual_seed(7))
    b = sample(logits, st, torch.Generator().manual_seed(7))
    c = sample(logits, st, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), state)


def test_temperature_distribution():
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5]])
    tok = sample(*_rows(logits, SamplingParams(temperature=2.0)), torch.Generator().manual_seed(0))
    want = torch.softmax(logits[0] / 2.0, -1)
    assert (_freqs(tok, 4) - want).abs().max() < 0.03


def test_top_k_restricts_support():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, 2.5, -1.0]])
    tok = sample(*_rows(logits, SamplingParams(top_k=3)), torch.Generator().manual_seed(0))
    assert set(tok.tolist()) == {1, 3, 4}
    f = _freqs(tok, 6)
    want = torch.softmax(logits[0, [1, 3, 4]], -1)
    assert (f[[1, 3, 4]] - want).abs().max() < 0.03


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    tok = sample(*_rows(probs.log(), SamplingParams(top_p=0.7)), torch.Generator().manual_seed(0))
    assert set(tok.tolist()) == {0, 1}
    assert _freqs(tok, 4)[0] == pytest.approx(0.5 / 0.8, abs=0.03)


def test_top_p_one_and_top_k_zero_are_off():
    logits = torch.randn(3, 20)
    st = SamplingTensors.from_params([SamplingParams()] * 3)
    assert torch.isfinite(filtered_logits(logits, st)).all()


@pytest.mark.parametrize("params", [SamplingParams(top_k=1), SamplingParams(top_p=1e-6)])
def test_degenerate_filters_are_greedy(params):
    logits = torch.randn(32, 100, generator=torch.Generator().manual_seed(3))
    st = SamplingTensors.from_params([params] * 32)
    assert torch.equal(sample(logits, st, torch.Generator().manual_seed(0)), greedy(logits))


@pytest.mark.parametrize("kw,field", [({"temperature": -1.0}, "temperature"),
                                      ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p")])
def test_params_validation_names_field(kw, field):
    with pytest.raises(ConfigError) as e:
        SamplingParams(**kw)
    assert e.value.field == field
