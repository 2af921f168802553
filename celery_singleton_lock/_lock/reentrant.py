"""``ReentrantLock``: a reentrant, renewed, fenced lock in one Redis hash."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Self

from .._errors import LockLostError, LockNotOwnedError, LockTimeoutError
from . import commands, observe
from .checks import (
    RedisClient,
    check_backend_timeout,
    check_client,
    check_lease_ms,
    check_wait,
    wait_of,
)
from .commands import ALL_HOLDS, AcquireReply, ReleaseReply
from .deadline import bounded
from .hold import Hold
from .keys import LockKeys, check_name, check_prefix
from .owner import default_owner, new_request_id
from .runtime import LockRuntime


class Leased:
    """What :class:`ReentrantLock` and :class:`Semaphore` share: acquiring, ``with``."""

    _name: str
    _ttl: float
    _owner: str | None
    _timeout: float | None
    #: the :class:`LockTimeoutError` of ``with`` (formatted with the object)
    _timed_out = "could not acquire lock {0.name!r} within {0._timeout} s"

    if TYPE_CHECKING:

        def _hold(self) -> Hold | None: ...
        def _take(self, wait: float | None) -> AcquireReply | Hold: ...
        def release(self) -> None: ...

    @property
    def name(self) -> str:
        return self._name

    @property
    def ttl(self) -> float:
        """The lease in seconds (of each permit, for a semaphore)."""
        return self._ttl

    @property
    def owner(self) -> str:
        """The owner token this object acts as, for the calling thread."""
        return self._owner if self._owner is not None else default_owner()

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire or re-enter the lock (a semaphore: a permit); whether it is held.
        ``blocking=False`` tries once; else wait up to ``timeout`` seconds (``None``: the
        object's own ``timeout``), woken by a holder's release or at the latest when its lease
        ends. Raises :class:`LockBackendError` when Redis fails, :class:`LockLostError` when
        re-entering a hold whose lease was lost."""
        taken = self._take(wait_of(blocking, timeout, self._timeout))
        return type(taken) is Hold or taken.acquired  # type: ignore[union-attr]  # Hold checked

    def try_acquire(self, timeout: float | None = 0.0) -> AcquireReply:
        """:meth:`acquire` that says what happened (``timeout=0``: one try; ``None``: the
        object's own ``timeout``). A refusal names the holder (``holder``), the seconds left on
        its lease (``lease_left``) and whether it is another run of this owner (``other_run``);
        a semaphore's is the refusal of the permit that frees first."""
        taken = self._take(self._timeout if timeout is None else check_wait(timeout))
        if isinstance(taken, Hold):
            return AcquireReply(True, taken.count, taken.fence)
        return taken

    @property
    def hold_count(self) -> int:
        """How many times this owner holds the lock (a permit) in this process (0: not held)."""
        hold = self._hold()
        return 0 if hold is None else hold.count

    @property
    def fence(self) -> int | None:
        """The fencing token of the current hold (of a semaphore: of its permit held, each has
        its own), larger for every new holder (``None``: not held): pass it to a store that
        refuses writes with a smaller one."""
        hold = self._hold()
        return None if hold is None else hold.fence

    def ensure_held(self) -> None:
        """Raise :class:`LockLostError` unless this owner still holds an unexpired lease (a
        semaphore: on a permit); no round trip."""
        hold = self._hold()
        if hold is None:
            raise LockLostError(f"lock {self._name!r} is not held by owner {self.owner!r}")
        if hold.lost.is_set():
            raise LockLostError(f"the lease of lock {self._name!r} was lost")
        if hold.lease_left() <= 0:
            hold.lost.set()
            raise LockLostError(
                f"the lease of lock {self._name!r} ran out before it could be renewed"
            )

    def __enter__(self) -> Self:
        if not self.acquire():
            message = self._timed_out.format(self)
            raise LockTimeoutError(message, name=self._name, timeout=self._timeout)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class ReentrantLock(Leased):
    """A reentrant lock held in one Redis hash: field = owner token, value = hold count.

    ``ttl`` is the lease in seconds, renewed about every ``ttl/3`` while held with ``renew``.
    ``owner`` defaults to a token of the calling process and thread; lock objects of one client,
    name and owner share one hold (they must agree on ``ttl`` and ``renew``), and the same owner
    in another process re-enters through Redis. ``timeout``: how long :meth:`acquire` waits by
    default (``None``: no bound); keys are ``prefix:{name}``; ``info`` is text for operators,
    ``state`` a label operator commands act on. While a hold has a ``run_token``, the same owner
    with another one is refused (``other_run``). ``backend_timeout`` bounds each Redis
    operation as a whole, resends included.

    Efficiency-grade: a holder paused past its lease can lose it. Check :attr:`lost` /
    :meth:`ensure_held`, and pass :attr:`fence` to stores that refuse an older holder's writes.
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        *,
        ttl: float = 30.0,
        owner: str | None = None,
        renew: bool = True,
        timeout: float | None = None,
        prefix: str = "lock",
        info: str = "",
        run_token: str = "",
        state: str = "",
        backend_timeout: float | None = None,
    ) -> None:
        check_client(client)
        check_name(name)
        check_lease_ms(ttl, "ttl")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise TypeError(f"owner must be a non-empty str or None, got {owner!r}")
        if not isinstance(renew, bool):
            raise TypeError(f"renew must be True or False, got {renew!r}")
        for parameter, value in (("info", info), ("run_token", run_token), ("state", state)):
            if not isinstance(value, str):
                raise TypeError(f"{parameter} must be a str, got {value!r}")
        keys = LockKeys.for_name(check_prefix(prefix), name)
        timeout, backend_timeout = check_wait(timeout), check_backend_timeout(backend_timeout)
        texts = (info, run_token, state)
        self._set(client, keys, float(ttl), owner, renew, timeout, backend_timeout, texts)

    def _set(self, client: Any, keys: LockKeys, ttl: float, owner: str | None, renew: bool,
             timeout: float | None, backend_timeout: float | None,
             texts: tuple[str, str, str]) -> None:  # fmt: skip
        """Every attribute, from checked arguments; ``texts``: info, run token, state."""
        self._timeout = timeout
        self._backend_timeout = backend_timeout
        self._client: Any = client
        self._name = keys.name
        self._ttl = ttl
        self._owner = owner
        self._renew = renew
        self._info, self._run_token, self._state = texts
        self._keys = keys
        #: a Semaphore's permit: its refusals are the semaphore's
        self._quiet = False
        #: the hold taken last (its ``lost`` outlives it), and ``lost`` before any hold
        self._last_hold: Hold | None = None
        self._never_lost: threading.Event | None = None

    @classmethod
    def checked(cls, client: Any, keys: LockKeys, ttl: float, owner: str,
                texts: tuple[str, str, str],
                backend_timeout: float | None) -> ReentrantLock:  # fmt: skip
        """A renewed lock of arguments already checked (:meth:`LockSpace.checked_lock`: one
        lock per job), without a default wait."""
        lock = cls.__new__(cls)
        cls._set(lock, client, keys, ttl, owner, True, None, backend_timeout, texts)
        return lock

    @property
    def key(self) -> str:
        """The Redis key of the lock hash."""
        return self._keys.lock

    def _hold(self) -> Hold | None:
        return LockRuntime.of(self._client).holds.find(self._keys.lock, self.owner)

    def _take(self, wait: float | None) -> AcquireReply | Hold:
        """Redis's reply, or the hold when re-entered here (the hot path: allocates nothing)."""
        deadline = None if wait is None else time.monotonic() + wait
        owner = self.owner
        runtime = LockRuntime.of(self._client)
        holds = runtime.holds
        while True:
            hold = holds.hold_for(self._client, self._keys, owner, self._ttl, self._renew)
            with hold.mutex:
                if hold.dead:
                    continue  # released (and unregistered) while we waited for its mutex
                if hold.count > 0:
                    if hold.ttl != self._ttl or hold.renew != self._renew:
                        # One hold, one lease: sharing it would silently drop this object's.
                        raise ValueError(
                            f"lock {self._name!r} is held by owner {owner!r} in this process "
                            f"with ttl={hold.ttl:g} renew={hold.renew}; this lock object has "
                            f"ttl={self._ttl:g} renew={self._renew}: lock objects of one owner "
                            "share one hold, so they must agree on ttl and renew"
                        )
                    if hold.lost.is_set():
                        raise LockLostError(f"cannot re-enter lock {self._name!r}: lease lost")
                    token = self._run_token
                    if token and hold.run_token and token != hold.run_token:  # another run
                        left = max(hold.valid_until - time.monotonic(), 0.0)
                        return AcquireReply(False, lease_left=left, holder=owner, other_run=True)
                    hold.count += 1
                    if observe.observer is not None:
                        observe.observer.acquired(True)
                    return hold
                hold.ttl, hold.renew = self._ttl, self._renew  # nobody holds it: this object's
                try:
                    attempt = self._attempt(runtime, hold)
                    if wait == 0.0:  # one try (a run's start): wait_for without its loop
                        reply = attempt(False)
                        if not (reply.acquired or self._quiet) and observe.observer is not None:
                            observe.observer.refused()
                    else:
                        reply = runtime.wait_for(self._keys.channel, deadline, attempt, self._quiet)
                except BaseException:
                    holds.forget(hold)
                    raise
                if not reply.acquired:
                    holds.forget(hold)
                return reply

    def _attempt(self, runtime: LockRuntime, hold: Hold) -> Callable[[bool], AcquireReply]:
        """One acquire in Redis per call (``again``: a new request id)."""
        request = new_request_id()

        def attempt(again: bool) -> AcquireReply:
            nonlocal request
            if again:
                request = new_request_id()
            sent = time.monotonic()
            with bounded(self._backend_timeout):
                reply = commands.acquire(
                    self._client,
                    self._keys,
                    hold.owner,
                    hold.lease_ms,
                    request,
                    self._info,
                    self._run_token,
                    self._state,
                )
            if reply.acquired:
                hold.count, hold.fence, hold.taken_at = 1, reply.fence, sent
                hold.run_token = self._run_token
                hold.valid_until = sent + hold.ttl
                self._last_hold = hold
                if self._owner is None:
                    hold.thread = weakref.ref(threading.current_thread())
                if hold.renew:
                    runtime.lane.add(hold)
                if observe.observer is not None:
                    observe.observer.acquired(reply.hold_count > 1)
            return reply

        return attempt

    def release(self) -> None:
        """Release one hold; the last one of this process goes to Redis. Raises
        :class:`LockNotOwnedError` when this owner does not hold it (or its lease was lost)."""
        runtime, owner = LockRuntime.of(self._client), self.owner
        hold = runtime.holds.find(self._keys.lock, owner)
        with hold.mutex if hold is not None else nullcontext():
            if hold is None or hold.count <= 0 or hold.dead:
                raise LockNotOwnedError(
                    f"cannot release lock {self._name!r}: it is not held by owner {owner!r}"
                )
            if hold.count > 1:
                hold.count -= 1
                if hold.lost.is_set():  # the caller learns at once the work was not protected
                    raise LockNotOwnedError(
                        f"cannot release lock {self._name!r}: owner {hold.owner!r} lost its "
                        f"lease meanwhile ({hold.count} nested hold(s) of it left to release)"
                    )
                return
            hold.count = 0  # stop renewing first: a lock is never renewed after its release
            runtime.lane.remove(hold)
            runtime.holds.forget(hold)
            reply = self._release(hold.owner, 1, hold.ttl)
        if not reply.owned:
            hold.lost.set()
            raise LockNotOwnedError(
                f"cannot release lock {self._name!r}: owner {hold.owner!r} no longer held it in "
                "Redis (its lease was lost: it expired or was released by someone else)"
            )
        if observe.observer is not None:
            observe.observer.released(time.monotonic() - hold.taken_at)

    def _release(self, owner: str, drop: int, retry_for: float) -> ReleaseReply:
        """Drop ``drop`` holds of ``owner`` in Redis. A release whose reply is lost may not have
        run: resent in the background for up to ``retry_for`` seconds, unless this process took
        the lock again meanwhile."""
        holds = LockRuntime.of(self._client).holds
        with bounded(self._backend_timeout):
            return commands.release(
                self._client,
                self._keys,
                owner,
                drop,
                retry_for=retry_for,
                retry_unless=lambda: holds.find(self._keys.lock, owner) is not None,
            )

    def _detach(self) -> Hold | None:
        """Forget this process's hold without telling Redis."""
        runtime = LockRuntime.of(self._client)
        hold = runtime.holds.find(self._keys.lock, self.owner)
        if hold is None:
            return None
        with hold.mutex:
            held = hold.count > 0
            hold.count = 0
            runtime.lane.remove(hold)
            runtime.holds.forget(hold)
        return hold if held else None

    def release_all(self) -> ReleaseReply:
        """Drop every hold of this owner, here and in Redis (other processes' too); whether it
        held any. When Redis fails, raises :class:`LockBackendError` and resends it in the
        background."""
        hold = self._detach()
        reply = self._release(self.owner, ALL_HOLDS, self._ttl if hold is None else hold.ttl)
        if hold is not None:
            if not reply.owned:
                hold.lost.set()  # held here, gone in Redis: the lease was lost on the way
            elif observe.observer is not None:
                observe.observer.released(time.monotonic() - hold.taken_at)
        return reply

    def park(self, lease: float, info: str = "", state: str = "") -> bool:
        """Hand the hold to a later process of the same owner: Redis keeps it, unrenewed, for
        ``lease`` seconds with its run token cleared (``info``/``state`` replace the hold's
        unless empty). ``False``: it was not held."""
        lease_ms = check_lease_ms(lease)
        self._detach()
        with bounded(self._backend_timeout):
            return commands.park(self._client, self._keys, self.owner, lease_ms, info, state)

    def owned(self) -> bool:
        """Whether this owner holds the lock in Redis now (one round trip)."""
        with bounded(self._backend_timeout), commands.backend_errors("check", self._name):
            return bool(self._client.hexists(self._keys.lock, self.owner))

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        with bounded(self._backend_timeout):
            return commands.is_held(self._client, self._keys)

    @property
    def lost(self) -> threading.Event:
        """Set the moment the heartbeat finds the lease gone or cannot renew it in time."""
        hold = self._hold() or self._last_hold
        if hold is not None:
            return hold.lost
        if self._never_lost is None:
            self._never_lost = threading.Event()
        return self._never_lost

    def __repr__(self) -> str:
        return (
            f"<ReentrantLock {self._keys.lock!r} ttl={self._ttl} owner={self.owner!r} "
            f"hold_count={self.hold_count}>"
        )
