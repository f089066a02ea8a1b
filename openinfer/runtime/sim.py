"""Virtual time: a SimPy environment with a seeded order for simultaneous events."""

from __future__ import annotations

from openinfer.runtime.base import OrderedEnvironment, Runtime
from openinfer.runtime.ordering import OrderSpec


class SimRuntime(Runtime):
    """Runtime on virtual time; replays exactly from (seed, order)."""

    def __init__(self, seed: int = 0, order: OrderSpec | None = None) -> None:
        spec = order or OrderSpec()
        super().__init__(OrderedEnvironment(spec.build(seed)), seed)
        self.order_spec = spec
