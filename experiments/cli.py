"""``key=value`` command lines checked against a dataclass before anything runs.

A misspelt key or a value of the wrong type stops the command with one line naming the
key and what it accepts, instead of a stack trace halfway through a run.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from openinfer.errors import ConfigError

T = TypeVar("T")


def parse_overrides(cls: type[T], argv: list[str]) -> T:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if any(a in ("-h", "--help") for a in argv):
        print(usage(cls, hints))
        raise SystemExit(0)
    values: dict[str, Any] = {}
    for arg in argv:
        key, sep, raw = arg.partition("=")
        if not sep:
            raise ConfigError(arg, None, "key=value")
        if key not in fields:
            raise ConfigError(key, raw, f"one of the keys {', '.join(sorted(fields))}")
        values[key] = _coerce(key, raw, hints[key])
    for name in _required(cls):
        if name not in values:
            raise ConfigError(name, None, f"a value ({name} is required; see --help)")
    cfg = cls(**values)
    check_read = getattr(cfg, "check_keys_read", None)
    if check_read is not None:   # keys the config's own choices leave unread: refuse, not drop
        check_read(set(values))
    return cfg


def comma_list(text: str) -> list[str]:
    """The items of a ``a,b,c`` value, each stripped, empty ones dropped
    (``sections=golden,`` and a quoted ``"sections=golden, offload"`` read as meant)."""
    return [s.strip() for s in str(text).split(",") if s.strip()]


def _required(cls: type) -> list[str]:
    """Fields without a default: the keys a command cannot run without."""
    return [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]


def usage(cls: type, hints: dict[str, Any]) -> str:
    """The docstring of the command (the module that defines its config), then every key
    with its type and default; keys without one are marked required."""
    mod = sys.modules.get(cls.__module__)
    doc = (getattr(mod, "__doc__", None) or cls.__doc__ or "").strip()
    required = _required(cls)
    header = ("keys (key=value; each optional unless marked required):" if required
              else "keys (key=value; each optional):")
    lines = [doc, "", header] if doc else [header]
    for f in dataclasses.fields(cls):
        if f.name in required:
            tail = "required"
        elif f.default is not dataclasses.MISSING:
            tail = f"default {f.default!r}"
        else:
            tail = f"default {f.default_factory()!r}"  # type: ignore[misc]
        typ = getattr(hints[f.name], "__name__", str(hints[f.name]))
        lines.append(f"  {f.name:<24} {typ:<14} {tail}")
    return "\n".join(lines)


def _coerce(key: str, raw: str, typ: Any) -> Any:
    text = str(typ)
    try:
        if typ is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return raw.lower() in ("true", "1")
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        if "None" in text and raw.lower() in ("null", "none", ""):
            return None
        if "float" in text:
            return float(raw)
        if "int" in text:
            return int(raw)
        return raw
    except ValueError:
        raise ConfigError(key, raw, f"a value of type {getattr(typ, '__name__', text)}") from None


def main_guard(fn):  # type: ignore[no-untyped-def]
    """Run ``fn(argv)``; a ConfigError becomes one clear line on stderr and exit code 2."""
    def wrapper() -> None:
        try:
            fn(sys.argv[1:])
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
    return wrapper


def write_report(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
