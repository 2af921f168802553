"""celery-singleton-lock: deduplicated jobs and singleton tasks for Celery.

A reentrant, hash-based Redis lock (:class:`ReentrantLock`), renewed by one heartbeat thread
per process, woken by push, fenced; on it a Celery ``Task`` base class (:class:`LockedTask`)
and :func:`install` for tasks that cannot use it. :class:`LockSpace` acts on locks held
elsewhere, :class:`RateLimiter` admits N starts per period, :func:`recent_counts` reads what the
locks counted lately. Every type a public method returns is importable from here or, for the
lock's typed replies and states, from :mod:`celery_singleton_lock.lock`; anything else is
private.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from . import _errors
from ._celery import LockedTask, install
from ._celery.config import close, reload_settings
from ._errors import *  # noqa: F403  # the errors: _errors.__all__
from ._lock import LockSpace, RateLimiter, ReentrantLock, Semaphore
from ._ops.counts import RecentCounts, recent_counts

try:
    __version__ = version("celery-singleton-lock")
except PackageNotFoundError:  # pragma: no cover - imported from a checkout, not installed
    __version__ = "0+unknown"

__all__ = [
    "LockSpace",
    "LockedTask",
    "RateLimiter",
    "RecentCounts",
    "ReentrantLock",
    "Semaphore",
    "close",
    "install",
    "recent_counts",
    "reload_settings",
]
__all__ += _errors.__all__
__all__.sort()
