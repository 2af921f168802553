"""``LockSpace``: the locks under one key prefix on one client; ``NamedLock``: one of them by
name, all its permits, acted on in Redis only (holds kept elsewhere: taken for an owner another
process goes on as, released or parked for one that is gone, inspected, force-released).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from . import commands, observe, scripts
from .checks import RedisClient, by_node, check_backend_timeout, check_client, check_lease_ms
from .commands import AcquireReply, LockState, ReleaseReply, backend_errors, text
from .deadline import bounded
from .keys import LockKeys, RateKeys, check_name, check_prefix, escape_name, glob_escape
from .owner import new_request_id
from .rate import Rate, RateLimiter, RateState, inspect_rate
from .reentrant import ReentrantLock
from .semaphore import Semaphore, check_permits, owned_by, permit_keys, release_owned, take_permit

#: inspect calls per pipeline: 10,000 locks in 20 round trips, each reply well under a
#: connection's buffer
INSPECT_BATCH = 500


class LockSpace:
    """The locks under ``prefix`` on ``client``. ``backend_timeout`` (seconds, ``None``: the
    client's own bounds only) bounds each operation here and of the locks it makes, resends
    included."""

    __slots__ = ("_checked_ttl", "backend_timeout", "client", "prefix")

    def __init__(
        self, client: RedisClient, prefix: str = "lock", *, backend_timeout: float | None = None
    ) -> None:
        check_client(client)
        self.client: Any = client
        self.prefix = check_prefix(prefix)
        self.backend_timeout = check_backend_timeout(backend_timeout)
        #: the lease :meth:`checked_lock` checked last (the same for every job)
        self._checked_ttl: float | None = None

    def keys(self, name: str) -> LockKeys:
        """The Redis keys of the lock ``name``."""
        return LockKeys.for_name(self.prefix, name)

    def keys_of(self, key_or_name: str) -> LockKeys:
        """The keys of a lock given by its Redis key (a permit's too) or by its name."""
        if key_or_name.startswith(f"{self.prefix}:{{"):
            with contextlib.suppress(ValueError):  # a name that looks like a key
                return LockKeys.from_lock_key(key_or_name)
        return self.keys(key_or_name)

    def lock(self, name: str, *, ttl: float, **options: Any) -> ReentrantLock:
        """A renewed :class:`ReentrantLock` on ``name`` in this space (``options``: its own)."""
        options.update(prefix=self.prefix, backend_timeout=self.backend_timeout)
        return ReentrantLock(self.client, name, ttl=ttl, **options)

    def checked_lock(
        self, name: str, *, ttl: float, owner: str, info: str, run_token: str, state: str
    ) -> ReentrantLock:
        """:meth:`lock` for one job, at the cost of its keys only: ``ttl`` is checked once per
        value, other arguments by :meth:`lock` unless they are the strings they must be."""
        if ttl is not self._checked_ttl:
            check_lease_ms(ttl, "ttl")
            self._checked_ttl = ttl
        texts = (info, run_token, state)
        strings = all(isinstance(value, str) for value in texts)  # (a StrEnum label too)
        if not (strings and type(name) is str and name and type(owner) is str and owner):
            return self.lock(
                name, ttl=ttl, owner=owner, info=info, run_token=run_token, state=state
            )
        keys = LockKeys.for_name(self.prefix, name)
        return ReentrantLock.checked(
            self.client, keys, float(ttl), owner, texts, self.backend_timeout
        )

    def semaphore(self, name: str, permits: int, *, ttl: float, **options: Any) -> Semaphore:
        """A renewed :class:`Semaphore` of ``permits`` on ``name`` (``options`` as :meth:`lock`)."""
        options.update(prefix=self.prefix, backend_timeout=self.backend_timeout)
        return Semaphore(self.client, name, permits, ttl=ttl, **options)

    def rate_limiter(self, name: str, rate: Rate | str) -> RateLimiter:
        """A :class:`RateLimiter` of ``rate`` (``"10/s"``) on ``name`` in this space."""
        return RateLimiter(
            self.client, name, rate, prefix=self.prefix, backend_timeout=self.backend_timeout
        )

    def rate_limiters(self) -> Iterator[RateState]:
        """Every rate limiter under this prefix (SCAN), inspected."""
        seen: set[str] = set()
        with backend_errors("scan", "", f"for the rate limiters under prefix {self.prefix!r}"):
            match = f"{glob_escape(self.prefix)}:rate:{{*"
            found = [text(raw) for raw in self.client.scan_iter(match=match, count=500)]
        for key in found:
            keys = RateKeys.from_key(self.prefix, key)
            if keys is not None and keys.name not in seen:
                seen.add(keys.name)
                yield inspect_rate(self.client, keys, None, self.backend_timeout)

    def named(self, name: str, permits: int = 1) -> NamedLock:
        """The lock ``name`` with its ``permits``, to act on in Redis only (no round trip)."""
        return NamedLock(self, name, permits)

    def inspect(self, key_or_name: str) -> LockState:
        """Everything about one lock key (or name), read atomically."""
        with bounded(self.backend_timeout):
            return commands.inspect(self.client, self.keys_of(key_or_name))

    def inspect_many(self, keys: Sequence[LockKeys]) -> list[LockState]:
        """:meth:`inspect` of each lock of ``keys``, in order, pipelined; each is read
        atomically, the list is no one snapshot."""
        client, replies = self.client, [None] * len(keys)
        subject = f"the locks under prefix {self.prefix!r}"
        with bounded(self.backend_timeout), backend_errors("inspect", "", subject):
            for node_client, indexes in by_node(client, [one.lock for one in keys]):
                for start in range(0, len(indexes), INSPECT_BATCH):
                    chunk = indexes[start : start + INSPECT_BATCH]
                    calls = [(keys[i].pair, ()) for i in chunk]
                    answered = scripts.INSPECT.pipelined(node_client, calls)
                    for i, reply in zip(chunk, answered, strict=True):
                        replies[i] = reply
            for i, reply in enumerate(replies):
                if isinstance(reply, Exception):  # sent again alone: a slot may have moved
                    replies[i] = scripts.INSPECT(client, keys[i].pair, ())
        return [commands.lock_state(one, reply) for one, reply in zip(keys, replies, strict=True)]

    def force_release(
        self, key_or_name: str, *, holder: str | None = None, states: Collection[str] = ()
    ) -> bool:
        """An operator's release of one lock key (or name), whoever holds it (only ``holder``;
        with ``states``, only while the hold is in one of them and has no run token). Wakes
        waiters; the fence keeps growing."""
        with bounded(self.backend_timeout):
            keys = self.keys_of(key_or_name)
            return commands.force_release(self.client, keys, holder or "", states=states)

    def find(self, pattern: str = "*", *, count: int = 500) -> Iterator[LockKeys]:
        """The keys of every lock (each permit too) whose name matches the glob ``pattern``,
        by SCAN; a lock may appear twice while the keyspace is rehashed."""
        with backend_errors("scan", "", f"for the locks under prefix {self.prefix!r}"):
            # The pattern is escaped as a name is, the prefix literally ('a*' must not find
            # the locks of 'ab'); the last '*' matches a permit's ':s<k>'.
            match = f"{glob_escape(self.prefix)}:{{{escape_name(pattern)}}}*"
            for raw in self.client.scan_iter(match=match, count=count):
                with contextlib.suppress(ValueError):
                    yield LockKeys.from_lock_key(text(raw))


class NamedLock:
    """The lock ``name`` of a :class:`LockSpace`, all its ``permits`` (``keys``: permit 1
    first), acted on in Redis only: no hold in this process, no renewal. A feature built on a
    lock runs its own scripts on its keys in :meth:`operation`."""

    __slots__ = ("_space", "keys", "name", "permits")

    def __init__(self, space: LockSpace, name: str, permits: int = 1) -> None:
        self._space = space
        self.name = check_name(name)
        self.permits = check_permits(permits)
        self.keys = tuple(permit_keys(space.prefix, name, self.permits))

    def _owned(self, owner: str) -> list[int]:
        return [0] if self.permits == 1 else owned_by(self._space.client, self.keys, owner)

    def take(self, owner: str, lease: float, *, info: str = "", state: str = "") -> AcquireReply:
        """Take or re-enter the lock (a permit) for ``owner`` for ``lease`` seconds; ``state``
        labels the hold (``""`` on a re-entry keeps its label)."""
        lease_ms = check_lease_ms(lease)
        client, keys = self._space.client, self.keys

        def attempt(i: int) -> AcquireReply:
            return commands.acquire(
                client, keys[i], owner, lease_ms, new_request_id(), info, "", state
            )

        with bounded(self._space.backend_timeout):
            owned = owned_by(client, keys, owner) if len(keys) > 1 else []  # (one: no look-up)
            reply = take_permit(attempt, len(keys), owned)[1]
        if observe.observer is not None:
            if reply.acquired:
                observe.observer.acquired(reply.hold_count > 1)
            else:
                observe.observer.refused()
        return reply

    def release(
        self, owner: str, *, holds: int | None = None, retry_for: float = 0.0
    ) -> ReleaseReply:
        """Drop ``holds`` holds of ``owner`` (``None``: every one). ``retry_for``: when Redis
        fails, also resend it in the background for up to that many seconds."""
        if holds is not None and (type(holds) is not int or holds < 1):
            raise ValueError(f"holds must be an int >= 1, or None for every hold, got {holds!r}")
        drop, client = holds or commands.ALL_HOLDS, self._space.client
        with bounded(self._space.backend_timeout):
            if self.permits == 1:
                return commands.release(client, self.keys[0], owner, drop, retry_for=retry_for)
            return release_owned(client, self.keys, owner, drop, retry_for)

    def park(self, owner: str, lease: float, *, info: str = "", state: str = "") -> bool:
        """:meth:`ReentrantLock.park` for ``owner``; ``False`` when it did not hold it."""
        lease_ms = check_lease_ms(lease)
        client = self._space.client
        with bounded(self._space.backend_timeout):
            parked = [
                commands.park(client, self.keys[i], owner, lease_ms, info, state)
                for i in self._owned(owner)
            ]
        return any(parked)

    def force_release(
        self,
        *,
        holder: str | None = None,
        states: Collection[str] = (),
        note: tuple[str, str] | None = None,
    ) -> bool:
        """:meth:`LockSpace.force_release` of each permit (``holder``'s only, when given);
        whether any was. ``note``: ``(kind, value)`` about ``holder``'s hold, written in the
        same step and kept as long as the hold had lease left."""
        client, written = self._space.client, None
        if note is not None:
            if not holder:
                raise ValueError("a note is about one holder's hold: give the holder")
            written = (self.keys[0].note(note[0], holder), note[1])
        with bounded(self._space.backend_timeout):
            permits = self._owned(holder) if holder else range(self.permits)
            who = holder or ""
            done = [
                commands.force_release(client, self.keys[i], who, states=states, note=written)
                for i in permits
            ]
        return any(done)

    def note(self, kind: str, owner: str) -> str | None:
        """The note of ``kind`` a release left about ``owner``'s hold, or ``None`` (a hash of
        one field, ``v``: commands the documented ACL rule allows)."""
        with bounded(self._space.backend_timeout), backend_errors("read a note beside", self.name):
            value = self._space.client.hget(self.keys[0].note(kind, owner), "v")
        return None if value is None else text(value)

    def inspect(self) -> list[LockState]:
        """:meth:`LockSpace.inspect` of each permit, permit 1 first."""
        with bounded(self._space.backend_timeout):
            return [commands.inspect(self._space.client, keys) for keys in self.keys]

    def is_held(self) -> bool:
        """Whether anyone holds any permit now."""
        with bounded(self._space.backend_timeout):
            return commands.is_held(self._space.client, *self.keys)

    def holder(self) -> str | None:
        """The owner of the first permit found held, or ``None``."""
        return next((state.holder for state in self.inspect() if state.held), None)

    @contextlib.contextmanager
    def operation(self, what: str) -> Iterator[Any]:
        """Yield the client for one operation on this lock's keys (a feature's own scripts),
        bounded by the space's ``backend_timeout``; a Redis error is a
        :class:`LockBackendError` saying ``what`` was done. Pass every key a script touches in
        its KEYS, made from :attr:`keys` (one hash tag)."""
        with bounded(self._space.backend_timeout), backend_errors(what, self.name):
            yield self._space.client

    def __repr__(self) -> str:
        return f"<NamedLock {self.keys[0].lock!r} permits={self.permits}>"
