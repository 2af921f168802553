"""A process's wait on one lock's wake-up channel, shared by its waiting threads: one reads the
socket while the others sleep on a condition (:mod:`.wakeup` makes and ends subscriptions)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .wakeup import WakeHub

log = logging.getLogger("celery_singleton_lock.wakeup")

#: what Subscription._read saw
_NOTHING, _RELEASE, _BROKEN = 0, 1, 2


class Subscription:
    """The subscription of one process to one lock's wake-up channel, shared by its waiters."""

    def __init__(self, hub: WakeHub, channel: str) -> None:
        self.hub = hub
        self.channel = channel
        self.cond = threading.Condition(threading.Lock())
        self.wakeups = 0  # releases heard and not yet taken: each wakes one waiter
        self.waiters = 0  # threads that joined and have not left
        self.sleeping = 0  # threads inside wait() now
        self.pubsub: Any = None
        self.broken = False  # the subscription failed: its waiters poll by lease
        self._reading = False

    def wait(self, timeout: float) -> bool:
        """Sleep until a release wakes this thread (``True``: try the lock again, or pass the
        wake-up on when leaving), or for ``timeout`` seconds (``False``)."""
        deadline = time.monotonic() + timeout
        cond = self.cond
        with cond:
            self.sleeping += 1
            try:
                while True:
                    if self.wakeups > 0:
                        self.wakeups -= 1
                        return True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    if self._reading or self.broken or self.pubsub is None:
                        cond.wait(left)
                        continue
                    self._reading = True
                    cond.release()
                    try:
                        seen = self._read(left)
                    except BaseException:
                        cond.acquire()
                        self._reading = False
                        cond.notify()  # the next one reads
                        raise
                    cond.acquire()
                    self._reading = False
                    if seen == _RELEASE:
                        # The reader takes this wake-up itself; a sleeper takes over the reading.
                        if self.sleeping > 1:
                            cond.notify()
                        return True
                    if seen == _BROKEN:
                        # A message may have been lost with the connection: everyone tries.
                        self.wakeups += self.sleeping
                        cond.notify_all()
                    else:
                        cond.notify()  # the reader's time is up: the next one reads
            finally:
                self.sleeping -= 1

    def pass_on(self) -> None:
        """Give a wake-up this thread took and will not use to the next waiter."""
        with self.cond:
            self.wakeups += 1
            self.cond.notify()
            reading = self._reading and not self.hub.sharded
        if reading:
            # The reader may be the only waiter left, asleep in the socket: a PING on its own
            # connection ends its read. (A cluster's sharded subscription has no connection of
            # its own: its reader finds the wake-up when its wait ends, by the lease at latest.)
            with contextlib.suppress(Exception):
                self.pubsub.ping()

    def _read(self, timeout: float) -> int:
        try:
            reply = self.hub.read(self.pubsub, timeout)
        except Exception as exc:
            log.warning(
                "wake-up subscription to %s failed (%s: %s); its waiters poll by lease",
                self.channel,
                type(exc).__name__,
                exc,
            )
            self.broken = True
            return _BROKEN
        return _NOTHING if reply is None else _RELEASE
