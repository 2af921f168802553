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


class BaseBackend(ABC):
    """celery-singleton's lock store interface, by lock name: ``lock`` (take for a task id
    for ``expiry`` seconds), ``unlock`` (whoever holds it), ``get`` (the holder) and ``clear``."""

    @abstractmethod
    def lock(self, lock: str, task_id: str, expiry: float | None = None) -> bool: ...

    @abstractmethod
    def unlock(self, lock: str) -> None: ...

    @abstractmethod
    def get(self, lock: str) -> str | None: ...

    @abstractmethod
    def clear(self, key_prefix: str) -> None: ...


class RedisBackend(BaseBackend):
    """An app's locks (``space``: see ``get_backend``), or a URL's (``RedisBackend(url,
    **redis_kwargs)``, as celery-singleton makes it, under ``SINGLETONLOCK_``), by lock name."""

    def __init__(self, *args: Any, space: LockSpace | None = None, **kwargs: Any) -> None:
        if space is None:
            space = LockSpace(redis.Redis.from_url(*args, **kwargs), DEFAULT_KEY_PREFIX)
        self.space = space
        self.redis = space.client

    def lock(self, lock: str, task_id: str, expiry: float | None = None) -> bool:
        # celery-singleton's None is "never": every lock here has a lease
        lease = 3600.0 if expiry is None else seconds("expiry", expiry)
        return self.space.named(lock).take(task_id, lease).acquired

    def unlock(self, lock: str) -> None:
        self.space.force_release(lock)

    def get(self, lock: str) -> str | None:
        return self.space.inspect(lock).holder

    def clear(self, key_prefix: str) -> None:
        """Delete every key that starts with ``key_prefix``, as celery-singleton's does (each
        lock, its ``:meta`` hash, celery-singleton's own ``SINGLETONLOCK_<md5>`` keys). Held
        locks are force-released first, for their waiters to wake (a DEL publishes nothing)."""
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
    """The backend of the app's ``Singleton`` tasks. Another ``singleton_backend_class`` raises
    :class:`~celery_singleton_lock.MisconfiguredError`."""
    config.check_backend_class()
    return RedisBackend(space=config.space())
