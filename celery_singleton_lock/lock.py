"""The lock on its own, without Celery: the lock classes and every type their methods return.

:class:`ReentrantLock` (and :class:`Semaphore`, N holders at once) is a hold this process keeps
and renews; :class:`LockSpace` and its :class:`NamedLock` act on holds kept elsewhere;
:class:`RateLimiter` admits at most N starts per period. A client whose retry policy is a
:class:`DeadlineRetry` stops resending at a lock's ``backend_timeout``.
"""

from __future__ import annotations

from ._lock import (
    AcquireReply,
    DeadlineRetry,
    LockKeys,
    LockSpace,
    LockState,
    NamedLock,
    Rate,
    RateLimiter,
    RateReply,
    RateState,
    ReentrantLock,
    ReleaseReply,
    Semaphore,
)

__all__ = [
    "AcquireReply",
    "DeadlineRetry",
    "LockKeys",
    "LockSpace",
    "LockState",
    "NamedLock",
    "Rate",
    "RateLimiter",
    "RateReply",
    "RateState",
    "ReentrantLock",
    "ReleaseReply",
    "Semaphore",
]
