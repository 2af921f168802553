"""One deadline for a whole lock operation, redis-py's resends included.

redis-py bounds each wait on a socket (``socket_timeout``) and resends a failed command as its
retry policy says, but nothing bounds the two together: against a Redis that hangs (it accepts
connections and never answers) an acquire waited the socket timeout once per attempt, and the
cancel of that lost acquire as long again, about 40 s with the Celery layer's client. A lock
operation run under :class:`deadline` (seconds from now) instead:

* sends no script once the deadline has passed (:mod:`.scripts`);
* starts no resend, and no pause before one, that would end past the deadline, with a client
  whose retry policy is a :class:`DeadlineRetry` (the clients the Celery layer builds, whose
  socket timeouts are also no longer than the deadline, so one wait for a reply cannot pass
  it either);
* hands what it must still settle (the cancel of an acquire whose reply was lost, a release) to
  the client's background lane rather than waiting for it (:mod:`.commands`).

One wait for a reply is bounded by the client's ``socket_timeout`` only: redis-py offers no
public way to wait for less on a connection its pool owns.

The deadline is a context variable, so it follows the calling thread (or greenlet) from the lock
down into redis-py's retry loop and never leaks into another thread: the client's lane runs
each background attempt under a deadline of its own (:func:`budget`: as long as the operation
that handed it over had).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, TypeVar

from redis.backoff import AbstractBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

__all__ = [
    "NO_DEADLINE",
    "DeadlineRetry",
    "bounded",
    "budget",
    "deadline",
    "expired",
    "time_left",
]

T = TypeVar("T")

#: (monotonic time the operation must end by, its length in seconds), or None: no deadline
_current: ContextVar[tuple[float, float] | None] = ContextVar(
    "celery_singleton_lock_deadline", default=None
)

#: what :func:`bounded` returns without a deadline: stateless, so one object serves every call
NO_DEADLINE: AbstractContextManager[None] = nullcontext()


class deadline:
    """Bound the lock's Redis calls inside the block to end ``seconds`` from now, resends
    included. An enclosing deadline that ends sooner wins. A class, not a generator: it runs
    on every acquire and release of the Celery layer."""

    __slots__ = ("_token", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._token: Token[tuple[float, float] | None] | None = None

    def __enter__(self) -> None:
        at = time.monotonic() + self.seconds
        outer = _current.get()
        if outer is None or at < outer[0]:
            self._token = _current.set((at, self.seconds))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
    """redis-py's :class:`~redis.retry.Retry`, but a resend (and the backoff pause before it)
    is only started when it would begin before the current :class:`deadline`; a call made
    once the deadline has passed raises :class:`redis.exceptions.TimeoutError` unsent.
    Without a deadline it retries exactly as ``Retry(backoff, retries)`` does.

    The backoff is kept here, not given to ``Retry`` (which sleeps it after the failure
    handler, where nothing could stop it at the deadline): the pause is slept in the
    failure handler, once this class has decided to resend."""

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
        #: the resends allowed (negative: no limit); kept here since ``Retry.get_retries()``
        #: is not in every redis-py version this package supports
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
        current = _current.get()
        at = None if current is None else current[0]
        if at is not None and time.monotonic() >= at:
            raise expired()
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

        result: T = super().call_with_retry(do, fail_then_pause, *args, **kwargs)
        return result
