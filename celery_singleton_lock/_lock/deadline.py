"""One deadline for a whole lock operation, redis-py's resends included.

redis-py bounds each wait on a socket and resends as its retry policy says, but nothing bounds
the two together: against a Redis that hangs, an acquire waited the socket timeout once per
attempt, and its cancel as long again. Under a :class:`deadline` no script is sent once it has
passed (:mod:`.scripts`), a client whose retry policy is a :class:`DeadlineRetry` starts no
resend that would end past it, and what must still be settled (a cancel, a release) goes to
the client's lane. It is a context variable: it follows the calling thread into redis-py's
retry loop and never leaks into another; the lane runs each background attempt under a
deadline of its own (:func:`budget`). One wait for a reply stays bounded by the client's
``socket_timeout`` only: redis-py has no public way to wait less on a pooled connection.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from redis.backoff import AbstractBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

T = TypeVar("T")

#: (monotonic time the operation must end by, its length in seconds), or None: no deadline
_current: ContextVar[tuple[float, float] | None] = ContextVar(
    "celery_singleton_lock_deadline", default=None
)

#: what :func:`bounded` returns without a deadline: stateless, so one object serves every call
NO_DEADLINE: AbstractContextManager[None] = nullcontext()


class deadline:
    """Bound the lock's Redis calls in the block to end ``seconds`` from now, resends included;
    an enclosing deadline that ends sooner wins. (A class, not a generator: it is on the hot
    path.)"""

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
    """:class:`deadline` of ``seconds``, or nothing at all when ``None``."""
    return NO_DEADLINE if seconds is None else deadline(seconds)


def time_left() -> float | None:
    """Seconds left before the current deadline (negative once passed), ``None`` without one."""
    current = _current.get()
    return None if current is None else current[0] - time.monotonic()


def budget() -> float | None:
    """The length of the current deadline (what a background retry of the operation gets for
    each attempt), ``None`` without one."""
    current = _current.get()
    return None if current is None else current[1]


def expired() -> RedisTimeoutError:
    """The error of a call that was not even sent: its operation's time had run out."""
    return RedisTimeoutError("no time left: the lock operation's deadline has passed")


class DeadlineRetry(Retry):
    """redis-py's :class:`~redis.retry.Retry`, but a resend (and the pause before it) starts
    only when it would begin before the current :class:`deadline`, and a call made past it
    raises :class:`redis.exceptions.TimeoutError` unsent. Without a deadline it retries as
    ``Retry(backoff, retries)`` does. (The backoff is slept here, in the failure handler:
    ``Retry`` would sleep it after, where nothing could stop it at the deadline.)"""

    def __init__(
        self,
        backoff: AbstractBackoff,
        retries: int,
        supported_errors: tuple[type[Exception], ...] = (
            RedisConnectionError,
            RedisTimeoutError,
            socket.timeout,
        ),
    ) -> None:
        super().__init__(NoBackoff(), retries, supported_errors)
        #: ``Any``: redis-py's backoff classes are not annotated in every version it supports
        self.backoff: Any = backoff
        #: the resends allowed (negative: no limit; ``Retry.get_retries()`` is not in every
        #: redis-py version supported)
        self.resends = retries
        self.supported_errors = tuple(supported_errors)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, DeadlineRetry):
            return NotImplemented
        return (self.resends, self.backoff, self.supported_errors) == (
            other.resends,
            other.backoff,
            other.supported_errors,
        )

    def __hash__(self) -> int:
        return hash((type(self), self.resends, self.supported_errors))

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        # The common case, twice per command on the hot path: a reply, with time left or no
        # deadline. It reads the context variable and the clock once and sends; the retry
        # machinery (the backoff, the closure, redis-py's loop) is entered on an error only.
        current = _current.get()
        at = None if current is None else current[0]
        if at is not None and time.monotonic() >= at:
            raise expired()
        try:
            return do()
        # Retry's own tuple: a client's retry_on_error / retry_on_timeout widen it (redis-py's
        # update_supported_errors), not ``supported_errors``.
        except self._supported_errors as error:
            return self._retrying(do, fail, at, error, args, kwargs)

    def _retrying(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        at: float | None,
        first: Exception,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        """The retry loop after ``first``, the error of the call already sent: it goes through
        the loop as the first attempt's failure (checked with ``is_retryable``, counted, handed
        to ``fail``, paused after), and no resend starts past ``at`` (``None``: no deadline)."""
        self.backoff.reset()
        retries = self.resends
        failures = 0

        def fail_then_pause(error: Exception, *count: Any) -> None:
            nonlocal failures
            failures += 1
            fail(error, *count)
            if 0 <= retries < failures:
                return  # Retry raises the error now
            pause = self.backoff.compute(failures)
            if at is not None and time.monotonic() + pause >= at:
                raise error
            if pause > 0:
                time.sleep(pause)

        pending = [first]

        def attempt() -> T:
            if pending:
                raise pending.pop()  # the failure of the call sent before the loop
            return do()

        result: T = super().call_with_retry(attempt, fail_then_pause, *args, **kwargs)
        return result
