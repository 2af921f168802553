"""How one task class locks: its validated options, how a call's lock name is made, its leases,
and what to do when Redis fails. ``LockedTask.locking`` is one of these, made with the class."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from .._errors import LockBackendError
from .._lock import LockSpace, LockState
from .client import lock_space
from .options import OPTION_NAMES, LockOptions, check_option_names, validate_options
from .settings import setting
from .taskkey import task_lock_name

__all__ = [
    "HEADER",
    "PERMITS_HEADER",
    "PREFIX_HEADER",
    "QUEUED",
    "SKIPPED",
    "MessageLock",
    "TaskLocking",
    "proceed_without_lock",
    "run_signature",
    "store_skipped",
]

#: message header that carries the lock name from the publisher to the worker
HEADER = "singleton_lock"
#: message header that carries the prefix of that lock's keys (the task class's own: a
#: drop-in's ``SINGLETONLOCK_``), so a worker that frees it without knowing the task (a message
#: it drops as unknown) finds it
PREFIX_HEADER = "singleton_lock_prefix"
#: message header that carries how many messages may hold that lock at once, when more than
#: one (``lock_limit`` with ``lock_at="publish"``): the message's hold is one of those permits
PERMITS_HEADER = "singleton_lock_permits"


@dataclass(frozen=True)
class MessageLock:
    """The lock a message's publish took, as the message's headers carry it to the worker."""

    #: the lock's name (``task:digest``, with ``lock_at="queue"`` its queued lock's)
    name: str
    #: the prefix of its keys; ``None`` in a message from a version that did not send it (the
    #: task's own prefix, or the app's, is then assumed)
    prefix: str | None = None
    #: how many messages of the job may hold it at once (its permits)
    permits: int = 1

    def put_in(self, headers: dict[str, Any]) -> None:
        """Write this lock into a message's ``headers``."""
        headers[HEADER] = self.name
        if self.prefix is not None:
            headers[PREFIX_HEADER] = self.prefix
        if self.permits != 1:
            headers[PERMITS_HEADER] = self.permits

    @classmethod
    def of(cls, headers: Any) -> MessageLock | None:
        """The lock named in a message's headers (a mapping, or a worker's request, which
        has ``get``), or ``None`` when its publisher took none."""
        get = getattr(headers, "get", None)
        if get is None:
            return None
        name = get(HEADER)
        if not isinstance(name, str) or not name:
            return None
        prefix = get(PREFIX_HEADER)
        permits = get(PERMITS_HEADER)
        return cls(
            name,
            prefix if isinstance(prefix, str) and prefix else None,
            permits if type(permits) is int and permits > 1 else 1,
        )


#: the state a skipped duplicate records (not a ready state: .get() on it waits)
SKIPPED = "SKIPPED"

#: with ``lock_at="queue"``, the lock a queued message holds is its job's lock name with this
#: suffix; its run takes the job's lock itself, so one copy can wait while another runs
QUEUED = ":queued"


def run_signature(cls: type) -> inspect.Signature | None:
    """The signature the task's arguments bind to, without ``self`` of a bound task."""
    run = inspect.getattr_static(cls, "run", None)
    if run is None:
        return None
    bound = not isinstance(run, staticmethod)
    func = run.__func__ if isinstance(run, (staticmethod, classmethod)) else run
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    if bound:
        params = list(sig.parameters.values())[1:]
        sig = sig.replace(parameters=params)
    return sig


