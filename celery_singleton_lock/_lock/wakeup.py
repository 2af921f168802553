"""Push wake-ups for blocked acquires: one shared subscription per process and Redis client.

A final release publishes the lock's key on the prefix's wake-up channel. Each process that has
a waiter keeps one pub/sub connection, read by one listener thread, and wakes exactly the
waiters of the key it is told about. A lost message (a dropped connection, a failover) costs a
waiter at most the holder's remaining lease: waits are bounded by it and then retried.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

from .commands import text

__all__ = ["WakeHub", "get_hub"]

log = logging.getLogger("celery_singleton_lock.wakeup")

#: after this long without a waiter the listener unsubscribes and its thread ends
IDLE_STOP = 30.0


class WakeHub:
    def __init__(self, client: Any, channel: str) -> None:
        self.client = client
        self.channel = channel
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._idle_since = time.monotonic()
        #: messages received, for tests and operators
        self.received = 0

    def register(self, key: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._waiters.setdefault(key, set()).add(event)
            if self._thread is None:
                self.ready.clear()
                self._thread = threading.Thread(
                    target=self._listen, name="celery-singleton-lock-wakeup", daemon=True
                )
                self._thread.start()
        return event

    def unregister(self, key: str, event: threading.Event) -> None:
        with self._lock:
            events = self._waiters.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[key]
            if not self._waiters:
                self._idle_since = time.monotonic()

    def _wake(self, key: str) -> None:
        with self._lock:
            events = list(self._waiters.get(key, ()))
        for event in events:
            event.set()

    def _should_stop(self, broken: bool = False) -> bool:
        # A broken subscription with nobody waiting is not worth reconnecting: the next waiter
        # starts a new listener.
        with self._lock:
            idle = broken or time.monotonic() - self._idle_since > IDLE_STOP
            if not self._waiters and idle:
                self._thread = None
                self.ready.clear()
                return True
            return False

    def _listen(self) -> None:
        backoff = 0.05
        while True:
            pubsub = None
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=False)
                pubsub.subscribe(self.channel)
                while True:
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        if self._should_stop():
                            return
                        continue
                    kind = text(message.get("type"))
                    if kind == "message":
                        self.received += 1
                        self._wake(text(message.get("data")))
                    elif kind == "subscribe":
                        self.ready.set()
                        backoff = 0.05
            except Exception as exc:
                self.ready.clear()
                log.warning(
                    "wake-up subscription to %s failed (%s: %s); waiters poll by lease until "
                    "it is back",
                    self.channel,
                    type(exc).__name__,
                    exc,
                )
                # Everyone waiting may have missed a release: let them look again now.
                with self._lock:
                    events = [e for es in self._waiters.values() for e in es]
                for event in events:
                    event.set()
                if self._should_stop(broken=True):
                    return
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                if self._should_stop():
                    return
            finally:
                if pubsub is not None:
                    # closing a broken connection may fail too; nothing is left to do then
                    with contextlib.suppress(Exception):
                        pubsub.close()


_hubs: dict[tuple[int, str], WakeHub] = {}
_hubs_lock = threading.Lock()
_hubs_pid = os.getpid()


def get_hub(client: Any, channel: str) -> WakeHub:
    """The process's hub for this client and channel (a forked child gets new ones)."""
    global _hubs_pid
    with _hubs_lock:
        if _hubs_pid != os.getpid():
            _hubs.clear()
            _hubs_pid = os.getpid()
        hub = _hubs.get((id(client), channel))
        if hub is None or hub.client is not client:
            hub = _hubs[(id(client), channel)] = WakeHub(client, channel)
        return hub


def _after_fork_in_child() -> None:
    global _hubs_lock
    _hubs_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
