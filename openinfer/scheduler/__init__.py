"""The Qwen3 scheduler: intake, ResolveHub, admission, chunked prefill, plans, effects,
control commands and P/D roles (spec §5)."""

from openinfer.scheduler.config import Role, SchedulerConfig, SchedulerSwitches
from openinfer.scheduler.control import ControlCommand, ControlOp, ControlResponse
from openinfer.scheduler.engine import Engine, LoadSnapshot
from openinfer.scheduler.request import (EventKind, FinishReason, GenerateRequest, RequestEvent,
                                         RequestHandle, SamplingParams)

__all__ = [
    "ControlCommand", "ControlOp", "ControlResponse", "Engine", "EventKind", "FinishReason",
    "GenerateRequest", "LoadSnapshot", "RequestEvent", "RequestHandle", "Role", "SamplingParams",
    "SchedulerConfig", "SchedulerSwitches",
]