class TaskLocking:
    """A task class's locking (the options as validated when the class was made)."""

    __slots__ = ("options", "signature", "strict")

    def __init__(
        self, options: LockOptions, signature: inspect.Signature | None, strict: bool = True
    ) -> None:
        self.options = options
        self.signature = signature
        #: arguments that do not fit the signature raise ``TypeError`` rather than make a key
        #: of their own (Celery's ``Task.typing``, which checks them at publish the same way)
        self.strict = strict

    @classmethod
    def of_class(cls, task_class: type, base: type) -> TaskLocking:
        """Read and check the options of ``task_class`` (a subclass of ``base``, whose
        attributes are the defaults): an error names the task and the option."""
        defaults = LockOptions()
        raw = {}
        for name in OPTION_NAMES:
            value = inspect.getattr_static(task_class, name)
            if isinstance(value, staticmethod):
                value = value.__func__
            if value is not getattr(defaults, name):
                raw[name] = value
        task = str(task_class.__dict__.get("name") or task_class.__qualname__)
        # Celery turns every decorator keyword into a class attribute: a misspelt option
        # would otherwise be ignored in silence. A subclass may name lock_* attributes of its
        # own (a compat shim's lock_expiry) in own_lock_attributes.
        own: set[str] = set()
        for klass in task_class.__mro__:
            own.update(vars(klass).get("own_lock_attributes", ()))
        check_option_names(
            task,
            (
                a
                for a in task_class.__dict__
                if a.startswith("lock_") and not hasattr(base, a) and a not in own
            ),
        )
        signature = run_signature(task_class)
        strict = getattr(task_class, "typing", True) is not False
        return cls(validate_options(task, raw, signature), signature, strict)

    def lock_name(
        self, task_name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
    ) -> str:
        """The lock name of one call (``task name:argument part``)."""
        options = self.options
        return task_lock_name(
            task_name,
            self.signature,
            args,
            kwargs,
            unique_on=options.lock_unique_on,
            key_func=options.lock_key,
            strict=self.strict,
        )

    @property
    def at_publish(self) -> bool:
        """Whether a publish takes a lock for its message (``lock_at`` "publish" or "queue")."""
        return self.options.lock_at != "run"

    def message_lock(self, name: str) -> str:
        """The lock a queued message of the job ``name`` holds: the job's lock itself, or with
        ``lock_at="queue"`` its queued lock."""
        return name + QUEUED if self.options.lock_at == "queue" else name

    @property
    def message_permits(self) -> int:
        """How many messages of one job may hold its message lock at once: ``lock_limit``
        with ``lock_at="publish"`` (a message's hold is its run's), one queued copy with
        ``"queue"``."""
        return self.options.lock_limit if self.options.lock_at == "publish" else 1

    def run_lock(self, message_lock: str) -> str:
        """The lock a run takes, from the lock its message holds (see :meth:`message_lock`)."""
        if self.options.lock_at == "queue" and message_lock.endswith(QUEUED):
            return message_lock[: -len(QUEUED)]
        return message_lock

    def states(self, app: Any, name: str) -> list[LockState]:
        """Every lock of the job ``name`` as Redis has it now: its slots (one unless
        ``lock_limit`` says more), then with ``lock_at="queue"`` its queued lock."""
        space = self.space(app)
        limit = self.options.lock_limit
        states = space.named(name, limit).inspect()
        if self.options.lock_at == "queue":
            states.append(space.inspect(self.message_lock(name)))
        return states

    def prefix(self, app: Any) -> str:
        """The prefix of this class's lock keys: ``singleton_lock_prefix``. A class's own
        (a drop-in keeping its peer's keys) is a fact of the class, so every process that
        publishes or runs its tasks names the same keys."""
        prefix: str = setting(app, "singleton_lock_prefix")
        return prefix

    def space(self, app: Any) -> LockSpace:
        """The locks of this class's tasks: the app's client, under :meth:`prefix`."""
        return lock_space(app, self.prefix(app))

    def ttl(self, app: Any) -> float:
        """The lease of a running lock."""
        if self.options.lock_ttl is not None:
            return self.options.lock_ttl
        ttl: float = setting(app, "singleton_lock_ttl")
        return ttl

    def queue_ttl(self, app: Any) -> float:
        """The lease of a publish-time (or parked) lock while its message waits."""
        if self.options.lock_queue_ttl is not None:
            return self.options.lock_queue_ttl
        ttl: float = setting(app, "singleton_lock_queue_ttl")
        return ttl


def store_skipped(task: Any, request: Any, meta: dict[str, Any]) -> None:
    """Record the run of ``request`` as :data:`SKIPPED` with ``meta`` (not in eager mode, and
    not without a result backend)."""
    if not request.is_eager:
        with suppress(NotImplementedError):  # no result backend configured
            task.backend.store_result(request.id, meta, SKIPPED, request=request)


def proceed_without_lock(app: Any, task_name: str, what: str, exc: LockBackendError) -> bool:
    """Whether to go on without the lock after ``exc``
    (``singleton_lock_on_backend_error="proceed"``); logs at ERROR when so."""
    if setting(app, "singleton_lock_on_backend_error") != "proceed":
        return False
    logging.getLogger(f"celery_singleton_lock.{what}").error(
        "Redis failed for the lock of task %s; going on WITHOUT the lock "
        "(singleton_lock_on_backend_error='proceed'): %s",
        task_name,
        exc,
    )
    return True
