"""When requests (or chat sessions) arrive: inter-arrival gaps of an open-loop client.

``poisson`` is ``vllm bench serve``'s default (exponential gaps); ``gamma`` with a
coefficient of variation ``cv`` is its ``--burstiness`` (burstiness = 1/cv²): cv < 1 is
smoother than Poisson, cv > 1 burstier at the same mean rate. ``rate=inf`` sends
everything at t=0, like ``--request-rate inf``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from openinfer.errors import require

PROCESSES = ("poisson", "gamma")


@dataclass(frozen=True)
class ArrivalSpec:
    rate: float = 1.0          # arrivals per second (mean); inf = all at once
    process: str = "poisson"
    cv: float = 1.0            # gamma only: std/mean of the gaps

    def __post_init__(self) -> None:
        require(self.process in PROCESSES, "arrival.process", self.process, f"one of {', '.join(PROCESSES)}")
        require(isinstance(self.rate, (int, float)) and self.rate > 0, "arrival.rate", self.rate,
                "a number > 0 (per second) or inf")
        require(isinstance(self.cv, (int, float)) and 0 < self.cv <= 100, "arrival.cv", self.cv,
                "a number in (0, 100]")
        require(self.process == "gamma" or self.cv == 1.0, "arrival.cv", self.cv,
                "1 unless the arrival process is gamma: Poisson gaps have cv 1, so another value "
                "would be ignored (gamma with cv 1 draws exponential gaps too, so a sweep "
                "against Poisson is arrival=gamma with cv=1,2)")

    def gap(self, rng: random.Random) -> float:
        """One inter-arrival gap in seconds."""
        if math.isinf(self.rate):
            return 0.0
        if self.process == "poisson":
            return rng.expovariate(self.rate)
        shape = 1.0 / (self.cv * self.cv)
        return rng.gammavariate(shape, 1.0 / (self.rate * shape))

    def gaps(self, rng: random.Random) -> Iterator[float]:
        while True:
            yield self.gap(rng)
