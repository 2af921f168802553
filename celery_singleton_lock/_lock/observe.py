"""What the lock reports as it works, for metrics: one observer per process, none by default
(then each call site costs one attribute read). :mod:`celery_singleton_lock.metrics` sets one.
"""

from __future__ import annotations

from typing import Protocol


class LockObserver(Protocol):
    """Called from the thread where the event happened; must be quick and never raise."""

    def acquired(self, reentered: bool) -> None:
        """A hold was taken, or ``reentered`` (the owner held it, here or in another process)."""

    def refused(self) -> None:
        """An acquire gave up: another owner held the lock (after any wait)."""

    def waited(self, seconds: float) -> None:
        """A blocking acquire that found the lock held waited this long (taken or not)."""

    def released(self, held_seconds: float) -> None:
        """This process's last hold was released, ``held_seconds`` after it was taken."""

    def renewed(self, leases: int) -> None:
        """The heartbeat renewed this many leases."""

    def renewal_failed(self) -> None:
        """A renewal call failed (retried until the lease ends)."""

    def lost(self) -> None:
        """A held lease was lost: expired, force-released, or not renewed in time."""

    def backend_error(self) -> None:
        """A lock operation raised ``LockBackendError``."""


#: the process's observer, or None (read directly by the call sites: the hot path)
observer: LockObserver | None = None


def set_observer(new: LockObserver | None) -> LockObserver | None:
    """Install ``new`` as the process's observer (``None``: report nothing); the one it
    replaces."""
    global observer
    old, observer = observer, new
    return old
