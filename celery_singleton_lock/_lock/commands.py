"""The lock's operations on Redis: one call to one Lua script (or one command) each.

This is the one place where script replies become typed replies (:class:`AcquireReply`,
:class:`ReleaseReply`, :class:`LockState`) and Redis errors become :class:`LockBackendError`.
Everything above it (the lock object, :class:`~._lock.space.LockSpace`) reads those replies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, NoReturn

from redis.exceptions import RedisError

from .._errors import LockBackendError
from . import observe, scripts
from .deadline import budget
from .keys import LockKeys
from .owner import new_request_id
from .pending import PendingCancel
from .runtime import LockRuntime, publish_command
from .scripts import META_RETENTION_MS
from .sentinel import ACQUIRE_CHECK_INTERVAL

__all__ = [
    "ALL_HOLDS",
    "CLAIMED",
    "CLAIMED_ELSEWHERE",
    "META_RETENTION_MS",
    "WAITERS",
    "WAIT_OVER",
    "WAIT_REPLACED",
    "AcquireReply",
    "LockState",
    "RecordReply",
    "ReleaseReply",
    "WaitReply",
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
    "settle",
    "text",
    "wait_claim",
    "wait_end",
    "wait_mark",
    "wait_park",
]


#: ``release(..., drop=ALL_HOLDS)`` drops every hold of the owner (lua/release.lua's 0)
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
    #: seconds left on the holder's lease when not acquired (-1.0: none known: the lock has no
    #: lease, or this request was voided)
    lease_left: float = 0.0
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
    #: seconds left on the lease; ``None`` when the lock is free (or has no lease)
    lease_left: float | None
    fence: int | None
    #: server time (Unix seconds) when the current holder took it, when known
    since: float | None
    #: operator info stored with the hold ("" when none)
    info: str
    #: the run token of the run that holds it ("" when no run has entered it)
    run_token: str
    #: the hold's state, as its holder labelled it ("" when none; see ``ReentrantLock(state=)``)
    state: str
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
    state: str = "",
) -> AcquireReply:
    """Take or re-enter the lock in Redis (``request``: the id that makes a resend harmless).

    A cancel of this owner's on this lock still pending (an earlier acquire's reply was lost)
    runs first; when it cannot, nothing is sent and :class:`LockBackendError` is raised."""
    runtime = LockRuntime.of(client)
    runtime.follow_master(ACQUIRE_CHECK_INTERVAL)  # Sentinel: where is the master
    if runtime.cancels.by_owner:  # (empty, the usual case: the one cost on the hot path)
        try:
            settle(client, keys, owner, runtime)
        except RedisError as exc:
            _raise_backend_error("acquire", keys.name, exc, _settling(keys, owner))
    # try/except rather than backend_errors(): this is the hot path, and a generator-based
    # context manager costs about a microsecond per call.
    try:
        # The meta hash's TTL is computed here, not in the script (a second number to parse
        # there); info, run token and state are sent only when there are any (fewer arguments).
        args: tuple[Any, ...] = (owner, lease_ms, request, lease_ms + META_RETENTION_MS)
        if info or run_token or state:
            args += (info, run_token, state)
        reply = scripts.ACQUIRE(client, keys.pair, args)
    except RedisError as exc:
        # The reply is lost, not necessarily the acquire: it may have run, or run later.
        _cancel(client, runtime, PendingCancel(keys, owner, request, lease_ms))
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
    return AcquireReply(False, 0, None, _seconds(reply[1]), text(reply[2]), len(reply) > 3)


def _seconds(pttl: Any) -> float:
    """A script's milliseconds left on a lease as seconds (-1.0: no lease)."""
    ms = int(pttl)
    return ms / 1000 if ms >= 0 else -1.0


def _run_cancel(client: Any, runtime: LockRuntime, cancel: PendingCancel) -> None:
    """Run ``cancel`` (lua/cancel.lua) once; it is no longer pending when Redis answered."""
    args = (cancel.owner, cancel.request, runtime.publish_command, META_RETENTION_MS)
    if int(scripts.CANCEL(client, cancel.keys.pair, (*args, cancel.lease_ms, cancel.keys.channel))):
        _log_acquire.warning(
            "the acquire of %s by %s whose reply was lost had taken the lock: undone",
            cancel.keys.lock,
            cancel.owner,
        )
    runtime.cancels.discard(cancel)


