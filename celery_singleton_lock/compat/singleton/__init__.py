"""A drop-in for celery-singleton 0.3.1: change ``from celery_singleton import Singleton`` to
``from celery_singleton_lock.compat.singleton import Singleton``. Its ``util``, ``config``,
``backends`` and ``exceptions`` modules are here under the same names."""

from __future__ import annotations

from .exceptions import CelerySingletonException, DuplicateTaskError
from .singleton import Singleton, clear_locks

__all__ = ["CelerySingletonException", "DuplicateTaskError", "Singleton", "clear_locks"]
