"""The lock's operations on Redis: one script call each, typed replies, redis-py errors as
:class:`LockBackendError`; an acquire whose reply was lost is cancelled (lua/cancel.lua), now
or from the client's lane."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, NoReturn

from redis.exceptions import NoPermissionError, RedisError

from .._errors import LockBackendError
from . import observe, scripts
from .deadline import budget
from .keys import LockKeys
from .owner import new_request_id
from .runtime import ACQUIRE_CHECK_INTERVAL, LockRuntime
from .scripts import META_RETENTION_MS

#: ``release(..., drop=ALL_HOLDS)`` drops every hold of the owner (lua/release.lua's 0)
ALL_HOLDS = 0

_log_acquire = logging.getLogger("celery_singleton_lock.acquire")
_log_release = logging.getLogger("celery_singleton_lock.release")


def text(value: Any) -> str:
    """A reply item as str, whether or not the client decodes responses."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def seconds(pttl: Any) -> float:
    """A script's milliseconds left on a lease as seconds (-1.0: no lease)."""
    ms = int(pttl)
    return ms / 1000 if ms >= 0 else -1.0


def _raise_backend_error(
    operation: str, name: str, exc: RedisError, subject: str | None = None
) -> NoReturn:
    if observe.observer is not None:
        observe.observer.backend_error()
    detail = str(exc).rstrip(".")  # (some of redis-py's end with one)
    # The ACL rule when Redis refused a command (a script's refusal comes as a plain
    # ResponseError worded by the server), else that Redis is reachable.
    refused = ("can't run this command", "no permissions to run", "NOPERM")  # Redis, Valkey
    if isinstance(exc, NoPermissionError) or any(words in str(exc) for words in refused):
        advice = (
            "The Redis user of the locks lacks a permission: give it the ACL rule for this "
            "server's version on the Production page (docs/production.md)"
        )
    else:
        advice = "Check that Redis is reachable at the configured URL"
    raise LockBackendError(
        f"Redis failed to {operation} {subject or f'lock {name!r}'}: {type(exc).__name__}: "
        f"{detail}. {advice}."
    ) from exc


@contextmanager
def backend_errors(operation: str, name: str, subject: str | None = None) -> Iterator[None]:
    """A redis-py error in the block as :class:`LockBackendError` about ``subject`` or lock."""
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
    #: seconds left on the holder's lease when refused (-1.0: no lease, or the request voided)
    lease_left: float = 0.0
    #: the holder's owner token when refused
    holder: str = ""
    #: refused because another run of the same owner holds it (see ``run_token``)
    other_run: bool = False

    def __bool__(self) -> bool:
        # A tuple with fields is always true: `if lock.try_acquire():` must mean "acquired".
        return self.acquired


class ReleaseReply(NamedTuple):
    """What a release did (lua/release.lua's -1 / 0 / n, typed)."""

    #: the owner held the lock (``False``: not held, released, or its lease was lost)
    owned: bool
    #: holds of this owner left in Redis (0: none)
    holds_left: int = 0

    def __bool__(self) -> bool:
        return self.owned

    @property
    def freed(self) -> bool:
        """The owner's last hold went."""
        return self.owned and self.holds_left == 0


NOT_OWNED = ReleaseReply(False)
_FREED = ReleaseReply(True)


class LockState(NamedTuple):
    """One lock as Redis has it now (lua/inspect.lua's reply, typed)."""

    keys: LockKeys
    #: seconds left on the lease; ``None`` when the lock is free (or has no lease)
    lease_left: float | None
    fence: int | None
    #: server time (Unix seconds) when the current holder took it, when known
    since: float | None
    #: operator info ("" when none)
    info: str
    #: the run token of the run that holds it ("" when none)
    run_token: str
    #: the label the holder gave its hold ("" when none)
    state: str
    #: owner token -> hold count
    owners: dict[str, int]

    @property
    def held(self) -> bool:
        return bool(self.owners)

    @property
    def holder(self) -> str | None:
        return next(iter(self.owners), None)


class PendingCancel(NamedTuple):
    """The cancel of an acquire whose reply was lost (lua/cancel.lua's arguments), until it ran:
    the owner's next operation on the lock runs it first, since once the owner acquired again
    cancel.lua could not tell which hold was the lost one."""

    keys: LockKeys
    owner: str
    request: str
    lease_ms: int


