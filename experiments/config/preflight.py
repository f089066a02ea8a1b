"""Check a command line's overrides before Hydra starts any job.

Hydra reports a misspelt key or a wrong type as a composition stack trace, and only the
simulator's dataclasses know the ranges. Here every combination a ``-m`` grid would run
(past ``MAX_COMBOS``, every value of every axis once) is composed with Hydra's own compose
API and built (``experiments.config.build``); the first problem becomes ``error: KEY=VALUE
is invalid: expected ...`` and exit code 2, as does a workload key the run's kind never
reads. A search space (``interval(...)``, on the command line or in the sweeper's
``params``) is checked just inside both of its ends; each trial still checks its config
when it builds.
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from experiments.config.build import HIGHER_IS_BETTER, build
from experiments.config.schema import GROUPS, register
from openinfer.errors import ConfigError
from openinfer.variants import variant as parse_variant
from sim.workload_spec import KIND_ONLY_KEYS

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
MAX_COMBOS = 64


def user_overrides(argv: list[str]) -> list[str]:
    """The ``key=value`` arguments (Hydra's flags such as -m, --cfg job are not overrides)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                 "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"):
            skip = a not in ("--info", "-i")
            continue
        if a.startswith("-"):
            continue
        out.append(a)
    return out


def combinations(overrides: list[str]) -> list[list[str]]:
    """Every job a basic grid would run (sweeps of a hydra.* key or a search space excluded)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    axes: list[list[str]] = []
    for o in parsed:
        key = o.get_key_element()
        bare = key.lstrip("+~")   # +hydra.x / ~hydra.x are Hydra's settings as much as hydra.x
        if bare.startswith("hydra") and not bare.startswith(("hydra/launcher", "hydra/sweeper")):
            continue
        if o.is_sweep_override():
            if o.is_interval_sweep():   # a search space: checked just inside both of its ends
                axes.append([f"{key}={v}" for v in _inside_ends(o.value())])
                continue
            try:
                values = [f"{key}={v}" for v in o.sweep_string_iterator()]
            except Exception:  # noqa: BLE001 - a search space only the sweeper understands
                continue
            axes.append(values)
        else:
            axes.append([o.input_line])
    if not axes:
        return [[]]
    combos = [list(c) for c in itertools.islice(itertools.product(*axes), MAX_COMBOS)]
    # Past the first MAX_COMBOS, still try every value of every axis once (row i takes
    # value i of each axis, or its last): a bad value late in a long axis must not wait
    # for its job. The check then costs one compose per value of the longest axis.
    longest = max(len(a) for a in axes)
    cover = [[a[min(i, len(a) - 1)] for a in axes] for i in range(longest)]
    return combos + [c for c in cover if c not in combos]


def _inside_ends(space: IntervalSweep) -> list[int | float]:
    """Two points of an Optuna interval, 1% in from each end (an open end such as qps > 0
    stays valid): a range that is mostly out of bounds fails here, not as trial after trial
    of a study that reports the bad trials' inf as its result."""
    lo, hi = float(space.start), float(space.end)
    if "int" in space.tags or isinstance(space.start, int) and isinstance(space.end, int):
        return [int(lo), int(hi)]      # int(interval(...)): Optuna draws integers from it
    step = (hi - lo) / 100
    return [lo + step, hi - step]


def unread_workload_keys(overrides: list[str], kind: str) -> dict[str, str]:
    """The workload keys set in ``overrides`` that ``kind`` never reads, each with the
    kind that does."""
    out = {}
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        for other, keys in KIND_ONLY_KEYS.items():
            if other != kind and key in {f"workload.{k}" for k in keys}:
                out[key] = other
    return out


def _unread_problem(unread: dict[str, tuple[str, str]]) -> str | None:
    for key, (kind, other) in unread.items():
        return (f"{key} is only read by workload.kind={other}, and every job of this command "
                f"has workload.kind={kind}: drop it or set workload.kind={other}")
    return None


# Keys a user reaches for after seeing conf/profiles/ (a folder of fitted profiles, read by
# path, that Hydra's --help lists as if it were a group).
FITTED_PROFILE_KEYS = ("profile", "profiles", "calibration")
FITTED_PROFILE_HINT = ("a fitted profile runs through python -m experiments.simulate "
                       "profile=conf/profiles/NAME.yaml; these jobs use the roofline step model")


def _allowed_keys(full_key: str) -> str:
    group = full_key.split(".", 1)[0]
    if group in GROUPS:
        from dataclasses import fields
        return f"one of the keys {', '.join(f.name for f in fields(GROUPS[group]))} of {group}"
    hint = f" ({FITTED_PROFILE_HINT})" if group in FITTED_PROFILE_KEYS else ""
    return f"one of the groups {', '.join(GROUPS)}{hint}"


def _options(group: str, config_name: str) -> list[str]:
    d = CONF_DIR / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _is_variant(name: str) -> bool:
    try:
        parse_variant(name)
    except ConfigError:
        return False
    return True


def _omegaconf_cause(err: BaseException) -> OmegaConfBaseException | None:
    """The OmegaConf error under Hydra's wrapping, which names the full key."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__
    return cause


def explain(err: BaseException, config_name: str = "config") -> str:
    """One line naming the key, the value and what is accepted."""
    if isinstance(err, ConfigError):
        return str(err)
    cause = _omegaconf_cause(err)
    if cause is not None:
        full_key = str(getattr(cause, "full_key", "") or "")
        msg = str(cause).splitlines()[0]
        value = getattr(cause, "value", None)
        if "not in" in msg or "Key '" in msg and "not" in msg:
            return f"{full_key or msg}: no such key; expected {_allowed_keys(full_key)}"
        m = re.search(r"could not be converted to (\w+)", msg) or re.search(r"Value '.*' is not a valid (\w+)", msg)
        expected = f"a value of type {m.group(1).lower()}" if m else msg
        shown = f"{value!r}" if value is not None else re.sub(r"^Value '(.*?)'.*", r"'\1'", msg)
        return f"{full_key}={shown} is invalid: expected {expected}"
    text = str(err)
    m = re.search(r"Could not find '([^']+)/([^'/]+)'", text)   # the group may be nested: hydra/sweeper
    if isinstance(err, MissingConfigException) or m:
        if m:
            group, option = m.group(1), m.group(2)
            opts = _options(group, config_name)
            if group == "variant" and _is_variant(option):
                return (f"variant={option} is invalid: expected a preset, one of {', '.join(opts)}; "
                        f"any mix runs as variant.names=[{option}]")
            if group.startswith("hydra/"):
                opts.append("or an installed Hydra plugin's")
            return f"{group}={option} is invalid: expected one of {', '.join(opts)}"
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        return f"{m.group(1)}: no such key; expected {_allowed_keys(m.group(1))}"
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


def _hydra_keys_problem(argv: list[str], config_name: str) -> str | None:
    """``hydra.sweeper.*`` / ``hydra.launcher.*`` settings, checked against the plugin's own
    config (the jobs' compose above leaves hydra.* out). Sweeps of them are the sweeper's."""
    overrides = user_overrides(argv)
    keys = [o for o in overrides if o.lstrip("+~").startswith(("hydra.sweeper.", "hydra.launcher."))]
    if not keys or any("," in o or "(" in o for o in keys):
        return None
    groups = [o for o in overrides if o.startswith(("hydra/sweeper=", "hydra/launcher="))]
    try:
        compose(config_name=config_name, overrides=groups + keys, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        cause = _omegaconf_cause(err)
        node = re.search(r"not in '(\w+)'", str(cause)) if cause is not None else None
        key = str(getattr(cause, "full_key", "") or "")
        if key and node:   # a misspelt key; a bad value is explained as any other
            return (f"{key}: no such key; expected a key of {node.group(1)} "
                    "(python -m experiments.sweep --cfg hydra lists them)")
        return explain(err, config_name)
    return None


def _direction_problem(argv: list[str], config_name: str, objectives: set[str]) -> str | None:
    """An optimising sweeper's direction against the objective's sense: a study that minimises
    request_throughput finds the worst setting and reports it as the best."""
    overrides = user_overrides(argv)
    if not any(o.startswith("hydra/sweeper=") for o in overrides):
        return None
    fixed = [o for o in overrides if o.startswith(("hydra/sweeper=", "hydra.sweeper.direction="))]
    sweeper = compose(config_name=config_name, overrides=fixed, return_hydra_config=True).hydra.sweeper
    direction = sweeper.get("direction")
    if direction is None:   # a sweeper that does not optimise
        return None
    if direction not in ("minimize", "maximize"):
        return f"hydra.sweeper.direction={direction} is invalid: expected minimize or maximize"
    for objective in sorted(objectives):
        wants = "maximize" if objective in HIGHER_IS_BETTER else "minimize"
        if direction != wants:
            return (f"experiment.objective={objective} is invalid with hydra.sweeper.direction={direction}: "
                    f"{'higher' if wants == 'maximize' else 'lower'} is better for it, so set "
                    f"hydra.sweeper.direction={wants} (or pick an objective to {direction})")
    return None


def _null_params_problem(argv: list[str], config_name: str) -> str | None:
    """A ``hydra.sweeper.params={...}`` override for a sweeper whose params are null (Hydra's
    basic sweeper): OmegaConf cannot merge a dict into null and Hydra dies with an
    AttributeError. The same grid goes on the command line as plain overrides."""
    overrides = user_overrides(argv)
    given = [o for o in overrides if o.lstrip("+").startswith("hydra.sweeper.params")]
    if not given:
        return None
    groups = [o for o in overrides if o.startswith("hydra/sweeper=")]
    sweeper = compose(config_name=config_name, overrides=groups, return_hydra_config=True).hydra.sweeper
    if "params" not in sweeper or sweeper.params is not None:
        return None
    value = OverridesParser.create().parse_override(given[0].lstrip("+")).value()
    if value is None or value == {}:   # no params: what the basic sweeper has already
        return None

    def as_sweep(v: object) -> str:
        return ",".join(map(str, v)) if isinstance(v, list) else str(v)

    plain = (" ".join(f"{k}={as_sweep(v)}" for k, v in value.items())
             if isinstance(value, dict) else "")
    return (f"{given[0]} is invalid with Hydra's basic sweeper (it cannot take params from the "
            f"command line): give the grid as overrides{': ' + plain if plain else ''}, "
            "or pick an Optuna sweeper (hydra/sweeper=host_tier or pool_and_tier)")


def sweeper_params(overrides: list[str], config_name: str) -> list[str]:
    """The sweeper's ``params`` (its config's, or a ``hydra.sweeper.params`` override) as
    overrides, less the keys the command line sets itself (Hydra's basic sweeper lets the
    command line win; Optuna lets a fixed value win over a search space wherever either is
    given, so there a command-line space over a fixed param is checked, not skipped): a bad
    search space there runs trial after trial of a study whose bad trials report inf."""
    hydra_side = [o for o in overrides
                  if o.startswith("hydra/sweeper=") or o.lstrip("+~").startswith("hydra.sweeper.params")]
    try:
        sweeper = compose(config_name=config_name, overrides=hydra_side,
                          return_hydra_config=True).hydra.sweeper
        given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        return [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items() if k not in given]
    except Exception:  # noqa: BLE001 - params this cannot read are left to Hydra, as before
        return []


def check(argv: list[str], config_name: str = "config") -> str | None:
    """The first problem of any job the command line would run, or None."""
    register()
    GlobalHydra.instance().clear()
    unread: dict[str, tuple[str, str]] | None = None   # key -> (a job's kind, the kind reading it)
    objectives: set[str] = set()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            overrides = user_overrides(argv)
            try:
                multirun = "-m" in argv or "--multirun" in argv   # only a sweep reads params
                combos = combinations(overrides + (sweeper_params(overrides, config_name)
                                                   if multirun else []))
            except HydraException as err:
                return f"cannot parse the overrides: {str(err).splitlines()[0]}"
            for combo in combos:
                try:
                    cfg = compose(config_name=config_name, overrides=combo)
                    build(cfg)
                except (HydraException, OmegaConfBaseException, ConfigError) as err:
                    return explain(err, config_name)
                if config_name == "sweep" and len(cfg.variant.names) != 1:
                    return (f"variant.names={list(cfg.variant.names)} is invalid for a sweep: expected one "
                            "variant a job (a job returns one objective); sweep over them instead, "
                            "e.g. -m variant=pr829,fixed")
                objectives.add(cfg.experiment.objective)
                kind = cfg.workload.kind
                here = {k: (kind, other) for k, other in unread_workload_keys(combo, kind).items()}
                # a key some job reads is fine (a grid over both kinds may set chat's turns)
                unread = here if unread is None else {k: v for k, v in unread.items() if k in here}
            problem = (_null_params_problem(argv, config_name)
                       or _hydra_keys_problem(argv, config_name)
                       or _direction_problem(argv, config_name, objectives))
            if problem is not None:
                return problem
    finally:
        GlobalHydra.instance().clear()
    return _unread_problem(unread or {})


def guard(argv: list[str], config_name: str) -> None:
    """Exit 2 with one line on stderr when the overrides are wrong."""
    problem = check(argv, config_name)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