def _cancel(client: Any, runtime: LockRuntime, cancel: PendingCancel) -> None:
    """Make sure the acquire whose reply never came holds nothing (lua/cancel.lua): now if
    Redis answers within what is left of the operation's deadline (nothing is sent when it
    has passed), else from the client's renewal lane until it does.

    Until it has run, the cancel is pending in the client's runtime (see :mod:`.pending`):
    the owner's next acquire, release or park of the lock runs it first. cancel.lua undoes the
    late acquire only while no other acquire of the owner has run since: an acquire of the
    owner that ran first would re-enter the late hold, and leave it behind its release.

    The lane keeps trying for as long as a hold that acquire could take might live: its lease
    (plus the meta hash's retention, which keeps the cancel's mark) counted from the last
    attempt that timed out, since a server that does not answer (stalled, or a silent path
    that still delivers later) may run the acquire when it wakes, long after it was sent; a
    server that refuses the connection has lost it with the old connection."""
    # Pending before the first try: another thread acting as the same owner settles it too.
    runtime.cancels.add(cancel)
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

        def in_background() -> None:
            if not cancel.done:  # (the owner's next operation may have run it)
                _run_cancel(client, runtime, cancel)

        runtime.retry(
            in_background,
            f"cancel acquire of {cancel.keys.lock}",
            (cancel.lease_ms + META_RETENTION_MS) / 1000,
            budget=budget(),
            while_stalled=True,
            # What it was to undo has ended with its lease by then: nothing is left to settle.
            gave_up=lambda: runtime.cancels.discard(cancel, done=False),
        )


def settle(client: Any, keys: LockKeys, owner: str, runtime: LockRuntime | None = None) -> None:
    """Run the cancels still pending for ``owner`` on the lock of ``keys`` (every permit of a
    semaphore), oldest first, within the current deadline: before the owner's next operation
    on it. Raises the ``RedisError`` of one that Redis did not answer (it stays pending; the
    lane goes on trying it too): the operation must not run on top of what it is to undo.

    A late acquire that arrives after its cancel ran is refused by the cancel's mark
    (``void:<request id>``); one that ran before is undone, as no acquire of the owner can
    have run since (its next one settles first), unless another process acting as the same
    owner ran one (only this process's pending cancels are known here)."""
    if runtime is None:
        runtime = LockRuntime.of(client)
    if not runtime.cancels.by_owner:
        return
    for cancel in runtime.cancels.of(keys, owner):
        if not cancel.done:
            _run_cancel(client, runtime, cancel)


def _settling(keys: LockKeys, owner: str) -> str:
    """The subject of the error of an operation whose pending cancel could not run."""
    return (
        f"lock {keys.name!r}: an earlier acquire by owner {owner!r} lost its reply, and its "
        "cancel, which must run first, did not reach Redis either"
    )


def park(
    client: Any, keys: LockKeys, owner: str, lease_ms: int, info: str = "", state: str = ""
) -> bool:
    """Keep ``owner``'s hold in Redis, unrenewed, for ``lease_ms``, its run token cleared (and
    its info and state replaced, unless empty); ``False`` when the owner did not hold it. A
    pending cancel runs first (see :func:`acquire`)."""
    args = (owner, lease_ms, META_RETENTION_MS, info, state)
    runtime = LockRuntime.of(client)
    if runtime.cancels.by_owner:
        with backend_errors("park", keys.name, _settling(keys, owner)):
            settle(client, keys, owner, runtime)
    with backend_errors("park", keys.name):
        return bool(int(scripts.PARK(client, keys.pair, args)))


class RecordReply(NamedTuple):
    """What :func:`record_if_held` did (lua/record_if_held.lua's reply, typed)."""

    #: the record was written: the owner held the lock with enough lease left
    recorded: bool
    #: the owner still held the lock (``False``: its lease was lost, or someone else holds it)
    held: bool
    #: seconds left on the lock's lease when held (-1.0: no lease)
    lease_left: float = 0.0

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
    return RecordReply(code == 1, code != 0, _seconds(pttl))


def records(client: Any, keys: LockKeys, kind: str) -> dict[str, str]:
    """The lock's ``kind`` records (see :func:`record_if_held`)."""
    with backend_errors("read the records of", keys.name):
        raw = client.hgetall(keys.records(kind))
    return {text(field): text(value) for field, value in raw.items()}


class WaitReply(NamedTuple):
    """What :func:`wait_park` did (lua/wait_park.lua's reply, typed)."""

    #: the record was written: the lock was held (or the write was forced)
    waiting: bool
    #: when written: seconds left on the lease that frees first (0.0: a slot is free, -1.0:
    #: no lease)
    lease_left: float = 0.0

    def __bool__(self) -> bool:
        return self.waiting


#: :func:`wait_claim`'s answers: this message claimed the wait; the copy waits no more; another
#: message claimed it (or the copy waits again with another token); the copy was replaced
CLAIMED, WAIT_OVER, CLAIMED_ELSEWHERE, WAIT_REPLACED = 1, 0, 2, 3


#: the kind of records (:meth:`LockKeys.records`) the waiters of a lock keep beside it
WAITERS = "wait"


def wait_park(
    client: Any,
    keys: LockKeys,
    locks: Sequence[str],
    waiter: str,
    record: str,
    keep_ms: int,
    force: bool = False,
) -> WaitReply:
    """Write ``waiter``'s ``record`` into the wait records of the lock ``keys`` while every
    one of ``locks`` (its slots) is held, checked in the same step; ``force`` writes it even
    when a slot is free. The records live at least ``keep_ms`` from now."""
    subject = f"the wait record of {waiter!r} beside lock {keys.name!r}"
    with backend_errors("write", keys.name, subject):
        code, pttl = scripts.WAIT_PARK(
            client,
            (keys.records(WAITERS), *locks),
            (waiter, record, keep_ms, "1" if force else ""),
        )
    return WaitReply(int(code) == 1, _seconds(pttl))


