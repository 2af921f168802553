"""celery-singleton's ``RedisBackend``, on this package's lock (a hash with a lease, scripts)."""

from __future__ import annotations

import re
from typing import Any

import redis

from ...._celery.config import LockConfig
from ...._lock import LockSpace, check_prefix
from ...._ops.locks import purge
from ..._shared import check_seconds
from ..config import DEFAULT_KEY_PREFIX, Config
from .base import BaseBackend

__all__ = ["RedisBackend"]

#: the lease of a lock taken with ``expiry=None`` (celery-singleton's "never expires"): a lock
#: without a lease could outlive its holder forever, which this package never allows
UNSET_EXPIRY = 3600.0

#: keys deleted per pipeline by :meth:`RedisBackend.clear`
_CLEAR_BATCH = 500


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis SCAN MATCH pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


class RedisBackend(BaseBackend):
    """The locks of an app (:meth:`for_app`: the same client and prefix as its tasks), or of a
    URL (``RedisBackend(url, **redis_kwargs)``, as celery-singleton makes it; prefix
    ``"SINGLETONLOCK_"``). Locks are named as :func:`..util.generate_lock` names them."""

    def __init__(self, *args: Any, space: LockSpace | None = None, **kwargs: Any) -> None:
        if space is None:
            space = LockSpace(redis.Redis.from_url(*args, **kwargs), DEFAULT_KEY_PREFIX)
        self.space = space
        self.redis = space.client

    @classmethod
    def for_app(cls, app: Any) -> RedisBackend:
        return cls(space=LockConfig.of(app).space(Config(app).key_prefix))

    def lock(self, lock: str, task_id: str, expiry: float | None = None) -> bool:
        lease = UNSET_EXPIRY if expiry is None else check_seconds("expiry", expiry)
        return self.space.named(lock).take(task_id, lease).acquired

    def unlock(self, lock: str) -> None:
        self.space.force_release(lock)

    def get(self, lock: str) -> str | None:
        return self.space.inspect(lock).holder

    def clear(self, key_prefix: str) -> None:
        """Delete every key whose name starts with ``key_prefix``, as celery-singleton's
        ``clear`` does: each lock, whoever holds it, and the keys kept beside it (the
        ``:meta`` hash with its fencing token, a beat leader's ``:last_run`` records), and any
        key celery-singleton itself left there (``SINGLETONLOCK_<md5>``).

        The held locks are force-released first, so that processes waiting for one of them
        are woken (a plain DEL publishes nothing); then what is left goes. Live holders lose
        their locks, and fencing tokens start again: only for when no worker runs."""
        prefix = check_prefix(key_prefix, "key_prefix")
        client = self.space.client
        purge(client, prefix)
        pattern = _glob_escape(prefix) + "*"
        batch: list[Any] = []
        for key in client.scan_iter(match=pattern, count=_CLEAR_BATCH):
            batch.append(key)
            if len(batch) >= _CLEAR_BATCH:
                _delete(client, batch)
                batch = []
        _delete(client, batch)


def _delete(client: Any, keys: list[Any]) -> None:
    """Delete ``keys`` one by one in a pipeline (one command per key: on Redis Cluster the
    keys of different locks live in different slots)."""
    if not keys:
        return
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.delete(key)
        pipe.execute()
