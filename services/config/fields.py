"""How a setting is declared and parsed: one dataclass field per env var, validated once."""

from __future__ import annotations

from dataclasses import field
from typing import Any

# Who needs to know a setting: a deployer (essential), someone tuning a running
# service (tuning), or someone hunting a problem (diagnostic).
TIERS = ("essential", "tuning", "diagnostic")


class SettingsError(ValueError):
    """A setting has a value the app cannot use."""


def setting(default: Any, env: str, doc: str, minimum: float | None = None, tier: str = "tuning") -> Any:
    """A settings field read from `env`; `doc` is its line in the reference, `minimum` its lower bound."""
    if tier not in TIERS:
        raise ValueError(f"{env}: tier {tier!r} is not one of {TIERS}")
    return field(default=default, metadata={"env": env, "doc": doc, "min": minimum, "tier": tier})


def parse(env: str, raw: str, kind: str, minimum: float | None) -> Any:
    """Parse one env value by the field's declared type name."""
    if kind == "str":
        return raw
    if kind == "bool":
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{env}={raw!r} is not a boolean (use true or false)")
    try:
        value: float = int(raw) if kind == "int" else float(raw)
    except ValueError:
        expected = "a whole number" if kind == "int" else "a number"
        raise SettingsError(f"{env}={raw!r} is not {expected}") from None
    if minimum is not None and value < minimum:
        raise SettingsError(f"{env}={raw!r} must be at least {minimum:g}")
    return value
