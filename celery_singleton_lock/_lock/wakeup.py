"""Push wake-ups for blocked acquires: a channel per lock, read by the waiting threads themselves.

A final release publishes on its lock's own channel (``prefix:{name}:wake``, in the lock's hash
tag; ``SPUBLISH`` on Redis Cluster, so the message stays on the lock's shard); every permit of a
:class:`~.semaphore.Semaphore` publishes on that one channel of its name. A process
subscribes to a lock's channel only while one of its threads waits for that lock, so it never
hears of the releases of other locks. The waiting threads of a lock share one subscription and
read it themselves: one of them reads while the others sleep on a condition (no listener thread
to hop through).

A release frees the lock for one holder, so it wakes one waiting thread of the process, not all
of them: the rest stay asleep on the subscription. No release goes unanswered: each message read
is one wake-up, kept until a waiter takes it (a message that arrives while no thread waits stays
in the socket until the next one does); a woken thread tries the lock again, and one that leaves
without trying passes its wake-up on (:meth:`WakeHub.leave`). A lost message (a dropped
connection, a failover) costs a waiter at most the holder's remaining lease: every wait is
bounded by it, and then the waiter tries again.

The hub and the memory of contended locks belong to a client's :class:`~.runtime.LockRuntime`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from redis import exceptions as errors

if TYPE_CHECKING:
    from .hub import WakeHub

__all__ = ["Contended", "Subscription", "WakeHub", "probe_channel", "probe_publish_command"]

log = logging.getLogger("celery_singleton_lock.wakeup")

#: idle subscriptions (connections) a process keeps per client for its next waits
KEEP_IDLE = 2
#: a lock this process was refused within this many seconds counts as contended: a blocking
#: acquire of it subscribes before its first try
CONTENDED_FOR = 10.0
#: how long a waiter waits for its SUBSCRIBE to be confirmed before it polls by lease instead
SUBSCRIBE_TIMEOUT = 2.0

#: the probe's errors that say nothing about the server's commands (it is unreachable, or its
#: cluster is down or resharding): asked again later
_NO_ANSWER = (
    errors.ConnectionError,
    errors.TimeoutError,
    errors.ClusterError,
    errors.RedisClusterException,
    errors.TryAgainError,
)

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
        #: threads inside :meth:`wait` now (an observable for tests and operators)
        self.sleeping = 0
        self.pubsub: Any = None
        #: the subscription failed: its waiters poll by lease until they leave
        self.broken = False
        self._reading = False

    def wait(self, timeout: float) -> bool:
        """Sleep until a release wakes this thread (``True``: it must try the lock again, or
        pass the wake-up on when it leaves), or for ``timeout`` seconds (``False``)."""
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
                        # The reader takes this wake-up itself (it holds the condition, so no
                        # one else can); one sleeper, if any, takes over the reading.
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
            self.cond.notify()  # a waiter asleep on the condition takes it
            reading = self._reading and not self.hub.sharded
        if reading:
            # The thread reading the socket may be the only waiter left, and it sleeps in the
            # socket, not on the condition: a PING on the subscription's own connection ends
            # its read (the pong), and it looks at the wake-ups. (A cluster's sharded
            # subscription has no connection of its own to ping: its reader finds the wake-up
            # when its wait ends, at the latest when the holder's lease would.)
            with contextlib.suppress(Exception):
                self.pubsub.ping()

    def _read(self, timeout: float) -> int:
        """Read the subscription for up to ``timeout`` s. Only the one reading thread gets
        here."""
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


class Contended:
    """Which locks this process (through one client) was refused lately: a blocking acquire of
    such a lock subscribes before its first try, so a blocked wait sends one refused acquire,
    not two."""

    __slots__ = ("_refused",)

    def __init__(self) -> None:
        #: wake-up channel -> when it was last refused (monotonic); a plain dict: its single
        #: reads and writes are atomic, and a stale entry costs one early subscription
        self._refused: dict[str, float] = {}

    def note(self, channel: str) -> None:
        """The lock of ``channel`` was refused just now."""
        if len(self._refused) >= 4096:  # bounded: forget them all rather than track their age
            self._refused.clear()
        self._refused[channel] = time.monotonic()

    def recent(self, channel: str) -> bool:
        """Whether the lock of ``channel`` was refused within :data:`CONTENDED_FOR` s."""
        at = self._refused.get(channel)
        return at is not None and time.monotonic() - at < CONTENDED_FOR


def probe_channel(prefix: str) -> str:
    """The channel :func:`probe_publish_command` publishes on: under the locks' key prefix, so
    the ACL that lets the locks publish on their wake-up channels (``&prefix:*``) allows it too;
    no lock's channel (theirs end in ``:wake``), and nobody subscribes to it."""
    return f"{prefix}:{{csl-probe}}:probe"


def probe_publish_command(client: Any, prefix: str) -> str:
    """``"spublish"`` for a Redis Cluster client whose servers have sharded pub/sub (Redis 7+),
    else ``"publish"``: one ``SPUBLISH`` of an empty message on :func:`probe_channel` of
    ``prefix`` (the client's runtime keeps the answer).

    Raises what the client raised when the server gave no answer (unreachable, a cluster
    down): the caller asks again later rather than keep a guess."""
    if not (hasattr(client, "get_nodes") and hasattr(client.pubsub(), "ssubscribe")):
        return "publish"
    channel = probe_channel(prefix)
    try:
        client.execute_command("SPUBLISH", channel, "")
    except errors.NoPermissionError as exc:
        # The server has SPUBLISH but the Redis user may not send it: the locks still work,
        # by PUBLISH, which the cluster bus copies to every node.
        log.warning(
            "the Redis user may not SPUBLISH on %s (%s): release wake-ups go by PUBLISH to "
            "every node of the cluster; allow +spublish +ssubscribe +sunsubscribe on the "
            "locks' channels (see the ACL rule in docs/production.md)",
            channel,
            exc,
        )
        return "publish"
    except _NO_ANSWER:
        raise
    except Exception:
        # An older server (Redis 6.2): it answers "unknown command", or redis-py's cluster
        # client finds no SPUBLISH in the server's command table and refuses to send it.
        # Plain PUBLISH, which the cluster bus spreads.
        return "publish"
    return "spublish"
