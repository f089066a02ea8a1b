"""Rebuild a workload from the ``describe()`` dict a report carries.

A report says what it ran; this turns that back into the same seeded workload, so a run on
the real GPU can be replayed in the simulator (the fidelity check), and a result file is
enough to reproduce its run. Trace workloads describe only their source file, so they are
rebuilt from the file, not from the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openinfer.errors import ConfigError
from sim.arrivals import ArrivalSpec
from sim.lengths import LengthDist
from sim.workloads import ChatWorkload, RandomWorkload, SyntheticWorkload, Workload

_LENGTH_FIELDS = {"random": (), "synthetic": ("input", "output"), "chat": ("turns", "user_len", "output_len")}
_CLASSES = {"random": RandomWorkload, "synthetic": SyntheticWorkload, "chat": ChatWorkload}


def workload_from_dict(data: Mapping[str, Any]) -> Workload:
    """The inverse of ``Workload.describe()`` for the generated workloads."""
    kind = data.get("kind")
    if kind not in _CLASSES:
        raise ConfigError("workload.kind", kind, f"one of {', '.join(_CLASSES)} (a trace is rebuilt from its file)")
    cls = _CLASSES[kind]
    fields = dict(data)
    fields.pop("kind")
    known = set(cls.__dataclass_fields__)
    for key in fields:
        if key not in known:
            raise ConfigError(f"workload.{key}", fields[key], f"one of {', '.join(sorted(known))} for kind={kind}")
    for name in _LENGTH_FIELDS[kind]:
        if isinstance(fields.get(name), Mapping):
            fields[name] = LengthDist(**fields[name])
    if isinstance(fields.get("arrival"), Mapping):
        arrival = dict(fields["arrival"])
        if isinstance(arrival.get("rate"), str):  # strict-JSON reports write inf as "inf"
            arrival["rate"] = float(arrival["rate"])
        fields["arrival"] = ArrivalSpec(**arrival)
    return cls(**fields)
