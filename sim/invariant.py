"""The exception every invariant check raises, in a module of its own so that checks
outside the monitors (the copy ledger at the copy engines) need not import them."""

from __future__ import annotations


class InvariantViolation(Exception):
    def __init__(self, name: str, time: float, detail: str) -> None:
        super().__init__(name, time, detail)  # SimPy re-raises a failed process's exception from its args
        self.name = name
        self.time = time
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.name} at t={self.time:.6f}s: {self.detail}"
