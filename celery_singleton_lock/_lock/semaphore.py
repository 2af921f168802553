"""``Semaphore``: at most N holders of one name at once, each on a leased, renewed permit."""

from __future__ import annotations

import threading
import time
from typing import Any

from .._errors import LockBackendError, LockTimeoutError
from . import observe
from .checks import RedisClient, check_backend_timeout, check_lease_ms, check_wait
from .commands import ALL_HOLDS, NOT_OWNED, AcquireReply, ReleaseReply
from .deadline import bounded
from .keys import LockKeys
from .permits import check_permits, owned_by, permit_keys, release_everywhere
from .permits import holders as permit_holders
from .permits import take as take_permit
from .reentrant import ReentrantLock
from .runtime import LockRuntime

__all__ = ["Semaphore"]


class _Permit(ReentrantLock):
    """Permit ``slot`` of a semaphore of several: a lock with keys of its own, whose refusals
    the semaphore reports (once per acquire of its own)."""

    def __init__(self, client: RedisClient, name: str, slot: int, **options: Any) -> None:
        super().__init__(client, name, **options)
        self._keys = LockKeys.for_name(self._keys.prefix, name, slot)
        self._quiet = True


class Semaphore:
    """``permits`` leases of one name: at most that many owners hold it at once.

    Each permit is a :class:`ReentrantLock` (permit 1 is the plain lock of ``name``, permit k
    ``prefix:{name}:s<k>``, one hash tag) with all a lock has, options included: its lease
    ``ttl`` renewed by the heartbeat, its fencing token. With ``permits=1`` it is that lock.

    An acquire re-enters the permit this owner holds in this process (no round trip); else,
    when the owner holds a permit in Redis (another process acting as it: a Celery publish
    took it), it re-enters that permit only, whose run token rule applies; else it tries the
    permits one by one from a random one, and takes the first free. A blocked acquire waits on
    one wake-up channel shared by all the permits, and tries them all again at each release, or
    when the first lease would end.

    Known gap: two processes acting as the same owner that acquire at the same instant can take
    two permits (finding the owner's permit and taking one are two steps). Each permit still
    checks its run token, so two runs of one owner with different run tokens never both enter
    the permit one of them holds.
    """

    def __init__(
        self,
        client: RedisClient,
        name: str,
        permits: int,
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
        count = check_permits(permits)  # first: nothing is made (nor sent) for a bad one
        options: dict[str, Any] = dict(ttl=ttl, owner=owner, renew=renew, timeout=timeout)
        options.update(prefix=prefix, info=info, run_token=run_token, state=state)
        # One permit is the plain lock itself; permit k of several is a lock with keys of its own.
        options["backend_timeout"] = backend_timeout
        self._locks = (
            tuple(_Permit(client, name, k, **options) for k in range(1, count + 1))
            if count > 1
            else (ReentrantLock(client, name, **options),)
        )
        self._client: Any = client
        self._timeout = check_wait(timeout, "timeout")
        self._backend_timeout = check_backend_timeout(backend_timeout)
        self._keys = permit_keys(prefix, name, count)
        #: the permit this object took last (its ``lost`` outlives the hold)
        self._last: ReentrantLock | None = None

    # -- identity and state --------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name of the semaphore (of its permit 1's lock)."""
        return self._locks[0].name

    @property
    def owner(self) -> str:
        """The owner token this semaphore acts as, for the calling thread."""
        return self._locks[0].owner

    @property
    def ttl(self) -> float:
        """The lease of a permit, in seconds."""
        return self._locks[0].ttl

    @property
    def permits(self) -> int:
        """How many may hold the semaphore at once."""
        return len(self._locks)

    @property
    def held(self) -> ReentrantLock | None:
        """The permit this owner holds in this process, or ``None``."""
        return next((lock for lock in self._locks if lock.hold_count > 0), None)

    @property
    def key(self) -> str:
        """The Redis key of the permit held, else of permit 1."""
        return (self.held or self._locks[0]).key

    @property
    def lost(self) -> threading.Event:
        """The ``lost`` of the permit held (or taken last): see :attr:`ReentrantLock.lost`."""
        return (self.held or self._last or self._locks[0]).lost

    @property
    def fence(self) -> int | None:
        """The fencing token of the permit held (each permit has its own); ``None`` when none."""
        return (self.held or self._locks[0]).fence  # (permit 1's is None when none is held)

    @property
    def hold_count(self) -> int:
        """How many times this owner holds its permit in this process (0: none)."""
        return (self.held or self._locks[0]).hold_count

    def ensure_held(self) -> None:
        """Raise :class:`LockLostError` unless this owner holds a permit with its lease."""
        (self.held or self._last or self._locks[0]).ensure_held()

    def holders(self) -> dict[str, int]:
        """Owner -> hold count over every permit, as Redis has them now (one round trip)."""
        with bounded(self._backend_timeout):
            return permit_holders(self._client, self._keys)

    # -- acquire -------------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take or re-enter a permit; return whether one is held. As
        :meth:`ReentrantLock.acquire`: ``blocking=False`` tries once, else wait up to
        ``timeout`` seconds (``None``: the semaphore's own ``timeout``)."""
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be True or False, got {blocking!r}")
        if not blocking:
            if timeout is not None:
                raise ValueError("timeout cannot be given with blocking=False")
            return self._take(0.0).acquired
        return self._take(self._timeout if timeout is None else check_wait(timeout)).acquired

    def try_acquire(self, timeout: float | None = 0.0) -> AcquireReply:
        """:meth:`acquire` with the reply (``timeout=None``: the semaphore's own ``timeout``);
        when refused, it is the refusal of the permit that frees first (its ``holder`` and
        ``lease_left``)."""
        return self._take(self._timeout if timeout is None else check_wait(timeout))

    def _take(self, wait: float | None) -> AcquireReply:
        if len(self._locks) == 1:
            return self._locks[0].try_acquire(wait)
        deadline = None if wait is None else time.monotonic() + wait
        runtime = LockRuntime.of(self._client)
        channel = self._keys[0].channel  # every permit's release publishes here
        sub = None
        woken = False  # as in ReentrantLock: a wake-up taken and not used is passed on
        started = time.monotonic()
        waits = (deadline is None or deadline > started) and self.held is None
        if waits and runtime.contended.recent(channel):
            # Refused a moment ago: subscribe before the first try (see ReentrantLock).
            sub = runtime.hub.join(channel)
        try:
            while True:
                reply = self._try_once()
                woken = False
                left = None if deadline is None else deadline - time.monotonic()
                if reply.acquired or (left is not None and left <= 0):
                    if observe.observer is not None:
                        if not reply.acquired:
                            observe.observer.refused()
                        if sub is not None:
                            observe.observer.waited(time.monotonic() - started)
                    return reply
                if sub is None:
                    # Subscribe, then look again: a release in between is not missed.
                    runtime.contended.note(channel)
                    sub = runtime.hub.join(channel)
                    continue
                pause = reply.lease_left if reply.lease_left > 0 else 0.001
                woken = sub.wait(pause if left is None else min(pause, left))
        finally:
            if sub is not None:
                sub.hub.leave(sub, woken=woken)

    def _try_once(self) -> AcquireReply:
        held = self.held
        if held is not None:
            reply = self._try(held)
            if reply.acquired:
                return reply
        with bounded(self._backend_timeout):
            owned = owned_by(self._client, self._keys, self.owner)
        return take_permit(lambda i: self._try(self._locks[i]), len(self._locks), owned)

    def _try(self, lock: ReentrantLock) -> AcquireReply:
        reply = lock.try_acquire(0.0)
        if reply.acquired:
            self._last = lock
        return reply

    # -- release -------------------------------------------------------------------------------

    def release(self) -> None:
        """Release one hold of the permit held (the last one goes to Redis); raises
        :class:`LockNotOwnedError` as :meth:`ReentrantLock.release` does."""
        (self.held or self._locks[0]).release()

    def _owned(self) -> list[ReentrantLock]:
        """The permits this owner holds: the one held here, else those it holds in Redis."""
        held = self.held
        if held is not None or len(self._locks) == 1:
            return [held or self._locks[0]]
        with bounded(self._backend_timeout):
            return [self._locks[i] for i in owned_by(self._client, self._keys, self.owner)]

    def release_all(self) -> ReleaseReply:
        """Drop every hold of this owner's permit, here and in Redis (see
        :meth:`ReentrantLock.release_all`). When Redis fails while the permit is looked for,
        the release is sent to every permit, and again in the background."""
        owner, holds = self.owner, LockRuntime.of(self._client).holds
        try:
            owned = self._owned()
        except LockBackendError:

            def again() -> bool:  # as ReentrantLock.release_all's: this process took one again
                return any(holds.find(keys.lock, owner) for keys in self._keys)

            with bounded(self._backend_timeout):
                release_everywhere(self._client, self._keys, owner, ALL_HOLDS, self.ttl, again)
            raise
        replies = [lock.release_all() for lock in owned]
        return next((reply for reply in replies if reply.owned), NOT_OWNED)

    def park(self, lease: float, info: str = "") -> bool:
        """Hand this owner's permit over to a later process of the same owner (see
        :meth:`ReentrantLock.park`); ``False`` when it held none."""
        check_lease_ms(lease)
        return any([lock.park(lease, info) for lock in self._owned()])

    def __enter__(self) -> Semaphore:
        if not self.acquire():
            message = f"no permit of {self.name!r} ({self.permits}) came free in {self._timeout} s"
            raise LockTimeoutError(message, name=self.name, timeout=self._timeout)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<Semaphore {self._keys[0].lock!r} permits={self.permits} owner={self.owner!r}>"
