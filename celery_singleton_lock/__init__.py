"""celery-singleton-lock: deduplicated jobs and singleton tasks for Celery.

A reentrant, hash-based Redis lock (:class:`ReentrantLock`), renewed by one heartbeat thread
per process, woken by push, with fencing tokens; and on it a Celery ``Task`` base class
(:class:`LockedTask`) and :func:`install` for tasks that cannot use it.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._celery import LockedTask, install
from ._errors import (
    AlreadyQueuedError,
    ChordDuplicateError,
    LockBackendError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    MisconfiguredError,
    TaskLockedError,
)
from ._lock import ReentrantLock

try:
    __version__ = version("celery-singleton-lock")
except PackageNotFoundError:  # pragma: no cover - imported from a checkout, not installed
    __version__ = "0+unknown"

__all__ = [
    "AlreadyQueuedError",
    "ChordDuplicateError",
    "LockBackendError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "LockedTask",
    "MisconfiguredError",
    "ReentrantLock",
    "TaskLockedError",
    "install",
]