def acquire(
    client: Any,
    keys: LockKeys,
    owner: str,
    lease_ms: int,
    request: str,
    info: str = "",
    run_token: str = "",
    state: str = "",
) -> AcquireReply:
    """Take or re-enter the lock (``request``: the id that makes a resend harmless), after the
    owner's pending cancels on it (when they cannot run, nothing is sent)."""
    runtime = LockRuntime.of(client)
    runtime.follow_master(ACQUIRE_CHECK_INTERVAL)
    if runtime.cancels:  # (empty, usually: the one cost on the hot path)
        settle(client, keys, owner, runtime, "acquire")
    # not backend_errors(): a generator context manager costs a microsecond on the hot path
    try:
        args: tuple[Any, ...] = (owner, lease_ms, request, lease_ms + META_RETENTION_MS)
        if info or run_token or state:
            args += (info, run_token, state)
        reply = scripts.ACQUIRE(client, keys.pair, args)
    except RedisError as exc:
        # The reply is lost, not necessarily the acquire: it may have run, or run later.
        _cancel(client, runtime, PendingCancel(keys, owner, request, lease_ms))
        _raise_backend_error("acquire", keys.name, exc)
    if isinstance(reply, int):  # a new holder: its fence alone
        count, fence = 1, reply
    elif int(reply[0]) == 1:
        count, fence = int(reply[1]), int(reply[2])
    else:
        return AcquireReply(False, 0, None, seconds(reply[1]), text(reply[2]), len(reply) > 3)
    _log_acquire.debug("acquired %s as %s (hold %s, fence %s)", keys.lock, owner, count, fence)
    return AcquireReply(True, count, fence)


def _run_cancel(client: Any, runtime: LockRuntime, cancel: PendingCancel) -> None:
    if cancel not in runtime.cancels:  # (run meanwhile by the owner's next operation, or the lane)
        return
    keys, publish = cancel.keys, runtime.publish_command(cancel.keys.prefix)
    args = (cancel.owner, cancel.request, publish, META_RETENTION_MS, cancel.lease_ms, keys.channel)
    if int(scripts.CANCEL(client, keys.pair, args)):
        _log_acquire.warning(
            "the acquire of %s by %s whose reply was lost had taken the lock: undone",
            keys.lock,
            cancel.owner,
        )
    runtime.cancels.pop(cancel, None)


def _cancel(client: Any, runtime: LockRuntime, cancel: PendingCancel) -> None:
    """Make sure the acquire whose reply never came holds nothing: now, else from the lane for
    as long as a hold it took might live (its lease plus the meta retention that keeps the void
    mark), counted from the last attempt that timed out (a stalled server may run it later)."""
    runtime.cancels[cancel] = None  # first: another thread acting as the owner settles it too
    try:
        _run_cancel(client, runtime, cancel)
    except RedisError as exc:
        _log_acquire.warning(
            "could not cancel the acquire of %s by %s whose reply was lost (%s: %s); retrying "
            "in the background, and before this owner's next operation on the lock",
            cancel.keys.lock,
            cancel.owner,
            type(exc).__name__,
            exc,
        )
        runtime.lane.retry(
            lambda: _run_cancel(client, runtime, cancel),
            f"cancel acquire of {cancel.keys.lock}",
            (cancel.lease_ms + META_RETENTION_MS) / 1000,
            budget=budget(),
            while_stalled=True,
            # by then what it was to undo has ended with its lease
            gave_up=lambda: runtime.cancels.pop(cancel, None),
        )


def settle(
    client: Any, keys: LockKeys, owner: str, runtime: LockRuntime | None = None, operation: str = ""
) -> None:
    """Run ``owner``'s pending cancels on the lock of ``keys``, oldest first; raises the
    ``RedisError`` of one Redis did not answer (the operation must not run on top of it), or
    with ``operation`` that operation's :class:`LockBackendError`."""
    runtime = runtime or LockRuntime.of(client)
    try:
        for cancel in runtime.cancels.copy():  # (every permit shares the channel: all settled)
            if cancel.owner == owner and cancel.keys.channel == keys.channel:
                _run_cancel(client, runtime, cancel)
    except RedisError as exc:
        if not operation:
            raise
        subject = (
            f"lock {keys.name!r}: an earlier acquire by owner {owner!r} lost its reply, and "
            "its cancel, which must run first, did not reach Redis either"
        )
        _raise_backend_error(operation, keys.name, exc, subject)


