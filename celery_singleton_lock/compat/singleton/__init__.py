"""A drop-in for celery-singleton 0.3.1: change ``from celery_singleton import Singleton`` to
``from celery_singleton_lock.compat.singleton import Singleton``. Its ``util``, ``config``,
``backends`` and ``exceptions`` modules are here under the same names.

A ``Singleton`` task is a ``lock_at="publish"`` task: ``apply_async`` takes the job's lock for
the new task id, or returns (or raises for) the task already queued or running. The lock is
renewed while the task runs and released as it ends, on every path (celery-singleton released
it in ``on_success`` / ``on_failure`` only, and a crashed worker's stayed for ``lock_expiry``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ... import AlreadyQueuedError, LockedTask
from .._shared import adopt_defaults, peer_option_errors, seconds
from .backends import RedisBackend, get_backend
from .config import Config
from .exceptions import CelerySingletonException, DuplicateTaskError
from .util import generate_lock, peer_name, unique_arguments

__all__ = ["CelerySingletonException", "DuplicateTaskError", "Singleton", "clear_locks"]


def clear_locks(app: Any) -> None:
    """Delete every key under the prefix of the app's ``Singleton`` tasks (see
    ``RedisBackend.clear``): only when no worker runs. No longer needed at a worker's start: a
    crashed worker's locks end within one lease."""
    config = Config(app)
    get_backend(config).clear(config.key_prefix)


class Singleton(LockedTask):
    """celery-singleton's base class: ``@app.task(base=Singleton)``.

    Options, as celery-singleton's: ``unique_on`` (a parameter name or a list of them; ``[]``:
    the task name alone), ``raise_on_duplicate`` (raise :class:`DuplicateTaskError` rather than
    return the queued task's ``AsyncResult``; default ``singleton_raise_on_duplicate``),
    ``lock_expiry`` (seconds the lock lasts while the message waits; default
    ``singleton_lock_expiry``, else ``singleton_lock_queue_ttl``). Every :class:`LockedTask`
    option works too. The keys are under ``Config(app).key_prefix`` (celery-singleton's
    ``SINGLETONLOCK_`` by default), and ``singleton_json_encoder_class`` writes the arguments.
    """

    own_lock_attributes = frozenset({"lock_expiry"})
    lock_at = "publish"
    lock_on_duplicate = "raise"  # apply_async hands AlreadyQueuedError to on_duplicate

    unique_on: ClassVar[str | Sequence[str] | None] = None
    raise_on_duplicate: ClassVar[bool | None] = None
    lock_expiry: ClassVar[float | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        task = str(cls.__dict__.get("name") or cls.__qualname__)
        own = cls.__dict__
        unique_on = own.get("unique_on")
        if unique_on is not None:
            cls.lock_unique_on = [unique_on] if isinstance(unique_on, str) else unique_on
        if own.get("lock_expiry") is not None:
            cls.lock_queue_ttl = seconds(f"task {task!r}: lock_expiry", own["lock_expiry"])
        raise_on_duplicate = own.get("raise_on_duplicate")
        if raise_on_duplicate is not None and not isinstance(raise_on_duplicate, bool):
            raise TypeError(
                f"task {task!r}: raise_on_duplicate must be True, False or None, got "
                f"{raise_on_duplicate!r}"
            )
        renamed = {"lock_unique_on": "unique_on"} if unique_on is not None else {}
        with peer_option_errors(renamed):
            super().__init_subclass__(**kwargs)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        config = Config(app)
        config.check_backend_class()  # at configuration time, not at the first publish
        adopt_defaults(
            app,
            {
                "singleton_lock_redis_url": config.backend_url,
                "singleton_lock_redis_options": config.backend_kwargs,
            },
        )
        super().on_bound(app)

    # -- LockedTask's extension points ----------------------------------------------------------

    @classmethod
    def key_prefix(cls, app: Any) -> str:
        return Config(app).key_prefix

    @classmethod
    def queue_lease(cls, app: Any) -> float:
        """``lock_expiry``, else ``singleton_lock_expiry``, else ``singleton_lock_queue_ttl``."""
        if cls.locking.options.lock_queue_ttl is None:
            expiry = Config(app).lock_expiry
            if expiry is not None:
                return expiry
        return super().queue_lease(app)

    @classmethod
    def key_encoder(cls) -> type[json.JSONEncoder] | None:
        """``singleton_json_encoder_class``, read for every name (as celery-singleton reads it
        per publish)."""
        return Config(cls.app).json_encoder_class

    # -- celery-singleton's methods -------------------------------------------------------------

    @property
    def singleton_config(self) -> Config:
        return Config(self._get_app())

    @property
    def singleton_backend(self) -> RedisBackend:
        return get_backend(self.singleton_config)

    @property
    def _raise_on_duplicate(self) -> bool:
        if self.raise_on_duplicate is not None:
            return self.raise_on_duplicate
        return bool(self.singleton_config.raise_on_duplicate)

    def generate_lock(
        self,
        task_name: str,
        task_args: Sequence[Any] | None = None,
        task_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The lock name of a call of ``task_name`` (a name, not a Redis key: see
        ``util.generate_lock``): its own lock's name when the app registers it as a locked task;
        for any other name, the name celery-singleton makes of it with this task's ``unique_on``
        and ``singleton_json_encoder_class``."""
        app = self._get_app()
        task = app.tasks.get(task_name)
        if isinstance(task, LockedTask):
            return generate_lock(task_name, task_args, task_kwargs, app=app)
        args, kwargs = unique_arguments(self, task_args, task_kwargs)
        return peer_name(task_name, args, kwargs, self.singleton_config.json_encoder_class)

    def get_existing_task_id(self, lock: str) -> str | None:
        """The id of the task holding ``lock`` (a name from :meth:`generate_lock`)."""
        return self.singleton_backend.get(lock)

    def aquire_lock(self, lock: str, task_id: str) -> bool:  # celery-singleton's spelling
        expiry = self.lock_expiry
        if expiry is None:
            expiry = self.singleton_config.lock_expiry
        return self.singleton_backend.lock(lock, task_id, expiry=expiry)

    def unlock(self, lock: str) -> None:
        self.singleton_backend.unlock(lock)

    def release_lock(  # type: ignore[override]  # celery-singleton's signature
        self,
        task_args: Sequence[Any] | None = None,
        task_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Free the lock of the job with these arguments, whoever holds it."""
        self.unlock(self.generate_lock(self.name, task_args, task_kwargs))

    def on_duplicate(self, existing_task_id: str) -> Any:
        """A duplicate publish: raise :class:`DuplicateTaskError`, or return the queued task's
        ``AsyncResult``."""
        if self._raise_on_duplicate:
            raise DuplicateTaskError(
                f"Attempted to queue a duplicate of task ID {existing_task_id}",
                task_id=existing_task_id,
            )
        return self.AsyncResult(existing_task_id)

    def apply_async(self, *args: Any, **options: Any) -> Any:
        try:
            return super().apply_async(*args, **options)
        except AlreadyQueuedError as exc:
            try:
                return self.on_duplicate(exc.task_id)
            except DuplicateTaskError as duplicate:
                duplicate.ttl, duplicate.key = exc.ttl, exc.key
                duplicate.args = (duplicate.message, duplicate.task_id, exc.ttl, exc.key)
                raise duplicate from None
