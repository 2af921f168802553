"""``ReentrantLock``: a reentrant, renewed, fenced lock in one Redis hash."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from types import TracebackType
from typing import Any

from . import _backend
from ._errors import LockLostError, LockNotOwnedError, LockTimeoutError
from ._heartbeat import get_heartbeat
from ._hold import Hold
from ._keys import LockKeys, check_prefix
from ._owner import default_owner, new_request_id
from ._wakeup import get_hub

__all__ = ["ReentrantLock"]

log = logging.getLogger("celery_singleton_lock.acquire")

#: (id(client), lock key, owner) -> the process's hold. An entry exists only while held, and it
#: keeps its client alive, so an id is never reused for another client meanwhile.
_holds: dict[tuple[int, str, str], Hold] = {}
_holds_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A child owns nothing its parent held (its owner tokens differ), and must not renew it.
    global _holds_lock
    _holds.clear()
    _holds_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_client(client: object) -> None:
    if not (hasattr(client, "evalsha") and hasattr(client, "pipeline")):
        raise TypeError(
            "client must be a redis-py client (redis.Redis, redis.RedisCluster, or a Sentinel "
            f"master_for(...) client), got {type(client).__name__}"
        )


def _check_seconds(value: object, parameter: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{parameter} must be a number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{parameter} must be finite, got {value!r}")
    return float(value)


class ReentrantLock:
    """A reentrant lock held in one Redis hash: field = owner token, value = hold count.

    ``ttl`` is the lease in seconds. With ``renew=True`` (the default) the process heartbeat
    renews it about every ``ttl/3`` for as long as it is held; a holder that crashes or stops
    renewing loses it when the lease ends. ``owner`` defaults to a token unique to the calling
    process and thread (new after fork); lock objects with the same client, name and owner share
    one hold, so nesting in one process costs no round trip. The same owner in another process
    (a Celery publisher and the worker running the task) re-enters through Redis.

    ``blocking_timeout`` bounds ``with lock:`` (``None`` waits as long as it takes);
    ``prefix`` is the first part of the Redis keys (``prefix:{name}``); ``info`` is a string
    stored beside the lock for operators.

    The lock is efficiency-grade: a holder paused longer than its lease can lose it while it
    still runs. Check :attr:`lost` / :meth:`ensure_held`, and pass :attr:`fence` to stores that
    can reject writes from an older holder, for correctness-grade safety.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: float = 30.0,
        owner: str | None = None,
        renew: bool = True,
        *,
        blocking_timeout: float | None = None,
        prefix: str = "lock",
        info: str = "",
    ) -> None:
        _check_client(client)
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        ttl_s = _check_seconds(ttl, "ttl")
        assert ttl_s is not None
        if ttl_s < 0.001:
            raise ValueError(f"ttl must be at least 0.001 s (one millisecond), got {ttl!r}")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise TypeError(f"owner must be a non-empty str or None, got {owner!r}")
        if not isinstance(renew, bool):
            raise TypeError(f"renew must be True or False, got {renew!r}")
        self._blocking_timeout = _check_seconds(
            blocking_timeout, "blocking_timeout", allow_none=True
        )
        if self._blocking_timeout is not None and self._blocking_timeout < 0:
            raise ValueError(f"blocking_timeout must be >= 0 or None, got {blocking_timeout!r}")
        if not isinstance(info, str):
            raise TypeError(f"info must be a str, got {info!r}")
        self._client = client
        self._name = name
        self._ttl = ttl_s
        self._owner = owner
        self._renew = renew
        self._info = info
        self._keys = LockKeys.for_name(check_prefix(prefix), name)
        self._last_lost = threading.Event()
        #: a run token (see lua/acquire.lua): the Celery layer sets one per task delivery
        self._run = ""
        #: the last refusal: holder's owner token and lease left (for the Celery layer's logs)
        self.last_refusal: _backend.AcquireReply | None = None

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

    def _slot(self) -> tuple[int, str, str]:
        return (id(self._client), self._keys.lock, self.owner)

    def _hold(self) -> Hold | None:
        hold = _holds.get(self._slot())
        if hold is None or hold.pid != os.getpid() or hold.count <= 0:
            return None
        return hold

    # -- acquire -------------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire or re-enter the lock; return whether it is held.

        ``blocking=False`` tries once. Otherwise wait up to ``timeout`` seconds (``None``: as
        long as it takes), woken by the holder's release, or at the latest when its lease ends.
        Raises :class:`LockBackendError` when Redis fails, and :class:`LockLostError` when
        re-entering a hold whose lease was already lost.
        """
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be True or False, got {blocking!r}")
        wait = _check_seconds(timeout, "timeout", allow_none=True)
        if wait is not None:
            if not blocking:
                raise ValueError("timeout cannot be given with blocking=False")
            if wait < 0:
                raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        deadline = None if wait is None else time.monotonic() + wait
        owner = self.owner
        slot = (id(self._client), self._keys.lock, owner)
        while True:
            with _holds_lock:
                hold = _holds.get(slot)
                if hold is None or hold.pid != os.getpid():
                    hold = _holds[slot] = Hold(
                        self._client, self._keys, owner, self._ttl, self._renew
                    )
            with hold.mutex:
                if hold.dead:
                    continue  # released (and unregistered) while we waited for its mutex
                if hold.count > 0:
                    if hold.lost.is_set():
                        raise LockLostError(
                            f"cannot re-enter lock {self._name!r}: its lease was lost"
                        )
                    hold.count += 1
                    return True
                try:
                    acquired = self._acquire_in_redis(hold, blocking, deadline)
                except BaseException:
                    self._forget(hold)
                    raise
                if not acquired:
                    self._forget(hold)
                return acquired

    def _forget(self, hold: Hold) -> None:
        with _holds_lock:
            hold.dead = True
            if _holds.get((id(hold.client), hold.keys.lock, hold.owner)) is hold:
                del _holds[(id(hold.client), hold.keys.lock, hold.owner)]

    def _acquire_in_redis(self, hold: Hold, blocking: bool, deadline: float | None) -> bool:
        hub = event = None
        request = new_request_id()
        try:
            while True:
                if event is not None:
                    event.clear()
                sent = time.monotonic()
                reply = _backend.acquire(
                    self._client,
                    self._keys,
                    hold.owner,
                    hold.lease_ms,
                    request,
                    self._info,
                    self._run,
                )
                if reply.acquired:
                    self._took(hold, reply.fence, sent)
                    return True
                self.last_refusal = reply
                if not blocking:
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                request = new_request_id()
                if hub is None:
                    # Subscribe before looking again, so a release between our look and our
                    # wait cannot go unseen.
                    hub = get_hub(self._client, self._keys.channel)
                    event = hub.register(self._keys.lock)
                    hub.ready.wait(1.0 if left is None else min(1.0, left))
                    continue
                # Wait for the push, but never longer than the holder's lease: if the push
                # is lost, the lease ending is the next moment the lock can be free.
                pause = reply.pttl / 1000 if reply.pttl > 0 else 0.001
                if left is not None:
                    pause = min(pause, left)
                assert event is not None
                event.wait(pause)
        finally:
            if hub is not None and event is not None:
                hub.unregister(self._keys.lock, event)

    def _took(self, hold: Hold, fence: int | None, sent: float) -> None:
        hold.count = 1
        hold.fence = fence
        hold.valid_until = sent + hold.ttl
        self._last_lost = hold.lost
        if self._owner is None:
            hold.thread = weakref.ref(threading.current_thread())
        if hold.renew:
            get_heartbeat().add(hold)

    # -- release -------------------------------------------------------------------------------

    def release(self) -> None:
        """Release one hold. The last release of this process's hold goes to Redis.

        Raises :class:`LockNotOwnedError` when this owner does not hold the lock (never
        acquired, already released, or the lease was lost meanwhile).
        """
        hold = self._hold()
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
                return
            # Stop renewing first: a lock is never renewed after its release began.
            hold.count = 0
            get_heartbeat().remove(hold)
            self._forget(hold)
            left = _backend.release(self._client, self._keys, hold.owner)
        if left < 0:
            hold.lost.set()
            raise LockNotOwnedError(
                f"cannot release lock {self._name!r}: owner {hold.owner!r} no longer held it in "
                "Redis (its lease was lost: it expired or was released by someone else)"
            )

    def _detach(self) -> Hold | None:
        """Forget this process's hold without telling Redis (the caller settles Redis)."""
        hold = self._hold()
        if hold is None:
            return None
        with hold.mutex:
            hold.count = 0
            get_heartbeat().remove(hold)
            self._forget(hold)
        return hold

    def _release_all(self) -> int:
        """Drop every hold of this owner, in this process and in Redis (other processes'
        holds of the same owner included): the end of a Celery task. Returns what
        :func:`_backend.release` returns."""
        self._detach()
        return _backend.release(self._client, self._keys, self.owner, 0)

    def _park(self, lease_ms: int, info: str = "") -> bool:
        """End this process's hold but keep the owner's hold in Redis for ``lease_ms`` with the
        run token cleared: a Celery retry is queued and will re-enter it."""
        self._detach()
        return _backend.park(self._client, self._keys, self.owner, lease_ms, info)

    def __enter__(self) -> ReentrantLock:
        if not self.acquire(blocking=True, timeout=self._blocking_timeout):
            raise LockTimeoutError(
                f"could not acquire lock {self._name!r} within {self._blocking_timeout} s",
                name=self._name,
                timeout=self._blocking_timeout,
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
        with _backend.backend_errors("check", self._name):
            return bool(self._client.hexists(self._keys.lock, self.owner))

    def locked(self) -> bool:
        """Whether anyone holds the lock now (one round trip)."""
        with _backend.backend_errors("check", self._name):
            return bool(self._client.exists(self._keys.lock))

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
        hold = self._hold()
        return self._last_lost if hold is None else hold.lost

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