def wait_claim(client: Any, keys: LockKeys, waiter: str, token: str, mark: str) -> tuple[int, str]:
    """Claim ``waiter``'s wait ``token`` beside the lock ``keys`` for the message marked
    ``mark``: :data:`CLAIMED` (with ``"again"`` when this message had claimed it before),
    :data:`WAIT_OVER`, :data:`CLAIMED_ELSEWHERE`, or :data:`WAIT_REPLACED` with the task id
    that replaced the waiter (see lua/wait_claim.lua)."""
    subject = f"the wait of {waiter!r} beside lock {keys.name!r}"
    with backend_errors("claim", keys.name, subject):
        code, by = scripts.WAIT_CLAIM(client, (keys.records(WAITERS),), (waiter, token, mark))
    return int(code), text(by)


def wait_mark(client: Any, keys: LockKeys, waiter: str, by: str) -> bool:
    """Mark ``waiter``'s wait beside the lock ``keys`` as replaced by task ``by``, if it has
    one (see lua/wait_mark.lua)."""
    subject = f"the wait of {waiter!r} beside lock {keys.name!r}"
    with backend_errors("mark", keys.name, subject):
        return bool(int(scripts.WAIT_MARK(client, (keys.records(WAITERS),), (waiter, by))))


def wait_end(
    client: Any,
    keys: LockKeys,
    waiter: str = "",
    token: str = "",
    claim: str = "",
    *,
    listing: bool = True,
) -> dict[str, str]:
    """Drop ``waiter``'s record beside the lock ``keys`` while it is the wait ``token`` or its
    ``claim``, and (with ``listing``) return the records of the waiters that are not claimed:
    task id -> record."""
    with backend_errors("read", keys.name, f"the waiters beside lock {keys.name!r}"):
        reply = scripts.WAIT_END(
            client, (keys.records(WAITERS),), (waiter, token, claim, "1" if listing else "")
        )
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


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
    the hold is someone's again (the owner took it anew: its own release settles it).

    A pending cancel runs first (see :func:`acquire`); when it cannot, the release is not sent
    now, but it is in the background with ``retry_for``."""
    runtime = LockRuntime.of(client)
    args: tuple[Any, ...] = (owner, drop, new_request_id(), META_RETENTION_MS, keys.channel)
    if runtime.publish_command == "spublish":
        args += ("spublish",)
    try:  # not backend_errors(): the hot path (see acquire)
        if runtime.cancels.by_owner:
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
            LockRuntime.of(client).retry(
                again, f"release {keys.lock} held by {owner}", retry_for, budget=budget()
            )
        _raise_backend_error("release", keys.name, exc)
    _log_release.debug("release %s by %s: %s", keys.lock, owner, left)
    if left == 0:
        return _FREED
    return _NOT_OWNED if left < 0 else ReleaseReply(True, left)


def force_release(
    client: Any, keys: LockKeys, holder: str = "", *, states: Collection[str] = ()
) -> bool:
    """Delete the lock whoever holds it (or only when ``holder`` holds it, and with ``states``
    only while its hold is in one of them and no run has entered it); wakes waiters."""
    if isinstance(states, str):
        raise TypeError(
            f"states must be a collection of labels, such as ('queued',), not {states!r}"
        )
    for state in states:
        if not isinstance(state, str) or not state:
            raise ValueError(f"states must be non-empty labels, got {state!r}")
    args = (publish_command(client), keys.channel, META_RETENTION_MS, holder, *states)
    with backend_errors("force-release", keys.name):
        done = int(scripts.FORCE_RELEASE(client, keys.pair, args))
    if done:
        _log_release.info("force-released %s%s", keys.lock, f" held by {holder}" if holder else "")
    return bool(done)


def inspect(client: Any, keys: LockKeys) -> LockState:
    """The lock's state, read atomically."""
    with backend_errors("inspect", keys.name):
        reply = scripts.INSPECT(client, keys.pair, ())
    pttl, fence = int(reply[0]), text(reply[1])
    return LockState(
        keys=keys,
        lease_left=pttl / 1000 if pttl >= 0 else None,
        fence=int(fence) if fence else None,
        # a new holder's fence is the server time in microseconds (see lua/acquire.lua)
        since=int(fence) / 1e6 if fence else None,
        info=text(reply[2]),
        run_token=text(reply[3]),
        state=text(reply[4]),
        owners={text(reply[i]): int(reply[i + 1]) for i in range(5, len(reply) - 1, 2)},
    )


def is_held(client: Any, *keys: LockKeys) -> bool:
    """Whether anyone holds any of the locks of ``keys`` (one name's permits) now."""
    with backend_errors("check", keys[0].name):
        return bool(client.exists(*(permit.lock for permit in keys)))


def is_owned(client: Any, keys: LockKeys, owner: str) -> bool:
    """Whether ``owner`` holds the lock now."""
    with backend_errors("check", keys.name):
        return bool(client.hexists(keys.lock, owner))
