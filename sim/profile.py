"""A fitted hardware profile: what ``experiments.calibrate`` learned from one GPU and model.

The roofline guesses; a profile knows. It holds the step-time coefficients fitted on the
real executor's timings, the copy links fitted on its D2H/H2D timings, and where they came
from (GPU name, date, sample counts, fit quality), so a simulator run that uses it can say
which measurements its numbers stand on. It is a YAML file under ``conf/profiles/`` so it
travels with the configs; step coefficients are per (GPU, model geometry), which is why
the profile also names the model it was fitted on and refuses another by default.

It also says how the real engine's host thread behaves (``host_holds_steps``: a step holds
the one Python thread the scheduler, store and copy pollers run on, so nothing that falls
due during a step is handled before it ends); what the thread does between two steps
(``host_overhead_s`` plus ``host_gap``: more around a step with prompt tokens, per decode
row, per copy submitted; ``sim.calibration.fit_host_gaps``); and whether a step waits for
a copy still in flight when it starts (``steps_wait_for``: the H200 captures say a D2H
does, an H2D does not; ``sim.calibration.copy_wait``); and whether a copy submitted during a
step starts only when it ends (``copies_after_step``, ``sim.calibration.copy_order``).
:meth:`FittedProfile.world` builds a simulated instance that behaves that way
(``sim.host_thread``, ``WorldConfig.copies_after_step``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from openinfer.errors import ConfigError, require
from sim.calibrated_step_model import CalibratedStepModel
from sim.hardware import HardwareSpec, preset as hardware_preset

if TYPE_CHECKING:
    from sim.model_geometry import ModelGeometry
    from sim.world import World, WorldConfig


HOST_GAP_KEYS = ("after_eager", "before_eager", "per_row", "per_copy")


@dataclass(frozen=True)
class LinkFit:
    """``seconds = latency_s + bytes / (gib_s · 2^30)`` for one copy direction."""

    gib_s: float
    latency_s: float
    samples: int = 0
    median_rel_error: float = 0.0

    def __post_init__(self) -> None:
        require(self.gib_s > 0, "profile.copies.gib_s", self.gib_s, "a number > 0 (GiB/s)")
        require(self.latency_s >= 0, "profile.copies.latency_s", self.latency_s, "a number >= 0 (s)")


@dataclass(frozen=True)
class FittedProfile:
    name: str
    gpu: str
    date: str
    model: str                              # the geometry the step coefficients belong to
    base_hardware: str = "h200"             # preset whose other fields (memory, peer link) stay
    step_model: CalibratedStepModel = field(default_factory=CalibratedStepModel)
    d2h: LinkFit | None = None
    h2d: LinkFit | None = None
    host_overhead_s: float = 0.0            # scheduler time between back-to-back steps, folded in
    host_holds_steps: bool = False          # a step holds the host thread (measured: sim.calibration.host_hold)
    host_gap: dict[str, float] = field(default_factory=dict)  # after_eager, before_eager, per_row, per_copy (s)
    steps_wait_for: tuple[str, ...] = ()    # copy directions a step waits for when one is in flight
    copies_after_step: bool = False         # a copy submitted mid-step starts when the step ends
    quality: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)

    def hardware(self) -> HardwareSpec:
        """The base preset with the fitted copy links. The per-step fixed cost lives in the
        step model's intercept, so the preset's ``step_overhead_s`` is not added again."""
        hw = hardware_preset(self.base_hardware)
        changes: dict[str, Any] = {"name": self.name, "step_overhead_s": 0.0}
        latencies = [link.latency_s for link in (self.d2h, self.h2d) if link is not None]
        if self.d2h is not None:
            changes["d2h_gib_s"] = self.d2h.gib_s
        if self.h2d is not None:
            changes["h2d_gib_s"] = self.h2d.gib_s
        if latencies:
            changes["copy_latency_s"] = sum(latencies) / len(latencies)
        fastest = max(changes.get("d2h_gib_s", 0.0), changes.get("h2d_gib_s", 0.0))
        if fastest > hw.pcie_gib_s:  # measured beats the preset's link: the measurement wins
            changes["pcie_gib_s"] = fastest
        return replace(hw, **changes)

    def __post_init__(self) -> None:
        for key in self.host_gap:
            if key not in HOST_GAP_KEYS:
                raise ConfigError(f"profile.host_gap.{key}", self.host_gap[key], f"one of {', '.join(HOST_GAP_KEYS)}")
        for d in self.steps_wait_for:
            require(d in ("d2h", "h2d"), "profile.steps_wait_for", d, "d2h or h2d")
        object.__setattr__(self, "steps_wait_for", tuple(self.steps_wait_for))

    def step_time_model(self) -> CalibratedStepModel:
        """The fitted coefficients with the host's work between steps added: in the simulator
        the scheduler's own work takes no time, on the real engine it does (the base gap on
        every step, the gap on either side of a step with prompt tokens on that step, the
        per-row work on the decode rows). Copies submitted between steps are charged by the
        held host (``sim.host_thread``), which sees them."""
        sm, g = self.step_model, self.host_gap
        around_prompt = g.get("after_eager", 0.0) + g.get("before_eager", 0.0)
        return replace(sm, intercept=sm.intercept + self.host_overhead_s,
                       eager_step=sm.eager_step + around_prompt,
                       graph_prompt_step=sm.graph_prompt_step + around_prompt,
                       host_per_row=sm.host_per_row + g.get("per_row", 0.0))

    def world(self, cfg: WorldConfig, *, model: ModelGeometry | None = None) -> World:
        """A simulated instance on this profile: its copy links and step model, and, when the
        host holds steps, the host-clock runtime and an executor that holds it
        (``sim.host_thread``). A held host needs ``transfer="queued"`` (WorldConfig checks
        it): the real transfer enqueues the DMA when the copy is submitted, and a modelled
        copy that first waits for its own process to run would start late by a step."""
        from sim.world import build_world
        if self.host_holds_steps:
            cfg = replace(cfg, host="held")
        if self.copies_after_step:
            cfg = replace(cfg, copies_after_step=True)
        w = build_world(cfg, hardware=self.hardware(), model=model, step_model=self.step_time_model())
        if self.host_holds_steps and (self.host_gap.get("per_copy") or self.steps_wait_for):
            w.executor.attach_copies(w.transfer, per_copy_s=self.host_gap.get("per_copy", 0.0),  # type: ignore[attr-defined]
                                     wait_for=self.steps_wait_for)
        return w

    def check_model(self, model_name: str) -> None:
        require(model_name == self.model, "profile.model", self.model,
                f"a profile fitted on {model_name!r} (this one was fitted on {self.model!r}; "
                "step coefficients do not carry over between geometries)")

    # -- files ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps_wait_for"] = list(self.steps_wait_for)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FittedProfile:
        known = set(cls.__dataclass_fields__)
        for key in data:
            if key not in known:
                raise ConfigError(f"profile.{key}", data[key], f"one of {', '.join(sorted(known))}")
        d = dict(data)
        d["step_model"] = CalibratedStepModel.from_dict(d.get("step_model") or {})
        for link in ("d2h", "h2d"):
            if d.get(link) is not None:
                d[link] = LinkFit(**d[link])
        return cls(**d)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        header = (f"# Fitted by python -m experiments.calibrate on {self.gpu} ({self.date}).\n"
                  f"# Step coefficients are for {self.model}; see sim/profile.py.\n")
        p.write_text(header + yaml.safe_dump(self.to_dict(), sort_keys=False))
        return p

    @classmethod
    def load(cls, path: str | Path) -> FittedProfile:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError("profile", str(path), f"a readable profile YAML from experiments.calibrate ({err})") \
                from None
        if not isinstance(data, dict):
            raise ConfigError("profile", str(path), "a YAML mapping written by experiments.calibrate")
        return cls.from_dict(data)
