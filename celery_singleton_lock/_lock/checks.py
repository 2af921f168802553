"""Checks of the lock's arguments: a clear ``TypeError`` / ``ValueError`` naming the parameter,
raised before anything is sent to Redis.

:func:`check_duration` is the package's one check of "a number of seconds": the lock's leases,
waits and backend timeout here, and the Celery layer's settings and task options, call it with
their own bounds.
"""

from __future__ import annotations

import math
from typing import Literal, overload

__all__ = [
    "MAX_LEASE_SECONDS",
    "check_backend_timeout",
    "check_duration",
    "check_lease_ms",
    "check_wait",
]

#: The longest lease the lock takes: ten years, longer than any real countdown plus queue
#: lease, and far below what the scripts can write exactly (lease + meta retention < 2**53 ms).
MAX_LEASE_SECONDS = 10 * 365 * 24 * 3600


def _shown(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


@overload
def check_duration(
    value: object,
    parameter: str,
    *,
    minimum: float = ...,
    include_minimum: bool = ...,
    maximum: float | None = ...,
    allow_none: Literal[False] = ...,
    none_means: str = ...,
    example: str = ...,
    too_long: str = ...,
) -> float: ...


@overload
def check_duration(
    value: object,
    parameter: str,
    *,
    minimum: float = ...,
    include_minimum: bool = ...,
    maximum: float | None = ...,
    allow_none: bool,
    none_means: str = ...,
    example: str = ...,
    too_long: str = ...,
) -> float | None: ...


def check_duration(
    value: object,
    parameter: str,
    *,
    minimum: float = 0.0,
    include_minimum: bool = False,
    maximum: float | None = MAX_LEASE_SECONDS,
    allow_none: bool = False,
    none_means: str = "no bound",
    example: str = "30",
    too_long: str = "",
) -> float | None:
    """``value`` as float seconds, or an error that names ``parameter`` and says what it takes.

    The one check of a duration in the package: a real number (``bool`` is not one), finite,
    above ``minimum`` (or equal to it with ``include_minimum``) and at most ``maximum``
    (``None``: no upper bound); ``None`` itself only with ``allow_none`` (the message says it
    means ``none_means``). A value of the wrong type is a ``TypeError``, a number out of bounds
    (NaN and infinities included) a ``ValueError``; ``too_long`` is appended to the message of
    a value above ``maximum`` (how to fix it)."""
    if value is None and allow_none:
        return None
    or_none = f", or None ({none_means})" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{parameter} must be a number of seconds such as {example}{or_none}, got {value!r}"
        )
    low = f">= {_shown(minimum)}" if include_minimum else f"> {_shown(minimum)}"
    if maximum is None:
        bounds = f"a finite number of seconds {low}"
    else:
        ten_years = " (ten years)" if maximum == MAX_LEASE_SECONDS else ""
        bounds = f"{low} and at most {_shown(maximum)} seconds{ten_years}"
    if not math.isfinite(value) or not (value >= minimum if include_minimum else value > minimum):
        raise ValueError(f"{parameter} must be {bounds}{or_none}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{parameter} must be {bounds}{or_none}, got {value!r}{too_long}")
    return float(value)


def check_wait(value: object, parameter: str = "timeout") -> float | None:
    """A wait in seconds: ``None`` (no bound) or a number >= 0."""
    return check_duration(
        value, parameter, include_minimum=True, maximum=None, allow_none=True, example="10"
    )


def check_backend_timeout(value: object, parameter: str = "backend_timeout") -> float | None:
    """How long one lock operation may wait for Redis in all: ``None`` (no bound beyond the
    client's own) or a number of seconds > 0 (zero would fail every call unsent)."""
    return check_duration(
        value,
        parameter,
        maximum=None,
        allow_none=True,
        none_means="no bound beyond the client's own",
        example="5",
    )


def check_lease_ms(value: object, parameter: str = "lease") -> int:
    """A lease in seconds, at least a millisecond, as whole milliseconds."""
    seconds = check_duration(
        value,
        parameter,
        minimum=0.001,
        include_minimum=True,
        too_long=(
            ": a lease is how long a lock outlives a holder that died; keep it short and let "
            "the heartbeat renew it"
        ),
    )
    return round(seconds * 1000)
