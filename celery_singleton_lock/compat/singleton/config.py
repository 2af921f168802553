"""celery-singleton's ``Config``: its ``singleton_*`` settings, read from the app."""

from __future__ import annotations

import importlib
from json import JSONEncoder
from typing import Any

from ..._celery.config import LockConfig
from ..._celery.settings import given
from ..._errors import MisconfiguredError
from ..._lock import check_prefix
from .._shared import check_seconds

__all__ = ["DEFAULT_BACKEND", "DEFAULT_KEY_PREFIX", "Config"]

#: celery-singleton's default ``singleton_key_prefix``: kept, so that the keys of migrated code
#: are found where operators (and their ``SINGLETONLOCK_*`` scans) look for them
DEFAULT_KEY_PREFIX = "SINGLETONLOCK_"

#: the only backend class accepted in ``singleton_backend_class`` (as celery-singleton names it,
#: or as this package does)
DEFAULT_BACKEND = "celery_singleton.backends.redis.RedisBackend"
_OURS = "celery_singleton_lock.compat.singleton.backends.redis.RedisBackend"


class Config:
    """The app's celery-singleton settings, each read when asked for (as celery-singleton's)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def _get(self, name: str, default: Any = None) -> Any:
        return self.app.conf.get(name, default)

    @property
    def key_prefix(self) -> str:
        """The prefix of every lock key: ``singleton_lock_prefix`` when set, else
        ``singleton_key_prefix``, else celery-singleton's default ``"SINGLETONLOCK_"``.

        Read here too, not only from the app's defaults that binding a Singleton task
        adopts: ``clear_locks(app)`` may run in a process that never bound one."""
        if given(self.app.conf, "singleton_lock_prefix") is not None:
            prefix: str = LockConfig.of(self.app).prefix
            return prefix
        return self.default_key_prefix

    @property
    def default_key_prefix(self) -> str:
        """``singleton_key_prefix``, else celery-singleton's default: the prefix a Singleton
        app's locks get when ``singleton_lock_prefix`` is not set."""
        return check_prefix(
            self._get("singleton_key_prefix") or DEFAULT_KEY_PREFIX, "singleton_key_prefix"
        )

    @property
    def backend_class(self) -> type:
        """The Redis backend; any other ``singleton_backend_class`` is refused."""
        self.check_backend_class()
        from .backends.redis import RedisBackend

        return RedisBackend

    def check_backend_class(self) -> None:
        """:class:`~celery_singleton_lock.MisconfiguredError` unless ``singleton_backend_class``
        is unset or names the Redis backend."""
        path_or_class = self._get("singleton_backend_class") or DEFAULT_BACKEND
        if isinstance(path_or_class, type):
            path_or_class = f"{path_or_class.__module__}.{path_or_class.__qualname__}"
        if path_or_class in (DEFAULT_BACKEND, _OURS):
            return
        raise MisconfiguredError(
            f"singleton_backend_class={path_or_class!r} cannot be used: celery-singleton's "
            "backend interface (lock, unlock, get, clear) has no way to renew a lease, to "
            "release only its own hold or to hand out fencing tokens, which the locks of "
            "celery-singleton-lock need (they live in Redis, run by its own scripts). Remove "
            "the setting. If your backend class only changed how to connect to Redis, set "
            "singleton_backend_url / singleton_backend_kwargs, or app.conf.singleton_lock_client "
            "to a redis-py client of your own (Sentinel and Cluster included)"
        )

    @property
    def backend_kwargs(self) -> dict[str, Any]:
        return dict(self._get("singleton_backend_kwargs") or {})

    @property
    def backend_url(self) -> str | None:
        """``singleton_backend_url``, else a ``redis://`` result backend, else the broker."""
        url = self._get("singleton_backend_url")
        if url is not None:
            return str(url)
        url = self._get("result_backend")
        if not url or not str(url).startswith("redis://"):
            url = self._get("broker_url")
        return None if url is None else str(url)

    @property
    def raise_on_duplicate(self) -> bool | None:
        value = self._get("singleton_raise_on_duplicate")
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"singleton_raise_on_duplicate must be True or False, got {value!r}")
        return value

    @property
    def lock_expiry(self) -> float | None:
        value = self._get("singleton_lock_expiry")
        return None if value is None else check_seconds("singleton_lock_expiry", value)

    @property
    def json_encoder_class(self) -> type | None:
        value = self._get("singleton_json_encoder_class")
        if isinstance(value, str):
            module, _, name = value.rpartition(".")
            value = getattr(importlib.import_module(module), name)
        if value is not None and not (isinstance(value, type) and issubclass(value, JSONEncoder)):
            raise TypeError(
                "singleton_json_encoder_class must be a json.JSONEncoder subclass or its "
                f"dotted path, got {value!r}"
            )
        return value
