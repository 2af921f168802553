"""celery-once's backends: ``Redis`` on this package's lock; ``File`` refused.

celery-once names its backend by dotted path in ``ONCE["backend"]``: its own
``celery_once.backends.Redis`` (or ``.redis.Redis``) and this module's ``Redis`` are served by
this package's lock; anything else is refused when the task is bound to the app.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._celery.config import LockConfig
from ..._errors import MisconfiguredError
from ..._lock import LockSpace
from .._shared import check_seconds

__all__ = ["File", "Redis", "check_backend", "import_backend"]

_REDIS = frozenset(
    {
        "celery_once.backends.Redis",
        "celery_once.backends.redis.Redis",
        "celery_singleton_lock.compat.once.backends.Redis",
    }
)
_FILE = frozenset(
    {
        "celery_once.backends.File",
        "celery_once.backends.file.File",
        "celery_singleton_lock.compat.once.backends.File",
    }
)


class Redis:
    """celery-once's Redis backend, on the app's lock client and prefix."""

    def __init__(self, space: LockSpace) -> None:
        self.space = space

    @property
    def redis(self) -> Any:
        return self.space.client

    def raise_or_lock(self, key: str, timeout: float, task_id: str = "") -> None:
        """Take ``key`` (a name from ``task.get_key``) for ``timeout`` seconds, or raise
        ``AlreadyQueued`` with the seconds left on its lease."""
        from .tasks import AlreadyQueued

        owner = task_id or f"raise_or_lock:{key}"
        reply = self.space.named(key).take(owner, check_seconds("timeout", timeout))
        if not reply.acquired:
            raise AlreadyQueued(max(reply.lease_left, 0.0), reply.holder or "", key)

    def clear_lock(self, key: str) -> bool:
        """Free ``key`` (a name from ``task.get_key``), whoever holds it."""
        return self.space.force_release(key)


class File:
    """celery-once's File backend is not supported: this package's locks live in Redis."""

    def __init__(self, settings: Any = None) -> None:
        raise MisconfiguredError(_file_refusal())


def _file_refusal() -> str:
    return (
        "ONCE['backend']: celery-once's File backend is not supported: celery-singleton-lock "
        "keeps its locks in Redis (a lease, renewal, fencing; shared by every worker). Set "
        "ONCE = {'backend': 'celery_once.backends.Redis', 'settings': {'url': "
        "'redis://...'}}, or app.conf.singleton_lock_redis_url"
    )


def import_backend(config: Mapping[str, Any], app: Any) -> Redis:
    """The backend ``config`` (the ``ONCE`` setting) names, serving ``app``'s locks."""
    check_backend(config)
    return Redis(LockConfig.of(app).space())


def check_backend(config: Mapping[str, Any]) -> None:
    """:class:`~celery_singleton_lock.MisconfiguredError` unless ``config`` (the ``ONCE``
    setting) names celery-once's Redis backend (or none)."""
    path = config.get("backend", "celery_once.backends.Redis")
    if isinstance(path, type):
        path = f"{path.__module__}.{path.__qualname__}"
    if path in _FILE:
        raise MisconfiguredError(_file_refusal())
    if path not in _REDIS:
        raise MisconfiguredError(
            f"ONCE['backend']={path!r} cannot be used: celery-singleton-lock serves celery-once's "
            "Redis backend only ('celery_once.backends.Redis'); to give the locks a client of "
            "your own, set app.conf.singleton_lock_client"
        )
