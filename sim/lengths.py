"""Token-count distributions for prompts, outputs, user turns and session lengths.

A workload names a distribution rather than a list of numbers so a sweep can move the
mean or the spread alone. ``lognormal`` takes the distribution's own mean (not the
underlying normal's), because "~1,000 input tokens" is how people state a workload.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from openinfer.errors import require

KINDS = ("fixed", "uniform", "lognormal", "exponential")


@dataclass(frozen=True)
class LengthDist:
    kind: str = "fixed"
    mean: float = 128.0          # fixed, lognormal, exponential
    low: int = 1                 # uniform: inclusive bounds
    high: int = 1
    sigma: float = 0.5           # lognormal: std of log(length)
    min: int = 1                 # every draw is clipped into [min, max]
    max: int | None = None

    def __post_init__(self) -> None:
        require(self.kind in KINDS, "length.kind", self.kind, f"one of {', '.join(KINDS)}")
        require(isinstance(self.min, int) and self.min >= 0, "length.min", self.min, "an int >= 0")
        require(self.max is None or (isinstance(self.max, int) and self.max >= self.min), "length.max",
                self.max, f"null or an int >= length.min={self.min}")
        if self.kind == "uniform":
            require(isinstance(self.low, int) and self.low >= 0, "length.low", self.low, "an int >= 0")
            require(isinstance(self.high, int) and self.high >= self.low, "length.high", self.high,
                    f"an int >= length.low={self.low}")
        else:
            require(isinstance(self.mean, (int, float)) and self.mean >= 0, "length.mean", self.mean,
                    "a number >= 0")
        if self.kind == "lognormal":
            require(isinstance(self.sigma, (int, float)) and 0 <= self.sigma <= 5, "length.sigma",
                    self.sigma, "a number in [0, 5]")

    @classmethod
    def fixed(cls, n: int) -> LengthDist:
        return cls("fixed", mean=n, min=min(1, n))

    @classmethod
    def uniform(cls, low: int, high: int) -> LengthDist:
        return cls("uniform", low=low, high=high, min=min(1, low))

    @classmethod
    def lognormal(cls, mean: float, sigma: float = 0.5, **kw: int | None) -> LengthDist:
        return cls("lognormal", mean=mean, sigma=sigma, **kw)  # type: ignore[arg-type]

    @property
    def expected(self) -> float:
        """The mean before clipping (what the workload was asked for)."""
        if self.kind == "uniform":
            return (self.low + self.high) / 2
        return float(self.mean)

    @property
    def least(self) -> int:
        """The smallest draw ``sample`` can return."""
        if self.kind == "fixed":
            low = int(round(self.mean))
        elif self.kind == "uniform":
            low = self.low
        else:   # a lognormal or exponential draw can round down to 0
            low = 0
        low = max(low, self.min)
        return low if self.max is None else min(low, self.max)

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            v = int(round(self.mean))
        elif self.kind == "uniform":
            v = rng.randint(self.low, self.high)
        elif self.kind == "exponential":
            v = int(round(rng.expovariate(1.0 / self.mean))) if self.mean > 0 else 0
        else:
            mu = math.log(self.mean) - self.sigma ** 2 / 2 if self.mean > 0 else -math.inf
            v = int(round(rng.lognormvariate(mu, self.sigma))) if self.mean > 0 else 0
        if v < self.min:
            v = self.min
        if self.max is not None and v > self.max:
            v = self.max
        return v
