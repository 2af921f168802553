"""One deadline for a whole lock operation, redis-py's resends included (redis-py bounds each
socket wait, not all its attempts together). Under a :class:`deadline` no script is sent once
it passed, a :class:`DeadlineRetry` starts no resend past it, and what must still be settled
goes to the client's lane. A context variable: it follows the thread into redis-py's retry
loop. One wait for a reply is bounded by the client's ``socket_timeout`` only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

T = TypeVar("T")

#: (monotonic time the operation must end by, its length in seconds), or None: no deadline
_current: ContextVar[tuple[float, float] | None] = ContextVar(
    "celery_singleton_lock_deadline", default=None
)

NO_DEADLINE: AbstractContextManager[None] = nullcontext()


class deadline:
    """Bound the lock's Redis calls in the block to end ``seconds`` from now; an enclosing one
    that ends sooner wins. (A class, not a generator: the hot path.)"""

    __slots__ = ("_token", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._token: Token[tuple[float, float] | None] | None = None

    def __enter__(self) -> None:
        at = time.monotonic() + self.seconds
        outer = _current.get()
        if outer is None or at < outer[0]:
            self._token = _current.set((at, self.seconds))

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None


def bounded(seconds: float | None) -> AbstractContextManager[None]:
    return NO_DEADLINE if seconds is None else deadline(seconds)


def time_left() -> float | None:
    """Seconds left before the current deadline (negative once passed), ``None`` without one."""
    current = _current.get()
    return None if current is None else current[0] - time.monotonic()


def budget() -> float | None:
    """The length of the current deadline (a background attempt's), ``None`` without one."""
    current = _current.get()
    return None if current is None else current[1]


def expired() -> RedisTimeoutError:
    return RedisTimeoutError("no time left: the lock operation's deadline has passed")


class DeadlineRetry(Retry):
    """redis-py's :class:`~redis.retry.Retry`, but a resend (and the pause before it) starts
    only before the current lock operation's deadline, and a call past it raises
    :class:`redis.exceptions.TimeoutError` unsent. Without a deadline, as
    ``Retry(backoff, retries)``."""

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        """Retry's loop, with the deadline's checks (redis-py 5 passes ``do`` and ``fail``
        only)."""
        current = _current.get()
        at = None if current is None else current[0]
        failures = 0
        while True:
            if at is not None and time.monotonic() >= at:
                raise expired()
            try:
                return do()
            # Retry's own tuple: a client's retry_on_error / retry_on_timeout widen it.
            except self._supported_errors as error:
                if is_retryable is not None and not is_retryable(error):
                    raise
                failures += 1
                backoff: Any = self._backoff  # (not annotated in every redis-py version)
                if failures == 1:
                    backoff.reset()  # (on an error only: the hot path sends at once)
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                if 0 <= self._retries < failures:
                    raise
                pause = backoff.compute(failures)
                if at is not None and time.monotonic() + pause >= at:
                    raise
                if pause > 0:
                    time.sleep(pause)
