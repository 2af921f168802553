"""``Rate``: the rule of a rate limiter, at most N starts in any window of P seconds, written
``"10/s"`` or ``"5/10s"``; and what a limiter answers, ``RateReply`` and ``RateState``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from .checks import check_duration

#: The longest period a rule takes: 30 days (a start is kept in Redis for one period).
MAX_RATE_PERIOD = 30 * 24 * 3600
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_FORM = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d*)?|\.\d+)?\s*([smhd])\s*")
_SHAPE = "'N/period' such as '10/s', '100/m' or '5/10s'"


@dataclass(frozen=True)
class Rate:
    """At most ``limit`` starts in any window of ``period`` seconds."""

    limit: int
    period: float

    def __post_init__(self) -> None:
        if type(self.limit) is not int or self.limit < 1:
            raise ValueError(f"limit must be an int >= 1 (starts per period), got {self.limit!r}")
        period = check_duration(
            self.period,
            "period",
            minimum=0.001,
            include_minimum=True,
            maximum=MAX_RATE_PERIOD,
            example="1",
            too_long=" (30 days)",
        )
        object.__setattr__(self, "period", period)  # an int period reads as float seconds

    @classmethod
    def parse(cls, value: str | Rate, parameter: str = "rate") -> Rate:
        """``value`` as a rule: ``"10/s"``, ``"100/m"``, ``"1/h"``, ``"5/d"``, ``"5/10s"``,
        ``"3/2.5s"``, ``"100/15m"`` (units s, m, h, d; spaces around the parts are fine), or a
        :class:`Rate` as it is. The error names ``parameter`` and shows the accepted form."""
        if isinstance(value, Rate):
            return value
        if not isinstance(value, str):
            raise TypeError(f"{parameter} must be {_SHAPE}, or a Rate, got {value!r}")
        match = _FORM.fullmatch(value)
        if match is None:
            raise ValueError(f"{parameter} must be {_SHAPE}, got {value!r}")
        count, every, unit = match.groups()
        limit, period = int(count), float(every or 1) * _UNITS[unit]
        if limit < 1:
            raise ValueError(f"{parameter} must allow at least 1 start ({_SHAPE}), got {value!r}")
        if not 0.001 <= period <= MAX_RATE_PERIOD:
            raise ValueError(
                f"{parameter} must have a period from 1 ms to 30 days ({_SHAPE}), got {value!r}"
            )
        return cls(limit, period)

    @property
    def period_ms(self) -> int:
        return round(self.period * 1000)

    def __str__(self) -> str:
        # the largest unit the period is a whole number of: "10/s", "100/15m", "3/2.5s"
        for unit, size in _UNITS.items():
            count = self.period / size
            if count.is_integer():
                return f"{self.limit}/{'' if count == 1 else int(count)}{unit}"
        return f"{self.limit}/{self.period!r}s"


class RateReply(NamedTuple):
    """What :meth:`RateLimiter.try_acquire` decided (lua/rate_take.lua's reply, typed)."""

    admitted: bool
    #: seconds until this call's turn (0.0 when admitted)
    wait: float = 0.0
    #: starts in the window ending now (this one included when admitted)
    used: int = 0
    #: Redis's clock at the decision, Unix seconds with microseconds (when admitted: this
    #: call's start as the limiter counts it)
    at: float = 0.0
    #: seconds the limiter stays paused (0.0: not paused)
    paused: float = 0.0

    def __bool__(self) -> bool:
        # A tuple with fields is always true: `if limiter.try_acquire():` must mean "admitted".
        return self.admitted


class RateState(NamedTuple):
    """One rate limiter as an operator sees it (lua/rate_inspect.lua's reply, typed)."""

    name: str
    #: the rule last used on it (0 and 0.0 when unknown)
    limit: int
    period: float
    #: starts in the window ending now
    used: int
    #: calls with a turn reserved
    waiting: int
    #: seconds until a new call would be admitted (0.0: now)
    next_free: float
    #: seconds of pause left (0.0: none)
    paused: float
