"""A client's wake-up subscriptions (see :mod:`.wakeup`): one per lock that a thread of this
process waits for, each on a pub/sub connection of its own, and a few idle connections kept
for the next waits.

The hub belongs to its client's :class:`~.runtime.LockRuntime` and holds the client weakly: the
waiters hold it while they wait, and a client its user dropped takes its hub, idle connections
included, with it (:meth:`WakeHub.close`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .wakeup import SUBSCRIBE_TIMEOUT, Subscription

__all__ = ["WakeHub"]

log = logging.getLogger("celery_singleton_lock.wakeup")

#: ``background(call, what, give_up_after)``: runs ``call`` soon on the client's lane
Background = Callable[[Callable[[], None], str, float], None]


class WakeHub:
    """A process's wake-up subscriptions through one Redis client."""

    def __init__(
        self,
        client: weakref.ReferenceType[Any],
        *,
        sharded: Callable[[str], bool],
        keep_idle: int,
        background: Background,
    ) -> None:
        self._client = client
        #: ``sharded(channel)``: whether to subscribe with SSUBSCRIBE (a Redis Cluster with
        #: sharded pub/sub, as its releases SPUBLISH), asked at the first subscription
        self._sharded_of = sharded
        #: SSUBSCRIBE rather than SUBSCRIBE (valid once ``_sharded_known``)
        self.sharded = False
        self._sharded_known = False
        #: idle connections kept (none for a cluster client: its pub/sub objects hold it)
        self._keep_idle = keep_idle
        self._background = background
        # Reentrant: close() may run from the garbage collector on a thread that holds it.
        self._mutex = threading.RLock()
        self._subscriptions: dict[str, Subscription] = {}
        self._idle: list[Any] = []
        self._closed = False
        #: wake-up messages read, for tests and operators
        self.received = 0

    def subscription(self, channel: str) -> Subscription | None:
        """The subscription of ``channel`` while a thread of this process waits on it."""
        return self._subscriptions.get(channel)

    @property
    def channels(self) -> list[str]:
        """The channels this process's threads wait on now."""
        with self._mutex:
            return list(self._subscriptions)

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

    def leave(self, sub: Subscription, *, woken: bool = False) -> None:
        """Leave the waiters of the subscription; the last one ends it. ``woken``: the thread
        took a wake-up it did not use (it leaves without trying the lock again): the next
        waiter gets it, so that release is not lost.

        The UNSUBSCRIBE goes from the client's lane, a moment later: sent here it would cost
        the leaving waiter a send (about 50 us) between its acquire's reply and its return, on
        the path of every hand-off."""
        with self._mutex:
            sub.waiters -= 1
            if sub.waiters > 0:
                if woken:
                    sub.pass_on()
                return
            del self._subscriptions[sub.channel]
        pubsub = sub.pubsub
        if pubsub is None:
            return
        if sub.broken:
            _close(pubsub)
            return
        self._background(
            lambda: self._unsubscribe(pubsub, sub.channel),
            f"unsubscribe from {sub.channel}",
            SUBSCRIBE_TIMEOUT,
        )

    def close(self) -> None:
        """Close every connection of the hub (its client is gone: nobody waits any more)."""
        with self._mutex:
            self._closed = True
            pubsubs = self._idle + [s.pubsub for s in self._subscriptions.values()]
            self._idle = []
        for pubsub in pubsubs:
            if pubsub is not None:
                _close(pubsub)

    def _unsubscribe(self, pubsub: Any, channel: str) -> None:
        """End a subscription no waiter uses any more, and keep its connection for the next
        waits while fewer than the hub keeps are idle (never raises)."""
        with self._mutex:
            room = not self._closed and len(self._idle) < self._keep_idle
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
                    if not self._closed and len(self._idle) < self._keep_idle:
                        self._idle.append(pubsub)
                        return
        _close(pubsub)

    def _subscribe(self, pubsub: Any, channel: str) -> Any:
        if pubsub is None:
            client = self._client()
            if client is None:  # (a waiter holds its client: only a bug gets here)
                raise RuntimeError("the client of this wake-up hub is gone")
            pubsub = client.pubsub(ignore_subscribe_messages=False)
        try:
            if not self._sharded_known:
                # (the first waiters of two locks may both ask: they get the same answer)
                self.sharded = self._sharded_of(channel)
                self._sharded_known = True
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
        """The next message published on the subscription, or None after ``timeout`` s (or
        sooner, at a pong)."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self._raw(pubsub, max(deadline - time.monotonic(), 0.0))
            if reply is None:
                return None
            if isinstance(reply, (bytes, str)):  # a PONG (a list ["pong", ""] in RESP2 too)
                return None  # Subscription.pass_on asks the reader to look at its wake-ups
            kind = _bytes(reply[0])
            if kind in (b"message", b"smessage"):
                return reply
            if kind == b"pong":
                return None
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
