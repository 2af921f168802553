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
        #: releases heard and not yet taken by a waiter: each wakes one
        self.wakeups = 0
        #: threads that joined and have not left
        self.waiters = 0
        #: threads inside :meth:`wait` now (observed by tests)
        self.sleeping = 0
        self.pubsub: Any = None
        #: the subscription failed: its waiters poll by lease until they leave
        self.broken = False
        self._reading = False
        #: when its last waiter left (monotonic), while it is kept for the next wait
        self.idle_since: float | None = None

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
        """Read the subscription for up to ``timeout`` s (the one reading thread only)."""
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
        if reply is None:
            return _NOTHING
        self.hub.received += 1
        return _RELEASE
