"""Scaling measured side by side: the big run on one CPU, the small size back to back on another.

This VM's speed drifts over minutes: the same 100k-request chat run took 157 s and 130 s
two hours apart (118 s in between, under a sampling profiler), while 10k runs seconds
apart agree within 2%. A per-request ratio
of a 100k run and 10k runs made minutes before it therefore measures the machine as much
as the simulator (it read 1.37 where, run at once, the two sizes cost the same per
request). So the big run is pinned to one CPU and, for as long as it runs, the small size
runs back to back pinned to another: both sides see the same machine at the same time,
and the scaling figure is the big run's per-request cost over the median of the small
runs that ran entirely inside it. A small run still going when the big one ends ran
partly alone and is not counted (``overhang``).

Both sides are slower than alone (they share the caches and memory bus), so a paired
run's own requests/s is not a solo figure; the table marks those rows.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _pinned(cpu: int | None) -> Callable[[], None] | None:
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def last_json_line(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


class PairedRunFailed(RuntimeError):
    def __init__(self, which: str, argv: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"{which} run failed (exit {returncode}): {stderr.strip()[-1500:]}")
        self.which, self.argv, self.returncode, self.stderr = which, argv, returncode, stderr


@dataclass
class PairedRun:
    """One big run and the small runs that ran entirely beside it."""

    big: dict[str, Any]
    companions: list[dict[str, Any]] = field(default_factory=list)
    overhang: int = 0          # small runs still going when the big one ended (not counted)
    cpus: tuple[int, int] = (0, 1)

    def ratio(self, big_n: int, small_n: int, key: str) -> float | None:
        """Per-request ``key`` (wall_s or cpu_s) of the big run over the companions' median."""
        if not self.companions:
            return None
        small = statistics.median(c[key] for c in self.companions) / small_n
        return (self.big[key] / big_n) / small if small > 0 else None


def run_paired(big_argv: list[str], small_argv: list[str], env: dict[str, str],
               cpus: tuple[int, int]) -> PairedRun:
    """Start ``big_argv`` on ``cpus[0]``; run ``small_argv`` on ``cpus[1]`` until it ends.

    Each command prints its result as a JSON line on stdout (``experiments.bench_one``).
    The big run's output goes to temporary files (nothing reads a pipe while it runs)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        big = subprocess.Popen(big_argv, stdout=out, stderr=err, text=True, env=env,
                               preexec_fn=_pinned(cpus[0]))
        run = PairedRun(big={}, cpus=cpus)
        try:
            while big.poll() is None:
                p = subprocess.run(small_argv, capture_output=True, text=True, env=env,
                                   preexec_fn=_pinned(cpus[1]))
                res = last_json_line(p.stdout)
                if p.returncode != 0 or res is None:
                    raise PairedRunFailed("small", small_argv, p.returncode, p.stderr)
                if big.poll() is None:
                    run.companions.append(res)
                else:
                    run.overhang += 1
        finally:
            if big.poll() is None:  # a small run failed: do not leave the big one running
                big.kill()
            big.wait()
        out.seek(0)
        err.seek(0)
        res = last_json_line(out.read())
        if big.returncode != 0 or res is None:
            raise PairedRunFailed("big", big_argv, big.returncode, err.read())
        run.big = res
    return run
