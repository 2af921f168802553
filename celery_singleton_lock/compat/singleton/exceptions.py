"""celery-singleton's exceptions, as subclasses of this package's."""

from __future__ import annotations

from ..._errors import AlreadyQueuedError

__all__ = ["CelerySingletonException", "DuplicateTaskError"]


class CelerySingletonException(Exception):
    """Base class of celery-singleton's exceptions."""


class DuplicateTaskError(AlreadyQueuedError, CelerySingletonException):
    """A duplicate ``apply_async`` with ``raise_on_duplicate``: ``task_id`` is the id of the
    task already queued or running. Also an :class:`~celery_singleton_lock.AlreadyQueuedError`
    (``ttl``: seconds left on that task's lease, ``key``: its lock's Redis key), and it
    survives pickling and the result backend's round trip."""

    def __init__(self, message: str, task_id: str, ttl: float = 0.0, key: str = "") -> None:
        super().__init__(task_id, ttl, key)
        self.message = message
        # Every constructor argument in args: Exception pickles (and Celery stores) args only.
        self.args = (message, task_id, ttl, key)

    def __str__(self) -> str:
        return self.message
