"""experiments.store_demo: the two-act round trip, and sizes that could not show it refused."""

from __future__ import annotations

import pytest

from experiments.store_demo import DemoConfig, run_demo
from openinfer.errors import ConfigError


def test_the_round_trip_restores_and_matches_every_sealed_block() -> None:
    rep = run_demo(DemoConfig(prompt_tokens=1000, suffix_tokens=7, gpu_blocks=80, host_blocks=64))
    sealed = 1000 // 16
    assert rep["ok"] and rep["act1"]["sealed_blocks"] == sealed and rep["act1"]["flush_ok"]
    assert rep["act2"]["restored_blocks"] == sealed == rep["act2"]["evicted_gpu_blocks"]
    assert rep["act2"]["matched_tokens"] == sealed * 16
    assert rep["act2"]["recompute_tokens"] == 1007 - sealed * 16


@pytest.mark.parametrize("field, value", [
    ("host_blocks", 255),      # a tier smaller than the prompt: act 2 would restore nothing
    ("gpu_blocks", 256),       # no room for the second request
    ("prompt_tokens", 8),      # less than one block: nothing is sealed
    ("block_size", 24), ("pcie_gib_s", 0.0),
])
def test_sizes_that_cannot_show_the_round_trip_are_refused(field, value) -> None:
    with pytest.raises(ConfigError, match=field):
        DemoConfig(**{field: value})
