"""celery-singleton's ``backends`` module: ``get_backend(config)`` and the backend classes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import BaseBackend
from .redis import RedisBackend

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["BaseBackend", "RedisBackend", "get_backend"]


def get_backend(config: Config) -> RedisBackend:
    """The app's backend: the lock client and prefix its ``Singleton`` tasks use. Another
    ``singleton_backend_class`` raises :class:`~celery_singleton_lock.MisconfiguredError`."""
    config.check_backend_class()
    return RedisBackend(space=config.space())
