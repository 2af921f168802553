"""The exceptions of celery-singleton-lock: one base class, one subclass per way a lock can fail.

Every one is a :class:`LockError`; :class:`LockBackendError` (Redis failed: an outage) and
:class:`MisconfiguredError` (a setting to fix) are apart, so a handler of outages never hides
a configuration mistake.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyQueuedError",
    "ChordDuplicateError",
    "LockBackendError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "MisconfiguredError",
    "TaskLockedError",
]


class LockError(Exception):
    """Base class of every error this package raises about a lock."""


class LockNotOwnedError(LockError):
    """The caller released (or asked about) a lock that its owner token does not hold."""


class LockTimeoutError(LockError):
    """The lock could not be acquired within the time allowed."""

    def __init__(self, message: str, *, name: str = "", timeout: float | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.timeout = timeout


class LockLostError(LockError):
    """The lease of a held lock ended: it expired, was force-released, or could not be renewed."""


class LockBackendError(LockError):
    """Redis was unreachable or failed; the redis-py error is chained as ``__cause__``."""


class MisconfiguredError(LockError):
    """No usable Redis is configured for the locks (e.g. ``singleton_lock_redis_url`` is
    missing and the broker is not Redis), or a setting asks for what the package cannot do: a
    setting to fix, never an outage. It is not a :class:`LockBackendError`, so neither an
    ``except LockBackendError`` nor ``singleton_lock_on_backend_error="proceed"`` goes on
    past it."""


class AlreadyQueuedError(LockError):
    """A publish-time duplicate: the same job is already queued or running.

    Raised by ``apply_async`` for tasks with ``lock_on_duplicate="raise"``.
    ``task_id`` is the id of the task that holds the lock, ``ttl`` the seconds left on its lease.
    ``cooldown`` says that task has ended and its job cools down (``lock_cooldown``): ``ttl``
    is then the cooldown left.
    """

    def __init__(self, task_id: str, ttl: float, key: str = "", cooldown: bool = False) -> None:
        super().__init__(task_id, ttl, key, cooldown)
        self.task_id = task_id
        self.ttl = ttl
        self.key = key
        self.cooldown = cooldown

    def __str__(self) -> str:
        if self.cooldown:
            return (
                f"task {self.task_id} ran last and its lock {self.key!r} cools down for "
                f"{self.ttl:.1f} s more; not publishing a duplicate"
            )
        return (
            f"task {self.task_id} already holds lock {self.key!r} "
            f"({self.ttl:.1f} s left on its lease); not publishing a duplicate"
        )


class ChordDuplicateError(AlreadyQueuedError):
    """A publish-time duplicate inside a chord header: the chord was not sent.

    Raised whatever ``lock_on_duplicate`` says, since returning the first job's result would
    leave the chord waiting for a member that never reports to it. ``revoked`` lists the ids of
    the members of that header this publish had sent already, now revoked (their publish locks
    freed); ``in_header`` says whether the holder was one of them (the same job twice in the
    header).
    """

    def __init__(
        self,
        task_id: str,
        ttl: float,
        key: str = "",
        revoked: tuple[str, ...] = (),
        in_header: bool = False,
    ) -> None:
        super().__init__(task_id, ttl, key)
        self.args = (task_id, ttl, key, revoked, in_header)  # what pickling passes back
        self.revoked = revoked
        self.in_header = in_header

    def __str__(self) -> str:
        held = (
            f"the same job appears twice in this chord's header (lock {self.key!r})"
            if self.in_header
            else (
                f"task {self.task_id} already holds lock {self.key!r} "
                f"({self.ttl:.1f} s left on its lease)"
            )
        )
        sent = (
            f"; the {len(self.revoked)} member(s) already sent to it were revoked"
            if self.revoked
            else ""
        )
        return (
            f"a chord header member is a duplicate: {held}. The chord was not sent{sent}: "
            "returning the first job's result would leave the chord waiting for a member that "
            "never reports to it. Deduplicate the header before building the chord (is_locked, "
            'lock_holder), or use lock_at="run", where a duplicate in a chord header fails and '
            "the chord's callback ends with ChordError"
        )


class TaskLockedError(LockError):
    """A run-time duplicate with ``lock_on_locked="raise"``: another run holds the lock.

    ``task_id`` (the holder) is the first constructor argument, so it survives the result
    backend's round trip of the exception.
    """

    def __init__(self, task_id: str, key: str = "", *args: Any) -> None:
        super().__init__(task_id, key, *args)
        self.task_id = task_id
        self.key = key

    def __str__(self) -> str:
        return f"task {self.task_id} holds lock {self.key!r}; this run did not start"
