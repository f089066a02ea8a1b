"""Rebuild a workload from the ``describe()`` dict a report carries.

A report says what it ran; this turns that back into the same seeded workload, so a run on
the real GPU can be replayed in the simulator (the fidelity check), and a result file is
enough to reproduce its run. Trace workloads describe only their source file, so they are
rebuilt from the file, not from the report.

``workload_from_flat`` builds the same workloads from a short flat dict of scalars (what
``experiments.serve_real`` takes as ``workload_cfg``, and what ``experiments.config.build``
maps the Hydra workload group onto), through the same constructor and key check.
"""

from __future__ import annotations

import math
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


# The keys only one generated kind reads, by the names both command lines use (the Hydra
# workload group and experiments.simulate): what a builder passes for that kind, and what a
# command refuses when the run's kind would drop it.
KIND_ONLY_KEYS: dict[str, tuple[str, ...]] = {
    "chat": ("turns", "system_prompt_len", "user_len", "think_time_s"),
    "random": ("input_len", "range_ratio", "prefix_len"),
}

# Omitted keys of the flat form: a small workload (the tiny model on a CPU serves it in seconds).
FLAT_DEFAULTS: dict[str, dict[str, Any]] = {
    "random": dict(num_requests=8, input_len=128, output_len=16, prefix_len=64),
    "chat": dict(num_sessions=4, turns=2, system_prompt_len=64, user_len=32, output_len=16, think_time_s=0.0),
}


def workload_from_flat(flat: Mapping[str, Any] | None) -> Workload:
    """A generated workload from the short flat form.

    ``kind``: "random" (default) or "chat". ``rate`` (per second; "inf" or None: all at
    once), ``process`` and ``cv`` make the ArrivalSpec: of requests for random, of sessions
    for chat. random: RandomWorkload's fields (num_requests, input_len, output_len,
    range_ratio, prefix_len). chat: ChatWorkload's fields with scalar lengths (num_sessions,
    turns, system_prompt_len, user_len, output_len, think_time_s, max_requests,
    max_context_tokens); turns are fixed, and so are user_len and output_len unless
    ``length_sigma`` > 0 draws them lognormal(mean, sigma, max=8·mean). ``seed`` belongs to
    the runtime, not the workload: accepted and ignored. Omitted keys: ``FLAT_DEFAULTS``.
    """
    fields = dict(flat or {})
    kind = fields.pop("kind", "random")
    if kind not in FLAT_DEFAULTS:
        raise ConfigError("workload.kind", kind, "random or chat")
    fields.pop("seed", None)
    rate = fields.pop("rate", "inf")
    fields["arrival"] = ArrivalSpec(rate=math.inf if rate in ("inf", None) else float(rate),
                                    process=fields.pop("process", "poisson"), cv=float(fields.pop("cv", 1.0)))
    fields = {**FLAT_DEFAULTS[kind], **fields}
    if kind == "chat":
        sigma = fields.pop("length_sigma", 0.0)
        fields["turns"] = LengthDist.fixed(fields["turns"])
        for name in ("user_len", "output_len"):
            n = fields[name]
            fields[name] = LengthDist.lognormal(n, sigma, max=8 * n) if sigma else LengthDist.fixed(n)
    return workload_from_dict(dict(kind=kind, **fields))
