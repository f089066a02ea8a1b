"""Error types shared by every layer.

Two families, because callers react differently: a :class:`ConfigError` is the user's to
fix before a run starts (it names the field and what is accepted), an
:class:`AccountingError` is a bug in the caller that would silently corrupt page
accounting if it were allowed to continue.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """Bad input: names the offending field and the accepted values."""

    def __init__(self, field: str, value: Any, accepted: str) -> None:
        self.field = field
        self.value = value
        self.accepted = accepted
        super().__init__(f"{field}={value!r} is invalid: expected {accepted}")


class AccountingError(RuntimeError):
    """API misuse that would corrupt accounting (double release, commit without reserve)."""


def require(condition: bool, field: str, value: Any, accepted: str) -> None:
    """Raise :class:`ConfigError` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, value, accepted)


def is_power_of_two(n: int) -> bool:
    return isinstance(n, int) and n > 0 and (n & (n - 1)) == 0
