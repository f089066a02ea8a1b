"""The Runtime seam (see :mod:`openinfer.runtime.base`)."""

from openinfer.runtime.base import OrderedEnvironment, ProcessGen, Runtime
from openinfer.runtime.ordering import EventOrder, FifoOrder, OrderSpec, PriorityOrder, RandomOrder
from openinfer.runtime.sim import SimRuntime
from openinfer.runtime.wall import WallRuntime

__all__ = [
    "EventOrder", "FifoOrder", "OrderSpec", "OrderedEnvironment", "PriorityOrder",
    "ProcessGen", "RandomOrder", "Runtime", "SimRuntime", "WallRuntime",
]
