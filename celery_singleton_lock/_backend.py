"""The lock's operations on Redis: one call to one Lua script each, Redis errors mapped to
:class:`LockBackendError`. Higher layers (the lock object, the Celery task) build on these."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from . import _scripts
from ._errors import LockBackendError
from ._keys import LockKeys
from ._owner import new_request_id

__all__ = [
    "META_RETENTION_MS",
    "AcquireReply",
    "LockState",
    "acquire",
    "backend_errors",
    "force_release",
    "inspect",
    "park",
    "release",
    "text",
]

#: How long the meta hash (last fencing token, operator info) outlives a lock or its lease. It
#: bounds the keys a released lock leaves behind to one hash that expires after a minute.
META_RETENTION_MS = 60_000

_log_acquire = logging.getLogger("celery_singleton_lock.acquire")
_log_release = logging.getLogger("celery_singleton_lock.release")


def text(value: Any) -> str:
    """A reply item as str, whether or not the client decodes responses."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _backend_error(operation: str, name: str, exc: RedisError) -> LockBackendError:
    return LockBackendError(
        f"Redis failed to {operation} lock {name!r}: {type(exc).__name__}: {exc}. "
        "Check that Redis is reachable at the configured URL."
    )


@contextmanager
def backend_errors(operation: str, name: str) -> Iterator[None]:
    try:
        yield
    except RedisError as exc:
        raise _backend_error(operation, name, exc) from exc


@dataclass(frozen=True)
class AcquireReply:
    acquired: bool
    #: the owner's hold count in Redis when acquired
    count: int = 0
    #: the fencing token when acquired
    fence: int | None = None
    #: milliseconds left on the holder's lease when not acquired (-1: no lease, -2: just freed)
    pttl: int = 0
    #: the holder's owner token when not acquired
    holder: str = ""
    #: not acquired because another run (delivery) of the same owner holds it
    other_run: bool = False


def acquire(
    client: Any,
    keys: LockKeys,
    owner: str,
    lease_ms: int,
    request: str,
    info: str = "",
    run: str = "",
) -> AcquireReply:
    # try/except rather than backend_errors(): this is the hot path, and a generator-based
    # context manager costs about a microsecond per call.
    try:
        reply = _scripts.ACQUIRE(
            client, keys.pair, (owner, lease_ms, request, info, META_RETENTION_MS, run)
        )
    except RedisError as exc:
        raise _backend_error("acquire", keys.name, exc) from exc
    if int(reply[0]) == 1:
        _log_acquire.debug(
            "acquired %s as %s (hold %s, fence %s)", keys.lock, owner, reply[1], reply[2]
        )
        return AcquireReply(True, count=int(reply[1]), fence=int(reply[2]))
    return AcquireReply(False, pttl=int(reply[1]), holder=text(reply[2]), other_run=len(reply) > 3)


def park(client: Any, keys: LockKeys, owner: str, lease_ms: int, info: str = "") -> bool:
    """Keep ``owner``'s hold for a queued retry: new lease, run token cleared."""
    with backend_errors("park", keys.name):
        return bool(
            int(_scripts.PARK(client, keys.pair, (owner, lease_ms, META_RETENTION_MS, info)))
        )


def release(client: Any, keys: LockKeys, owner: str, drop: int = 1) -> int:
    """Drop ``drop`` holds of ``owner`` (0: all). Returns holds left, 0 when freed, -1 not owner.

    Idempotent per call: a resend of the same call (redis-py's retry) is answered as the
    first one was."""
    args = (owner, drop, keys.channel, META_RETENTION_MS, new_request_id())
    try:  # not backend_errors(): the hot path (see acquire)
        left = int(_scripts.RELEASE(client, keys.pair, args))
    except RedisError as exc:
        raise _backend_error("release", keys.name, exc) from exc
    _log_release.debug("release %s by %s: %s", keys.lock, owner, left)
    return left


def force_release(client: Any, keys: LockKeys, holder: str = "") -> bool:
    """Delete the lock whoever holds it (or only when ``holder`` holds it); wakes waiters."""
    with backend_errors("force-release", keys.name):
        done = int(
            _scripts.FORCE_RELEASE(client, keys.pair, (keys.channel, META_RETENTION_MS, holder))
        )
    if done:
        _log_release.info("force-released %s%s", keys.lock, f" held by {holder}" if holder else "")
    return bool(done)


@dataclass(frozen=True)
class LockState:
    """One lock as Redis has it now."""

    keys: LockKeys
    #: milliseconds left on the lease; -2 when the lock is free
    pttl: int
    fence: int | None
    #: server time in ms when the current holder took it, when known
    since_ms: int | None
    info: str
    owners: dict[str, int] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return bool(self.owners)

    @property
    def holder(self) -> str | None:
        return next(iter(self.owners), None)


def inspect(client: Any, keys: LockKeys) -> LockState:
    with backend_errors("inspect", keys.name):
        reply = _scripts.INSPECT(client, keys.pair, ())
    fence, since = text(reply[1]), text(reply[2])
    owners = {text(reply[i]): int(reply[i + 1]) for i in range(4, len(reply) - 1, 2)}
    return LockState(
        keys=keys,
        pttl=int(reply[0]),
        fence=int(fence) if fence else None,
        since_ms=int(since) if since else None,
        info=text(reply[3]),
        owners=owners,
    )
