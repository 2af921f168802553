"""``RateLimiter``: at most N starts in any window of a period, across every process, counted on
Redis's clock. Two keys per limiter (:class:`~.keys.RateKeys`), one script per decision
(lua/rate_take.lua): exact over any window, and a call over the limit is handed a *turn*, a
time when it will be admitted, so calls refused together come back one by one.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import scripts
from .checks import RedisClient, check_backend_timeout, check_client, check_duration
from .commands import backend_errors, text
from .deadline import bounded
from .keys import RateKeys, check_prefix

__all__ = ["Rate", "RateLimiter", "RateReply", "RateState", "read_state"]

#: the longest period a rate may have, seconds (30 days)
MAX_PERIOD_SECONDS = 30 * 86_400
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_FORM = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*$")


@dataclass(frozen=True)
class Rate:
    """``limit`` starts in any window of ``period`` seconds."""

    limit: int
    period: float

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"a rate's limit must be a whole number >= 1, got {self.limit!r}")
        check_duration(self.period, "a rate's period", maximum=MAX_PERIOD_SECONDS)
        if self.period < 0.001:
            raise ValueError(f"a rate's period must be at least 1 ms, got {self.period!r} s")

    @classmethod
    def parse(cls, value: str | Rate, parameter: str = "rate") -> Rate:
        """``"10/s"``, ``"100/m"``, ``"1/h"``, ``"5/d"``, ``"5/10s"``, ``"3/2.5s"`` (a
        :class:`Rate` is returned as it is); an error names ``parameter`` and the form."""
        if isinstance(value, Rate):
            return value
        form = "'N/period' such as '10/s', '100/m', '1/h' or '5/10s'"
        if not isinstance(value, str):
            raise TypeError(f"{parameter} must be {form}, got {value!r}")
        match = _FORM.match(value)
        if match is None:
            raise ValueError(f"{parameter} must be {form}, got {value!r}")
        limit, count, unit = int(match[1]), float(match[2] or 1), match[3]
        period = count * _UNITS[unit]
        if limit < 1 or not 0.001 <= period <= MAX_PERIOD_SECONDS:
            raise ValueError(
                f"{parameter} must allow at least 1 start in a period from 1 ms to 30 days, "
                f"got {value!r}"
            )
        return cls(limit, period)

    @property
    def period_ms(self) -> int:
        return max(1, round(self.period * 1000))

    def __str__(self) -> str:
        for unit, seconds in (("d", 86_400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            if self.period == seconds:
                return f"{self.limit}/{unit}"
        return f"{self.limit}/{self.period:g}s"


class RateReply(NamedTuple):
    """What a limiter answered one call (lua/rate_take.lua's reply, typed)."""

    admitted: bool
    #: seconds until this call's turn (0.0 when admitted)
    wait: float = 0.0
    #: starts in the window ending now (this one included when admitted)
    used: int = 0
    #: Redis's clock at the decision (Unix seconds): when admitted, the start it counted
    at: float = 0.0
    #: seconds the limiter stays paused (0.0: not paused)
    paused: float = 0.0

    def __bool__(self) -> bool:
        return self.admitted


class RateState(NamedTuple):
    """A limiter as an operator sees it."""

    name: str
    #: the rule last used on it (0 and 0.0 when unknown)
    limit: int
    period: float
    #: starts in the window ending now
    used: int
    #: calls holding a turn
    waiting: int
    #: seconds until a new call would start (0.0: now)
    next_free: float
    #: seconds of pause left (0.0: none)
    paused: float


class RateLimiter:
    """At most ``rate.limit`` starts in any window of ``rate.period`` seconds, across every
    process using ``name`` under ``prefix``, counted on Redis's clock. ``backend_timeout``
    bounds each call as :class:`ReentrantLock`'s does."""

    __slots__ = ("_backend_timeout", "_client", "keys", "name", "prefix", "rate")

    def __init__(
        self,
        client: RedisClient,
        name: str,
        rate: Rate | str,
        *,
        prefix: str = "lock",
        backend_timeout: float | None = None,
    ) -> None:
        self._client: Any = check_client(client)
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        self.name = name
        self.rate = Rate.parse(rate)
        self.prefix = check_prefix(prefix)
        self._backend_timeout = check_backend_timeout(backend_timeout)
        self.keys = RateKeys.for_name(self.prefix, name)

    def try_acquire(self, call_id: str | None = None) -> RateReply:
        """This call's turn now, or the seconds until it (one round trip). ``call_id``: the
        caller's own stable id; refused, the call keeps a turn under it, and the same id coming
        back is that turn's owner (``None``: a new id, a turn nobody comes back for)."""
        call = call_id or uuid.uuid4().hex
        args = (self.rate.limit, self.rate.period_ms, call)
        with bounded(self._backend_timeout), backend_errors("take a turn of", self.name):
            admitted, wait, used, now, paused = scripts.RATE_TAKE(
                self._client, self.keys.pair, args
            )
        return RateReply(
            int(admitted) == 1,
            float(text(wait)) / 1000,
            int(used),
            float(text(now)) / 1000,
            float(text(paused)) / 1000,
        )

    def acquire(self, timeout: float | None = None, call_id: str | None = None) -> RateReply:
        """Wait for this call's turn, up to ``timeout`` seconds (``None``: as long as it takes;
        ``0``: one try). Returns the admitting reply, or the last refusal when time ran out."""
        limit = check_duration(
            timeout, "timeout", minimum=0.0, include_minimum=True, maximum=None, allow_none=True
        )
        call = call_id or uuid.uuid4().hex
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            reply = self.try_acquire(call)
            if reply.admitted:
                return reply
            left = math.inf if deadline is None else deadline - time.monotonic()
            if left <= 0 or reply.wait > left:
                if left > 0:
                    self.cancel(call)  # its turn comes too late: nobody comes back for it
                return reply
            time.sleep(reply.wait)

    def pause(self, seconds: float) -> float:
        """Refuse every call of this limiter for ``seconds`` from now (Redis's clock): a pause
        only lengthens the pause in force. Returns the seconds of pause left."""
        pause_ms = max(1, math.ceil(check_duration(seconds, "seconds") * 1000))
        with bounded(self._backend_timeout), backend_errors("pause", self.name):
            left = scripts.RATE_PAUSE(self._client, self.keys.pair, (pause_ms,))
        return float(text(left)) / 1000

    def cancel(self, call_id: str) -> bool:
        """Give up ``call_id``'s turn (a call that will not come back); whether it had one."""
        with bounded(self._backend_timeout), backend_errors("cancel a turn of", self.name):
            return bool(self._client.zrem(self.keys.log, f"r:{call_id}"))

    def reset(self) -> bool:
        """An operator's reset: forget the starts, the turns and the pause (the calls waiting
        for a turn are admitted as new calls when they come back). Whether it was in use."""
        with bounded(self._backend_timeout), backend_errors("reset", self.name):
            return bool(self._client.delete(*self.keys.pair))

    def inspect(self) -> RateState:
        """The limiter now, read in one step."""
        with bounded(self._backend_timeout):
            return read_state(self._client, self.keys)

    def __repr__(self) -> str:
        return f"<RateLimiter {self.keys.log!r} {self.rate}>"


def read_state(client: Any, keys: RateKeys) -> RateState:
    """The limiter whose keys are ``keys``, read in one step (lua/rate_inspect.lua)."""
    with backend_errors("inspect", keys.name, f"rate limiter {keys.name!r}"):
        reply = scripts.RATE_INSPECT(client, keys.pair, ())
    limit, period_ms, used, waiting, next_free, paused = reply
    return RateState(
        keys.name,
        int(limit),
        int(period_ms) / 1000,
        int(used),
        int(waiting),
        float(text(next_free)) / 1000,
        float(text(paused)) / 1000,
    )
