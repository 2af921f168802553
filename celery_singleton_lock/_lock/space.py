"""``LockSpace``: every lock under one key prefix on one Redis client, by name.

The hold API for the layers above the lock. A :class:`ReentrantLock` is a hold this process
keeps and renews; the operations here act in Redis only, for a hold that lives elsewhere: a
publisher takes a job's lock for its queued message (owner = the task id) and lets it go if the
publish fails, a worker's main process releases or parks the hold of a pool child that died,
an operator inspects and force-releases. Each returns a typed reply from :mod:`.commands`.

``take``, ``release`` and ``park`` act on a :class:`Semaphore`'s permits with ``permits`` > 1:
on the permit the owner holds, else (``take``) on the first free one (see :mod:`.permits`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterator
from typing import Any

from . import commands, observe
from .checks import check_backend_timeout, check_lease_ms
from .client import RedisClient, check_client
from .commands import ALL_HOLDS, AcquireReply, LockState, ReleaseReply
from .deadline import bounded
from .keys import LockKeys, check_prefix, escape_name
from .owner import new_request_id
from .permits import check_permits, owned_by, permit_keys, release_owned, take
from .reentrant import ReentrantLock
from .semaphore import Semaphore

__all__ = ["LockSpace"]


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

    def take(
        self,
        name: str,
        owner: str,
        lease: float,
        *,
        info: str = "",
        state: str = "",
        permits: int = 1,
    ) -> AcquireReply:
        """Take or re-enter ``name`` (one of its ``permits``) for ``owner`` in Redis only: no
        hold in this process, no renewal; the lease is ``lease`` seconds. Another process
        acting as ``owner`` (a task's run) re-enters it, and :meth:`release` lets it go.
        ``state`` labels the hold (on a re-entry, ``""`` keeps the label it has)."""
        lease_ms = check_lease_ms(lease)
        keys = permit_keys(self.prefix, name, check_permits(permits))

        def attempt(i: int) -> AcquireReply:
            return commands.acquire(
                self.client, keys[i], owner, lease_ms, new_request_id(), info, "", state
            )

        with bounded(self.backend_timeout):
            if len(keys) == 1:
                reply = attempt(0)
            else:
                reply = take(attempt, len(keys), owned_by(self.client, keys, owner))
        if observe.observer is not None:
            if reply.acquired:
                observe.observer.acquired(reply.hold_count > 1)
            else:
                observe.observer.refused()
        return reply

    def release(
        self,
        name: str,
        owner: str,
        holds: int = ALL_HOLDS,
        *,
        retry_for: float = 0.0,
        permits: int = 1,
    ) -> ReleaseReply:
        """Drop ``holds`` holds of ``owner`` (:data:`ALL_HOLDS`, the default: every one), on
        the permit it holds when ``permits`` > 1.

        ``retry_for``: when Redis fails, raise :class:`LockBackendError` and also keep sending
        this release in the background for up to that many seconds (for a hold that nobody
        will release otherwise, such as the publish lock of a message that was never sent); to
        every permit, when it failed while the owner's permit was looked for."""
        keys = permit_keys(self.prefix, name, check_permits(permits))
        with bounded(self.backend_timeout):
            if len(keys) == 1:
                return commands.release(self.client, keys[0], owner, holds, retry_for=retry_for)
            return release_owned(self.client, keys, owner, holds, retry_for)

    def park(
        self,
        name: str,
        owner: str,
        lease: float,
        *,
        info: str = "",
        state: str = "",
        permits: int = 1,
    ) -> bool:
        """Keep ``owner``'s hold (on the permit it holds, with ``permits`` > 1) for ``lease``
        seconds, unrenewed, for a later run of the same owner (a redelivered message), labelled
        ``state`` unless empty; ``False`` when the owner did not hold it."""
        lease_ms = check_lease_ms(lease)
        keys = permit_keys(self.prefix, name, check_permits(permits))
        with bounded(self.backend_timeout):
            owned = [0] if len(keys) == 1 else owned_by(self.client, keys, owner)
            parked = [
                commands.park(self.client, keys[i], owner, lease_ms, info, state) for i in owned
            ]
        return any(parked)

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
    ) -> commands.RecordReply:
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

    def add_waiter(
        self,
        name: str,
        waiter: str,
        record: str,
        keep: float,
        *,
        permits: int = 1,
        force: bool = False,
    ) -> commands.WaitReply:
        """Write ``waiter``'s ``record`` beside the lock ``name`` (``permits`` slots) while
        every slot is held, checked in the same step (``force``: even when one is free); the
        records live at least ``keep`` seconds from now. A run that ends reads them with
        :meth:`waiters` after its release, so either this call finds a slot free or that read
        finds the record."""
        keep_ms = check_lease_ms(keep)
        locks = [keys.lock for keys in permit_keys(self.prefix, name, check_permits(permits))]
        with bounded(self.backend_timeout):
            return commands.wait_park(
                self.client, self.keys(name), locks, waiter, record, keep_ms, force
            )

    def claim_waiter(self, name: str, waiter: str, token: str, mark: str) -> tuple[int, str]:
        """Claim the wait ``token`` of ``waiter`` beside ``name`` for the message ``mark``:
        :data:`~.commands.CLAIMED` (with ``"again"`` when this same message claimed it
        before),
        :data:`~.commands.WAIT_OVER`, :data:`~.commands.CLAIMED_ELSEWHERE`, or
        :data:`~.commands.WAIT_REPLACED` and the task id that replaced the waiter (see
        :meth:`replace_waiter`)."""
        with bounded(self.backend_timeout):
            return commands.wait_claim(self.client, self.keys(name), waiter, token, mark)

    def replace_waiter(self, name: str, waiter: str, by: str) -> bool:
        """``waiter``, waiting beside ``name``, was replaced by task ``by``: its next message
        learns so from its claim, and no run's end wakes it. ``False``: it had no record."""
        with bounded(self.backend_timeout):
            return commands.wait_mark(self.client, self.keys(name), waiter, by)

    def waiters(
        self,
        name: str,
        *,
        drop: str = "",
        token: str = "",
        claim: str = "",
        listing: bool = True,
    ) -> dict[str, str]:
        """The records of the waiters beside ``name`` that no message claimed (with
        ``listing``), after dropping the record of ``drop`` if it is still the wait ``token``
        or its ``claim``: one round trip."""
        with bounded(self.backend_timeout):
            return commands.wait_end(
                self.client, self.keys(name), drop, token, claim, listing=listing
            )

    def force_release(
        self,
        name: str,
        *,
        holder: str | None = None,
        states: Collection[str] = (),
        permits: int = 1,
    ) -> bool:
        """An operator's release, whoever holds ``name`` (or only when ``holder`` does; with
        ``states``, only while the hold is in one of those states and no run has entered it:
        checked in Redis, in the same step). With ``permits`` > 1 and a ``holder``, the permit
        that holder holds. Wakes waiters; the fencing token keeps increasing. Returns whether a
        lock was released."""
        if permits == 1:
            with bounded(self.backend_timeout):
                return commands.force_release(
                    self.client, self.keys_of(name), holder or "", states=states
                )
        if not holder:
            raise ValueError("force_release of one permit of several needs the holder")
        keys = permit_keys(self.prefix, name, check_permits(permits))
        with bounded(self.backend_timeout):
            return any(
                commands.force_release(self.client, keys[i], holder, states=states)
                for i in owned_by(self.client, keys, holder)
            )

    def inspect(self, name: str) -> LockState:
        """Everything about one lock (given by name or Redis key), read atomically."""
        with bounded(self.backend_timeout):
            return commands.inspect(self.client, self.keys_of(name))

    def inspect_permits(self, name: str, permits: int) -> list[LockState]:
        """:meth:`inspect` of each permit of the semaphore ``name``, permit 1 first."""
        keys = permit_keys(self.prefix, name, check_permits(permits))
        with bounded(self.backend_timeout):
            return [commands.inspect(self.client, permit) for permit in keys]

    def is_held(self, name: str) -> bool:
        """Whether anyone holds ``name`` now (one round trip)."""
        with bounded(self.backend_timeout):
            return commands.is_held(self.client, self.keys(name))

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

    def server_time_ms(self) -> float:
        """The server's clock in milliseconds (the local clock for a Redis Cluster client,
        whose nodes answer one by one)."""
        try:
            seconds, micros = self.client.time()
            return float(seconds) * 1000 + float(micros) / 1000
        except Exception:  # a cluster answers per node; the local clock is close enough
            return time.time() * 1000
