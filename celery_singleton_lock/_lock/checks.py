"""Checks of the lock's arguments: a clear ``TypeError`` / ``ValueError`` naming the parameter,
raised before anything is sent to Redis."""

from __future__ import annotations

import math

__all__ = [
    "MAX_LEASE_SECONDS",
    "check_backend_timeout",
    "check_lease_ms",
    "check_seconds",
    "check_wait",
]

#: The longest lease the lock takes: ten years, longer than any real countdown plus queue
#: lease, and far below what the scripts can write exactly (lease + meta retention < 2**53 ms).
MAX_LEASE_SECONDS = 10 * 365 * 24 * 3600


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


def check_backend_timeout(value: object, parameter: str = "backend_timeout") -> float | None:
    """How long one lock operation may wait for Redis in all: ``None`` (no bound beyond the
    client's own) or a number of seconds > 0 (zero would fail every call unsent)."""
    seconds = check_seconds(value, parameter, allow_none=True)
    if seconds is not None and seconds <= 0:
        raise ValueError(f"{parameter} must be > 0 seconds or None, got {value!r}")
    return seconds


def check_lease_ms(value: object, parameter: str = "lease") -> int:
    """A lease in seconds, at least a millisecond, as whole milliseconds."""
    seconds = check_seconds(value, parameter)
    assert seconds is not None
    if seconds < 0.001:
        raise ValueError(f"{parameter} must be at least 0.001 s (one millisecond), got {value!r}")
    if seconds > MAX_LEASE_SECONDS:
        raise ValueError(
            f"{parameter} must be at most {MAX_LEASE_SECONDS} s (ten years), got {value!r}: a "
            "lease is how long a lock outlives a holder that died; keep it short and let the "
            "heartbeat renew it"
        )
    return round(seconds * 1000)
