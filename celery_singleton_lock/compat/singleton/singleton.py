"""celery-singleton's ``Singleton`` base class and ``clear_locks``, on :class:`LockedTask`.

A ``Singleton`` task is a ``lock_at="publish"`` task: ``apply_async`` takes the job's lock for
the new task id, or returns (or raises for) the task already queued or running. The lock is
renewed while the task runs and released as it ends, on every path (celery-singleton released
it in ``on_success`` / ``on_failure`` only, and a crashed worker left it for ``lock_expiry``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..._celery.locking import TaskLocking
from ..._celery.task import LockedTask
from ..._celery.taskkey import bind_arguments, canonical, task_lock_name
from ..._errors import AlreadyQueuedError
from .._shared import ShimLocking, adopt_defaults, check_seconds, peer_option_errors
from .backends import get_backend
from .backends.redis import RedisBackend
from .config import Config
from .exceptions import DuplicateTaskError

__all__ = ["Singleton", "clear_locks"]


def clear_locks(app: Any) -> None:
    """Delete every key under the app's prefix (celery-singleton's ``clear_locks``): the
    locks, whoever holds them, and what each lock keeps beside it (its ``:meta`` hash).

    Locks held by live runs go too, and the fencing tokens start again from 1: call it only
    when no worker runs. (It is no longer needed at worker start: a crashed worker's locks end
    within one lease.)"""
    config = Config(app)
    get_backend(config).clear(config.key_prefix)


def _encoded_argument(encoder: type[json.JSONEncoder], name: str, value: Any) -> str:
    """``value`` as ``encoder`` writes it; a value the encoder refuses is written in the
    lock's canonical form instead (celery-singleton raised ``TypeError`` there)."""
    instance: json.JSONEncoder

    def fallback(o: Any) -> Any:
        try:
            return type(instance).default(instance, o)
        except TypeError:
            return canonical(o, name)

    # json.dumps passes default= to every encoder class, so each one accepts it; it replaces
    # the class's default() on this instance only, which fallback() still calls first.
    instance = encoder(sort_keys=True, separators=(",", ":"), default=fallback)
    return instance.encode(value)


class SingletonLocking(ShimLocking):
    """A Singleton task class's locking: ``singleton_lock_expiry`` as the queued lease,
    ``singleton_json_encoder_class`` for the arguments' part of the key, and celery-singleton's
    key prefix."""

    __slots__ = ("task_class",)

    def __init__(self, task_class: Any, base: TaskLocking) -> None:
        super().__init__(base, lambda app: Config(app).lock_expiry)
        self.task_class = task_class

    def prefix(self, app: Any) -> str:
        """``singleton_lock_prefix`` when set, else ``singleton_key_prefix``, else
        celery-singleton's ``SINGLETONLOCK_``: for this class's tasks only (a plain
        ``LockedTask`` of the same app keeps the app's prefix), and the same in every process
        that knows the class, whichever tasks it happened to bind first."""
        return Config(app).key_prefix

    def lock_name(
        self, task_name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
    ) -> str:
        """The lock name of one call. With ``singleton_json_encoder_class`` set, the arguments
        are keyed as that encoder writes them, as celery-singleton keys them: an encoder that
        writes a ``UUID`` as its string makes ``f(uuid)`` and ``f(str(uuid))`` one job.

        The setting is read on every call (celery-singleton reads it per publish too), and the
        worker keys a run by name the same way (a ``send_task`` duplicate is still found). For
        strings, numbers, booleans, ``None`` and lists of them, the text hashed is the canonical
        form's, so turning the encoder on keeps those jobs' keys."""
        encoder = None
        if self.options.lock_key is None:
            encoder = Config(self.task_class.app).json_encoder_class
        if encoder is None:
            return super().lock_name(task_name, args, kwargs)
        arguments = bind_arguments(self.signature, tuple(args or ()), dict(kwargs or {}))
        unique_on = self.options.lock_unique_on
        if unique_on is not None:
            arguments = {name: arguments.get(name) for name in unique_on}
        try:
            pairs = [
                f"[{json.dumps(name)},{_encoded_argument(encoder, name, arguments[name])}]"
                for name in sorted(arguments)
            ]
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"cannot build a lock key of task {task_name!r} with "
                f"singleton_json_encoder_class {encoder.__qualname__}: {exc}"
            ) from exc
        text = "[" + ",".join(pairs) + "]"
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()
        return task_lock_name(task_name, None, (), {}, key_func=lambda: digest)


class Singleton(LockedTask):
    """celery-singleton's base class: ``@app.task(base=Singleton)``.

    Options (decorator keywords or class attributes), as celery-singleton's: ``unique_on``
    (a parameter name or a list of them; an empty list: the task name alone),
    ``raise_on_duplicate`` (raise :class:`DuplicateTaskError` instead of returning the
    queued task's ``AsyncResult``; default ``singleton_raise_on_duplicate``), ``lock_expiry``
    (seconds the lock lasts while the message waits; default ``singleton_lock_expiry``, else
    ``singleton_lock_queue_ttl``: the running task's lock is renewed instead). Every
    :class:`LockedTask` option works too.
    """

    own_lock_attributes = frozenset({"lock_expiry"})
    lock_at = "publish"
    #: duplicates come back from LockedTask as AlreadyQueuedError; on_duplicate decides
    lock_on_duplicate = "raise"

    #: parameter name(s) that make up the lock's key; ``None``: every argument
    unique_on: ClassVar[str | Sequence[str] | None] = None
    #: raise DuplicateTaskError for a duplicate (``None``: ``singleton_raise_on_duplicate``)
    raise_on_duplicate: ClassVar[bool | None] = None
    #: seconds the lock lasts while the message waits (``None``: ``singleton_lock_expiry``)
    lock_expiry: ClassVar[float | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        task = str(cls.__dict__.get("name") or cls.__qualname__)
        own = cls.__dict__
        if own.get("unique_on") is not None:
            unique_on = own["unique_on"]
            cls.lock_unique_on = [unique_on] if isinstance(unique_on, str) else unique_on
        if own.get("lock_expiry") is not None:
            cls.lock_queue_ttl = check_seconds(f"task {task!r}: lock_expiry", own["lock_expiry"])
        raise_on_duplicate = own.get("raise_on_duplicate")
        if raise_on_duplicate is not None and not isinstance(raise_on_duplicate, bool):
            raise TypeError(
                f"task {task!r}: raise_on_duplicate must be True, False or None, got "
                f"{raise_on_duplicate!r}"
            )
        renamed = {"lock_unique_on": "unique_on"} if own.get("unique_on") is not None else {}
        with peer_option_errors(renamed):
            super().__init_subclass__(**kwargs)
        cls.locking = SingletonLocking(cls, cls.locking)

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
        """The lock name of a call (a name, not a Redis key: see ``util.generate_lock``)."""
        return self.locking.lock_name(task_name, task_args, task_kwargs)

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

    def release_lock(  # type: ignore[override]  # celery-singleton's signature, not LockedTask's
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
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        except AlreadyQueuedError as exc:
            try:
                return self.on_duplicate(exc.task_id)
            except DuplicateTaskError as duplicate:
                duplicate.ttl, duplicate.key = exc.ttl, exc.key
                duplicate.args = (duplicate.message, duplicate.task_id, exc.ttl, exc.key)
                raise duplicate from None
