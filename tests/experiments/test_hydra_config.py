"""Start-up validation: a wrong key, type or range is one line naming the key, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from experiments.config.preflight import check


@pytest.mark.parametrize("argv, key, hint", [
    (["workload.qpss=3"], "workload.qpss", "qps"),
    (["workload.qps=abc"], "workload.qps", "float"),
    (["workload.qps=-1"], "workload.qps", "> 0"),
    (["store.num_blocks=1"], "store.num_blocks", ">= 2"),
    (["variant=foo"], "variant=foo", "pr829"),
    (["+workload.zz=1"], "workload.zz", "num_requests"),
    (["faults.schedule.0.port=xx"], "faults.schedule[0].port", "metaserver"),
    (["experiment.objective=nope"], "experiment.objective", "p99_ttft_ms"),
    (["-m", "workload.qps=1,2,-3"], "workload.qps", "> 0"),
])
def test_bad_override_names_the_key_and_the_accepted_values(argv, key, hint) -> None:
    msg = check(argv)
    assert msg is not None and key in msg and hint in msg, msg


def test_good_overrides_pass() -> None:
    assert check([]) is None
    assert check(["experiment=smoke", "variant=fixed", "workload.qps=4"]) is None
    assert check(["-m", "workload.qps=2,4"], "sweep") is None


def test_cli_exits_2_with_one_line() -> None:
    p = subprocess.run([sys.executable, "-m", "experiments.run", "workload.qpss=3"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "workload.qpss" in p.stderr
