"""The lock's operations on Redis: one call to one Lua script (or one command) each.

This is the one place where script replies become typed replies (:class:`AcquireReply`,
:class:`ReleaseReply`, :class:`LockState`) and Redis errors become :class:`LockBackendError`.
Everything above it (the lock object, :class:`~._lock.space.LockSpace`) reads those replies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, NoReturn

from redis.exceptions import RedisError

from .._errors import LockBackendError
from . import observe, scripts
from .deadline import budget
from .keys import LockKeys
from .owner import new_request_id
from .runtime import LockRuntime, publish_command
from .scripts import META_RETENTION_MS
from .sentinel import ACQUIRE_CHECK_INTERVAL

__all__ = [
    "ALL_HOLDS",
    "META_RETENTION_MS",
    "AcquireReply",
    "LockState",
    "RecordReply",
    "ReleaseReply",
    "acquire",
    "backend_errors",
    "force_release",
    "inspect",
    "is_held",
    "is_owned",
    "park",
    "record_if_held",
    "records",
    "release",
    "text",
]


#: ``release(..., drop=ALL_HOLDS)`` drops every hold of the owner
ALL_HOLDS = 0

_log_acquire = logging.getLogger("celery_singleton_lock.acquire")
_log_release = logging.getLogger("celery_singleton_lock.release")


def text(value: Any) -> str:
    """A reply item as str, whether or not the client decodes responses."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _raise_backend_error(
    operation: str, name: str, exc: RedisError, subject: str | None = None
) -> NoReturn:
    if observe.observer is not None:
        observe.observer.backend_error()
    # redis-py's messages often end with a period of their own ("Connection refused.")
    detail = str(exc).rstrip(".")
    raise LockBackendError(
        f"Redis failed to {operation} {subject or f'lock {name!r}'}: {type(exc).__name__}: "
        f"{detail}. Check that Redis is reachable at the configured URL."
    ) from exc


@contextmanager
def backend_errors(operation: str, name: str, subject: str | None = None) -> Iterator[None]:
    """Turn a redis-py error inside the block into :class:`LockBackendError` (about lock
    ``name``, or about ``subject`` when given: what was being done, in words)."""
    try:
        yield
    except RedisError as exc:
        _raise_backend_error(operation, name, exc, subject)


class AcquireReply(NamedTuple):
    """What an acquire did (lua/acquire.lua's reply, typed)."""

    acquired: bool
    #: the owner's hold count when acquired
    hold_count: int = 0
    #: the fencing token when acquired
    fence: int | None = None
    #: milliseconds left on the holder's lease when not acquired (-1: no lease, -2: just freed)
    pttl: int = 0
    #: the holder's owner token when not acquired
    holder: str = ""
    #: not acquired because another run of the same owner holds it (see ``run_token``)
    other_run: bool = False

    def __bool__(self) -> bool:
        # A tuple with fields is always true: `if lock.try_acquire():` must mean "acquired".
        return self.acquired


class ReleaseReply(NamedTuple):
    """What a release did (lua/release.lua's -1 / 0 / n, typed)."""

    #: the owner held the lock; ``False``: never held, already released, or its lease was lost
    owned: bool
    #: holds of this owner left in Redis after the release (0: none)
    holds_left: int = 0

    def __bool__(self) -> bool:
        # as AcquireReply: `if lock.release_all():` means "this owner held it"
        return self.owned

    @property
    def freed(self) -> bool:
        """The owner's last hold went: the lock is free (or held by nobody of this owner)."""
        return self.owned and self.holds_left == 0


_NOT_OWNED = ReleaseReply(False)
_FREED = ReleaseReply(True)


class LockState(NamedTuple):
    """One lock as Redis has it now (lua/inspect.lua's reply, typed)."""

    keys: LockKeys
    #: milliseconds left on the lease; -2 when the lock is free
    pttl: int
    fence: int | None
    #: server time in ms when the current holder took it, when known
    since_ms: int | None
    #: operator info stored with the hold ("" when none)
    info: str
    #: the run token of the run that holds it ("" when no run has entered it)
    run_token: str
    #: owner token -> hold count
    owners: dict[str, int]

    @property
    def held(self) -> bool:
        return bool(self.owners)

    @property
    def holder(self) -> str | None:
        return next(iter(self.owners), None)


