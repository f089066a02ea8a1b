"""The side-by-side runner of experiments.bench: each side on its own CPU, only the small
runs that ended while the big one ran counted, and a failure that stops both sides."""

from __future__ import annotations

import os
import sys
import time

import pytest

from experiments.bench_paired import PairedRun, PairedRunFailed, run_paired, usable_cpus

pytestmark = pytest.mark.skipif(len(usable_cpus()) < 2 or not hasattr(os, "sched_setaffinity"),
                                reason="pairing pins two CPUs")

# Each "run" sleeps, then prints its CPU mask and a wall time as the JSON line bench_one would.
RUN = ("import json, os, sys, time; time.sleep(float(sys.argv[1])); "
       "print(json.dumps(dict(cpus=sorted(os.sched_getaffinity(0)), wall_s=float(sys.argv[1]), "
       "cpu_s=float(sys.argv[1]))))")


def _argv(seconds: float) -> list[str]:
    return [sys.executable, "-c", RUN, str(seconds)]


def test_each_side_runs_pinned_and_only_whole_companions_count() -> None:
    cpus = usable_cpus()
    pair = run_paired(_argv(1.5), _argv(0.2), dict(os.environ), (cpus[0], cpus[1]))
    assert pair.big["cpus"] == [cpus[0]]
    assert pair.companions and all(c["cpus"] == [cpus[1]] for c in pair.companions)
    # back to back, each ~0.2 s plus an interpreter start: several fit in 1.5 s, the one
    # running when the big side ends is cut off, not counted
    assert 2 <= len(pair.companions) <= 8 and pair.overhang == 1
    assert pair.ratio(100, 10, "wall_s") == pytest.approx((1.5 / 100) / (0.2 / 10))


def test_no_companion_means_no_ratio() -> None:
    assert PairedRun(big=dict(wall_s=1.0)).ratio(10, 1, "wall_s") is None


def test_a_failed_small_run_stops_the_big_one_and_names_the_side() -> None:
    cpus = usable_cpus()
    bad = [sys.executable, "-c", "import sys; sys.exit('boom')"]
    t0 = time.monotonic()
    with pytest.raises(PairedRunFailed) as err:
        run_paired(_argv(60), bad, dict(os.environ), (cpus[0], cpus[1]))
    assert err.value.which == "small" and "boom" in str(err.value)
    assert time.monotonic() - t0 < 30  # the 60 s big run was killed, not waited for


def test_a_failed_big_run_is_reported_with_its_stderr() -> None:
    cpus = usable_cpus()
    bad = [sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit('big trouble')"]
    with pytest.raises(PairedRunFailed) as err:
        run_paired(bad, _argv(0.05), dict(os.environ), (cpus[0], cpus[1]))
    assert err.value.which == "big" and "big trouble" in str(err.value)
