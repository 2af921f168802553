"""The lock layer: a reentrant, renewed, fenced Redis hash lock. It never imports Celery.

The rest of the package uses only what this module exports: :class:`ReentrantLock` (and
:class:`Semaphore`) for a hold this process keeps and renews, :class:`LockSpace` and its
:class:`NamedLock` for holds kept elsewhere, :class:`RateLimiter` for at most N starts per
period, and their typed replies.

Modules, bottom up: ``keys``, ``owner`` (tokens), ``checks`` (arguments, the client),
``deadline`` (one deadline per operation), ``scripts`` (lua/), ``observe`` (what it reports),
``hold``, ``renewal`` (a client's renewal lane), ``wakeup`` (push wake-ups), ``sentinel``,
``runtime`` (all of those for one client and process), ``commands`` (one script call each),
``reentrant``, ``permits``, ``semaphore``, ``rule`` and ``rate``
(a rate limiter), ``space``.
"""

from __future__ import annotations

from .checks import MAX_LEASE_SECONDS, RedisClient, check_duration
from .commands import AcquireReply, LockState, ReleaseReply, text
from .deadline import DeadlineRetry
from .keys import LockKeys, RateKeys, check_prefix
from .observe import LockObserver, get_observer, set_observer
from .owner import new_run_token
from .rate import RateLimiter
from .reentrant import ReentrantLock
from .rule import Rate, RateReply, RateState
from .semaphore import Semaphore
from .space import (
    CLAIMED,
    WAIT_OVER,
    WAIT_REPLACED,
    LockSpace,
    NamedLock,
    RecordReply,
    WaitReply,
)

__all__ = [
    "CLAIMED",
    "MAX_LEASE_SECONDS",
    "WAIT_OVER",
    "WAIT_REPLACED",
    "AcquireReply",
    "DeadlineRetry",
    "LockKeys",
    "LockObserver",
    "LockSpace",
    "LockState",
    "NamedLock",
    "Rate",
    "RateKeys",
    "RateLimiter",
    "RateReply",
    "RateState",
    "RecordReply",
    "RedisClient",
    "ReentrantLock",
    "ReleaseReply",
    "Semaphore",
    "WaitReply",
    "check_duration",
    "check_prefix",
    "get_observer",
    "new_run_token",
    "set_observer",
    "text",
]
