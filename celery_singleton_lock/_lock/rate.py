"""``RateLimiter``: at most N starts in any window of P seconds, across every process, counted on
Redis's clock (lua/rate_take.lua); its rule and replies are in :mod:`.rule`."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from . import scripts
from .checks import (
    MAX_LEASE_SECONDS,
    RedisClient,
    check_backend_timeout,
    check_client,
    check_duration,
    check_wait,
)
from .commands import backend_errors, text
from .deadline import bounded
from .keys import RateKeys, check_prefix, glob_escape
from .rule import Rate, RateReply, RateState

_log = logging.getLogger("celery_singleton_lock.rate")


def new_call_id() -> str:
    return uuid.uuid4().hex


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
    """The limiter of ``keys`` as Redis has it now; ``rate``: the rule to assume when Redis
    has none."""
    rule = (rate.limit, rate.period_ms) if rate is not None else (0, 0)
    with bounded(backend_timeout), backend_errors("inspect", keys.name, _subject(keys.name)):
        limit, period, used, waiting, free, paused = scripts.RATE_INSPECT(client, keys.pair, rule)
    ms = float(text(period))
    return RateState(
        keys.name,
        int(limit),
        ms / 1000,
        int(used),
        int(waiting),
        float(text(free)) / 1000,
        float(text(paused)) / 1000,
    )


def find_rate_limiters(
    client: Any, prefix: str, backend_timeout: float | None = None
) -> Iterator[RateState]:
    """Every rate limiter under ``prefix``, by SCAN (each once), inspected."""
    seen: set[str] = set()
    with backend_errors("scan", "", f"for the rate limiters under prefix {prefix!r}"):
        found = [text(raw) for raw in client.scan_iter(match=_pattern(prefix), count=500)]
    for key in found:
        keys = RateKeys.from_key(prefix, key)
        if keys is not None and keys.name not in seen:
            seen.add(keys.name)
            yield inspect_rate(client, keys, None, backend_timeout)


def _pattern(prefix: str) -> str:
    return f"{glob_escape(prefix)}:rate:{{*"


def _subject(name: str) -> str:
    return f"rate limiter {name!r}"


class RateLimiter:
    """At most ``rate.limit`` starts in any window of ``rate.period`` seconds, across every
    process, counted on Redis's clock.

    Each try is one ``EVALSHA``. A refused call is given a turn: the earliest time it can start
    if every call ahead of it takes its own, kept under its ``call_id``, so waiting callers
    come back about once each, in order. Two keys in one hash tag, which expire by time alone.
    ``backend_timeout`` bounds each call (see :class:`ReentrantLock`).
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
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        #: the redis-py client (``Any``: ZREM is used too)
        self.client: Any = client
        self.name = name
        self.rate = Rate.parse(rate, "rate")
        self.prefix = check_prefix(prefix)
        self.backend_timeout = check_backend_timeout(backend_timeout)
        self.keys = RateKeys.for_name(prefix, name)

    def try_acquire(self, call_id: str | None = None) -> RateReply:
        """One try: admitted now, or refused with the wait until this call's turn. ``call_id``:
        the caller's stable id (a Celery task id), under which a refused call keeps its turn;
        ``None``: a one-off try, whose refusal keeps no turn (nobody could come back to it; its
        ``wait`` is the turn it would have had)."""
        call = "" if call_id is None else _check_call_id(call_id)
        args = (self.rate.limit, self.rate.period_ms, call)
        with bounded(self.backend_timeout), backend_errors("try", "", _subject(self.name)):
            admitted, wait, used, at, paused = scripts.RATE_TAKE(self.client, self.keys.pair, args)
        reply = RateReply(
            int(admitted) == 1,
            float(text(wait)) / 1000,
            int(used),
            float(text(at)),
            float(text(paused)) / 1000,
        )
        if not reply.admitted and _log.isEnabledFor(logging.DEBUG):
            _log.debug("rate limiter %r refused %r: turn in %.3f s", self.name, call, reply.wait)
        return reply

    def acquire(self, timeout: float | None = None, call_id: str | None = None) -> RateReply:
        """Wait for this call's turn: try, sleep the reply's wait (bounded by the time left),
        try again with the same ``call_id``. The admitted reply, or the last refused one when
        ``timeout`` seconds (``None``: no bound; 0: one try) have passed. Without a
        ``call_id``, a call that gives up drops its turn (nobody else can come back to it)."""
        wait = check_wait(timeout)
        if wait == 0:
            return self.try_acquire(call_id)
        call = new_call_id() if call_id is None else _check_call_id(call_id)
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
        """Refuse every caller of this limiter for ``seconds`` from now (Redis's clock); a
        pause only lengthens one in force, never shortens it. The seconds of pause left."""
        ms = check_duration(seconds, "seconds", include_minimum=True, maximum=MAX_LEASE_SECONDS)
        with bounded(self.backend_timeout), backend_errors("pause", "", _subject(self.name)):
            left = scripts.RATE_PAUSE(self.client, self.keys.pair, (repr(ms * 1000),))
        paused = float(text(left)) / 1000
        if ms > 0:
            _log.info("rate limiter %r paused: %.3f s left (asked %.3f s)", self.name, paused, ms)
        return paused

    def cancel(self, call_id: str) -> bool:
        """Drop ``call_id``'s turn (a call that gave up); whether it had one. One ``ZREM``,
        atomic by itself: no script."""
        member = "r:" + _check_call_id(call_id)
        with bounded(self.backend_timeout), backend_errors("cancel", "", _subject(self.name)):
            return int(self.client.zrem(self.keys.log, member)) == 1

    def reset(self) -> bool:
        """An operator's reset: forget the starts, the turns and the pause (the calls waiting
        for a turn are admitted as new calls when they come back). Whether it was in use."""
        with bounded(self.backend_timeout), backend_errors("reset", "", _subject(self.name)):
            return int(self.client.delete(*self.keys.pair)) > 0

    def inspect(self) -> RateState:
        """This limiter as Redis has it now (the rule last used on it, else this one's)."""
        return inspect_rate(self.client, self.keys, self.rate, self.backend_timeout)

    def __repr__(self) -> str:
        return f"<RateLimiter {self.keys.log!r} rate={str(self.rate)!r}>"
