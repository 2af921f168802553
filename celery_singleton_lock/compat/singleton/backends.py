"""celery-singleton's ``backends`` module: ``BaseBackend`` (for code that names it),
``RedisBackend`` on this package's lock, and ``get_backend(config)``, the app's backend."""

from __future__ import annotations

import itertools
import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import redis

from ... import LockSpace
from .._shared import seconds

if TYPE_CHECKING:
    from .config import Config

__all__ = ["DEFAULT_KEY_PREFIX", "BaseBackend", "RedisBackend", "get_backend"]

#: celery-singleton's ``singleton_key_prefix``, kept: migrated keys stay where operators look
DEFAULT_KEY_PREFIX = "SINGLETONLOCK_"

#: the lease of ``lock(expiry=None)`` (celery-singleton's "never"): every lock here has one
UNSET_EXPIRY = 3600.0


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


class RedisBackend(BaseBackend):
    """An app's locks (``space``: see ``get_backend``), or a URL's (``RedisBackend(url,
    **redis_kwargs)``, as celery-singleton makes it, under ``SINGLETONLOCK_``), by lock name."""

    def __init__(self, *args: Any, space: LockSpace | None = None, **kwargs: Any) -> None:
        if space is None:
            space = LockSpace(redis.Redis.from_url(*args, **kwargs), DEFAULT_KEY_PREFIX)
        self.space = space
        self.redis = space.client

    def lock(self, lock: str, task_id: str, expiry: float | None = None) -> bool:
        lease = UNSET_EXPIRY if expiry is None else seconds("expiry", expiry)
        return self.space.named(lock).take(task_id, lease).acquired

    def unlock(self, lock: str) -> None:
        self.space.force_release(lock)

    def get(self, lock: str) -> str | None:
        return self.space.inspect(lock).holder

    def clear(self, key_prefix: str) -> None:
        """Delete every key that starts with ``key_prefix``, as celery-singleton's does: each
        lock, whoever holds it, what it keeps beside it (its ``:meta`` hash, a beat leader's
        records), and celery-singleton's own ``SINGLETONLOCK_<md5>`` keys. Held locks are
        force-released first, so that their waiters wake (a DEL publishes nothing). Live
        holders lose their locks and fencing tokens start again: for when no worker runs."""
        space = LockSpace(self.redis, key_prefix)
        for keys in list(space.find()):
            space.force_release(keys.lock)
        # Each key on its own: on Redis Cluster the keys of different locks are in other slots.
        found = self.redis.scan_iter(
            match=re.sub(r"([*?\[\]\\])", r"\\\1", key_prefix) + "*", count=500
        )
        while batch := list(itertools.islice(found, 500)):
            with self.redis.pipeline(transaction=False) as pipe:
                for key in batch:
                    pipe.delete(key)
                pipe.execute()


def get_backend(config: Config) -> RedisBackend:
    """The app's backend: the lock client and prefix its ``Singleton`` tasks use. Another
    ``singleton_backend_class`` raises :class:`~celery_singleton_lock.MisconfiguredError`."""
    config.check_backend_class()
    return RedisBackend(space=config.space())
