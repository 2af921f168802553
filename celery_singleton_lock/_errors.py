"""The exceptions: one base class (:class:`LockError`), one subclass per way a lock fails. An
outage (:class:`LockBackendError`) and a setting to fix (:class:`MisconfiguredError`) are apart,
so a handler of outages never hides a configuration mistake."""

from __future__ import annotations

__all__ = [
    "AlreadyQueuedError",
    "ChordDuplicateError",
    "LockBackendError",
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "MisconfiguredError",
    "RateLimitExceededError",
    "RateLimited",
    "TaskLockedError",
]


def install_hint(extra: str | None = None, pip: str = "pip install") -> str:
    """How to install the package (with ``extra``, e.g. ``"web"``) while it is not on PyPI,
    for errors naming a missing extra; ``pip`` is the command (e.g. a reinstall)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        wheel = f"celery_singleton_lock-{version('celery-singleton-lock')}-py3-none-any.whl"
    except PackageNotFoundError:  # pragma: no cover - imported from a checkout, not installed
        wheel = "celery_singleton_lock-<version>-py3-none-any.whl"
    wanted = f"[{extra}]" if extra else ""
    return (
        f"{pip} '/path/to/celery-singleton-lock{wanted}' (its checkout) or "
        f"'/path/to/{wheel}{wanted}' (a wheel built from it): the package is not on PyPI yet"
    )


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
    """No usable Redis is configured (no ``singleton_lock_redis_url`` and a non-Redis broker),
    or a setting asks the impossible. Not a :class:`LockBackendError`: ``"proceed"`` on backend
    errors never goes past it."""


class AlreadyQueuedError(LockError):
    """A publish-time duplicate (``lock_on_duplicate="raise"``): ``task_id`` holds the lock,
    ``ttl`` seconds left on its lease (with ``cooldown``: it ended, ``ttl`` of cooldown left)."""

    def __init__(self, task_id: str, ttl: float, key: str = "", cooldown: bool = False) -> None:
        super().__init__(task_id, ttl, key, cooldown)
        self.task_id = task_id
        self.ttl = ttl
        self.key = key
        self.cooldown = cooldown

    def __str__(self) -> str:
        if self.cooldown:
            held = f"ran last and its lock {self.key!r} cools down for {self.ttl:.1f} s more"
        else:
            held = f"already holds lock {self.key!r} ({self.ttl:.1f} s left on its lease)"
        return f"task {self.task_id} {held}; not publishing a duplicate"


class ChordDuplicateError(AlreadyQueuedError):
    """A publish-time duplicate in a chord header, whatever ``lock_on_duplicate`` says: the
    chord was not sent. ``revoked``: members already sent, now revoked (locks freed);
    ``in_header``: the holder was one of them (the same job twice in the header)."""

    def __init__(
        self,
        task_id: str,
        ttl: float,
        key: str = "",
        revoked: tuple[str, ...] = (),
        in_header: bool = False,
    ) -> None:
        super().__init__(task_id, ttl, key)
        self.args = (task_id, ttl, key, revoked, in_header)  # for pickling
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
    """A run-time duplicate with ``lock_on_locked="raise"``: run ``task_id`` holds the lock
    (the first argument, so that the result backend keeps it)."""

    def __init__(self, task_id: str, key: str = "") -> None:
        super().__init__(task_id, key)
        self.task_id = task_id
        self.key = key

    def __str__(self) -> str:
        return f"task {self.task_id} holds lock {self.key!r}; this run did not start"


class RateLimitExceededError(LockError):
    """A ``lock_rate`` call (``lock_on_locked="raise"``) whose turn did not come within
    ``lock_rate_max_delay``: ``limiter`` names the limiter, ``wait`` the seconds still away."""

    def __init__(self, limiter: str, wait: float) -> None:
        super().__init__(limiter, wait)
        self.limiter = limiter
        self.wait = wait

    def __str__(self) -> str:
        return (
            f"rate limiter {self.limiter!r}: this call's turn was still {self.wait:.1f} s away "
            "past lock_rate_max_delay; this run did not start"
        )


class RateLimited(Exception):
    """Raise in a task's body when the service says "slow down" (an HTTP 429): the task's
    ``lock_rate`` limiter pauses ``retry_after`` seconds for every worker, and this call comes
    back after it, not counted as a retry (``LockedTask.rate_limit_pause`` maps others)."""

    def __init__(self, retry_after: float, message: str = "") -> None:
        if isinstance(retry_after, bool) or not isinstance(retry_after, int | float):
            raise TypeError(
                f"RateLimited: retry_after must be a number of seconds such as 2.5, "
                f"got {retry_after!r}"
            )
        if not 0 <= retry_after <= 86_400 * 30:
            raise ValueError(
                f"RateLimited: retry_after must be from 0 to 30 days in seconds, got {retry_after}"
            )
        super().__init__(message or f"rate limited: retry after {retry_after} s")
        self.retry_after = float(retry_after)
