"""A drop-in for celery-singleton 0.3.1: change ``from celery_singleton import Singleton`` to
``from celery_singleton_lock.compat.singleton import Singleton``; its ``util``, ``config``,
``backends`` and ``exceptions`` modules are here under the same names. A ``Singleton`` is a
``lock_at="publish"`` task, its lock renewed while it runs (see docs/migration.md)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ... import AlreadyQueuedError, LockedTask
from .._shared import adopt_defaults, peer_option_errors, seconds
from .backends import RedisBackend, get_backend
from .config import Config
from .exceptions import CelerySingletonException, DuplicateTaskError
from .util import generate_lock, peer_name

__all__ = ["CelerySingletonException", "DuplicateTaskError", "Singleton", "clear_locks"]


def clear_locks(app: Any) -> None:
    """Delete every key under the prefix of the app's ``Singleton`` tasks, held or not (fencing
    tokens start again): only when no worker runs. A dead worker's locks expire on their own."""
    config = Config(app)
    get_backend(config).clear(config.key_prefix)


class Singleton(LockedTask):
    """celery-singleton's base class: ``@app.task(base=Singleton)``.

    Options as celery-singleton's: ``unique_on`` (a parameter name or a list; ``[]``: the task
    name alone), ``raise_on_duplicate`` (raise :class:`DuplicateTaskError`, not return the queued
    task's ``AsyncResult``; default ``singleton_raise_on_duplicate``), ``lock_expiry`` (seconds
    the lock lasts while queued; default ``singleton_lock_expiry``, else
    ``singleton_lock_queue_ttl``); and every :class:`LockedTask` option."""

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
        """``singleton_json_encoder_class``, read per name (as celery-singleton reads it)."""
        return Config(cls.app).json_encoder_class

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
        """The lock name (not a Redis key) of a call of ``task_name``: its own lock's when the app
        registers it as a locked task, else celery-singleton's with this task's ``unique_on``."""
        app = self._get_app()
        if isinstance(app.tasks.get(task_name), LockedTask):
            return generate_lock(task_name, task_args, task_kwargs, app=app)
        unique_on = self.locking.options.lock_unique_on
        if unique_on:  # only those arguments, bound to the parameters (defaults applied)
            bound = inspect.signature(self.run).bind(*(task_args or ()), **(task_kwargs or {}))
            bound.apply_defaults()
            task_args, task_kwargs = [], {name: bound.arguments[name] for name in unique_on}
        elif unique_on is not None:
            task_args, task_kwargs = [], {}
        encoder = self.singleton_config.json_encoder_class
        return peer_name(task_name, task_args, task_kwargs, encoder)

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
        """A duplicate: raise :class:`DuplicateTaskError`, or return the queued task's result."""
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
