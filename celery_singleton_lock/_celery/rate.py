"""``lock_rate``: at most N starts per period per key, across every worker, on Redis's clock. A
call over the limit comes back at the turn its limiter reserved, as a copy of its message with
a countdown, the same task id and ``retries``; past ``lock_rate_max_delay`` ``lock_on_locked``
applies. A body that raises :class:`RateLimited` pauses the whole limiter.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

from celery.exceptions import Ignore, Reject

from .._lock import AcquireReply, Rate, RateLimiter, RateReply
from .config import Bound
from .hold import report_refusal, store_retry
from .options import LockOptions

log = logging.getLogger("celery_singleton_lock.rate")

#: the message header of a call that comes back for its turn: ``[comebacks, since, retries]``
RATE_HEADER = "singleton_lock_rate"

#: a call whose turn is at most this many seconds away waits for it in its pool process
#: instead of coming back: about what a comeback itself takes on a busy worker
NEAR_TURN = 0.25

#: what the mode does with the hold: ``let_go(countdown)`` for a comeback, ``let_go(None)``: none
LetGo = Callable[[float | None], None]


@dataclass(frozen=True, slots=True)
class Waited:
    """A call's comebacks so far, and its first refusal on Redis's clock (0.0: never)."""

    comebacks: int = 0
    since: float = 0.0

    @classmethod
    def of(cls, request: Any) -> Waited:
        """The wait a comeback's message carries (a later retry copies the header along, with
        another ``retries``)."""
        get = getattr(request, "get", None)
        value = None if get is None else get(RATE_HEADER)
        if (
            isinstance(value, list | tuple)
            and len(value) == 3
            and type(value[0]) is int
            and isinstance(value[1], int | float)
            and value[2] == (getattr(request, "retries", 0) or 0)
        ):
            return cls(value[0], float(value[1]))
        return cls()


class Turn(NamedTuple):
    """A call admitted by its limiter, and its reply (``reply.at``: the start)."""

    limiter: RateLimiter
    reply: RateReply


class TaskRate:
    """A task class's ``lock_rate``: which limiter a call asks, and what a refusal does."""

    __slots__ = ("_shared", "asks", "key", "max_delay", "rate")

    def __init__(self, options: LockOptions) -> None:
        self.rate = options.lock_rate
        self.key = options.lock_rate_key
        self.max_delay = options.lock_rate_max_delay
        self.asks = callable(self.rate) or callable(self.key)
        #: the limiter of a fixed name and rule, with the lock space it was made for
        self._shared: tuple[Any, RateLimiter] | None = None

    def limiter(self, task: Any, bound: Bound, job: str, args: Any, kwargs: Any) -> RateLimiter:
        """The limiter of one call of the job ``job`` (its lock name)."""
        key, rate = self.key, self.rate
        if isinstance(key, str) and isinstance(rate, Rate):
            # one limiter for every call: made once per app config, not per call
            shared = self._shared
            if shared is None or shared[0] is not bound.space:
                shared = self._shared = (bound.space, bound.space.rate_limiter(key, rate))
            return shared[1]
        name, rule = self.answer(task, job, args, kwargs)
        return bound.space.rate_limiter(name, rule)

    def answer(
        self, task: Any, job: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
    ) -> tuple[str, Rate]:
        """The limiter's name and rule for one call: ``lock_rate`` and ``lock_rate_key`` asked
        when callables, their answers checked (a ``TypeError`` or ``ValueError`` naming them)."""
        key, rate = self.key, self.rate
        args, kwargs = args or (), kwargs or {}
        if not isinstance(rate, Rate):
            assert rate is not None, "a TaskRate is made for a task with lock_rate"
            rate = Rate.parse(rate(*args, **kwargs), f"task {task.name!r}: lock_rate(...)")
        name = key(*args, **kwargs) if callable(key) else key or job
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"task {task.name!r}: lock_rate_key(...) must return a non-empty str (the "
                f"limiter's name), got {name!r}"
            )
        return name, rate

    def admit(
        self, task: Any, request: Any, limiter: RateLimiter, conflict: Any, let_go: LetGo
    ) -> Turn:
        """This call's turn now, or (it raises) its comeback at its turn. An eager call waits
        here instead."""
        if request.is_eager:
            reply = limiter.acquire(timeout=self.max_delay, call_id=request.id)
        else:
            reply = limiter.try_acquire(request.id)
            left = self.delay_left(request, reply)
            if not reply.admitted and not reply.paused and reply.wait <= min(NEAR_TURN, left):
                # A turn this near is the window's last starts leaving it: wait here, not by a
                # comeback, which would take longer and come back late again.
                timeout = min(reply.wait + NEAR_TURN, left)
                reply = limiter.acquire(timeout=timeout, call_id=request.id)
        if reply.admitted:
            return Turn(limiter, reply)
        self.wait_turn(task, request, limiter, reply, conflict, let_go)

    def delay_left(self, request: Any, reply: RateReply) -> float:
        """Seconds of ``lock_rate_max_delay`` left at ``reply``, from the first refusal."""
        return self.max_delay - (reply.at - (Waited.of(request).since or reply.at))

    def paused(
        self, task: Any, request: Any, turn: Turn, seconds: float, conflict: Any, let_go: LetGo
    ) -> NoReturn:
        """The body said "slow down": pause the limiter for every worker, come back after."""
        limiter = turn.limiter
        left = limiter.pause(seconds)
        log.warning(
            "%s[%s]: rate limiter %s paused for %.1f s (the body raised a rate limit); this "
            "call comes back after the pause",
            task.name,
            request.id,
            limiter.name,
            left,
        )
        reply = RateReply(False, wait=left, at=turn.reply.at, paused=left)
        self.wait_turn(task, request, limiter, reply, conflict, let_go)

    def wait_turn(
        self,
        task: Any,
        request: Any,
        limiter: RateLimiter,
        reply: RateReply,
        conflict: Any,
        let_go: LetGo,
    ) -> NoReturn:
        """A refused turn: come back at the turn ``reply`` gives, or past ``lock_rate_max_delay``
        hand the call to ``lock_on_locked``."""
        report_refusal(task, "rate")
        waited = Waited.of(request)
        since = waited.since or reply.at
        if request.is_eager or reply.wait > self.delay_left(request, reply):
            try:
                limiter.cancel(request.id)
            finally:
                let_go(None)
            log.info(
                "%s[%s]: its turn under rate limiter %s (%s) is %.1f s away, past "
                "lock_rate_max_delay (%.0f s)",
                task.name,
                request.id,
                limiter.name,
                limiter.rate,
                reply.wait,
                self.max_delay,
            )
            refusal = AcquireReply(False, lease_left=reply.wait)
            conflict.refused(task, request, limiter.name, refusal, "rate")
        # jitter: a worker's clock ahead of Redis's must not bring it back before the turn
        countdown = reply.wait + random.uniform(0.005, 0.02 + reply.wait * 0.02)
        let_go(countdown)
        # sent again as Task.retry does but with the same retries, its RETRY stored first
        retries = request.retries or 0
        headers = {**(request.headers or {}), RATE_HEADER: [waited.comebacks + 1, since, retries]}
        sig = task.signature_from_request(
            request, countdown=countdown, retries=retries, headers=headers
        )
        log.info(
            "%s[%s] waits for its rate limit turn: back in %.2f s (comeback %d)",
            task.name,
            request.id,
            countdown,
            waited.comebacks + 1,
        )
        store_retry(task, request)
        try:
            sig.apply_async()
        except Exception as exc:
            log.error("%s[%s]: its comeback could not be sent: %r", task.name, request.id, exc)
            # Not sent: its turn and its hold are let go first, and only then is the call
            # stored as failed (a caller that sees FAILURE may call again).
            try:
                limiter.cancel(request.id)
            finally:
                let_go(None)
                with suppress(Exception):  # the caller is told, when the backend answers
                    task.backend.mark_as_failure(request.id, exc, request=request)
            raise Reject(exc, requeue=False) from exc
        raise Ignore()
