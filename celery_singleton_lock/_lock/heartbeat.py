"""The heartbeat: one daemon thread per process that renews every held lock in batches.

It starts with the first renewed hold, is replaced (never inherited) in a forked child, renews
each lease about every lease/3, and sends all the renewals that are due together, one pipeline
per Redis client: a thousand held locks cost one round trip per period. It never dies on an
error: it logs, retries until the lease would have ended, and then sets the hold's ``lost``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from . import scripts
from .commands import META_RETENTION_MS
from .hold import Hold

__all__ = ["Heartbeat", "get_heartbeat"]

log = logging.getLogger("celery_singleton_lock.heartbeat")

#: locks per EVALSHA: keeps one script run short, so Redis serves other clients in between
BATCH = 250
#: the longest the thread sleeps when it has nothing due, so it notices new holds cheaply
IDLE_WAKE = 5.0


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "keyslot") and hasattr(client, "get_nodes")


class Heartbeat:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holds: dict[int, Hold] = {}
        self._thread: threading.Thread | None = None
        self._wake_at = 0.0
        self.pid = os.getpid()
        #: counters for benchmarks and operators: pipelines sent, leases renewed
        self.round_trips = 0
        self.renewed = 0

    def add(self, hold: Hold) -> None:
        hold.next_renew = hold.valid_until - hold.ttl * 2 / 3
        with self._cond:
            self._holds[id(hold)] = hold
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-singleton-lock-heartbeat", daemon=True
                )
                self._thread.start()
            elif hold.next_renew < self._wake_at:
                self._cond.notify()

    def remove(self, hold: Hold) -> None:
        with self._cond:
            self._holds.pop(id(hold), None)

    def held(self) -> list[Hold]:
        with self._cond:
            return list(self._holds.values())

    def _run(self) -> None:
        while True:
            try:
                due = self._wait_for_due()
                self._renew(due)
            except Exception:  # pragma: no cover - a bug guard: the heartbeat must not die
                log.exception("heartbeat iteration failed; retrying")
                time.sleep(0.1)

    def _wait_for_due(self) -> list[Hold]:
        with self._cond:
            while True:
                now = time.monotonic()
                wake_at = now + IDLE_WAKE
                for hold in self._holds.values():
                    wake_at = min(wake_at, hold.next_renew)
                if wake_at <= now:
                    # Something is due: take along every hold within the early half of its
                    # period, so holds with close due times share one round trip.
                    due = [h for h in self._holds.values() if h.next_renew - h.ttl / 6 <= now]
                    return self._drop_orphans(due)
                self._wake_at = wake_at
                self._cond.wait(wake_at - now)

    def _drop_orphans(self, due: list[Hold]) -> list[Hold]:
        alive = []
        for hold in due:
            thread = hold.thread() if hold.thread is not None else None
            if hold.thread is not None and (thread is None or not thread.is_alive()):
                # Renewing for a thread that is gone would keep the lock forever (Redisson's
                # watchdog does): stop, and let the lease run out.
                del self._holds[id(hold)]
                log.warning(
                    "the thread that holds %s ended without releasing it; renewal stopped, "
                    "the lease ends in %.1f s",
                    hold.keys.lock,
                    max(0.0, hold.lease_left()),
                )
                hold.lost.set()
            elif hold.lost.is_set():
                # The lease ran out before this thread could renew it (it was held up, e.g. by
                # a Redis that did not answer): a late renewal must not revive a lost lock.
                del self._holds[id(hold)]
                log.error(
                    "the lease of %s ran out %.2f s ago before it could be renewed; the lock "
                    "is lost",
                    hold.keys.lock,
                    -hold.lease_left(),
                )
            else:
                alive.append(hold)
        return alive

    def _renew(self, due: Sequence[Hold]) -> None:
        by_client: dict[int, list[Hold]] = {}
        for hold in due:
            by_client.setdefault(id(hold.client), []).append(hold)
        for holds in by_client.values():
            sent = time.monotonic()
            try:
                results = self._renew_batch(holds[0].client, holds)
            except Exception as exc:
                self._failed(holds, exc)
                continue
            for hold, ok in zip(holds, results, strict=True):
                if isinstance(ok, Exception):
                    self._failed([hold], ok)
                elif ok:
                    self.renewed += 1
                    hold.valid_until = sent + hold.ttl
                    hold.next_renew = sent + hold.ttl / 3
                else:
                    self._gone(hold)

    def _renew_batch(self, client: Any, holds: Sequence[Hold]) -> list[int | Exception]:
        """One result per hold: 1 renewed, 0 gone, or the error that kept it from renewing."""
        if _is_cluster(client):
            return self._renew_cluster(client, holds)
        groups = [list(holds[i : i + BATCH]) for i in range(0, len(holds), BATCH)]
        results: dict[int, int] = {}
        for group, reply in zip(groups, self._pipelined(client, groups), strict=True):
            if isinstance(reply, Exception):
                raise reply
            for hold, ok in zip(group, reply, strict=True):
                results[id(hold)] = int(ok)
        return [results[id(hold)] for hold in holds]

    def _renew_cluster(self, client: Any, holds: Sequence[Hold]) -> list[int | Exception]:
        # A script may only touch one slot there, and redis-py refuses EVALSHA in a cluster
        # pipeline: one call per slot, sent in one pipeline per node through that node's own
        # client. A call the node refuses (a slot that moved) goes again through the cluster
        # client, which follows the redirect; a node that fails costs only its own holds.
        slots: dict[int, list[Hold]] = {}
        for hold in holds:
            slots.setdefault(client.keyslot(hold.keys.lock), []).append(hold)
        nodes: dict[str, tuple[Any, list[list[Hold]]]] = {}
        for in_slot in slots.values():
            node = client.get_node_from_key(in_slot[0].keys.lock)
            groups = nodes.setdefault(node.name, (node.redis_connection, []))[1]
            groups += [in_slot[i : i + BATCH] for i in range(0, len(in_slot), BATCH)]
        results: dict[int, int | Exception] = {}
        for node_client, groups in nodes.values():
            try:
                replies: list[Any] = self._pipelined(node_client, groups)
            except Exception as exc:
                replies = [exc] * len(groups)
            for group, reply in zip(groups, replies, strict=True):
                if isinstance(reply, Exception):
                    try:
                        reply = scripts.RENEW(client, *self._call_args(group))
                    except Exception as exc:
                        reply = [exc] * len(group)
                for hold, ok in zip(group, reply, strict=True):
                    results[id(hold)] = ok if isinstance(ok, Exception) else int(ok)
        return [results[id(hold)] for hold in holds]

    @staticmethod
    def _call_args(group: Sequence[Hold]) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        args: list[Any] = []
        for hold in group:
            keys += hold.keys.pair
            args += (hold.owner, hold.lease_ms, META_RETENTION_MS)
        return keys, args

    def _pipelined(self, client: Any, groups: Sequence[Sequence[Hold]]) -> list[Any]:
        """One RENEW call per group in one pipeline (one round trip); reloads on NOSCRIPT."""

        def send() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for group in groups:
                scripts.RENEW.queue(pipe, *self._call_args(group))
            self.round_trips += 1
            replies: list[Any] = pipe.execute(raise_on_error=False)
            return replies

        replies = send()
        if any(isinstance(r, NoScriptError) for r in replies):
            scripts.RENEW.load(client)
            self.round_trips += 1
            replies = send()
        return replies

    def _failed(self, holds: Sequence[Hold], exc: Exception) -> None:
        now = time.monotonic()
        for hold in holds:
            if not self._still_held(hold):
                continue
            left = hold.valid_until - now
            if left <= 0:
                self.remove(hold)
                hold.lost.set()
                log.error(
                    "could not renew %s before its lease ended (%s: %s); the lock is lost",
                    hold.keys.lock,
                    type(exc).__name__,
                    exc,
                )
            else:
                # Retry soon, but not in a tight loop against a Redis that is down.
                hold.next_renew = now + min(1.0, left / 3) + hold.ttl / 6
                log.warning(
                    "renewing %s failed (%s: %s); retrying, %.2f s of lease left",
                    hold.keys.lock,
                    type(exc).__name__,
                    exc,
                    left,
                )

    def _gone(self, hold: Hold) -> None:
        if not self._still_held(hold):
            return  # released while the renewal was on its way: not a loss
        self.remove(hold)
        hold.lost.set()
        log.warning(
            "the lease of %s (owner %s) is gone: it expired, was force-released or deleted; "
            "the lock is lost",
            hold.keys.lock,
            hold.owner,
        )

    def _still_held(self, hold: Hold) -> bool:
        with self._cond:
            return id(hold) in self._holds and self._holds[id(hold)] is hold


_heartbeat: Heartbeat | None = None
_heartbeat_lock = threading.Lock()


def get_heartbeat() -> Heartbeat:
    """This process's heartbeat (a forked child gets its own, never its parent's)."""
    global _heartbeat
    hb = _heartbeat
    if hb is not None and hb.pid == os.getpid():
        return hb
    with _heartbeat_lock:
        if _heartbeat is None or _heartbeat.pid != os.getpid():
            _heartbeat = Heartbeat()
        return _heartbeat


def _after_fork_in_child() -> None:
    global _heartbeat, _heartbeat_lock
    _heartbeat = None
    _heartbeat_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
