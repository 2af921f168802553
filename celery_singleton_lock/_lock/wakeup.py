"""Push wake-ups for blocked acquires: a channel per lock, read by the waiting threads themselves.

A final release publishes on its lock's own channel (``prefix:{name}:wake``, in the lock's hash
tag; ``SPUBLISH`` on Redis Cluster, so the message stays on the lock's shard). A process
subscribes to a lock's channel only while one of its threads waits for that lock, so it never
hears of the releases of other locks. The waiting threads of a lock share one subscription and
read it themselves: one of them reads while the others sleep on a condition, and the reader
wakes them when the release arrives (no listener thread to hop through).

A waiter snapshots :attr:`Subscription.generation` before each try and passes it to
:meth:`Subscription.wait`, so a release that arrives between its refused try and its wait is not
missed. A lost message (a dropped connection, a failover) costs a waiter at most the holder's
remaining lease: every wait is bounded by it, and then the waiter tries again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from typing import Any

__all__ = [
    "Subscription",
    "WakeHub",
    "get_hub",
    "note_refused",
    "publish_command",
    "recently_refused",
]

log = logging.getLogger("celery_singleton_lock.wakeup")

#: idle subscriptions (connections) a process keeps per client for its next waits
KEEP_IDLE = 2
#: a lock this process was refused within this many seconds counts as contended: a blocking
#: acquire of it subscribes before its first try
CONTENDED_FOR = 10.0
#: how long a waiter waits for its SUBSCRIBE to be confirmed before it polls by lease instead
SUBSCRIBE_TIMEOUT = 2.0


class Subscription:
    """The subscription of one process to one lock's wake-up channel, shared by its waiters."""

    def __init__(self, hub: WakeHub, channel: str) -> None:
        self.hub = hub
        self.channel = channel
        self.cond = threading.Condition(threading.Lock())
        #: releases seen on the channel (and connection failures, which may have hidden one)
        self.generation = 0
        self.waiters = 0
        self.pubsub: Any = None
        #: the subscription failed: its waiters poll by lease until they leave
        self.broken = False
        self._reading = False

    def wait(self, seen: int, timeout: float) -> None:
        """Return when the generation has moved past ``seen`` (a release was published since
        the caller looked), or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        cond = self.cond
        with cond:
            while self.generation == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if self._reading or self.broken or self.pubsub is None:
                    cond.wait(left)
                    continue
                self._reading = True
                cond.release()
                woke = False
                try:
                    woke = self._read(left)
                finally:
                    cond.acquire()
                    self._reading = False
                    if woke:
                        self.generation += 1
                    # a woken waiter, or the next reader when this one's time is up
                    cond.notify_all()

    def _read(self, timeout: float) -> bool:
        """Read the subscription for up to ``timeout`` s; True when a release (or a failure that
        may have hidden one) arrived. Only the one reading thread gets here."""
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
            return True
        if reply is None:
            return False
        self.hub.received += 1
        return True


class WakeHub:
    """A process's wake-up subscriptions through one Redis client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sharded = publish_command(client) == "spublish"
        self._mutex = threading.Lock()
        self._subscriptions: dict[str, Subscription] = {}
        self._idle: list[Any] = []
        #: wake-up messages read, for tests and operators
        self.received = 0

    def join(self, channel: str) -> Subscription:
        """Join the waiters of ``channel``; the first one subscribes (confirmed before it
        returns, so a release after this call is heard)."""
        with self._mutex:
            sub = self._subscriptions.get(channel)
            if sub is not None:
                sub.waiters += 1
                first = False
            else:
                sub = self._subscriptions[channel] = Subscription(self, channel)
                sub.waiters = 1
                pubsub = self._idle.pop() if self._idle else None
                first = True
        if not first:
            with sub.cond:
                # the first waiter is still subscribing: wait for it, not longer
                sub.cond.wait_for(lambda: sub.pubsub is not None or sub.broken, SUBSCRIBE_TIMEOUT)
            return sub
        try:
            pubsub = self._subscribe(pubsub, channel)
        except Exception as exc:
            log.warning(
                "cannot subscribe to %s (%s: %s); its waiters poll by lease",
                channel,
                type(exc).__name__,
                exc,
            )
            with sub.cond:
                sub.broken = True
                sub.cond.notify_all()
            return sub
        with sub.cond:
            sub.pubsub = pubsub
            sub.cond.notify_all()
        return sub

    def leave(self, sub: Subscription) -> None:
        """Leave the waiters of the subscription; the last one ends it.

        The UNSUBSCRIBE goes from the client's heartbeat lane, a moment later: sent here it
        would cost the leaving waiter a send (about 50 us) between its acquire's reply and its
        return, on the path of every hand-off."""
        with self._mutex:
            sub.waiters -= 1
            if sub.waiters > 0:
                return
            del self._subscriptions[sub.channel]
        pubsub = sub.pubsub
        if pubsub is None:
            return
        if sub.broken:
            _close(pubsub)
            return
        from .heartbeat import get_heartbeat  # (heartbeat -> commands -> this module)

        get_heartbeat().retry(
            self.client,
            lambda: self._unsubscribe(pubsub, sub.channel),
            f"unsubscribe from {sub.channel}",
            SUBSCRIBE_TIMEOUT,
        )

    def _unsubscribe(self, pubsub: Any, channel: str) -> None:
        """End a subscription no waiter uses any more, and keep its connection for the next
        waits while fewer than :data:`KEEP_IDLE` are kept (never raises)."""
        with self._mutex:
            room = len(self._idle) < KEEP_IDLE
        if room:
            try:  # the confirmation is read by the next user of the connection
                if self.sharded:
                    pubsub.sunsubscribe(channel)
                else:
                    pubsub.unsubscribe(channel)
            except Exception:  # a broken connection: not worth keeping
                pass
            else:
                with self._mutex:
                    if len(self._idle) < KEEP_IDLE:
                        self._idle.append(pubsub)
                        return
        _close(pubsub)

    def _subscribe(self, pubsub: Any, channel: str) -> Any:
        if pubsub is None:
            pubsub = self.client.pubsub(ignore_subscribe_messages=False)
        try:
            if self.sharded:
                pubsub.ssubscribe(channel)
            else:
                pubsub.subscribe(channel)
            # Read up to our confirmation: the confirmations (and late messages) of the
            # connection's earlier channel come first on a reused connection.
            deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
            kind = b"ssubscribe" if self.sharded else b"subscribe"
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no confirmation of the subscription to {channel}")
                reply = self._raw(pubsub, left)
                if reply is None:
                    continue
                if not self.sharded:  # (get_sharded_message did its bookkeeping)
                    pubsub.handle_message(reply, ignore_subscribe_messages=False)
                if _bytes(reply[0]) == kind and _bytes(reply[1]) == channel.encode():
                    return pubsub
        except BaseException:
            _close(pubsub)
            raise

    def _raw(self, pubsub: Any, timeout: float) -> Any:
        if self.sharded:
            message = pubsub.get_sharded_message(ignore_subscribe_messages=False, timeout=timeout)
            if message is None:
                return None
            return [message["type"], message["channel"], message["data"]]
        return pubsub.parse_response(block=False, timeout=timeout)

    def read(self, pubsub: Any, timeout: float) -> Any:
        """The next message published on the subscription, or None after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self._raw(pubsub, max(deadline - time.monotonic(), 0.0))
            if reply is None:
                return None
            kind = _bytes(reply[0])
            if kind in (b"message", b"smessage"):
                return reply
            # a (un)subscribe confirmation, or a reconnect's resubscription: bookkeeping only
            if not self.sharded:
                pubsub.handle_message(reply, ignore_subscribe_messages=False)
            if time.monotonic() >= deadline:
                return None


def _close(pubsub: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        pubsub.close()


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


# -- which locks are contended -----------------------------------------------------------------

#: wake-up channel -> when this process was last refused that lock (monotonic); a plain dict:
#: its single reads and writes are atomic, and a stale entry costs one early subscription
_refused: dict[str, float] = {}


def note_refused(channel: str) -> None:
    if len(_refused) >= 4096:  # bounded: forget them all rather than track their age
        _refused.clear()
    _refused[channel] = time.monotonic()


def recently_refused(channel: str) -> bool:
    at = _refused.get(channel)
    return at is not None and time.monotonic() - at < CONTENDED_FOR


# -- the publish side ---------------------------------------------------------------------------

_publish_commands: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def publish_command(client: Any) -> str:
    """``"spublish"`` for a Redis Cluster client whose servers have sharded pub/sub (Redis 7+),
    else ``"publish"``. Asked once per client."""
    try:
        return _publish_commands[client]
    except (KeyError, TypeError):
        pass
    command = "publish"
    if hasattr(client, "get_nodes") and hasattr(client.pubsub(), "ssubscribe"):
        try:
            client.execute_command("SPUBLISH", "{csl-probe}:wake", "")
        except Exception:  # an older server: plain PUBLISH, which the cluster bus spreads
            pass
        else:
            command = "spublish"
    with contextlib.suppress(TypeError):  # a client that cannot be weakly referenced
        _publish_commands[client] = command
    return command


# -- one hub per client and process -------------------------------------------------------------

_hubs: dict[int, WakeHub] = {}
_hubs_lock = threading.Lock()
_hubs_pid = os.getpid()


def get_hub(client: Any) -> WakeHub:
    """The process's hub for this client (a forked child gets new ones)."""
    global _hubs_pid
    with _hubs_lock:
        if _hubs_pid != os.getpid():
            _hubs.clear()
            _hubs_pid = os.getpid()
        hub = _hubs.get(id(client))
        if hub is None or hub.client is not client:
            hub = _hubs[id(client)] = WakeHub(client)
        return hub


def _after_fork_in_child() -> None:
    global _hubs_lock
    _hubs_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
