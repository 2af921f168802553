"""Push wake-ups for blocked acquires: a channel per lock, read by the waiting threads themselves.

The last release of a lock publishes on its channel (``prefix:{name}:wake``; ``SPUBLISH`` on
Redis Cluster, so the message stays on the lock's shard); every permit of a name shares it. A
process subscribes to a channel while one of its threads waits for that lock, and for a moment
after (:data:`KEEP_SUBSCRIBED`: the next wait for a contended lock comes soon, and finds its
subscription made; the last waiter to leave, on its way out of a hand-off, does nothing more).
Its waiting threads share the subscription: one reads the socket while the others sleep on a
condition. A release wakes one waiting thread of the process (it frees the lock for one
holder); a woken thread that leaves without trying passes its wake-up on. A lost message costs
a waiter at most the holder's remaining lease: every wait is bounded by it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from redis import exceptions as errors

from .subscription import Subscription

log = logging.getLogger("celery_singleton_lock.wakeup")

#: errors of the probe that say nothing about the server's commands (it is unreachable, its
#: cluster down or resharding): it is asked again later
_NO_ANSWER = (
    errors.ConnectionError,
    errors.TimeoutError,
    errors.ClusterError,
    errors.RedisClusterException,
    errors.TryAgainError,
)

#: idle subscriptions (connections) a process keeps per client for its next waits
KEEP_IDLE = 2
#: a lock refused within this many seconds counts as contended: a blocking acquire of it
#: subscribes before its first try
CONTENDED_FOR = 10.0
#: how long a waiter waits for its SUBSCRIBE to be confirmed before it polls by lease instead
SUBSCRIBE_TIMEOUT = 2.0
#: seconds a subscription nobody waits on is kept for the next wait on its channel; the
#: client's lane ends it at its next sweep after that (:data:`SWEEP_EVERY`), so it goes within
#: about a second
KEEP_SUBSCRIBED = 0.5
#: how often the lane looks for subscriptions to end while this process has any
SWEEP_EVERY = 0.5

#: numbers the PINGs that empty a kept subscription (:meth:`WakeHub._drained`)
_pings = itertools.count(1)


class Background(Protocol):
    """``background(call, what, give_up_after)``: runs ``call`` soon on the client's lane (no
    sooner than ``delay`` s from now; ``quiet``: no log line when done)."""

    def __call__(
        self,
        call: Callable[[], None],
        what: str,
        give_up_after: float,
        *,
        delay: float = 0.0,
        quiet: bool = False,
    ) -> None: ...


class Contended:
    """The locks (by channel) refused lately through one client: a blocking acquire of one of
    them subscribes before its first try, so a blocked wait sends one refused acquire, not two."""

    __slots__ = ("_refused",)

    def __init__(self) -> None:
        #: channel -> when last refused (monotonic); a plain dict: its single reads and writes
        #: are atomic, and a stale entry costs one early subscription
        self._refused: dict[str, float] = {}

    def note(self, channel: str) -> None:
        if len(self._refused) >= 4096:  # bounded: forget them all rather than track their age
            self._refused.clear()
        self._refused[channel] = time.monotonic()

    def recent(self, channel: str) -> bool:
        at = self._refused.get(channel)
        return at is not None and time.monotonic() - at < CONTENDED_FOR


def probe_channel(prefix: str) -> str:
    """The probe's channel: under the locks' key prefix, so the ACL that lets the locks publish
    on their wake-up channels (``&prefix:*``) allows it; no lock's channel, and unsubscribed."""
    return f"{prefix}:{{csl-probe}}:probe"


