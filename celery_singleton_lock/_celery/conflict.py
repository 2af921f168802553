"""What a run-time duplicate does (``lock_on_locked``): one class per choice (``"wait"`` is
``"skip"`` after a wait), made once per task class. A chord header member that would be skipped
fails instead: a skip never reports to its chord, which would wait for ever.
"""

from __future__ import annotations

import logging
import random
from typing import Any, NoReturn

from celery.exceptions import Ignore, MaxRetriesExceededError

from .._errors import RateLimitExceededError, TaskLockedError
from .._lock import AcquireReply
from .canvas import chord_member_of
from .hold import report_duplicate, store_skipped
from .options import LockOptions

log = logging.getLogger("celery_singleton_lock.run")

#: seconds before a retried duplicate's first retry; each later one waits twice as long
RETRY_FIRST_DELAY = 1.0
#: no lock retry is sooner than this (seconds): each one costs the broker a message
RETRY_MIN_DELAY = 0.1


class Conflict:
    """``lock_on_locked="skip"``: the duplicate ends ``SKIPPED``, the holder in its meta.
    ``"wait"``: the same, after blocking up to ``lock_wait_timeout`` for the lock."""

    def __init__(self, options: LockOptions) -> None:
        self.options = options
        #: seconds to block for the lock before giving up (``None``: try once)
        self.wait_timeout = options.lock_wait_timeout if options.lock_on_locked == "wait" else None

    def refused(
        self, task: Any, request: Any, key: str, refusal: AcquireReply, reason: str
    ) -> NoReturn:
        """End the duplicate (``reason``: ``locked``, ``limit``, ``cooldown``, or ``rate``: its
        ``lock_rate`` turn did not come in time; ``key`` is then the limiter's name)."""
        if chord_member_of(request):
            log.warning(
                "%s[%s] is a chord header member and lock %s is held by task %s: failing it "
                "(TaskLockedError), so its chord ends with ChordError instead of waiting",
                task.name,
                request.id,
                key,
                refusal.holder,
            )
            Raise.refused(self, task, request, key, refusal, reason)
        if reason == "rate":
            log.info(
                "skipped %s[%s]: its turn under rate limiter %s did not come within "
                "lock_rate_max_delay",
                task.name,
                request.id,
                key,
            )
        elif reason == "cooldown":
            log.info(
                "skipped %s[%s]: lock %s cools down after task %s (%.1f s left)",
                task.name,
                request.id,
                key,
                refusal.holder,
                refusal.lease_left,
            )
        else:
            log.info(
                "skipped %s[%s]: lock %s is held by task %s",
                task.name,
                request.id,
                key,
                refusal.holder,
            )
        report_duplicate(task, "skipped")
        store_skipped(task, request, {"holder": refusal.holder, "lock": key, "reason": reason})
        raise Ignore()


class Raise(Conflict):
    """``"raise"``: the run fails with :class:`TaskLockedError` naming the holder."""

    def refused(  # also a chord header member's, whatever the choice (self: any Conflict)
        self: Conflict, task: Any, request: Any, key: str, refusal: AcquireReply, reason: str
    ) -> NoReturn:
        report_duplicate(task, "raised")
        if reason == "rate":
            raise RateLimitExceededError(key, refusal.lease_left)
        raise TaskLockedError(refusal.holder, key)


class Retry(Conflict):
    """``"retry"``: come back later (counted against ``max_retries``); skip when they run out.
    An eager call is skipped at once (Celery's eager retry reruns at once, in the same stack)."""

    def refused(
        self, task: Any, request: Any, key: str, refusal: AcquireReply, reason: str
    ) -> NoReturn:
        if request.is_eager:
            log.info(
                "%s[%s] is an eager call, which cannot come back later: skipped at once "
                "(lock_on_locked='retry')",
                task.name,
                request.id,
            )
            super().refused(task, request, key, refusal, reason)
        report_duplicate(task, "retried")
        try:
            countdown = self.options.lock_retry_countdown
            if not countdown:
                # a backoff doubling with the retries, capped by the holder's remaining lease,
                # with equal jitter (duplicates refused together come apart)
                backoff = RETRY_FIRST_DELAY * 2.0 ** min(max(request.retries, 0), 30)
                ceiling = min(backoff, max(refusal.lease_left, RETRY_MIN_DELAY))
                countdown = max(RETRY_MIN_DELAY, ceiling * random.uniform(0.5, 1.0))
            raise task.retry(countdown=countdown)
        except MaxRetriesExceededError:
            log.info("%s[%s] ran out of retries waiting for lock %s", task.name, request.id, key)
        super().refused(task, request, key, refusal, reason)


def conflict_for(options: LockOptions) -> Conflict:
    """The class's ``lock_on_locked`` choice (``"wait"`` and ``"skip"`` are one class)."""
    return {"raise": Raise, "retry": Retry}.get(options.lock_on_locked, Conflict)(options)
