"""``ReentrantLock``: a reentrant, renewed, fenced lock in one Redis hash."""

from __future__ import annotations

import threading
import time
import weakref
from types import TracebackType
from typing import Any

from .._errors import LockLostError, LockNotOwnedError, LockTimeoutError
from . import commands, observe
from .checks import RedisClient, check_backend_timeout, check_client, check_lease_ms, check_wait
from .commands import ALL_HOLDS, AcquireReply, ReleaseReply
from .deadline import bounded
from .hold import Hold
from .keys import LockKeys, check_prefix
from .owner import default_owner, new_request_id
from .runtime import LockRuntime

__all__ = ["ReentrantLock"]


class ReentrantLock:
    """A reentrant lock held in one Redis hash: field = owner token, value = hold count.

    ``ttl`` is the lease in seconds. With ``renew=True`` (the default) the process heartbeat
    renews it about every ``ttl/3`` for as long as it is held; a holder that crashes or stops
    renewing loses it when the lease ends. ``owner`` defaults to a token unique to the calling
    process and thread (new after fork); lock objects with the same client, name and owner share
    one hold, so nesting in one process costs no round trip (they must agree on ``ttl`` and
    ``renew``: re-entering a held hold with others raises ``ValueError``). The same owner in
    another process (a Celery publisher and the worker running the task) re-enters through
    Redis. What the lock keeps about its client (holds, renewal lane, wake-up subscriptions) is
    the client's :class:`~.runtime.LockRuntime`, shared by all its locks.

    ``timeout`` is how long :meth:`acquire` and ``with lock:`` wait when not told otherwise
    (``None``, the default: as long as it takes). Every option comes after the name, by keyword.
    ``prefix`` is the first part of the Redis keys (``prefix:{name}``); ``info`` is a string
    stored beside the lock for operators; ``state`` is a label of the hold's state that
    operator commands can act on (``LockSpace.force_release(states=...)``), never parsed out of
    ``info``.

    ``run_token`` names one session of an owner that several processes act as: while a holder
    with a run token holds the lock, the same owner with another run token is refused, and the
    same owner without one may always re-enter. (A job whose owner token is its id can be
    delivered twice; the Celery layer passes one run token per delivery, so a redelivered
    message never runs beside its first run.)

    ``backend_timeout`` (seconds, ``None``: no bound beyond the client's own) bounds each of
    the lock's operations on Redis as a whole, the client's resends included: one acquire
    attempt (a blocking wait is made of several, and waits as long as it was asked to), a
    release, a park, a check. What an operation cut short leaves open is settled in the
    background: the cancel of an acquire whose reply was lost, a release sent again.

    The lock is efficiency-grade: a holder paused longer than its lease can lose it while it
    still runs. Check :attr:`lost` / :meth:`ensure_held`, and pass :attr:`fence` to stores that
    can reject writes from an older holder, for correctness-grade safety.
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
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        check_lease_ms(ttl, "ttl")  # a finite number of seconds, at least a millisecond
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise TypeError(f"owner must be a non-empty str or None, got {owner!r}")
        if not isinstance(renew, bool):
            raise TypeError(f"renew must be True or False, got {renew!r}")
        self._timeout = check_wait(timeout, "timeout")
        if not isinstance(info, str):
            raise TypeError(f"info must be a str, got {info!r}")
        if not isinstance(run_token, str):
            raise TypeError(f"run_token must be a str, got {run_token!r}")
        if not isinstance(state, str):
            raise TypeError(f"state must be a str, got {state!r}")
        self._backend_timeout = check_backend_timeout(backend_timeout)
        self._client: Any = client
        self._name = name
        self._ttl = float(ttl)
        self._owner = owner
        self._renew = renew
        self._info = info
        self._run_token = run_token
        self._state = state
        self._keys = LockKeys.for_name(check_prefix(prefix), name)
        #: a permit of a Semaphore (see semaphore._Permit): its refusals are the semaphore's
        self._quiet = False
        #: the hold this object took last (its ``lost`` outlives the hold), and the Event
        #: that ``lost`` returns before any hold: both made only when needed
        self._last_hold: Hold | None = None
        self._never_lost: threading.Event | None = None

    # -- identity ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def key(self) -> str:
        """The Redis key of the lock hash."""
        return self._keys.lock

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def owner(self) -> str:
        """The owner token this lock object acts as, for the calling thread."""
        return self._owner if self._owner is not None else default_owner()

    def _hold(self) -> Hold | None:
        return LockRuntime.of(self._client).holds.find(self._keys.lock, self.owner)

    # -- acquire -------------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire or re-enter the lock; return whether it is held.

        ``blocking=False`` tries once. Otherwise wait up to ``timeout`` seconds (``None``: the
        lock's own ``timeout``, which by default waits as long as it takes), woken by the
        holder's release, or at the latest when its lease ends.
        Raises :class:`LockBackendError` when Redis fails, and :class:`LockLostError` when
        re-entering a hold whose lease was already lost.
        """
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be True or False, got {blocking!r}")
        if not blocking:
            if timeout is not None:
                raise ValueError("timeout cannot be given with blocking=False")
            wait: float | None = 0.0
        else:
            wait = self._timeout if timeout is None else check_wait(timeout)
        taken = self._take(wait)
        return type(taken) is Hold or taken.acquired  # type: ignore[union-attr]  # Hold checked

    def try_acquire(self, timeout: float | None = 0.0) -> AcquireReply:
        """Acquire or re-enter the lock, and say what happened: :meth:`acquire` with the reply.

        ``timeout=0`` (the default) tries once; otherwise it waits as :meth:`acquire` does
        (``None``: the lock's own ``timeout``). When not acquired, the reply names the holder's
        owner token (``holder``), the seconds left on its lease (``lease_left``), and whether
        the holder is another run of this same owner (``other_run``).
        """
        taken = self._take(self._timeout if timeout is None else check_wait(timeout))
        if isinstance(taken, Hold):
            return AcquireReply(True, taken.count, taken.fence)
        return taken

    def _take(self, wait: float | None) -> AcquireReply | Hold:
        """The reply of Redis, or the hold itself when re-entered in this process (nested
        re-entry is the hot path of a reentrant lock: it allocates nothing)."""
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
                        raise LockLostError(
                            f"cannot re-enter lock {self._name!r}: its lease was lost"
                        )
                    hold.count += 1
                    if observe.observer is not None:
                        observe.observer.acquired(True)
                    return hold
                hold.set_lease(self._ttl, self._renew)  # nobody holds it: this object's lease
                try:
                    reply = self._acquire_in_redis(runtime, hold, deadline)
                except BaseException:
                    holds.forget(hold)
                    raise
                if not reply.acquired:
                    holds.forget(hold)
                return reply

    def _acquire_in_redis(
        self, runtime: LockRuntime, hold: Hold, deadline: float | None
    ) -> AcquireReply:
        sub = None
        # A release woke this thread and it has not tried the lock since: if it leaves now,
        # the wake-up goes to the next waiter (see WakeHub.leave).
        woken = False
        request = new_request_id()
        started = time.monotonic()
        channel = self._keys.channel
        if (deadline is None or deadline > started) and runtime.contended.recent(channel):
            # This process met a holder of this lock a moment ago: subscribe before the first
            # try, so a blocked wait sends one refused acquire, not two.
            sub = runtime.hub.join(channel)
        try:
            while True:
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
                woken = False  # tried since
                if reply.acquired:
                    self._took(runtime, hold, reply.fence, sent)
                    if observe.observer is not None:
                        observe.observer.acquired(reply.hold_count > 1)
                        if sub is not None:
                            observe.observer.waited(time.monotonic() - started)
                    return reply
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if observe.observer is not None and not self._quiet:
                        observe.observer.refused()
                        if sub is not None:
                            observe.observer.waited(time.monotonic() - started)
                    return reply
                request = new_request_id()
                if sub is None:
                    # Subscribe, then look again: a release between our look and our
                    # subscription cannot go unseen.
                    runtime.contended.note(channel)
                    sub = runtime.hub.join(channel)
                    continue
                # Wait for the push (a release wakes one waiting thread of this process), but
                # never longer than the holder's lease: if the push is lost, the lease ending
                # is the next moment the lock can be free.
                pause = reply.lease_left if reply.lease_left > 0 else 0.001
                if left is not None:
                    pause = min(pause, left)
                woken = sub.wait(pause)
        finally:
            if sub is not None:
                sub.hub.leave(sub, woken=woken)

    def _took(self, runtime: LockRuntime, hold: Hold, fence: int | None, sent: float) -> None:
        hold.count = 1
        hold.fence = fence
        hold.taken_at = sent
        hold.valid_until = sent + hold.ttl
        self._last_hold = hold
        if self._owner is None:
            hold.thread = weakref.ref(threading.current_thread())
        if hold.renew:
            runtime.renew(hold)

    # -- release -------------------------------------------------------------------------------

    def release(self) -> None:
        """Release one hold. The last release of this process's hold goes to Redis.

        Raises :class:`LockNotOwnedError` when this owner does not hold the lock (never
        acquired, already released, or the lease was lost meanwhile).
        """
        runtime = LockRuntime.of(self._client)
        hold = runtime.holds.find(self._keys.lock, self.owner)
        if hold is None:
            raise LockNotOwnedError(
                f"cannot release lock {self._name!r}: it is not held by owner {self.owner!r}"
            )
        with hold.mutex:
            if hold.count <= 0 or hold.dead:
                raise LockNotOwnedError(
                    f"cannot release lock {self._name!r}: it is not held by owner {hold.owner!r}"
                )
            if hold.count > 1:
                hold.count -= 1
                if hold.lost.is_set():
                    # Every release of a lost hold says so, the nested ones too: the caller
                    # learns at the first one that the work inside was not protected to its end.
                    raise LockNotOwnedError(
                        f"cannot release lock {self._name!r}: owner {hold.owner!r} lost its "
                        f"lease meanwhile ({hold.count} nested hold(s) of it left to release)"
                    )
                return
            # Stop renewing first: a lock is never renewed after its release began.
            hold.count = 0
            runtime.stop_renewing(hold)
            runtime.holds.forget(hold)
            # A release whose reply is lost may not have run: it is sent again in the background
            # (for up to a lease: after that the lock is gone anyway), unless this process has
            # taken the lock again meanwhile.
            with bounded(self._backend_timeout):
                reply = commands.release(
                    self._client,
                    self._keys,
                    hold.owner,
                    retry_for=hold.ttl,
                    retry_unless=lambda: (
                        runtime.holds.find(self._keys.lock, hold.owner) is not None
                    ),
                )
        if reply.owned:
            if observe.observer is not None:
                observe.observer.released(time.monotonic() - hold.taken_at)
        else:
            hold.lost.set()
            raise LockNotOwnedError(
                f"cannot release lock {self._name!r}: owner {hold.owner!r} no longer held it in "
                "Redis (its lease was lost: it expired or was released by someone else)"
            )

    def _detach(self) -> Hold | None:
        """Forget this process's hold without telling Redis (the caller settles Redis)."""
        runtime = LockRuntime.of(self._client)
        hold = runtime.holds.find(self._keys.lock, self.owner)
        if hold is None:
            return None
        with hold.mutex:
            held = hold.count > 0
            hold.count = 0
            runtime.stop_renewing(hold)
            runtime.holds.forget(hold)
        return hold if held else None

    def release_all(self) -> ReleaseReply:
        """Drop every hold of this owner, in this process and in Redis (the holds that other
        processes took as the same owner included). Never raises :class:`LockNotOwnedError`:
        the reply says whether the owner still held it.

        When Redis fails, :class:`LockBackendError` is raised and the release is also sent
        again in the background, as :meth:`release` does (for up to a lease: a hold of this
        owner taken through this object has this lease, renewed until now), unless this
        process takes the lock again as the same owner meanwhile."""
        hold = self._detach()
        owner = self.owner
        holds = LockRuntime.of(self._client).holds
        with bounded(self._backend_timeout):
            reply = commands.release(
                self._client,
                self._keys,
                owner,
                ALL_HOLDS,
                retry_for=self._ttl if hold is None else hold.ttl,
                retry_unless=lambda: holds.find(self._keys.lock, owner) is not None,
            )
        if hold is not None:
            if not reply.owned:
                hold.lost.set()  # held here, gone in Redis: the lease was lost on the way
            elif observe.observer is not None:
                observe.observer.released(time.monotonic() - hold.taken_at)
        return reply

    def park(self, lease: float, info: str = "", state: str = "") -> bool:
        """Hand the hold over to a later process of the same owner: end this process's hold
        (no more renewal) but keep the owner's hold in Redis for ``lease`` seconds, its run
        token cleared, so that process re-enters it (a Celery retry does). ``info`` and
        ``state`` replace the hold's unless empty. Returns ``False`` when the owner no longer
        held it."""
        lease_ms = check_lease_ms(lease)
        self._detach()
        with bounded(self._backend_timeout):
            return commands.park(self._client, self._keys, self.owner, lease_ms, info, state)

    def __enter__(self) -> ReentrantLock:
        if not self.acquire():
            raise LockTimeoutError(
                f"could not acquire lock {self._name!r} within {self._timeout} s",
                name=self._name,
                timeout=self._timeout,
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # -- state ---------------------------------------------------------------------------------

    def owned(self) -> bool:
        """Whether this owner holds the lock in Redis now (one round trip)."""
        with bounded(self._backend_timeout):
            return commands.is_owned(self._client, self._keys, self.owner)

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        with bounded(self._backend_timeout):
            return commands.is_held(self._client, self._keys)

    @property
    def hold_count(self) -> int:
        """How many times this owner holds the lock in this process (0 when not held)."""
        hold = self._hold()
        return 0 if hold is None else hold.count

    @property
    def fence(self) -> int | None:
        """The fencing token of the current hold: larger for every new holder; ``None`` when
        not held. Pass it to a store that refuses writes carrying a smaller token."""
        hold = self._hold()
        return None if hold is None else hold.fence

    @property
    def lost(self) -> threading.Event:
        """Set the moment the heartbeat finds the lease gone or cannot renew it in time."""
        hold = self._hold() or self._last_hold
        if hold is not None:
            return hold.lost
        if self._never_lost is None:
            self._never_lost = threading.Event()
        return self._never_lost

    def ensure_held(self) -> None:
        """Raise :class:`LockLostError` unless this owner still holds an unexpired lease.

        No round trip: it trusts the heartbeat's verdict and the lease's own clock.
        """
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

    def __repr__(self) -> str:
        return (
            f"<ReentrantLock {self._keys.lock!r} ttl={self._ttl} owner={self.owner!r} "
            f"hold_count={self.hold_count}>"
        )
