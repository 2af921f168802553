"""The cancels of lost acquires that this process has not yet seen run, by lock and owner.

An acquire whose reply never came may still run in Redis, late: its cancel (lua/cancel.lua)
makes it hold nothing, but only when the cancel runs first or while that acquire's hold is the
owner's latest one. Once the same owner has acquired again, cancel.lua cannot tell which of the
owner's holds came from the lost acquire, and the late hold stays for its lease (a "ghost":
the owner's release drops its own hold and returns, the lock stays held). So a cancel that
could not be sent at once is kept here, in the client's :class:`~.runtime.LockRuntime`, until it
has run; the owner's next acquire, release or park of that lock runs it first (see
:func:`.commands.settle`), and fails rather than act on top of a hold that may be a ghost.

Only this process's cancels are known here. A Celery task id is an owner that several
processes act as (the publisher, the worker): a late acquire of the publisher that lands after
the worker entered the lock is undone by nobody, and ends with its lease (cancel.lua says so).
"""

from __future__ import annotations

import threading

from .keys import LockKeys

__all__ = ["PendingCancel", "PendingCancels"]


class PendingCancel:
    """The cancel of one acquire whose reply was lost (the arguments of lua/cancel.lua)."""

    __slots__ = ("done", "keys", "lease_ms", "owner", "request")

    def __init__(self, keys: LockKeys, owner: str, request: str, lease_ms: int) -> None:
        self.keys = keys
        self.owner = owner
        #: the request id of the lost acquire
        self.request = request
        #: the lease that acquire asked for (its void mark must outlive any hold it could make)
        self.lease_ms = lease_ms
        #: it ran (from the caller's operation or from the lane): nothing more to do
        self.done = False


class PendingCancels:
    """The pending cancels of one client's runtime, by (lock, owner).

    ``by_owner`` is read without the mutex on the hot path (an empty dict: nothing pending, the
    usual case); every change is made under it."""

    __slots__ = ("_mutex", "by_owner")

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        #: (lock, owner) -> its pending cancels, oldest first. The lock is named by its wake-up
        #: channel, which every permit of a semaphore shares: an operation on one permit
        #: settles the owner's cancels on all of them (it may have taken any).
        self.by_owner: dict[tuple[str, str], list[PendingCancel]] = {}

    def add(self, cancel: PendingCancel) -> None:
        with self._mutex:
            self.by_owner.setdefault((cancel.keys.channel, cancel.owner), []).append(cancel)

    def of(self, keys: LockKeys, owner: str) -> list[PendingCancel]:
        """The cancels still pending for ``owner`` on the lock of ``keys`` (a copy)."""
        with self._mutex:
            return list(self.by_owner.get((keys.channel, owner), ()))

    def discard(self, cancel: PendingCancel, *, done: bool = True) -> None:
        """Forget ``cancel``: it ran (``done``), or the lane gave up on it (what it was to
        undo has ended with its lease)."""
        with self._mutex:
            if done:
                cancel.done = True
            key = (cancel.keys.channel, cancel.owner)
            pending = self.by_owner.get(key)
            if pending is not None and cancel in pending:
                pending.remove(cancel)
                if not pending:
                    del self.by_owner[key]
