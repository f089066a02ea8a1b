"""Named ports: the places where storage operations can be held, delayed or failed.

Every tier operation passes through its port (``query``, ``load``, ``save``, ``flush``,
``registration``, ``metaserver``) before doing its work. With no hook installed that costs
one dict lookup. Tests install a :class:`Gate` to complete each operation exactly when they
say; the simulator's fault injection installs stall/delay/error hooks at the same ports,
so a scenario test and a random fault run exercise one code path.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

from simpy.events import Event

from openinfer.errors import ConfigError

PORT_NAMES = ("query", "load", "save", "flush", "registration", "metaserver")


class PortHook(Protocol):
    def enter(self, port: str, what: str) -> Generator[Event, Any, str | None]:
        """Wait as the hook decides; return an error message to fail the operation."""
        ...


class Ports:
    """The hooks installed on each named port of one tier (or one MetaServer)."""

    def __init__(self) -> None:
        self._hooks: dict[str, list[PortHook]] = {}

    def install(self, port: str, hook: PortHook) -> PortHook:
        if port not in PORT_NAMES:
            raise ConfigError("port", port, f"one of {', '.join(PORT_NAMES)}")
        self._hooks.setdefault(port, []).append(hook)
        return hook

    def remove(self, port: str, hook: PortHook) -> None:
        self._hooks.get(port, []).remove(hook)

    def active(self, port: str) -> bool:
        return bool(self._hooks.get(port))

    def through(self, port: str, what: str = "") -> Generator[Event, Any, str | None]:
        for hook in list(self._hooks.get(port, ())):
            err = yield from hook.enter(port, what)
            if err is not None:
                return err
        return None


@dataclass
class _Waiter:
    event: Event
    what: str


@dataclass
class Gate:
    """Holds operations at a port until the test releases them (or fails them).

    ``selector`` narrows the gate to the operations whose description it accepts (for a
    save, the first block's hash prefix); the others pass straight through.
    """

    rt: Any
    selector: Callable[[str], bool] | None = None
    waiting: list[_Waiter] = field(default_factory=list)
    passed: int = 0
    open: bool = False

    def enter(self, port: str, what: str) -> Generator[Event, Any, str | None]:
        if self.open or (self.selector is not None and not self.selector(what)):
            self.passed += 1
            return None
        ev = self.rt.event()
        self.waiting.append(_Waiter(ev, what))
        err = yield ev
        self.passed += 1
        return err

    def release(self, n: int = 1, error: str | None = None) -> int:
        """Let the ``n`` oldest waiting operations proceed (or fail with ``error``)."""
        n = min(n, len(self.waiting))
        for w in self.waiting[:n]:
            w.event.succeed(error)
        del self.waiting[:n]
        return n

    def release_all(self, error: str | None = None) -> int:
        return self.release(len(self.waiting), error)

    def open_gate(self) -> None:
        """Release everything waiting and let every later operation straight through."""
        self.open = True
        self.release_all()
