"""celery-singleton-lock: deduplicated jobs and singleton tasks for Celery.

A reentrant, hash-based Redis lock (:class:`ReentrantLock`), renewed by one heartbeat thread
per process, woken by push, with fencing tokens; and on it a Celery ``Task`` base class
(:class:`LockedTask`) and :func:`install` for tasks that cannot use it.
"""

from __future__ import annotations

from ._errors import (
    AlreadyQueuedError,
    LockBackendError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    TaskLockedError,
)
from ._install import install
from ._lock import ReentrantLock
from ._task import LockedTask

__version__ = "0.1.0"

__all__ = [
    "AlreadyQueuedError",
    "LockBackendError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LockedTask",
    "ReentrantLock",
    "TaskLockedError",
    "install",
]