def acquire(
    client: Any,
    keys: LockKeys,
    owner: str,
    lease_ms: int,
    request: str,
    info: str = "",
    run_token: str = "",
) -> AcquireReply:
    """Take or re-enter the lock in Redis (``request``: the id that makes a resend harmless)."""
    LockRuntime.of(client).follow_master(ACQUIRE_CHECK_INTERVAL)  # Sentinel: where is the master
    # try/except rather than backend_errors(): this is the hot path, and a generator-based
    # context manager costs about a microsecond per call.
    try:
        # The meta hash's TTL is computed here, not in the script (a second number to parse
        # there); info and run token are sent only when there are any (fewer arguments).
        args: tuple[Any, ...] = (owner, lease_ms, request, lease_ms + META_RETENTION_MS)
        if info or run_token:
            args += (info, run_token)
        reply = scripts.ACQUIRE(client, keys.pair, args)
    except RedisError as exc:
        # The reply is lost, not necessarily the acquire: it may have run, or run later.
        _cancel(client, keys, owner, request, lease_ms)
        _raise_backend_error("acquire", keys.name, exc)
    if isinstance(reply, int):
        # a new holder: the reply is its fencing token alone
        _log_acquire.debug("acquired %s as %s (hold 1, fence %s)", keys.lock, owner, reply)
        return AcquireReply(True, 1, reply)
    if int(reply[0]) == 1:
        _log_acquire.debug(
            "acquired %s as %s (hold %s, fence %s)", keys.lock, owner, reply[1], reply[2]
        )
        return AcquireReply(True, int(reply[1]), int(reply[2]))
    return AcquireReply(False, 0, None, int(reply[1]), text(reply[2]), len(reply) > 3)


def _cancel(client: Any, keys: LockKeys, owner: str, request: str, lease_ms: int) -> None:
    """Make sure the acquire ``request``, whose reply never came, holds nothing (lua/cancel.lua):
    now if Redis answers within what is left of the operation's deadline (nothing is sent
    when it has passed), else from the client's renewal lane until it does.

    The lane keeps trying for as long as a hold that acquire could take might live: its lease
    (plus the meta hash's retention, which keeps the cancel's mark) counted from the last
    attempt that timed out, since a server that does not answer (stalled, or a silent path
    that still delivers later) may run the acquire when it wakes, long after it was sent; a
    server that refuses the connection has lost it with the old connection."""
    args = (owner, request, publish_command(client, keys.prefix), META_RETENTION_MS, lease_ms)

    def cancel() -> None:
        if int(scripts.CANCEL(client, keys.pair, args)):
            _log_acquire.warning(
                "the acquire of %s by %s whose reply was lost had taken the lock: undone",
                keys.lock,
                owner,
            )

    try:
        cancel()
    except RedisError as exc:
        _log_acquire.warning(
            "could not cancel the acquire of %s by %s whose reply was lost (%s: %s); retrying "
            "in the background",
            keys.lock,
            owner,
            type(exc).__name__,
            exc,
        )
        LockRuntime.of(client).retry(
            cancel,
            f"cancel acquire of {keys.lock}",
            (lease_ms + META_RETENTION_MS) / 1000,
            budget=budget(),
            while_stalled=True,
        )


def park(client: Any, keys: LockKeys, owner: str, lease_ms: int, info: str = "") -> bool:
    """Keep ``owner``'s hold in Redis, unrenewed, for ``lease_ms``, its run token cleared;
    ``False`` when the owner did not hold it."""
    with backend_errors("park", keys.name):
        return bool(
            int(scripts.PARK(client, keys.pair, (owner, lease_ms, META_RETENTION_MS, info)))
        )


class RecordReply(NamedTuple):
    """What :func:`record_if_held` did (lua/record_if_held.lua's reply, typed)."""

    #: the record was written: the owner held the lock with enough lease left
    recorded: bool
    #: the owner still held the lock (``False``: its lease was lost, or someone else holds it)
    held: bool
    #: milliseconds left on the lock's lease when held (-1: no lease)
    pttl: int = 0

    def __bool__(self) -> bool:
        return self.recorded


