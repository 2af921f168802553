"""A drop-in for celery-once 3.0.1 on this package's lock: change
``from celery_once import QueueOnce, AlreadyQueued`` to
``from celery_singleton_lock.compat.once import QueueOnce, AlreadyQueued``.

The ``ONCE`` setting is read as celery-once reads it (``backend``, ``settings.url``,
``settings.default_timeout``). See ``docs/migration.md`` for what is supported differently.
"""

from __future__ import annotations

from .tasks import AlreadyQueued, QueueOnce

__all__ = ["AlreadyQueued", "QueueOnce"]
