"""LoRA control commands: Load, Unload, List, each answered on its own response event."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from simpy.events import Event


class ControlOp(Enum):
    LOAD = "load"
    UNLOAD = "unload"
    LIST = "list"


@dataclass
class ControlCommand:
    op: ControlOp | str
    adapter: str | None = None
    load_inplace: bool = False


@dataclass
class ControlResponse:
    ok: bool
    message: str | None = None
    adapters: list[str] | None = None
    applied_at: float = 0.0


@dataclass
class PendingControl:
    seq: int
    command: ControlCommand
    response: Event
    arrived_at: float
    after_request: int = 0  # id of the last generate submitted before this command


def malformed(cmd: ControlCommand) -> str | None:
    """Why a command cannot be applied at all, or None."""
    ops = {o.value for o in ControlOp}
    op = cmd.op.value if isinstance(cmd.op, ControlOp) else cmd.op
    if op not in ops:
        return f"control op {op!r} is invalid: expected one of {', '.join(sorted(ops))}"
    if op in ("load", "unload") and not cmd.adapter:
        return f"control {op} needs an adapter name"
    return None
