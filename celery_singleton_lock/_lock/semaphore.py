"""``Semaphore``: at most N holders of one name at once, each on a leased, renewed permit (a
lock of its own; permit 1 is the plain lock); and the permits of one name in Redis, which
:class:`~.space.NamedLock` uses too."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

from .._errors import LockBackendError
from . import commands
from .checks import RedisClient, check_backend_timeout, check_lease_ms, check_wait
from .commands import ALL_HOLDS, NOT_OWNED, AcquireReply, ReleaseReply
from .deadline import bounded
from .hold import Hold
from .keys import LockKeys
from .reentrant import Leased, ReentrantLock
from .runtime import LockRuntime


class LockOptions(TypedDict, total=False):
    """The keyword options of :class:`ReentrantLock`, which a :class:`Semaphore` takes too."""

    ttl: float
    owner: str | None
    renew: bool
    timeout: float | None
    prefix: str
    info: str
    run_token: str
    state: str
    backend_timeout: float | None


def check_permits(permits: object) -> int:
    if type(permits) is int and permits >= 1:  # (every lock of a job checks its permits)
        return permits
    message = f"permits must be an int >= 1 (how many may hold at once), got {permits!r}"
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(message)
    if permits < 1:
        raise ValueError(message)
    return permits


def permit_keys(prefix: str, name: str, permits: int) -> list[LockKeys]:
    if permits == 1:  # (most): no loop
        return [LockKeys.for_name(prefix, name)]
    return [LockKeys.for_name(prefix, name, k) for k in range(1, permits + 1)]


def owned_by(client: Any, keys: Sequence[LockKeys], owner: str) -> list[int]:
    """The permits (indexes into ``keys``) ``owner`` holds now, in one pipeline. The owner's
    pending cancels run first: this must not find, or miss, the hold of a lost acquire."""
    subject = f"the permit of owner {owner!r} of semaphore {keys[0].name!r}"
    with commands.backend_errors("find", keys[0].name, subject):
        commands.settle(client, keys[0], owner)
        pipe = client.pipeline(transaction=False)
        for permit in keys:
            pipe.hexists(permit.lock, owner)
        found = pipe.execute()
    return [index for index, there in enumerate(found) if there]


def take_permit(
    attempt: Callable[[int], AcquireReply], permits: int, owned: Sequence[int]
) -> tuple[int, AcquireReply]:
    """The acquire rule (``attempt(i)`` tries permit ``i``): an owner re-enters the permit it
    holds (``owned``) only, so it never takes two; else the permits are tried from a random
    one up to the first taken; when all refuse, the refusal of the permit that frees first.
    Returns the permit's index with its reply."""
    for index in owned:
        reply = attempt(index)
        if reply.acquired or reply.other_run:
            return index, reply
        # its lease ended and another owner took it meanwhile: the owner may take any
    start = random.randrange(permits)
    refusals = []
    for step in range(permits):
        index = (start + step) % permits
        reply = attempt(index)
        if reply.acquired:
            return index, reply
        refusals.append((index, reply))
    return min(refusals, key=lambda refusal: refusal[1].lease_left)


def release_everywhere(
    client: Any,
    keys: Sequence[LockKeys],
    owner: str,
    holds: int,
    retry_for: float,
    retry_unless: Callable[[], bool] | None = None,
) -> None:
    """The release of ``owner`` sent to every permit (resent in the background while Redis
    fails), when its permit could not be found; the others answer "not the owner"."""
    for permit in keys:
        with contextlib.suppress(LockBackendError):  # it goes on in the background
            commands.release(
                client, permit, owner, holds, retry_for=retry_for, retry_unless=retry_unless
            )


def release_owned(
    client: Any, keys: Sequence[LockKeys], owner: str, holds: int, retry_for: float
) -> ReleaseReply:
    """Drop ``holds`` holds of ``owner`` on its permit; when Redis fails while it is looked for
    (and ``retry_for`` > 0), to every permit before :class:`LockBackendError` is raised."""
    try:
        owned = owned_by(client, keys, owner)
    except LockBackendError:
        if retry_for > 0:
            release_everywhere(client, keys, owner, holds, retry_for)
        raise
    replies = [commands.release(client, keys[i], owner, holds, retry_for=retry_for) for i in owned]
    return next((reply for reply in replies if reply.owned), NOT_OWNED)


class _Permit(ReentrantLock):
    """Permit ``slot`` of a semaphore: a lock whose refusals the semaphore reports."""

    def __init__(
        self, client: RedisClient, name: str, slot: int, **options: Unpack[LockOptions]
    ) -> None:
        super().__init__(client, name, **options)
        self._keys = LockKeys.for_name(self._keys.prefix, name, slot)
        self._quiet = True


