"""celery-singleton's exceptions, as subclasses of this package's."""

from __future__ import annotations

from ... import AlreadyQueuedError

__all__ = ["CelerySingletonException", "DuplicateTaskError"]


class CelerySingletonException(Exception):
    """Base class of celery-singleton's exceptions."""


class DuplicateTaskError(AlreadyQueuedError, CelerySingletonException):
    """A duplicate ``apply_async`` with ``raise_on_duplicate``: ``task_id`` is the task already
    queued or running. Also an :class:`~celery_singleton_lock.AlreadyQueuedError` (``ttl``,
    ``key``), and it survives pickling and the result backend."""

    def __init__(self, message: str, task_id: str, ttl: float = 0.0, key: str = "") -> None:
        super().__init__(task_id, ttl, key)
        self.message = message
        self.args = (message, task_id, ttl, key)  # what pickling (and Celery's result) keeps

    def __str__(self) -> str:
        return self.message
