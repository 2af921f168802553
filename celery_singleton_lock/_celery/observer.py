"""The Celery layer's observer: what it reports of duplicates, beside the lock's own events.

The process's lock observer (``_lock.set_observer``) is asked for these too when it has them
(:class:`celery_singleton_lock.metrics.LockMetrics` does).
"""

from __future__ import annotations

from typing import Protocol, cast

from .._lock import get_observer as _lock_observer

__all__ = ["CeleryObserver", "get_observer"]


class CeleryObserver(Protocol):
    def duplicate(self, task: str, action: str) -> None:
        """A duplicate of ``task`` was ``skipped``, ``retried``, ``raised``, ``returned`` or
        ``replaced``."""

    def refused_by(self, task: str, reason: str) -> None:
        """A duplicate of ``task`` was refused for ``reason``: ``limit`` or ``cooldown``."""


def get_observer() -> CeleryObserver | None:
    """The process's observer when it counts duplicates, else ``None``."""
    observer = _lock_observer()
    return cast(CeleryObserver, observer) if hasattr(observer, "duplicate") else None
