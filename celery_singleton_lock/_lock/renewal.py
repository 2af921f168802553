"""A renewal lane: the thread that renews one Redis client's held locks about every lease/3,
all those due in one pipeline of RENEW calls (:data:`BATCH` locks each). On an error it logs
and retries until the lease would have ended, then sets the hold's ``lost``. It also runs the
client's background retries (:meth:`Lane.retry`). A lane per client: a stalled Redis holds up
only its own locks; a lane never holds its client.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import observe, scripts
from .checks import by_node, is_cluster
from .deadline import bounded
from .hold import Hold

log = logging.getLogger("celery_singleton_lock.heartbeat")

#: locks per EVALSHA: keeps one script run short, so Redis serves other clients in between
BATCH = 250
#: the longest a lane sleeps with nothing due
IDLE_WAKE = 5.0
#: a lane with nothing to renew or retry for this long ends its thread (a new hold starts one)
IDLE_EXIT = 30.0


@dataclass(eq=False, slots=True)
class _Retry:
    """A call of :meth:`Lane.retry`: with ``span``, an attempt that times out moves
    ``give_up_at`` to at least ``span`` s later (a server that does not answer may still run
    what it was sent)."""

    call: Callable[[], None]
    what: str
    give_up_at: float
    budget: float | None
    span: float | None
    gave_up: Callable[[], None] | None
    next_try: float = field(default_factory=time.monotonic)
    attempts: int = 0


class Lane:
    """The renewals and background retries of one client, on a thread of their own: started
    by the first hold or retry, ended once idle for :data:`IDLE_EXIT` (the next one starts
    another). ``follow_master()`` runs before each renewal batch."""

    def __init__(self, follow_master: Callable[[], None]) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.holds: dict[int, Hold] = {}
        self._retries: list[_Retry] = []
        self._follow_master = follow_master
        self._stopped = False
        self._wake_at = 0.0
        #: the lane's thread while it runs
        self.thread: threading.Thread | None = None

    def _wake(self) -> None:
        """Start the thread, or wake it (with ``cond`` held)."""
        if self.thread is None and not self._stopped:
            name = "celery-singleton-lock-heartbeat"
            self.thread = threading.Thread(target=self._run, name=name, daemon=True)
            self.thread.start()
        self.cond.notify()

    def add(self, hold: Hold) -> None:
        hold.next_renew = hold.valid_until - hold.ttl * 2 / 3
        with self.cond:
            self.holds[id(hold)] = hold
            if hold.next_renew < self._wake_at or self.thread is None:
                self._wake()

    def remove(self, hold: Hold) -> None:
        with self.cond:
            self.holds.pop(id(hold), None)

    def stop(self) -> None:
        """End the thread; never blocks: the garbage collector may call it holding ``cond``."""
        self._stopped = True
        if self.cond.acquire(blocking=False):
            self.cond.notify()
            self.cond.release()

    def retry(
        self,
        call: Callable[[], None],
        what: str,
        give_up_after: float,
        *,
        budget: float | None = None,
        while_stalled: bool = False,
        gave_up: Callable[[], None] | None = None,
    ) -> None:
        """Call ``call`` from this lane until it succeeds, for at most ``give_up_after`` s
        (``while_stalled``: counted from the last attempt that timed out), each attempt bounded
        by ``budget`` s (the handing operation's deadline); ``gave_up()`` when the lane gives up
        on it."""
        span = give_up_after if while_stalled else None
        job = _Retry(call, what, time.monotonic() + give_up_after, budget, span, gave_up)
        with self.cond:
            self._retries.append(job)
            self._wake()

    def _run(self) -> None:
        while True:
            try:
                if not self._round():
                    return
            except Exception:  # pragma: no cover - a bug guard: the lane must not die
                log.exception("heartbeat iteration failed; retrying")
                time.sleep(0.1)

    def _round(self) -> bool:
        """Wait for work and do it; ``False`` once out of service. (A frame of its own: an idle
        lane keeps nothing of a round, so no client alive.)"""
        work = self._wait_for_work()
        if work is None:
            return False
        due, retries = work
        if due:
            self._renew(due)
        for i, job in enumerate(retries):
            if not self._try(job):
                # Redis did not answer: the later calls would each wait as long, holding up
                # the renewals. They go with this one's next try.
                for later in retries[i + 1 :]:
                    if time.monotonic() >= later.give_up_at:
                        self._drop(later, gave_up="Redis did not answer")
                    later.next_try = max(later.next_try, job.next_try)
                break
        return True

    def _wait_for_work(self) -> tuple[list[Hold], list[_Retry]] | None:
        idle_since = math.inf
        with self.cond:
            while not self._stopped:
                now = time.monotonic()
                idle = not self.holds and not self._retries
                idle_since = min(idle_since, now) if idle else math.inf
                wake_at = min(
                    [now + IDLE_WAKE, idle_since + IDLE_EXIT]
                    + [hold.next_renew for hold in self.holds.values()]
                    + [job.next_try for job in self._retries]
                )
                if wake_at > now:
                    self._wake_at = wake_at
                    self.cond.wait(wake_at - now)
                elif idle:  # for IDLE_EXIT: the thread ends
                    self.thread = None
                    return None
                else:
                    # with every hold in the early half of its period: one round trip
                    due = [h for h in self.holds.values() if h.next_renew - h.ttl / 6 <= now]
                    retries = [job for job in self._retries if job.next_try <= now]
                    return self._drop_orphans(due), retries
        return None

    def _drop_orphans(self, due: list[Hold]) -> list[Hold]:
        alive = []
        for hold in due:
            thread = hold.thread() if hold.thread is not None else None
            if hold.thread is not None and (thread is None or not thread.is_alive()):
                # Renewing for a thread that is gone would keep the lock forever: let it end.
                del self.holds[id(hold)]
                log.warning(
                    "the thread that holds %s ended without releasing it; renewal stopped, "
                    "the lease ends in %.1f s",
                    hold.keys.lock,
                    max(0.0, hold.lease_left()),
                )
                hold.lost.set()
            elif hold.lost.is_set():
                # a late renewal must not revive a lost lock
                del self.holds[id(hold)]
                log.error(
                    "the lease of %s ran out %.2f s ago before it could be renewed; the lock "
                    "is lost",
                    hold.keys.lock,
                    -hold.lease_left(),
                )
            else:
                alive.append(hold)
        return alive

    def _try(self, job: _Retry) -> bool:
        """One attempt at ``job``; ``False`` when Redis did not answer."""
        job.attempts += 1
        try:
            with bounded(job.budget):
                job.call()
        except Exception as exc:
            now = time.monotonic()
            if job.span is not None and isinstance(exc, RedisTimeoutError):
                job.give_up_at = max(job.give_up_at, now + job.span)
            if now >= job.give_up_at:
                self._drop(job, gave_up=exc)
            else:
                job.next_try = now + min(0.1 * 2**job.attempts, 5.0)  # do not hammer a dead Redis
            return not isinstance(exc, (RedisConnectionError, RedisTimeoutError))
        self._drop(job)
        log.info("%s: done after %d attempts", job.what, job.attempts)
        return True

    def _drop(self, job: _Retry, *, gave_up: object = None) -> None:
        """Take ``job`` out; ``gave_up``: why the lane gives up on it."""
        with self.cond:
            self._retries.remove(job)
        if gave_up is None:
            return
        if job.gave_up is not None:
            job.gave_up()
        log.error("gave up trying to %s after %d attempts: %s", job.what, job.attempts, gave_up)

    def _renew(self, due: Sequence[Hold]) -> None:
        self._follow_master()  # renew where the master is now
        sent = time.monotonic()
        try:
            results = self._send(due[0].client, due)
        except Exception as exc:
            self._failed(due, exc)
            return
        renewed = 0
        for hold, ok in results:
            if isinstance(ok, Exception):
                self._failed([hold], ok)
            elif ok:
                renewed += 1
                hold.valid_until = sent + hold.ttl
                hold.next_renew = sent + hold.ttl / 3
            elif id(hold) in self.holds:  # (else released while the renewal was on its way)
                self.remove(hold)
                hold.lost.set()
                log.warning(
                    "the lease of %s (owner %s) is gone: it expired, was force-released or "
                    "deleted; the lock is lost",
                    hold.keys.lock,
                    hold.owner,
                )
        if renewed and observe.observer is not None:
            observe.observer.renewed(renewed)

    def _failed(self, holds: Sequence[Hold], exc: Exception) -> None:
        now = time.monotonic()
        if observe.observer is not None:
            observe.observer.renewal_failed()
        for hold in holds:
            if id(hold) not in self.holds:  # released meanwhile
                continue
            left = hold.valid_until - now
            if left <= 0:
                self.remove(hold)
                hold.lost.set()
                log.error(
                    "could not renew %s (owner %s) before its lease ended (%s: %s); the lock "
                    "is lost",
                    hold.keys.lock,
                    hold.owner,
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

    def _send(self, client: Any, holds: Sequence[Hold]) -> list[tuple[Hold, int | Exception]]:
        """Each hold with its result: 1 renewed, 0 gone, or its error; raises when a single server
        did not answer. On a Cluster, one pipeline per node of calls of one slot each; a call a
        node refuses (its slot moved) goes again through the cluster client."""
        cluster = is_cluster(client)
        slots: dict[int, list[Hold]] = {}
        for hold in holds:
            slots.setdefault(client.keyslot(hold.keys.lock) if cluster else 0, []).append(hold)
        batches = [s[i : i + BATCH] for s in slots.values() for i in range(0, len(s), BATCH)]
        results: list[tuple[Hold, int | Exception]] = []
        for node_client, indexes in by_node(client, [batch[0].keys.lock for batch in batches]):
            groups = [batches[i] for i in indexes]
            try:
                calls = [_renew_args(group) for group in groups]
                replies: list[Any] = scripts.RENEW.pipelined(node_client, calls)
            except Exception as exc:
                if not cluster:
                    raise
                replies = [exc] * len(groups)
            for group, reply in zip(groups, replies, strict=True):
                if isinstance(reply, Exception):
                    if not cluster:
                        raise reply
                    try:
                        reply = scripts.RENEW(client, *_renew_args(group))
                    except Exception as exc:
                        reply = [exc] * len(group)
                results += zip(group, reply, strict=True)
        return results


def _renew_args(group: Sequence[Hold]) -> tuple[list[str], list[Any]]:
    """KEYS = (lock, meta) pairs, ARGV = (owner, lease, retention) triples (lua/renew.lua)."""
    keys = [key for hold in group for key in hold.keys.pair]
    args = [arg for hold in group for arg in (hold.owner, hold.lease_ms, scripts.META_RETENTION_MS)]
    return keys, args
