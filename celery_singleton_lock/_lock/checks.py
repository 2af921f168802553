"""Checks of the lock's arguments: a clear ``TypeError`` / ``ValueError`` naming the parameter,
raised before anything is sent to Redis."""

from __future__ import annotations

import math

__all__ = ["check_lease_ms", "check_seconds", "check_wait"]


def check_seconds(value: object, parameter: str, *, allow_none: bool = False) -> float | None:
    """``value`` as float seconds (``None`` only with ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{parameter} must be a number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{parameter} must be finite, got {value!r}")
    return float(value)


def check_wait(value: object, parameter: str = "timeout") -> float | None:
    """A wait in seconds: ``None`` (no bound) or a number >= 0."""
    wait = check_seconds(value, parameter, allow_none=True)
    if wait is not None and wait < 0:
        raise ValueError(f"{parameter} must be >= 0 or None, got {value!r}")
    return wait


def check_lease_ms(value: object, parameter: str = "lease") -> int:
    """A lease in seconds, at least a millisecond, as whole milliseconds."""
    seconds = check_seconds(value, parameter)
    assert seconds is not None
    if seconds < 0.001:
        raise ValueError(f"{parameter} must be at least 0.001 s (one millisecond), got {value!r}")
    return round(seconds * 1000)