class Semaphore(Leased):
    """``permits`` leases of one name: at most that many owners hold it at once.

    Each permit is a :class:`ReentrantLock` of the ``options`` (``ttl``, ``owner``, ...: those
    of :class:`ReentrantLock`): permit 1 is the lock of ``name``, permit k ``prefix:{name}:s<k>``.
    An acquire re-enters the permit this owner holds, else tries the permits from a random one
    and takes the first free; a blocked acquire waits on the channel they share.

    Known gap: two processes acting as the same owner at the same instant can take two permits;
    each permit still checks its run token.
    """

    def __init__(
        self, client: RedisClient, name: str, permits: int, **options: Unpack[LockOptions]
    ) -> None:
        count = check_permits(permits)  # first: nothing is made (nor sent) for a bad one
        self._locks = (
            tuple(_Permit(client, name, k, **options) for k in range(1, count + 1))
            if count > 1
            else (ReentrantLock(client, name, **options),)
        )
        self._client: Any = client
        self._name, self._ttl, self._owner = name, self._locks[0].ttl, options.get("owner")
        self._timeout = check_wait(options.get("timeout"), "timeout")
        self._backend_timeout = check_backend_timeout(options.get("backend_timeout"))
        self._keys = permit_keys(options.get("prefix", "lock"), name, count)
        #: the permit taken last (its ``lost`` outlives the hold)
        self._last: ReentrantLock | None = None
        #: the permit whose refusal :meth:`try_acquire` returned last
        self._refused_by: ReentrantLock | None = None

    _timed_out = "no permit of {0.name!r} ({0.permits}) came free in {0._timeout} s"

    @property
    def permits(self) -> int:
        return len(self._locks)

    @property
    def held(self) -> ReentrantLock | None:
        """The permit this owner holds in this process, or ``None``."""
        return next((lock for lock in self._locks if lock.hold_count > 0), None)

    @property
    def key(self) -> str:
        """The Redis key of the permit held, else of the last refusal's, else of permit 1."""
        return (self.held or self._refused_by or self._locks[0]).key

    @property
    def lost(self) -> threading.Event:
        """The ``lost`` of the permit held (or taken last)."""
        return (self.held or self._last or self._locks[0]).lost

    def _hold(self) -> Hold | None:
        holds, owner = LockRuntime.of(self._client).holds, self.owner
        return next(filter(None, (holds.find(keys.lock, owner) for keys in self._keys)), None)

    def holders(self) -> dict[str, int]:
        """Owner -> hold count over every permit, as Redis has them now."""
        subject = f"the holders of {self.name!r}"
        with bounded(self._backend_timeout), commands.backend_errors("read", self.name, subject):
            pipe = self._client.pipeline(transaction=False)
            for permit in self._keys:
                pipe.hgetall(permit.lock)
            hashes = pipe.execute()
        counts: dict[str, int] = {}
        for fields in hashes:
            for owner, count in fields.items():
                name = commands.text(owner)
                counts[name] = counts.get(name, 0) + int(count)
        return counts

    def _take(self, wait: float | None) -> AcquireReply:
        if len(self._locks) == 1:
            return self._locks[0].try_acquire(wait)
        started = time.monotonic()
        deadline = None if wait is None else started + wait
        if self.held is not None:  # a re-entry here waits for nothing
            deadline = started
        runtime = LockRuntime.of(self._client)
        return runtime.wait_for(self._keys[0].channel, deadline, lambda _: self._try_once())

    def _try_once(self) -> AcquireReply:
        held = self.held
        if held is not None:
            reply = held.try_acquire(0.0)
            if reply.acquired:
                self._last = held
                return reply
        with bounded(self._backend_timeout):
            owned = owned_by(self._client, self._keys, self.owner)
        locks = self._locks
        index, reply = take_permit(lambda i: locks[i].try_acquire(0.0), len(locks), owned)
        if reply.acquired:
            self._last = locks[index]
        self._refused_by = None if reply.acquired else locks[index]
        return reply

    def release(self) -> None:
        """Release one hold of the permit held (as :meth:`ReentrantLock.release`)."""
        (self.held or self._locks[0]).release()

    def _owned(self) -> list[ReentrantLock]:
        held = self.held
        if held is not None or len(self._locks) == 1:
            return [held or self._locks[0]]
        with bounded(self._backend_timeout):
            return [self._locks[i] for i in owned_by(self._client, self._keys, self.owner)]

    def release_all(self) -> ReleaseReply:
        """Drop every hold of this owner's permit, here and in Redis (see
        :meth:`ReentrantLock.release_all`)."""
        owner, holds = self.owner, LockRuntime.of(self._client).holds
        try:
            owned = self._owned()
        except LockBackendError:

            def again() -> bool:  # this process took one again
                return any(holds.find(keys.lock, owner) for keys in self._keys)

            with bounded(self._backend_timeout):
                release_everywhere(self._client, self._keys, owner, ALL_HOLDS, self.ttl, again)
            raise
        replies = [lock.release_all() for lock in owned]
        return next((reply for reply in replies if reply.owned), NOT_OWNED)

    def park(self, lease: float, info: str = "") -> bool:
        """:meth:`ReentrantLock.park` of this owner's permit; ``False`` when it held none."""
        check_lease_ms(lease)
        return any([lock.park(lease, info) for lock in self._owned()])

    def __repr__(self) -> str:
        return f"<Semaphore {self._keys[0].lock!r} permits={self.permits} owner={self.owner!r}>"
