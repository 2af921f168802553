"""What the lock reports as it works, for metrics: one observer per process, none by default
(then each call site costs one attribute read). :mod:`celery_singleton_lock.metrics` sets one.
"""

from __future__ import annotations

from typing import Protocol


class LockObserver(Protocol):
    """Called from the thread where the event happened; must be quick and never raise."""

    def acquired(self, reentered: bool) -> None: ...  # a hold taken or re-entered
    def refused(self) -> None: ...  # an acquire gave up (after any wait)
    def waited(self, seconds: float) -> None: ...  # a blocked acquire's wait, taken or not
    def released(self, held_seconds: float) -> None: ...  # this process's last hold went
    def renewed(self, leases: int) -> None: ...  # the heartbeat renewed this many leases
    def renewal_failed(self) -> None: ...  # a renewal call failed (retried)
    def lost(self) -> None: ...  # a lease lost: expired, force-released, not renewed in time
    def backend_error(self) -> None: ...  # an operation raised LockBackendError


#: the process's observer, or None (read directly by the call sites: the hot path)
observer: LockObserver | None = None


def set_observer(new: LockObserver | None) -> LockObserver | None:
    """Install ``new`` as the process's observer (``None``: none); returns the one replaced."""
    global observer
    old, observer = observer, new
    return old
