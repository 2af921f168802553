"""``LockSpace``: every lock under one key prefix on one Redis client, by name; and
``NamedLock``: one lock of it, all its permits, acted on in Redis only.

A :class:`ReentrantLock` is a hold this process keeps and renews; a :class:`NamedLock` acts on
holds kept elsewhere: taken for an owner that another process goes on as, released or parked
for an owner that is gone, inspected or force-released by an operator. With several permits it
acts on the permit the owner holds, else (``take``) on the first free one (see :mod:`.permits`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterator
from typing import Any

from . import commands, observe
from .checks import check_backend_timeout, check_lease_ms
from .client import RedisClient, check_client
from .commands import AcquireReply, LockState, RecordReply, ReleaseReply, WaitReply
from .deadline import bounded
from .keys import LockKeys, check_prefix, escape_name
from .owner import new_request_id
from .permits import check_permits, owned_by, permit_keys, release_owned, take
from .reentrant import ReentrantLock
from .semaphore import Semaphore

__all__ = ["LockSpace", "NamedLock"]


class LockSpace:
    """The locks under ``prefix`` on ``client``.

    ``backend_timeout`` (seconds, ``None``: no bound beyond the client's own) bounds each
    operation here, and each of the locks made by :meth:`lock`, as a whole, the client's
    resends included (see :class:`ReentrantLock`); what an operation cut short leaves open
    (the cancel of a lost acquire, a release with ``retry_for``) goes on in the background."""

    __slots__ = ("backend_timeout", "client", "prefix")

    def __init__(
        self, client: RedisClient, prefix: str = "lock", *, backend_timeout: float | None = None
    ) -> None:
        check_client(client)
        #: the redis-py client (``Any``: beyond :class:`RedisClient`, SCAN and TIME are used)
        self.client: Any = client
        self.prefix = check_prefix(prefix)
        self.backend_timeout = check_backend_timeout(backend_timeout)

    def keys(self, name: str) -> LockKeys:
        """The Redis keys of the lock ``name``."""
        return LockKeys.for_name(self.prefix, name)

    def keys_of(self, key_or_name: str) -> LockKeys:
        """The keys of a lock given by its Redis key (``prefix:{name}``, or a semaphore's
        permit ``prefix:{name}:s<k>``) or by its name."""
        if key_or_name.startswith(f"{self.prefix}:{{"):
            with contextlib.suppress(ValueError):  # not a key after all: a name that looks like one
                return LockKeys.from_lock_key(key_or_name)
        return self.keys(key_or_name)

    def lock(
        self,
        name: str,
        *,
        ttl: float,
        owner: str | None = None,
        info: str = "",
        run_token: str = "",
        state: str = "",
    ) -> ReentrantLock:
        """A renewed :class:`ReentrantLock` on ``name`` in this space."""
        return ReentrantLock(
            self.client,
            name,
            ttl=ttl,
            owner=owner,
            prefix=self.prefix,
            info=info,
            run_token=run_token,
            state=state,
            backend_timeout=self.backend_timeout,
        )

    def semaphore(
        self,
        name: str,
        permits: int,
        *,
        ttl: float,
        owner: str | None = None,
        info: str = "",
        run_token: str = "",
        state: str = "",
    ) -> Semaphore:
        """A renewed :class:`Semaphore` of ``permits`` on ``name`` in this space."""
        return Semaphore(
            self.client,
            name,
            permits,
            ttl=ttl,
            owner=owner,
            prefix=self.prefix,
            info=info,
            run_token=run_token,
            state=state,
            backend_timeout=self.backend_timeout,
        )

    def named(self, name: str, permits: int = 1) -> NamedLock:
        """The lock ``name`` with its ``permits``, to act on in Redis only (no round trip)."""
        return NamedLock(self, name, permits)

    def record_if_held(
        self,
        name: str,
        owner: str,
        kind: str,
        field: str,
        value: str,
        *,
        min_lease: float,
        keep: float,
    ) -> RecordReply:
        """Write ``field = value`` into the ``kind`` records kept beside lock ``name``, only
        while ``owner`` holds it with at least ``min_lease`` seconds of its lease left (one
        script: the check and the write are one step). The records live ``keep`` seconds after
        this write."""
        with bounded(self.backend_timeout):
            return commands.record_if_held(
                self.client,
                self.keys(name),
                kind,
                owner,
                field,
                value,
                round(max(min_lease, 0.0) * 1000),
                check_lease_ms(keep),
            )

    def records(self, name: str, kind: str) -> dict[str, str]:
        """The ``kind`` records kept beside lock ``name`` (see :meth:`record_if_held`)."""
        with bounded(self.backend_timeout):
            return commands.records(self.client, self.keys(name), kind)

    def force_release(
        self, key_or_name: str, *, holder: str | None = None, states: Collection[str] = ()
    ) -> bool:
        """An operator's release of one lock key (or name), whoever holds it (or only when
        ``holder`` does; with ``states``, only while the hold is in one of those states and no
        run token is recorded: checked in the same step). Wakes waiters; the fencing token
        keeps increasing. Returns whether it was released."""
        with bounded(self.backend_timeout):
            return commands.force_release(
                self.client, self.keys_of(key_or_name), holder or "", states=states
            )

    def inspect(self, key_or_name: str) -> LockState:
        """Everything about one lock key (or name), read atomically."""
        with bounded(self.backend_timeout):
            return commands.inspect(self.client, self.keys_of(key_or_name))

    def find(self, pattern: str = "*") -> Iterator[LockKeys]:
        """The keys of every lock whose name matches the glob ``pattern`` (each permit of a
        semaphore, too), found by SCAN (never KEYS); a lock may appear twice while the
        keyspace is rehashed."""
        with commands.backend_errors("scan", "", f"for the locks under prefix {self.prefix!r}"):
            # The pattern is escaped as a name is, so the '}' after it is the key's only one: it
            # matched the name itself. The '*' after the tag matches a permit's ':s<k>' (and
            # the meta and record hashes, which are not lock keys: left out).
            match = f"{self.prefix}:{{{escape_name(pattern)}}}*"
            for raw in self.client.scan_iter(match=match, count=500):
                try:
                    keys = LockKeys.from_lock_key(commands.text(raw))
                except ValueError:
                    continue
                yield keys

    def server_time(self) -> float:
        """The server's clock in Unix seconds (the local clock for a Redis Cluster client,
        whose nodes answer one by one)."""
        try:
            seconds, micros = self.client.time()
            return float(seconds) + float(micros) / 1e6
        except Exception:  # a cluster answers per node; the local clock is close enough
            return time.time()


class NamedLock:
    """The lock ``name`` of a :class:`LockSpace`, all its ``permits`` (``keys``: permit 1
    first), acted on in Redis only: no hold in this process, no renewal. Made by
    :meth:`LockSpace.named`."""

    __slots__ = ("_space", "keys", "name", "permits")

    def __init__(self, space: LockSpace, name: str, permits: int = 1) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        self._space = space
        self.name = name
        self.permits = check_permits(permits)
        self.keys = tuple(permit_keys(space.prefix, name, self.permits))

    def _owned(self, owner: str) -> list[int]:
        """The permits ``owner`` holds (one round trip, none with one permit)."""
        if self.permits == 1:
            return [0]
        return owned_by(self._space.client, self.keys, owner)

    def take(self, owner: str, lease: float, *, info: str = "", state: str = "") -> AcquireReply:
        """Take or re-enter the lock (a permit) for ``owner``, with a lease of ``lease``
        seconds. Another process acting as ``owner`` re-enters it, and :meth:`release` lets
        it go. ``state`` labels the hold (on a re-entry, ``""`` keeps the label it has)."""
        lease_ms = check_lease_ms(lease)
        space, keys = self._space, self.keys

        def attempt(i: int) -> AcquireReply:
            return commands.acquire(
                space.client, keys[i], owner, lease_ms, new_request_id(), info, "", state
            )

        with bounded(space.backend_timeout):
            if len(keys) == 1:
                reply = attempt(0)
            else:
                reply = take(attempt, len(keys), owned_by(space.client, keys, owner))
        if observe.observer is not None:
            if reply.acquired:
                observe.observer.acquired(reply.hold_count > 1)
            else:
                observe.observer.refused()
        return reply

    def release(
        self, owner: str, *, holds: int | None = None, retry_for: float = 0.0
    ) -> ReleaseReply:
        """Drop ``holds`` holds of ``owner`` (``None``: every one) on the permit it holds.

        ``retry_for``: when Redis fails, raise :class:`LockBackendError` and also keep sending
        this release in the background for up to that many seconds (for a hold that nobody
        will release otherwise); to every permit, when it failed while the owner's permit was
        looked for."""
        if holds is not None and (type(holds) is not int or holds < 1):
            raise ValueError(f"holds must be an int >= 1, or None for every hold, got {holds!r}")
        drop = holds or commands.ALL_HOLDS
        space = self._space
        with bounded(space.backend_timeout):
            if self.permits == 1:
                return commands.release(
                    space.client, self.keys[0], owner, drop, retry_for=retry_for
                )
            return release_owned(space.client, self.keys, owner, drop, retry_for)

    def park(self, owner: str, lease: float, *, info: str = "", state: str = "") -> bool:
        """Keep ``owner``'s hold for ``lease`` seconds, unrenewed, its run token cleared, for
        a later process of the same owner, labelled ``state`` unless empty; ``False`` when
        the owner did not hold it."""
        lease_ms = check_lease_ms(lease)
        client = self._space.client
        with bounded(self._space.backend_timeout):
            parked = [
                commands.park(client, self.keys[i], owner, lease_ms, info, state)
                for i in self._owned(owner)
            ]
        return any(parked)

    def force_release(self, *, holder: str | None = None, states: Collection[str] = ()) -> bool:
        """:meth:`LockSpace.force_release` of each permit (of the one ``holder`` holds, when
        given). Returns whether any was released."""
        client = self._space.client
        with bounded(self._space.backend_timeout):
            owned = range(self.permits) if not holder else self._owned(holder)
            done = [
                commands.force_release(client, self.keys[i], holder or "", states=states)
                for i in owned
            ]
        return any(done)

    def inspect(self) -> list[LockState]:
        """:meth:`LockSpace.inspect` of each permit, permit 1 first."""
        with bounded(self._space.backend_timeout):
            return [commands.inspect(self._space.client, keys) for keys in self.keys]

    def is_held(self) -> bool:
        """Whether anyone holds any permit now (one round trip)."""
        with bounded(self._space.backend_timeout):
            return commands.is_held(self._space.client, *self.keys)

    def holder(self) -> str | None:
        """The owner of the first permit found held, or ``None``."""
        return next((state.holder for state in self.inspect() if state.held), None)

    # -- waiters: records kept beside the lock, each woken by a release that follows ----------

    def add_waiter(
        self, waiter: str, record: str, keep: float, *, force: bool = False
    ) -> WaitReply:
        """Write ``waiter``'s ``record`` beside the lock while every permit is held, checked
        in the same step (``force``: even when one is free); the records live at least
        ``keep`` seconds from now. A release that ends a hold reads them after it
        (:meth:`waiters`), so either this call finds a permit free or that read finds it."""
        keep_ms = check_lease_ms(keep)
        locks = [keys.lock for keys in self.keys]
        with bounded(self._space.backend_timeout):
            return commands.wait_park(
                self._space.client, self.keys[0], locks, waiter, record, keep_ms, force
            )

    def claim_waiter(self, waiter: str, token: str, mark: str) -> tuple[int, str]:
        """Claim the wait ``token`` of ``waiter`` for ``mark`` (one of the waiter's wake-ups):
        :data:`~.commands.CLAIMED` (with ``"again"`` when this mark claimed it before),
        :data:`~.commands.WAIT_OVER`, :data:`~.commands.CLAIMED_ELSEWHERE`, or
        :data:`~.commands.WAIT_REPLACED` and who replaced the waiter (:meth:`replace_waiter`)."""
        with bounded(self._space.backend_timeout):
            return commands.wait_claim(self._space.client, self.keys[0], waiter, token, mark)

    def replace_waiter(self, waiter: str, by: str) -> bool:
        """``waiter`` was replaced by ``by``: its next claim learns so, and no release wakes it.
        ``False``: it had no record."""
        with bounded(self._space.backend_timeout):
            return commands.wait_mark(self._space.client, self.keys[0], waiter, by)

    def waiters(
        self, *, drop: str = "", token: str = "", claim: str = "", listing: bool = True
    ) -> dict[str, str]:
        """The records of the unclaimed waiters (with ``listing``), after dropping the record
        of ``drop`` if it is still the wait ``token`` or its ``claim``: one round trip."""
        with bounded(self._space.backend_timeout):
            return commands.wait_end(
                self._space.client, self.keys[0], drop, token, claim, listing=listing
            )

    def __repr__(self) -> str:
        return f"<NamedLock {self.keys[0].lock!r} permits={self.permits}>"
