"""Push wake-ups for blocked acquires: a channel per lock, read by the waiting threads themselves.

The last release of a lock publishes on its channel (``prefix:{name}:wake``; ``SPUBLISH`` on
Redis Cluster, so the message stays on the lock's shard). A process subscribes to a channel
only while one of its threads waits for that lock; its waiters share the :class:`Subscription`
(one reads the socket, the others sleep on a condition), and a release wakes one of them. A lost
message costs a waiter at most the holder's remaining lease: every wait is bounded by it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from redis import exceptions as errors

from .renewal import Lane

log = logging.getLogger("celery_singleton_lock.wakeup")

#: probe errors that say nothing about the server's commands: it is asked again later
_NO_ANSWER = (
    errors.ConnectionError,
    errors.TimeoutError,
    errors.ClusterError,
    errors.RedisClusterException,
    errors.TryAgainError,
)

#: idle subscriptions (connections) a process keeps per client for its next waits
KEEP_IDLE = 2
#: how long a waiter waits for its SUBSCRIBE to be confirmed before it polls by lease instead
SUBSCRIBE_TIMEOUT = 2.0


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
                    message = None
                    try:
                        message = self.hub.read(self.pubsub, left)
                    except Exception as exc:
                        _poll_by_lease("wake-up subscription to %s failed", self.channel, exc)
                        self.broken = True
                    finally:
                        cond.acquire()
                        self._reading = False
                        cond.notify()  # the next one reads (the reader's time is up, or it left)
                    if self.broken:
                        # A message may have been lost with the connection: everyone tries.
                        self.wakeups += self.sleeping
                        cond.notify_all()
                    elif message is not None:
                        return True  # the reader takes this wake-up itself
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


def probe_publish_command(client: Any, prefix: str) -> str:
    """``"spublish"`` for a Redis Cluster client with sharded pub/sub (Redis 7+), else
    ``"publish"``: one ``SPUBLISH`` under ``prefix`` (the locks' ACL rule allows it). Raises
    what the client raised when the server gave no answer."""
    if not (hasattr(client, "get_nodes") and hasattr(client.pubsub(), "ssubscribe")):
        return "publish"
    channel = f"{prefix}:{{csl-probe}}:probe"
    try:
        client.execute_command("SPUBLISH", channel, "")
    except errors.NoPermissionError as exc:
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
    except Exception:  # an older server (6.2), or one redis-py finds without SPUBLISH
        return "publish"
    return "spublish"


class WakeHub:
    """A process's wake-up subscriptions through one client: one per lock a thread waits for,
    each on a pub/sub connection of its own, and a few idle connections kept for the next
    waits. It holds its client weakly."""

    def __init__(self, client: Any, lane: Lane, sharded: Callable[[str], bool]) -> None:
        self._client = weakref.ref(client)
        self._lane = lane  # (it sends the UNSUBSCRIBEs)
        self._sharded_of = sharded
        self.sharded: bool | None = None  # (None: not asked yet)
        # a cluster's pub/sub objects hold their client: none kept idle
        self._keep_idle = 0 if hasattr(client, "get_nodes") else KEEP_IDLE
        # Reentrant: close() may run from the garbage collector on a thread that holds it.
        self._mutex = threading.RLock()
        self.subscriptions: dict[str, Subscription] = {}
        self._idle: list[Any] = []
        self._closed = False

    def join(self, channel: str) -> Subscription:
        """Join the waiters of ``channel``; the first one subscribes (confirmed before it
        returns, so a release after this call is heard)."""
        with self._mutex:
            sub = self.subscriptions.get(channel)
            first, pubsub = sub is None, None
            if sub is None:
                sub = self.subscriptions[channel] = Subscription(self, channel)
                pubsub = self._idle.pop() if self._idle else None
            sub.waiters += 1
        if not first:
            with sub.cond:  # the first waiter is still subscribing: wait for it, not longer
                sub.cond.wait_for(lambda: sub.pubsub is not None or sub.broken, SUBSCRIBE_TIMEOUT)
            return sub
        try:
            pubsub = self._subscribe(pubsub, channel)
        except Exception as exc:
            _poll_by_lease("cannot subscribe to %s", channel, exc)
            pubsub = None
        with sub.cond:
            sub.pubsub, sub.broken = pubsub, pubsub is None
            sub.cond.notify_all()
        return sub

    def leave(self, sub: Subscription, *, woken: bool = False) -> None:
        """Leave the waiters of ``sub``; the last one ends it. ``woken``: the thread took a
        wake-up it did not use, which goes to the next waiter. The UNSUBSCRIBE goes from the
        client's lane: sent here it would delay every hand-off by a send."""
        with self._mutex:
            sub.waiters -= 1
            if sub.waiters > 0:
                if woken:
                    sub.pass_on()
                return
            del self.subscriptions[sub.channel]
        pubsub = sub.pubsub
        if pubsub is not None and sub.broken:
            _close(pubsub)
        elif pubsub is not None:
            self._lane.retry(
                lambda: self._unsubscribe(pubsub, sub.channel),
                f"unsubscribe from {sub.channel}",
                SUBSCRIBE_TIMEOUT,
            )

    def close(self) -> None:
        """Close every connection of the hub (its client is gone)."""
        with self._mutex:
            self._closed = True
            pubsubs = self._idle + [s.pubsub for s in self.subscriptions.values()]
            self._idle = []
        for pubsub in pubsubs:
            if pubsub is not None:
                _close(pubsub)

    def _unsubscribe(self, pubsub: Any, channel: str) -> None:
        """End a subscription, its connection kept while fewer than ``keep_idle`` are idle."""
        with contextlib.suppress(Exception):  # a broken connection is not worth keeping
            if not self._closed and len(self._idle) < self._keep_idle:  # (checked again below)
                # the confirmation is read by the next user of the connection
                (pubsub.sunsubscribe if self.sharded else pubsub.unsubscribe)(channel)
                with self._mutex:
                    if not self._closed and len(self._idle) < self._keep_idle:
                        self._idle.append(pubsub)
                        return
        _close(pubsub)

    def _subscribe(self, pubsub: Any, channel: str) -> Any:
        if pubsub is None:
            client: Any = self._client()  # (alive: a waiter holds it)
            pubsub = client.pubsub(ignore_subscribe_messages=False)
        try:
            if self.sharded is None:
                self.sharded = self._sharded_of(channel)
            (pubsub.ssubscribe if self.sharded else pubsub.subscribe)(channel)
            # Read up to our confirmation: on a reused connection the confirmations (and late
            # messages) of its earlier channel come first.
            kind = b"ssubscribe" if self.sharded else b"subscribe"
            deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
            while (left := deadline - time.monotonic()) > 0:
                reply = self._raw(pubsub, left)
                if reply is None:
                    continue
                if not self.sharded:  # (get_sharded_message did its bookkeeping)
                    pubsub.handle_message(reply, ignore_subscribe_messages=False)
                if _bytes(reply[0]) == kind and _bytes(reply[1]) == channel.encode():
                    return pubsub
            raise TimeoutError(f"no confirmation of the subscription to {channel}")
        except BaseException:
            _close(pubsub)
            raise

    def _raw(self, pubsub: Any, timeout: float) -> Any:
        if self.sharded:
            message = pubsub.get_sharded_message(ignore_subscribe_messages=False, timeout=timeout)
            return None if message is None else [message[k] for k in ("type", "channel", "data")]
        return pubsub.parse_response(block=False, timeout=timeout)

    def read(self, pubsub: Any, timeout: float) -> Any:
        """The next message published, or None after ``timeout`` s (or at a pong)."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self._raw(pubsub, max(deadline - time.monotonic(), 0.0))
            # nothing in time, or a PONG (bytes, or ["pong", ""] in RESP2): pass_on's call to
            # look at the wake-ups
            if reply is None or isinstance(reply, (bytes, str)) or _bytes(reply[0]) == b"pong":
                return None
            if _bytes(reply[0]) in (b"message", b"smessage"):
                return reply
            # a (un)subscribe confirmation, or a reconnect's resubscription: bookkeeping only
            if not self.sharded:
                pubsub.handle_message(reply, ignore_subscribe_messages=False)
            if time.monotonic() >= deadline:
                return None


def _poll_by_lease(what: str, channel: str, exc: Exception) -> None:
    log.warning(what + " (%s: %s); its waiters poll by lease", channel, type(exc).__name__, exc)


def _close(pubsub: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        pubsub.close()


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
