"""celery-once's ``QueueOnce`` and ``AlreadyQueued``, on :class:`LockedTask`.

A ``QueueOnce`` task is a ``lock_at="publish"`` task: ``apply_async`` takes the job's lock for
the new task id, or raises :class:`AlreadyQueued` (or, with ``graceful``, returns a ``REJECTED``
result). Unlike celery-once's one fixed timeout, the running task's lock is renewed (a task
longer than ``timeout`` keeps it; a crashed worker's lock ends within one lease), a retry keeps
its lock, and the lock is released as the task ends, before its result is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from celery import states
from celery.result import EagerResult

from ..._celery.task import LockedTask
from ..._errors import AlreadyQueuedError
from .._shared import (
    ShimLocking,
    adopt_defaults,
    check_seconds,
    peer_option_errors,
    queue_ttl_for_call,
)
from .backends import Redis, check_backend, import_backend

__all__ = ["AlreadyQueued", "QueueOnce"]

#: the keys celery-once reads from a task's ``once`` dict
ONCE_KEYS = frozenset({"graceful", "keys", "timeout", "unlock_before_run"})
#: the keys it reads from ``apply_async(once={...})``
CALL_KEYS = frozenset({"graceful", "timeout"})


class AlreadyQueued(AlreadyQueuedError):
    """A duplicate ``apply_async``: ``countdown`` is the seconds left on the queued task's
    lock, ``message`` says so. Also an :class:`~celery_singleton_lock.AlreadyQueuedError`
    (``task_id`` of the queued task, ``key`` of its lock)."""

    def __init__(self, countdown: float, task_id: str = "", key: str = "") -> None:
        super().__init__(task_id, countdown, key)
        self.countdown = countdown
        self.message = f"Expires in {countdown} seconds"
        # Every constructor argument in args: Exception pickles (and Celery stores) args only.
        self.args = (countdown, task_id, key)

    def __str__(self) -> str:
        return self.message


def _once_config(app: Any) -> Mapping[str, Any]:
    once = app.conf.get("ONCE") or {}
    if not isinstance(once, Mapping):
        raise TypeError(
            f"ONCE must be a dict {{'backend': ..., 'settings': {{...}}}}, got {once!r}"
        )
    return once


def _default_timeout(app: Any) -> float | None:
    value = (_once_config(app).get("settings") or {}).get("default_timeout")
    return None if value is None else check_seconds("ONCE['settings']['default_timeout']", value)


def _check_once(where: str, once: object, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(once, Mapping):
        raise TypeError(f"{where} must be a dict, got {once!r}")
    unknown = sorted(set(once) - allowed)
    if unknown:
        raise TypeError(f"{where}: unknown key(s) {unknown}; the keys are {sorted(allowed)}")
    if "graceful" in once and not isinstance(once["graceful"], bool):
        raise TypeError(f"{where}['graceful'] must be True or False, got {once['graceful']!r}")
    return once


class QueueOnce(LockedTask):
    """celery-once's base class: ``@app.task(base=QueueOnce, once={...})``.

    ``once`` (on the task, or per call as ``apply_async(once={...})`` for ``graceful`` and
    ``timeout``): ``graceful`` (return a ``REJECTED`` result instead of raising
    :class:`AlreadyQueued`), ``keys`` (the parameter names that make up the key; ``[]``: the
    task name alone), ``timeout`` (seconds the lock lasts while the message waits; default
    ``ONCE["settings"]["default_timeout"]``, else ``singleton_lock_queue_ttl``: the running
    task's lock is renewed instead), ``unlock_before_run`` (release when the run starts).
    """

    lock_at = "publish"
    #: duplicates come back from LockedTask as AlreadyQueuedError; apply_async translates them
    lock_on_duplicate = "raise"
    #: celery-once's options (see the class docstring)
    once: ClassVar[Mapping[str, Any]] = {"graceful": False, "unlock_before_run": False}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        task = str(cls.__dict__.get("name") or cls.__qualname__)
        once = _check_once(f"task {task!r}: once", cls.once, ONCE_KEYS)
        if "keys" in once and once["keys"] is not None:
            cls.lock_unique_on = list(once["keys"])
        if once.get("timeout") is not None:
            cls.lock_queue_ttl = check_seconds(f"task {task!r}: once['timeout']", once["timeout"])
        cls.lock_release_on_start = bool(once.get("unlock_before_run", False))
        with peer_option_errors({"lock_unique_on": "once['keys']"}):
            super().__init_subclass__(**kwargs)
        cls.locking = ShimLocking(cls.locking, _default_timeout)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        once = _once_config(app)
        check_backend(once)  # a backend we cannot serve fails here, at configuration
        settings = once.get("settings") or {}
        adopt_defaults(app, {"singleton_lock_redis_url": settings.get("url")})
        super().on_bound(app)

    # -- celery-once's attributes ----------------------------------------------------------------

    @property
    def config(self) -> Any:
        return self._get_app().conf

    @property
    def once_config(self) -> Mapping[str, Any]:
        return _once_config(self._get_app())

    @property
    def once_backend(self) -> Redis:
        return import_backend(self.once_config, self._get_app())

    @property
    def default_timeout(self) -> float:
        return self.locking.queue_ttl(self._get_app())

    def unlock_before_run(self) -> bool:
        return bool(self.once.get("unlock_before_run", False))

    def get_key(
        self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None
    ) -> str:
        """The lock name of a call (``once_backend.clear_lock(task.get_key(args, kwargs))``)."""
        return self.locking.lock_name(self.name, args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> Any:
        call = _check_once("apply_async(once=...)", options.pop("once", None) or {}, CALL_KEYS)
        graceful = call.get("graceful", self.once.get("graceful", False))
        timeout = call.get("timeout")
        if timeout is not None:
            timeout = check_seconds("apply_async(once={'timeout': ...})", timeout)
        try:
            with queue_ttl_for_call(timeout):
                return super().apply_async(
                    args, kwargs, task_id, producer, link, link_error, shadow, **options
                )
        except AlreadyQueued:
            raise
        except AlreadyQueuedError as exc:
            if graceful:
                return EagerResult(None, None, states.REJECTED)
            raise AlreadyQueued(exc.ttl, exc.task_id, exc.key) from None