def probe_publish_command(client: Any, prefix: str) -> str:
    """``"spublish"`` for a Redis Cluster client whose servers have sharded pub/sub (Redis 7+),
    else ``"publish"``: one ``SPUBLISH`` on :func:`probe_channel`. Raises what the client raised
    when the server gave no answer (the caller asks again later rather than keep a guess)."""
    if not (hasattr(client, "get_nodes") and hasattr(client.pubsub(), "ssubscribe")):
        return "publish"
    channel = probe_channel(prefix)
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
    waits. It holds its client weakly: a client its user dropped takes the hub with it."""

    def __init__(
        self,
        client: weakref.ReferenceType[Any],
        *,
        sharded: Callable[[str], bool],
        keep_idle: int,
        background: Background,
    ) -> None:
        self._client = client
        #: ``sharded(channel)``: SSUBSCRIBE rather than SUBSCRIBE, asked at the first subscription
        self._sharded_of = sharded
        self.sharded = False
        self._sharded_known = False
        self._keep_idle = keep_idle
        self._background = background
        # Reentrant: close() may run from the garbage collector on a thread that holds it.
        self._mutex = threading.RLock()
        self._subscriptions: dict[str, Subscription] = {}
        self._idle: list[Any] = []
        self._closed = False
        #: a sweep of the subscriptions nobody waits on is due on the lane
        self._sweeping = False
        #: wake-up messages read (observed by tests)
        self.received = 0

    def subscription(self, channel: str) -> Subscription | None:
        """The subscription of ``channel`` while a thread of this process waits on it."""
        return self._subscriptions.get(channel)

    @property
    def channels(self) -> list[str]:
        """The channels a thread of this process waits on now."""
        with self._mutex:
            return [channel for channel, sub in self._subscriptions.items() if sub.waiters > 0]

    def join(self, channel: str) -> Subscription:
        """Join the waiters of ``channel``; the first one subscribes, or takes the subscription
        kept from the last wait and drops what it heard meanwhile (either way before it
        returns, so a release after this call is heard, and none before it)."""
        pubsub = None
        kept = None
        with self._mutex:
            sub = self._subscriptions.get(channel)
            first = sub is None or sub.waiters == 0
            if sub is None:
                sub = self._subscriptions[channel] = Subscription(self, channel)
                pubsub = self._idle.pop() if self._idle else None
            elif sub.waiters == 0:  # kept: the others wait for it as for a new subscription
                kept, sub.pubsub, sub.idle_since, sub.wakeups = sub.pubsub, None, None, 0
            sub.waiters += 1
            sweep = first and not self._sweeping
            self._sweeping = self._sweeping or sweep
        if sweep:  # (the start of a wait: not a hand-off's path)
            self._background(
                self._sweep, "end the wake-up subscriptions nobody waits on", 60.0,
                delay=SWEEP_EVERY, quiet=True,
            )  # fmt: skip
        if not first:
            with sub.cond:  # the first waiter is still subscribing: wait for it, not longer
                sub.cond.wait_for(lambda: sub.pubsub is not None or sub.broken, SUBSCRIBE_TIMEOUT)
            return sub
        try:
            if kept is not None:
                pubsub = self._drained(kept, channel)
            if pubsub is None or kept is None:
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
        """Leave the waiters of ``sub``; the last one keeps it for the next wait on its
        channel, and the client's lane ends it :data:`KEEP_SUBSCRIBED` s later unless a wait
        took it. ``woken``: the thread took a wake-up it did not use, which goes to the next
        waiter. Nothing is sent or handed over here: the last waiter leaves on its way out of
        an acquire, and anything more would delay every hand-off."""
        with self._mutex:
            sub.waiters -= 1
            if sub.waiters > 0:
                if woken:
                    sub.pass_on()
                return
            if not sub.broken and sub.pubsub is not None:
                sub.idle_since = time.monotonic()
                return
            del self._subscriptions[sub.channel]
        if sub.pubsub is not None:
            _close(sub.pubsub)  # broken: not worth keeping

    def _sweep(self) -> None:
        """On the client's lane: end the subscriptions nobody has waited on for
        :data:`KEEP_SUBSCRIBED` s (their connections kept idle for the next waits, up to
        ``keep_idle``); sweep again later while the process has any."""
        now = time.monotonic()
        with self._mutex:
            ended = [
                sub
                for sub in self._subscriptions.values()
                if sub.waiters == 0
                and sub.idle_since is not None
                and now - sub.idle_since >= KEEP_SUBSCRIBED
            ]
            for sub in ended:
                del self._subscriptions[sub.channel]
            again = self._sweeping = bool(self._subscriptions) and not self._closed
        for sub in ended:
            self._unsubscribe(sub.pubsub, sub.channel)
        if again:
            self._background(
                self._sweep, "end the wake-up subscriptions nobody waits on", 60.0,
                delay=SWEEP_EVERY, quiet=True,
            )  # fmt: skip

    def close(self) -> None:
        """Close every connection of the hub (its client is gone)."""
        with self._mutex:
            self._closed = True
            pubsubs = self._idle + [s.pubsub for s in self._subscriptions.values()]
            self._idle = []
        for pubsub in pubsubs:
            if pubsub is not None:
                _close(pubsub)

    def _unsubscribe(self, pubsub: Any, channel: str) -> None:
        """End a subscription nobody waits on, and keep its connection while fewer than
        ``keep_idle`` are idle (never raises)."""
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

    def _drained(self, pubsub: Any, channel: str) -> Any:
        """The kept subscription ``pubsub`` of ``channel``, emptied of what it heard while
        nobody waited (a release before this wait is no wake-up for it): a PING of its own on
        the connection, and everything read before its answer dropped. The answer also says
        the subscription is live (a connection that broke meanwhile was made again and
        subscribed again by redis-py, in order, before it). ``None``, closed, when the
        connection fails (the caller subscribes afresh). A cluster's sharded subscription has
        no connection of its own to PING: what it has buffered is dropped."""
        try:
            if self.sharded:
                while self._raw(pubsub, 0.0) is not None:
                    pass
                return pubsub
            token = f"csl-kept-{next(_pings)}"
            pubsub.ping(token)
            expected = token.encode()

            def answered(reply: Any) -> bool:
                if isinstance(reply, (bytes, str)):  # RESP3: the PING's answer alone
                    return _bytes(reply) == expected
                kind = _bytes(reply[0])
                if kind == b"pong":
                    return _bytes(reply[1]) == expected
                if kind not in (b"message", b"smessage"):  # a resubscription's confirmation
                    pubsub.handle_message(reply, ignore_subscribe_messages=False)
                return False

            self._read_until(pubsub, answered, f"answer to the PING of the kept {channel}")
            return pubsub
        except Exception as exc:
            log.info("the kept subscription to %s failed (%s); subscribing again", channel, exc)
            _close(pubsub)
            return None

    def _subscribe(self, pubsub: Any, channel: str) -> Any:
        if pubsub is None:
            client = self._client()
            if client is None:  # (a waiter holds its client: only a bug gets here)
                raise RuntimeError("the client of this wake-up hub is gone")
            pubsub = client.pubsub(ignore_subscribe_messages=False)
        try:
            if not self._sharded_known:
                self.sharded = self._sharded_of(channel)
                self._sharded_known = True
            if self.sharded:
                pubsub.ssubscribe(channel)
            else:
                pubsub.subscribe(channel)
            # Read up to our confirmation: on a reused connection the confirmations (and late
            # messages) of its earlier channel come first.
            kind = b"ssubscribe" if self.sharded else b"subscribe"

            def confirmed(reply: Any) -> bool:
                if not self.sharded:  # (get_sharded_message did its bookkeeping)
                    pubsub.handle_message(reply, ignore_subscribe_messages=False)
                return _bytes(reply[0]) == kind and _bytes(reply[1]) == channel.encode()

            self._read_until(pubsub, confirmed, f"confirmation of the subscription to {channel}")
            return pubsub
        except BaseException:
            _close(pubsub)
            raise

    def _read_until(self, pubsub: Any, done: Callable[[Any], bool], what: str) -> None:
        """Read ``pubsub`` until ``done(reply)``, for :data:`SUBSCRIBE_TIMEOUT` s at most."""
        deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what}")
            reply = self._raw(pubsub, left)
            if reply is not None and done(reply):
                return

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
