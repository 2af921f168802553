"""``RateLimiter``: at most N starts in any window of P seconds, across every process, on Redis's
clock (lua/rate_take.lua); ``Rate``, its rule (``"10/s"``, ``"5/10s"``), and its replies."""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import scripts
from .checks import RedisClient, check_backend_timeout, check_client, check_duration, check_wait
from .commands import backend_errors, text
from .deadline import bounded
from .keys import RateKeys, check_name, check_prefix

_log = logging.getLogger("celery_singleton_lock.rate")

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
        ``"3/2.5s"`` (units s, m, h, d), or a :class:`Rate` as it is."""
        if isinstance(value, Rate):
            return value
        if not isinstance(value, str):
            raise TypeError(f"{parameter} must be {_SHAPE}, or a Rate, got {value!r}")
        match = _FORM.fullmatch(value)
        if match is None:
            raise ValueError(f"{parameter} must be {_SHAPE}, got {value!r}")
        count, every, unit = match.groups()
        try:
            return cls(int(count), float(every or 1) * _UNITS[unit])
        except ValueError:  # (__post_init__'s words name no parameter)
            bounds = "at least 1 start in a period from 1 ms to 30 days"
            raise ValueError(f"{parameter} must allow {bounds} ({_SHAPE}), got {value!r}") from None

    @property
    def period_ms(self) -> int:
        return round(self.period * 1000)

    def __str__(self) -> str:
        # in the largest unit the period is a whole number of
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
    #: Redis's clock at the decision, Unix seconds (when admitted: this call's start)
    at: float = 0.0
    #: seconds the limiter stays paused (0.0: not paused)
    paused: float = 0.0

    def __bool__(self) -> bool:
        # `if limiter.try_acquire():` must mean "admitted"
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


def _check_call_id(call_id: object) -> str:
    if not isinstance(call_id, str) or not call_id:
        raise TypeError(
            f"call_id must be a non-empty str (the caller's stable id, such as a Celery task "
            f"id), or None for a call that keeps no turn, got {call_id!r}"
        )
    return call_id


def inspect_rate(
    client: Any, keys: RateKeys, rate: Rate | None = None, backend_timeout: float | None = None
) -> RateState:
    """The limiter of ``keys`` now; ``rate``: the rule to assume when Redis has none."""
    rule = (rate.limit, rate.period_ms) if rate is not None else (0, 0)
    with bounded(backend_timeout), backend_errors("inspect", keys.name, _subject(keys.name)):
        limit, period, used, waiting, free, paused = scripts.RATE_INSPECT(client, keys.pair, rule)
    return RateState(
        keys.name, int(limit), _secs(period), int(used), int(waiting), _secs(free), _secs(paused)
    )


def _secs(ms: Any) -> float:
    """A script's milliseconds (an int, or a float as text) as seconds."""
    return float(text(ms)) / 1000


def _subject(name: str) -> str:
    return f"rate limiter {name!r}"


class RateLimiter:
    """At most ``rate.limit`` starts in any window of ``rate.period`` seconds, across every
    process, counted on Redis's clock.

    Each try is one ``EVALSHA``. A refused call is given a turn (the earliest time it can start
    if every call ahead takes its own), kept under its ``call_id``, so waiting callers come back
    about once each, in order. ``backend_timeout`` bounds each call.
    """

    __slots__ = ("backend_timeout", "client", "keys", "name", "prefix", "rate")

    def __init__(
        self,
        client: RedisClient,
        name: str,
        rate: Rate | str,
        *,
        prefix: str = "lock",
        backend_timeout: float | None = None,
    ) -> None:
        check_client(client)
        self.client: Any = client
        self.name = check_name(name)
        self.rate = Rate.parse(rate, "rate")
        self.prefix = check_prefix(prefix)
        self.backend_timeout = check_backend_timeout(backend_timeout)
        self.keys = RateKeys.for_name(prefix, name)

    def try_acquire(self, call_id: str | None = None) -> RateReply:
        """One try: admitted, or refused with the wait until this call's turn. ``call_id``: the
        caller's stable id (a Celery task id), under which a refused call keeps its turn;
        ``None``: a one-off try whose refusal keeps none."""
        call = "" if call_id is None else _check_call_id(call_id)
        args = (self.rate.limit, self.rate.period_ms, call)
        with bounded(self.backend_timeout), backend_errors("try", "", _subject(self.name)):
            admitted, wait, used, at, paused = scripts.RATE_TAKE(self.client, self.keys.pair, args)
        reply = RateReply(admitted == 1, _secs(wait), int(used), float(text(at)), _secs(paused))
        if not reply.admitted and _log.isEnabledFor(logging.DEBUG):
            _log.debug("rate limiter %r refused %r: turn in %.3f s", self.name, call, reply.wait)
        return reply

    def acquire(self, timeout: float | None = None, call_id: str | None = None) -> RateReply:
        """Try until admitted, sleeping until this call's turn in between: the admitted reply,
        or the last refused one once ``timeout`` seconds (``None``: no bound; 0: one try) have
        passed. Without a ``call_id``, a call that gives up drops its turn."""
        wait = check_wait(timeout)
        if wait == 0:
            return self.try_acquire(call_id)
        call = uuid.uuid4().hex if call_id is None else _check_call_id(call_id)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            reply = self.try_acquire(call)
            left = None if deadline is None else deadline - time.monotonic()
            if reply.admitted or (left is not None and left <= 0):
                break
            time.sleep(reply.wait if left is None else min(reply.wait, left))
        if not reply.admitted and call_id is None:
            self.cancel(call)
        return reply

    def pause(self, seconds: float) -> float:
        """Refuse every caller for ``seconds`` from now (a pause only lengthens one in force);
        the seconds of pause left."""
        ms = check_duration(seconds, "seconds", include_minimum=True)  # (at most ten years)
        with bounded(self.backend_timeout), backend_errors("pause", "", _subject(self.name)):
            left = scripts.RATE_PAUSE(self.client, self.keys.pair, (repr(ms * 1000),))
        paused = _secs(left)
        if ms > 0:
            _log.info("rate limiter %r paused: %.3f s left (asked %.3f s)", self.name, paused, ms)
        return paused

    def cancel(self, call_id: str) -> bool:
        """Drop ``call_id``'s turn (a call that gave up); whether it had one."""
        member = "r:" + _check_call_id(call_id)
        with bounded(self.backend_timeout), backend_errors("cancel", "", _subject(self.name)):
            return int(self.client.zrem(self.keys.log, member)) == 1

    def reset(self) -> bool:
        """Forget the starts, the turns and the pause; whether it was in use."""
        with bounded(self.backend_timeout), backend_errors("reset", "", _subject(self.name)):
            return int(self.client.delete(*self.keys.pair)) > 0

    def inspect(self) -> RateState:
        """This limiter as Redis has it now."""
        return inspect_rate(self.client, self.keys, self.rate, self.backend_timeout)

    def __repr__(self) -> str:
        return f"<RateLimiter {self.keys.log!r} rate={str(self.rate)!r}>"
