"""What the lock reports as it works, for metrics: one observer per process, none by default.

The lock layer calls the observer at each outcome; with none set (the default) every call site
costs one attribute read. :mod:`celery_singleton_lock.metrics` sets one that counts into
Prometheus.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["LockObserver", "get_observer", "set_observer"]


class LockObserver(Protocol):
    """Called from the thread where the event happened; must be quick and never raise."""

    def acquired(self, reentered: bool) -> None:
        """A hold was taken, or ``reentered``: the owner already held the lock (in this
        process, or in Redis: another process acting as the same owner took it)."""

    def refused(self) -> None:
        """An acquire gave up: the lock was held by another owner (after any wait)."""

    def waited(self, seconds: float) -> None:
        """A blocking acquire that found the lock held waited this long (taken or not)."""

    def released(self, held_seconds: float) -> None:
        """The last hold of this process was released, ``held_seconds`` after it was taken."""

    def renewed(self, leases: int) -> None:
        """The heartbeat renewed this many leases."""

    def renewal_failed(self) -> None:
        """A renewal call failed (Redis unreachable, timed out): retried until the lease ends."""

    def lost(self) -> None:
        """A held lease was lost: it expired, was force-released, or could not be renewed."""

    def backend_error(self) -> None:
        """A lock operation failed because Redis did (it raised ``LockBackendError``)."""


#: the process's observer, or None (read directly by the call sites: the hot path)
observer: LockObserver | None = None


def set_observer(new: LockObserver | None) -> None:
    """Install ``new`` as the process's observer (``None``: report nothing)."""
    global observer
    observer = new


def get_observer() -> LockObserver | None:
    return observer