def park(
    client: Any, keys: LockKeys, owner: str, lease_ms: int, info: str = "", state: str = ""
) -> bool:
    """Keep ``owner``'s hold, unrenewed, for ``lease_ms``, its run token cleared; ``False``
    when the owner did not hold it."""
    runtime = LockRuntime.of(client)
    if runtime.cancels:
        settle(client, keys, owner, runtime, "park")
    with backend_errors("park", keys.name):
        args = (owner, lease_ms, META_RETENTION_MS, info, state)
        return bool(int(scripts.PARK(client, keys.pair, args)))


def release(
    client: Any,
    keys: LockKeys,
    owner: str,
    drop: int = 1,
    *,
    retry_for: float = 0.0,
    retry_unless: Callable[[], bool] | None = None,
) -> ReleaseReply:
    """Drop ``drop`` holds of ``owner`` (:data:`ALL_HOLDS`: every one). With ``retry_for`` > 0
    a release Redis fails is raised and resent from the lane for up to ``retry_for`` s, unless
    ``retry_unless()`` (the owner took the lock anew)."""
    runtime = LockRuntime.of(client)
    args: tuple[Any, ...] = (owner, drop, new_request_id(), META_RETENTION_MS, keys.channel)
    if runtime.publish_command(keys.prefix) == "spublish":
        args += ("spublish",)
    try:  # not backend_errors(): the hot path (see acquire)
        if runtime.cancels:
            settle(client, keys, owner, runtime)
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
            runtime.lane.retry(
                again, f"release {keys.lock} held by {owner}", retry_for, budget=budget()
            )
        _raise_backend_error("release", keys.name, exc)
    _log_release.debug("release %s by %s: %s", keys.lock, owner, left)
    return _FREED if left == 0 else NOT_OWNED if left < 0 else ReleaseReply(True, left)


def force_release(
    client: Any,
    keys: LockKeys,
    holder: str = "",
    *,
    states: Collection[str] = (),
    note: tuple[str, str] | None = None,
) -> bool:
    """Delete the lock (see :meth:`LockSpace.force_release`); wakes waiters. ``note``:
    ``(key, value)`` written in the same step, kept as long as the hold had lease left."""
    if isinstance(states, str):
        raise TypeError(
            f"states must be a collection of labels, such as ('parked',), not {states!r}"
        )
    for state in states:
        if not isinstance(state, str) or not state:
            raise ValueError(f"states must be non-empty labels, got {state!r}")
    publish = LockRuntime.of(client).publish_command(keys.prefix)
    args: tuple[Any, ...] = (publish, keys.channel, META_RETENTION_MS, holder)
    names: tuple[str, ...] = keys.pair
    if note is not None:
        names, args = (*names, note[0]), (*args, note[1])
    with backend_errors("force-release", keys.name):
        done = int(scripts.FORCE_RELEASE(client, names, (*args, *states)))
    if done:
        _log_release.info("force-released %s%s", keys.lock, f" held by {holder}" if holder else "")
    return bool(done)


def inspect(client: Any, keys: LockKeys) -> LockState:
    with backend_errors("inspect", keys.name):
        return lock_state(keys, scripts.INSPECT(client, keys.pair, ()))


def lock_state(keys: LockKeys, reply: Any) -> LockState:
    pttl, fence = int(reply[0]), text(reply[1])
    return LockState(
        keys=keys,
        lease_left=pttl / 1000 if pttl >= 0 else None,
        fence=int(fence) if fence else None,
        since=int(fence) / 1e6 if fence else None,  # a new holder's fence is the server's us
        info=text(reply[2]),
        run_token=text(reply[3]),
        state=text(reply[4]),
        owners={text(reply[i]): int(reply[i + 1]) for i in range(5, len(reply) - 1, 2)},
    )


def is_held(client: Any, *keys: LockKeys) -> bool:
    """Whether anyone holds any of ``keys`` (one name's permits) now."""
    with backend_errors("check", keys[0].name):
        return bool(client.exists(*(permit.lock for permit in keys)))
