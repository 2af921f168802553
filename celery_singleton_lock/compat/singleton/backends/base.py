"""celery-singleton's ``BaseBackend``, for code that names it: only :class:`.RedisBackend`, on
this package's lock, is used."""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["BaseBackend"]


class BaseBackend(ABC):
    """What celery-singleton asks of a lock store, by lock name."""

    @abstractmethod
    def lock(self, lock: str, task_id: str, expiry: float | None = None) -> bool:
        """Take ``lock`` for ``task_id`` for ``expiry`` seconds; whether it was taken."""

    @abstractmethod
    def unlock(self, lock: str) -> None:
        """Free ``lock``, whoever holds it."""

    @abstractmethod
    def get(self, lock: str) -> str | None:
        """The task id holding ``lock``, or ``None``."""

    @abstractmethod
    def clear(self, key_prefix: str) -> None:
        """Free every lock under ``key_prefix``."""
