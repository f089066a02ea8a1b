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

# Each "run" prints its CPU mask and a wall time as the JSON line bench_one would.
RUN = ("import json, os, sys, time; time.sleep(float(sys.argv[1])); "
       "print(json.dumps(dict(cpus=sorted(os.sched_getaffinity(0)), wall_s=float(sys.argv[1]), "
       "cpu_s=float(sys.argv[1]))))")

# A big run that ends when the test's small runs say so (no race with the machine's load):
# it records its pid, waits for the file `go`, then reports 1.5 s.
BIG = ("import json, os, pathlib, sys, time; d = pathlib.Path(sys.argv[1]); "
       "(d / 'pid.tmp').write_text(str(os.getpid())); (d / 'pid.tmp').rename(d / 'big.pid'); "
       "t = time.monotonic() + 60\n"
       "while not (d / 'go').exists() and time.monotonic() < t: time.sleep(0.005)\n"
       "print(json.dumps(dict(cpus=sorted(os.sched_getaffinity(0)), wall_s=1.5, cpu_s=1.5)))")
# Small run number k: run `last` creates `go` and returns only once the big process has
# exited (a zombie or gone), so every earlier run ended inside the big one and this one
# ended after it.
SMALL = ("import json, os, pathlib, sys, time; d = pathlib.Path(sys.argv[1]); "
         "last = int(sys.argv[2]); t = time.monotonic() + 60\n"
         "with open(d / 'count', 'a') as f: f.write('x')\n"
         "if len((d / 'count').read_text()) == last:\n"
         "    (d / 'go').touch()\n"
         "    while not (d / 'big.pid').exists() and time.monotonic() < t: time.sleep(0.005)\n"
         "    stat = pathlib.Path('/proc', (d / 'big.pid').read_text(), 'stat')\n"
         "    while stat.exists() and stat.read_text().rsplit(')', 1)[1].split()[0] != 'Z' \\\n"
         "            and time.monotonic() < t: time.sleep(0.005)\n"
         "print(json.dumps(dict(cpus=sorted(os.sched_getaffinity(0)), wall_s=0.2, cpu_s=0.2)))")


def _argv(seconds: float) -> list[str]:
    return [sys.executable, "-c", RUN, str(seconds)]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc for the big run")
def test_each_side_runs_pinned_and_only_whole_companions_count(tmp_path) -> None:
    cpus = usable_cpus()
    pair = run_paired([sys.executable, "-c", BIG, str(tmp_path)],
                      [sys.executable, "-c", SMALL, str(tmp_path), "4"], dict(os.environ),
                      (cpus[0], cpus[1]))
    assert pair.big["cpus"] == [cpus[0]]
    assert all(c["cpus"] == [cpus[1]] for c in pair.companions)
    # runs 1-3 ended while the big one ran; run 4 was still going when it ended: cut off
    assert len(pair.companions) == 3 and pair.overhang == 1
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