def record_if_held(
    client: Any,
    keys: LockKeys,
    kind: str,
    owner: str,
    field: str,
    value: str,
    min_lease_ms: int,
    keep_ms: int,
) -> RecordReply:
    """Write ``field = value`` into the lock's ``kind`` records (``<lock key>:<kind>``, kept
    ``keep_ms`` after this write), only while ``owner`` holds the lock with at least
    ``min_lease_ms`` of its lease left."""
    with backend_errors("record", keys.name):
        code, pttl = scripts.RECORD_IF_HELD(
            client, (keys.lock, keys.records(kind)), (owner, field, value, min_lease_ms, keep_ms)
        )
    code = int(code)
    return RecordReply(code == 1, code != 0, int(pttl))


def records(client: Any, keys: LockKeys, kind: str) -> dict[str, str]:
    """The lock's ``kind`` records (see :func:`record_if_held`)."""
    with backend_errors("read the records of", keys.name):
        raw = client.hgetall(keys.records(kind))
    return {text(field): text(value) for field, value in raw.items()}


def release(
    client: Any,
    keys: LockKeys,
    owner: str,
    drop: int = 1,
    *,
    retry_for: float = 0.0,
    retry_unless: Callable[[], bool] | None = None,
) -> ReleaseReply:
    """Drop ``drop`` holds of ``owner`` (:data:`ALL_HOLDS`: every one).

    Idempotent per call: a resend of the same call (redis-py's retry) is answered as the
    first one was. With ``retry_for`` > 0, a release that Redis fails (or that the operation's
    deadline cut short) is still raised, and also sent again from the client's renewal lane
    (the same call: it cannot drop a hold twice) until it goes through, for up to
    ``retry_for`` seconds (a hold cannot outlive its lease), or until ``retry_unless()`` says
    the hold is someone's again (the owner took it anew: its own release settles it)."""
    args: tuple[Any, ...] = (owner, drop, new_request_id(), META_RETENTION_MS)
    if publish_command(client, keys.prefix) == "spublish":
        args += ("spublish",)
    try:  # not backend_errors(): the hot path (see acquire)
        left = int(scripts.RELEASE(client, keys.pair, args))
    except RedisError as exc:
        if retry_for > 0:

            def again() -> None:
                if retry_unless is None or not retry_unless():
                    scripts.RELEASE(client, keys.pair, args)

            _log_release.warning(
                "could not release %s held by %s (%s: %s); sending the release again in the "
                "background for up to %.0f s",
                keys.lock,
                owner,
                type(exc).__name__,
                exc,
                retry_for,
            )
            LockRuntime.of(client).retry(
                again, f"release {keys.lock} held by {owner}", retry_for, budget=budget()
            )
        _raise_backend_error("release", keys.name, exc)
    _log_release.debug("release %s by %s: %s", keys.lock, owner, left)
    if left == 0:
        return _FREED
    return _NOT_OWNED if left < 0 else ReleaseReply(True, left)


def force_release(
    client: Any, keys: LockKeys, holder: str = "", *, unentered: bool = False
) -> bool:
    """Delete the lock whoever holds it (or only when ``holder`` holds it, and with
    ``unentered`` only while no run has entered it); wakes waiters."""
    args = (
        publish_command(client, keys.prefix),
        META_RETENTION_MS,
        holder,
        "1" if unentered else "",
    )
    with backend_errors("force-release", keys.name):
        done = int(scripts.FORCE_RELEASE(client, keys.pair, args))
    if done:
        _log_release.info("force-released %s%s", keys.lock, f" held by {holder}" if holder else "")
    return bool(done)


def inspect(client: Any, keys: LockKeys) -> LockState:
    """The lock's state, read atomically."""
    with backend_errors("inspect", keys.name):
        reply = scripts.INSPECT(client, keys.pair, ())
    fence, since = text(reply[1]), text(reply[2])
    owners = {text(reply[i]): int(reply[i + 1]) for i in range(5, len(reply) - 1, 2)}
    return LockState(
        keys=keys,
        pttl=int(reply[0]),
        fence=int(fence) if fence else None,
        since_ms=int(since) if since else None,
        info=text(reply[3]),
        run_token=text(reply[4]),
        owners=owners,
    )


def is_held(client: Any, keys: LockKeys) -> bool:
    """Whether anyone holds the lock now."""
    with backend_errors("check", keys.name):
        return bool(client.exists(keys.lock))


def is_owned(client: Any, keys: LockKeys, owner: str) -> bool:
    """Whether ``owner`` holds the lock now."""
    with backend_errors("check", keys.name):
        return bool(client.hexists(keys.lock, owner))
