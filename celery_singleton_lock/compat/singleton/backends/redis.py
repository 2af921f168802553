"""celery-singleton's ``RedisBackend``, on this package's lock (a hash with a lease, scripts)."""

from __future__ import annotations

from typing import Any

import redis

from ...._celery.client import lock_space
from ...._lock import LockSpace
from ...._ops.locks import purge
from ..._shared import check_seconds
from .base import BaseBackend

__all__ = ["RedisBackend"]

#: the lease of a lock taken with ``expiry=None`` (celery-singleton's "never expires"): a lock
#: without a lease could outlive its holder forever, which this package never allows
UNSET_EXPIRY = 3600.0


class RedisBackend(BaseBackend):
    """The locks of an app (:meth:`for_app`: the same client and prefix as its tasks), or of a
    URL (``RedisBackend(url, **redis_kwargs)``, as celery-singleton makes it; prefix
    ``"lock"``). Locks are named as :func:`..util.generate_lock` names them."""

    def __init__(self, *args: Any, space: LockSpace | None = None, **kwargs: Any) -> None:
        if space is None:
            space = LockSpace(redis.Redis.from_url(*args, **kwargs))
        self.space = space
        self.redis = space.client

    @classmethod
    def for_app(cls, app: Any) -> RedisBackend:
        return cls(space=lock_space(app))

    def lock(self, lock: str, task_id: str, expiry: float | None = None) -> bool:
        lease = UNSET_EXPIRY if expiry is None else check_seconds("expiry", expiry)
        return self.space.take(lock, task_id, lease).acquired

    def unlock(self, lock: str) -> None:
        self.space.force_release(lock)

    def get(self, lock: str) -> str | None:
        return self.space.inspect(lock).holder

    def clear(self, key_prefix: str) -> None:
        """Free every lock of this backend's prefix (``key_prefix`` must be that prefix)."""
        if key_prefix != self.space.prefix:
            raise ValueError(
                f"key_prefix {key_prefix!r} is not this backend's prefix "
                f"{self.space.prefix!r} (singleton_lock_prefix)"
            )
        purge(self.space.client, self.space.prefix)
