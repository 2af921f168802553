"""celery-singleton's ``Config``: its ``singleton_*`` settings, read from the app."""

from __future__ import annotations

import importlib
from json import JSONEncoder
from typing import Any

from ... import LockedTask, LockSpace, MisconfiguredError
from .._shared import dotted, seconds
from .backends import DEFAULT_KEY_PREFIX, RedisBackend

__all__ = ["Config"]

#: the ``singleton_backend_class`` accepted: celery-singleton's Redis backend, or ours
_REDIS_BACKENDS = ("celery_singleton.backends.redis.RedisBackend", dotted(RedisBackend))


class Config:
    """The app's celery-singleton settings, each read when asked for (as celery-singleton's)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    @property
    def key_prefix(self) -> str:
        """``singleton_lock_prefix`` when set, else ``singleton_key_prefix``, else
        celery-singleton's ``SINGLETONLOCK_``."""
        if self.app.conf.get("singleton_lock_prefix") is not None:
            return LockedTask.key_prefix(self.app)
        prefix = self.app.conf.get("singleton_key_prefix") or DEFAULT_KEY_PREFIX
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise ValueError(f"singleton_key_prefix must be a str without braces, got {prefix!r}")
        return prefix

    def space(self) -> LockSpace:
        """The app's locks under :attr:`key_prefix`."""
        locks = LockedTask.lock_space(self.app)
        return LockSpace(locks.client, self.key_prefix, backend_timeout=locks.backend_timeout)

    @property
    def backend_class(self) -> type:
        self.check_backend_class()
        return RedisBackend

    def check_backend_class(self) -> None:
        """:class:`~celery_singleton_lock.MisconfiguredError` unless ``singleton_backend_class``
        is unset or names the Redis backend."""
        path = dotted(self.app.conf.get("singleton_backend_class") or _REDIS_BACKENDS[0])
        if path not in _REDIS_BACKENDS:
            raise MisconfiguredError(
                f"singleton_backend_class={path!r} cannot be used: celery-singleton's backend "
                "interface (lock, unlock, get, clear) has no way to renew a lease, to release "
                "only its own hold or to hand out fencing tokens, which the locks of "
                "celery-singleton-lock need. Remove the setting. If your backend class only "
                "changed how to connect to Redis, set singleton_backend_url / "
                "singleton_backend_kwargs, or app.conf.singleton_lock_client to a redis-py "
                "client of your own (Sentinel and Cluster included)"
            )

    @property
    def backend_kwargs(self) -> dict[str, Any]:
        return dict(self.app.conf.get("singleton_backend_kwargs") or {})

    @property
    def backend_url(self) -> str | None:
        """``singleton_backend_url``, else a ``redis://`` result backend, else the broker."""
        url = self.app.conf.get("singleton_backend_url")
        if url is None:
            url = self.app.conf.get("result_backend")
            if not url or not str(url).startswith("redis://"):
                url = self.app.conf.get("broker_url")
        return None if url is None else str(url)

    @property
    def raise_on_duplicate(self) -> bool | None:
        value = self.app.conf.get("singleton_raise_on_duplicate")
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"singleton_raise_on_duplicate must be True or False, got {value!r}")
        return value

    @property
    def lock_expiry(self) -> float | None:
        value = self.app.conf.get("singleton_lock_expiry")
        return None if value is None else seconds("singleton_lock_expiry", value)

    @property
    def json_encoder_class(self) -> type[JSONEncoder] | None:
        value = self.app.conf.get("singleton_json_encoder_class")
        if isinstance(value, str):
            module, _, name = value.rpartition(".")
            value = getattr(importlib.import_module(module), name)
        if value is not None and not (isinstance(value, type) and issubclass(value, JSONEncoder)):
            raise TypeError(
                "singleton_json_encoder_class must be a json.JSONEncoder subclass or its "
                f"dotted path, got {value!r}"
            )
        return value
