"""One process's hold on one lock, and the registry of the holds taken through one client.

Every lock object with the same client, name and owner shares one hold, so nested re-entry is
counted here and never reaches Redis. A registry (one per client's runtime) keeps a hold only
while it is held or being taken.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from . import observe
from .keys import LockKeys


class LeaseLost(threading.Event):
    """A hold's ``lost``: set by the heartbeat when the lease is gone or cannot be renewed, and
    by itself once the lease runs out on the local clock (a lane stuck on a hung Redis reports
    nothing, and a lease that ran out must never look held)."""

    def __init__(self, hold: Hold) -> None:
        super().__init__()
        self._hold = weakref.ref(hold)

    def set(self) -> None:
        # Every way a lease is lost ends here: the one place to report it, once per hold.
        if not threading.Event.is_set(self):
            super().set()
            if observe.observer is not None:
                observe.observer.lost()
        else:
            super().set()

    def _lease_left(self) -> float | None:
        """Seconds left on the lease while the lock is held; ``None`` when it is not held."""
        hold = self._hold()
        if hold is None or hold.dead or hold.count <= 0 or hold.valid_until <= 0:
            return None
        return hold.lease_left()

    def is_set(self) -> bool:
        if super().is_set():
            return True
        left = self._lease_left()
        if left is not None and left <= 0:
            self.set()
            return True
        return False

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            # Sleep until the set() of the heartbeat, the end of the lease as known now (a
            # renewal moves it: look again then), or the caller's timeout.
            step = self._lease_left()
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                step = remaining if step is None else min(step, remaining)
            if super().wait(None if step is None else max(step, 0.0) + 0.001):
                return True
        return True


@dataclass(eq=False, slots=True, weakref_slot=True)
class Hold:
    """The hold of one owner on one lock through one client, in this process."""

    client: Any
    keys: LockKeys
    owner: str
    ttl: float
    renew: bool
    lease_ms: int = field(init=False)
    #: nesting depth in this process; Redis counts this whole hold as one
    count: int = 0
    fence: int | None = None
    #: made at its first use: most holds end without anyone asking
    _lost: LeaseLost | None = None
    mutex: threading.Lock = field(default_factory=threading.Lock)
    #: set when the hold left the registry; a thread that finds it dead looks again
    dead: bool = False
    #: the thread that took it, when the owner is that thread's default token: renewal stops if
    #: that thread ends without releasing (a lease must not outlive its holder)
    thread: weakref.ReferenceType[threading.Thread] | None = None
    #: monotonic time the lease ends as far as this process knows: when the last successful
    #: acquire or renewal was *sent*, plus the lease
    valid_until: float = 0.0
    next_renew: float = 0.0
    #: monotonic time the acquire that took it was sent (for the hold-time metric)
    taken_at: float = 0.0
    #: the run token it was taken with ("" for none): another run of the owner in this process
    #: (a thread pool) is refused as Redis refuses one from another process
    run_token: str = ""

    def __post_init__(self) -> None:
        self.lease_ms = max(1, round(self.ttl * 1000))

    @property
    def lost(self) -> threading.Event:
        """Set when the lease is lost (see :class:`LeaseLost`); one Event per hold."""
        lost = self._lost
        if lost is None:
            with _lost_made:
                lost = self._lost
                if lost is None:
                    lost = self._lost = LeaseLost(self)
        return lost

    def set_lease(self, ttl: float, renew: bool) -> None:
        """Take the lease and renewal of the lock object about to take this hold (only while
        nobody holds it: a live hold keeps those it was taken with)."""
        self.ttl = ttl
        self.lease_ms = max(1, round(ttl * 1000))
        self.renew = renew

    def lease_left(self) -> float:
        return self.valid_until - time.monotonic()

    def __repr__(self) -> str:
        return f"<Hold {self.keys.lock} owner={self.owner} count={self.count} fence={self.fence}>"


#: makes a hold's ``lost`` Event once, whichever thread asks first
_lost_made = threading.Lock()


def after_fork_in_child() -> None:
    """In a forked child (called by :mod:`.runtime`'s one fork hook): a lock that a thread
    of the parent held at the fork would never be released here."""
    global _lost_made
    _lost_made = threading.Lock()


class HoldRegistry:
    """The holds taken through one client in this process, by (lock key, owner)."""

    __slots__ = ("_holds", "_mutex")

    def __init__(self) -> None:
        self._holds: dict[tuple[str, str], Hold] = {}
        self._mutex = threading.Lock()

    def find(self, lock_key: str, owner: str) -> Hold | None:
        """The live hold of ``owner`` on the lock, or ``None``."""
        hold = self._holds.get((lock_key, owner))
        if hold is None or hold.count <= 0:
            return None
        return hold

    def hold_for(self, client: Any, keys: LockKeys, owner: str, ttl: float, renew: bool) -> Hold:
        """The registered hold of ``owner`` on the lock, registered now (not yet held) if
        none."""
        slot = (keys.lock, owner)
        with self._mutex:
            hold = self._holds.get(slot)
            if hold is None:
                hold = self._holds[slot] = Hold(client, keys, owner, ttl, renew)
            return hold

    def forget(self, hold: Hold) -> None:
        """Take the hold out of the registry; a thread that finds it ``dead`` looks again."""
        slot = (hold.keys.lock, hold.owner)
        with self._mutex:
            hold.dead = True
            if self._holds.get(slot) is hold:
                del self._holds[slot]
