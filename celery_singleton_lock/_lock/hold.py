"""One process's hold on one lock, shared by every lock object of its client, name and owner
(nested re-entry never reaches Redis), and the registry of a client's holds."""

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
    nothing)."""

    def __init__(self, hold: Hold) -> None:
        super().__init__()
        self._hold = weakref.ref(hold)

    def set(self) -> None:
        # every way a lease is lost ends here: reported once per hold
        first = not threading.Event.is_set(self)
        super().set()
        if first and observe.observer is not None:
            observe.observer.lost()

    def _lease_left(self) -> float | None:
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
            # Until set(), the lease's end as known now (a renewal moves it), or the timeout.
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
    client: Any
    keys: LockKeys
    owner: str
    ttl: float
    renew: bool
    #: nesting depth in this process; Redis counts this whole hold as one
    count: int = 0
    fence: int | None = None
    #: made at its first use (most holds end without anyone asking)
    _lost: LeaseLost | None = None
    mutex: threading.Lock = field(default_factory=threading.Lock)
    #: set when the hold left the registry; a thread that finds it dead looks again
    dead: bool = False
    #: the thread that took it as its default owner: renewal stops if it ends without releasing
    thread: weakref.ReferenceType[threading.Thread] | None = None
    #: monotonic time the lease ends: when the last acquire or renewal was *sent*, plus the lease
    valid_until: float = 0.0
    next_renew: float = 0.0
    taken_at: float = 0.0
    #: the run token it was taken with: another run of the owner here is refused as in Redis
    run_token: str = ""

    @property
    def lost(self) -> threading.Event:
        lost = self._lost
        if lost is None:
            with _lost_made:
                lost = self._lost
                if lost is None:
                    lost = self._lost = LeaseLost(self)
        return lost

    @property
    def lease_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    def lease_left(self) -> float:
        return self.valid_until - time.monotonic()

    def __repr__(self) -> str:
        return f"<Hold {self.keys.lock} owner={self.owner} count={self.count} fence={self.fence}>"


_lost_made = threading.Lock()


def after_fork_in_child() -> None:
    # a lock a thread of the parent held at the fork would never be released here
    global _lost_made
    _lost_made = threading.Lock()


class HoldRegistry:
    """The holds taken through one client in this process, by (lock key, owner)."""

    __slots__ = ("_holds", "_mutex")

    def __init__(self) -> None:
        self._holds: dict[tuple[str, str], Hold] = {}
        self._mutex = threading.Lock()

    def find(self, lock_key: str, owner: str) -> Hold | None:
        hold = self._holds.get((lock_key, owner))
        return hold if hold is not None and hold.count > 0 else None

    def hold_for(self, client: Any, keys: LockKeys, owner: str, ttl: float, renew: bool) -> Hold:
        """The registered hold of ``owner`` on the lock, registered now if none."""
        slot = (keys.lock, owner)
        with self._mutex:
            hold = self._holds.get(slot)
            if hold is None:
                hold = self._holds[slot] = Hold(client, keys, owner, ttl, renew)
            return hold

    def forget(self, hold: Hold) -> None:
        slot = (hold.keys.lock, hold.owner)
        with self._mutex:
            hold.dead = True
            if self._holds.get(slot) is hold:
                del self._holds[slot]
