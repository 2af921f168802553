"""celery-singleton-lock: deduplicated jobs and singleton tasks for Celery.

A reentrant, hash-based Redis lock (:class:`ReentrantLock`), renewed by one heartbeat thread
per process, woken by push, fenced; on it a Celery ``Task`` base class (:class:`LockedTask`)
and :func:`install` for tasks that cannot use it. :class:`LockSpace` and its
:class:`NamedLock` act on locks held elsewhere. Every type a public method returns is
importable from here; anything else is private.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._celery import LockedTask, install
from ._celery.config import close, reload_settings
from ._errors import (
    AlreadyQueuedError,
    ChordDuplicateError,
    LockBackendError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    MisconfiguredError,
    RateLimited,
    RateLimitExceededError,
    TaskLockedError,
)
from ._lock import (
    AcquireReply,
    LockKeys,
    LockSpace,
    LockState,
    NamedLock,
    Rate,
    RateLimiter,
    RateReply,
    RateState,
    RecordReply,
    ReentrantLock,
    ReleaseReply,
    Semaphore,
    WaitReply,
)

try:
    __version__ = version("celery-singleton-lock")
except PackageNotFoundError:  # pragma: no cover - imported from a checkout, not installed
    __version__ = "0+unknown"

__all__ = [
    "AcquireReply",
    "AlreadyQueuedError",
    "ChordDuplicateError",
    "LockBackendError",
    "LockError",
    "LockKeys",
    "LockLostError",
    "LockNotOwnedError",
    "LockSpace",
    "LockState",
    "LockTimeoutError",
    "LockedTask",
    "MisconfiguredError",
    "NamedLock",
    "Rate",
    "RateLimitExceededError",
    "RateLimited",
    "RateLimiter",
    "RateReply",
    "RateState",
    "RecordReply",
    "ReentrantLock",
    "ReleaseReply",
    "Semaphore",
    "TaskLockedError",
    "WaitReply",
    "close",
    "install",
    "reload_settings",
]
