"""A drop-in for celery-once 3.0.1: change ``from celery_once import QueueOnce, AlreadyQueued``
to ``from celery_singleton_lock.compat.once import QueueOnce, AlreadyQueued``. A ``QueueOnce``
is a ``lock_at="publish"`` task, its lock renewed while it runs (see docs/migration.md); the
``ONCE`` setting is read as celery-once reads it."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from celery import states
from celery.result import EagerResult

from .. import AlreadyQueuedError, LockedTask, LockSpace, MisconfiguredError
from ._shared import adopt_defaults, dotted, lock_name, peer_option_errors, seconds

__all__ = ["AlreadyQueued", "QueueOnce", "Redis"]

#: the keys of a task's ``once``; ``apply_async(once=...)`` accepts them, applies ``CALL_KEYS``
ONCE_KEYS = frozenset({"graceful", "keys", "timeout", "unlock_before_run"})
CALL_KEYS = frozenset({"graceful", "timeout"})

log = logging.getLogger("celery_singleton_lock.compat.once")

_call_timeout: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "celery_singleton_lock_once_timeout", default=None
)

#: the ``ONCE["backend"]`` paths served (by :class:`Redis`), and celery-once's File backend
_REDIS = {"celery_once.backends.Redis", "celery_once.backends.redis.Redis", f"{__name__}.Redis"}
_FILE = {"celery_once.backends.File", "celery_once.backends.file.File"}


class AlreadyQueued(AlreadyQueuedError):
    """A duplicate ``apply_async``: ``countdown`` is the seconds left on the queued task's lock;
    an :class:`~celery_singleton_lock.AlreadyQueuedError` (``task_id``, ``key``)."""

    def __init__(self, countdown: float, task_id: str = "", key: str = "") -> None:
        super().__init__(task_id, countdown, key)
        self.countdown = countdown
        self.message = f"Expires in {countdown} seconds"
        self.args = (countdown, task_id, key)  # what pickling (and Celery's result) keeps

    def __str__(self) -> str:
        return self.message


class Redis:
    """celery-once's Redis backend, on the app's lock client and prefix."""

    def __init__(self, space: LockSpace) -> None:
        self.space = space
        self.redis = space.client

    def raise_or_lock(self, key: str, timeout: float, task_id: str = "") -> None:
        """Take ``key`` (a name from ``get_key``) for ``timeout`` seconds, or raise
        :class:`AlreadyQueued`."""
        owner = task_id or f"raise_or_lock:{key}"
        reply = self.space.named(key).take(owner, seconds("timeout", timeout))
        if not reply.acquired:
            raise AlreadyQueued(max(reply.lease_left, 0.0), reply.holder, key)

    def clear_lock(self, key: str) -> bool:
        """Free ``key`` (a name from ``get_key``), whoever holds it."""
        return self.space.force_release(key)


def _once_config(app: Any) -> Mapping[str, Any]:
    once = app.conf.get("ONCE") or {}
    if not isinstance(once, Mapping):
        raise TypeError(
            f"ONCE must be a dict {{'backend': ..., 'settings': {{...}}}}, got {once!r}"
        )
    path = dotted(once.get("backend", "celery_once.backends.Redis"))
    if path in _FILE:
        raise MisconfiguredError(
            "ONCE['backend']: celery-once's File backend is not supported: celery-singleton-lock "
            "keeps its locks in Redis (a lease, renewal, fencing; shared by every worker). Set "
            "ONCE = {'backend': 'celery_once.backends.Redis', 'settings': {'url': "
            "'redis://...'}}, or app.conf.singleton_lock_redis_url"
        )
    if path not in _REDIS:
        raise MisconfiguredError(
            f"ONCE['backend']={path!r} cannot be used: celery-singleton-lock serves celery-once's "
            "Redis backend only ('celery_once.backends.Redis'); to give the locks a client of "
            "your own, set app.conf.singleton_lock_client"
        )
    return once


def _checked(where: str, once: object) -> Mapping[str, Any]:
    if not isinstance(once, Mapping):
        raise TypeError(f"{where} must be a dict, got {once!r}")
    unknown = sorted(set(once) - ONCE_KEYS)
    if unknown:
        raise TypeError(f"{where}: unknown key(s) {unknown}; the keys are {sorted(ONCE_KEYS)}")
    if "graceful" in once and not isinstance(once["graceful"], bool):
        raise TypeError(f"{where}['graceful'] must be True or False, got {once['graceful']!r}")
    return once


class QueueOnce(LockedTask):
    """celery-once's base class: ``@app.task(base=QueueOnce, once={...})``.

    ``once`` (``graceful`` and ``timeout`` also per call, ``apply_async(once={...})``):
    ``graceful`` (return a ``REJECTED`` result, not raise :class:`AlreadyQueued`), ``keys`` (the
    parameters that make the key; ``[]``: the task name alone), ``timeout`` (seconds the lock
    lasts while queued; default ``ONCE["settings"]["default_timeout"]``, else
    ``singleton_lock_queue_ttl``), ``unlock_before_run`` (release as the run starts)."""

    lock_at = "publish"
    lock_on_duplicate = "raise"  # apply_async turns AlreadyQueuedError into AlreadyQueued
    once: ClassVar[Mapping[str, Any]] = {"graceful": False, "unlock_before_run": False}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        task = str(cls.__dict__.get("name") or cls.__qualname__)
        once = _checked(f"task {task!r}: once", cls.once)
        if once.get("keys") is not None:
            cls.lock_unique_on = list(once["keys"])
        if once.get("timeout") is not None:
            cls.lock_queue_ttl = seconds(f"task {task!r}: once['timeout']", once["timeout"])
        cls.lock_release_on_start = bool(once.get("unlock_before_run", False))
        with peer_option_errors({"lock_unique_on": "once['keys']"}):
            super().__init_subclass__(**kwargs)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        settings = _once_config(app).get("settings") or {}  # a wrong backend fails here
        adopt_defaults(app, {"singleton_lock_redis_url": settings.get("url")})
        super().on_bound(app)

    @classmethod
    def queue_lease(cls, app: Any) -> float:
        """The call's ``timeout``, the task's, ``ONCE["settings"]["default_timeout"]``, ours."""
        asked = _call_timeout.get()
        if asked is not None:
            return asked
        if cls.locking.options.lock_queue_ttl is None:
            default = (_once_config(app).get("settings") or {}).get("default_timeout")
            if default is not None:
                return seconds("ONCE['settings']['default_timeout']", default)
        return super().queue_lease(app)

    @property
    def config(self) -> Any:
        return self._get_app().conf

    @property
    def once_config(self) -> Mapping[str, Any]:
        return _once_config(self._get_app())

    @property
    def once_backend(self) -> Redis:
        app = self._get_app()
        _once_config(app)
        return Redis(self.lock_space(app))

    @property
    def default_timeout(self) -> float:
        return self.queue_lease(self._get_app())

    def unlock_before_run(self) -> bool:
        return bool(self.once.get("unlock_before_run", False))

    def get_key(
        self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None
    ) -> str:
        """The lock name of a call (``once_backend.clear_lock(task.get_key(args, kwargs))``)."""
        return lock_name(self, args, kwargs)

    def apply_async(self, *args: Any, **options: Any) -> Any:
        call = _checked("apply_async(once=...)", options.pop("once", None) or {})
        ignored = sorted(set(call) - CALL_KEYS)
        if ignored:
            # celery-once accepts them in a call and ignores them: the same here, said.
            log.warning(
                "%s: apply_async(once=...) ignores %s, as celery-once does: set them in the "
                "task's once={...}",
                self.name,
                ignored,
            )
        timeout = call.get("timeout")
        token = _call_timeout.set(
            None if timeout is None else seconds("apply_async(once={'timeout': ...})", timeout)
        )
        try:
            return super().apply_async(*args, **options)
        except AlreadyQueuedError as exc:
            if call.get("graceful", self.once.get("graceful", False)):
                return EagerResult(None, None, states.REJECTED)
            raise AlreadyQueued(exc.ttl, exc.task_id, exc.key) from None
        finally:
            _call_timeout.reset(token)
