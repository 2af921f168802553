"""One runtime per Redis client and process: its holds, renewal lane (started with the first
renewed hold or background call, ended when idle), wake-up subscriptions, contended locks,
pending cancels, publish command and, for Sentinel, the master it follows. It holds its client
weakly: when the client goes, its idle connections close and its lane ends. A forked child
starts with no runtimes and new owner tokens: it never acts on what its parent had.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError
from redis.sentinel import SentinelConnectionPool

from . import hold as _hold
from . import observe
from . import owner as _owner
from .renewal import Lane
from .wakeup import WakeHub, probe_publish_command

if TYPE_CHECKING:
    from .commands import AcquireReply, PendingCancel  # (commands imports this module)


log = logging.getLogger("celery_singleton_lock.sentinel")

#: a lock refused within this many seconds counts as contended (see ``LockRuntime.contended``)
CONTENDED_FOR = 10.0
#: the longest an acquire trusts the master address it last checked, in seconds
ACQUIRE_CHECK_INTERVAL = 1.0


class LockRuntime:
    """The lock's state and threads for one Redis client in this process."""

    def __init__(self, client: Any) -> None:
        self._client = weakref.ref(client)
        self._mutex = threading.Lock()  # (for follow_master)
        self.holds = _hold.HoldRegistry()
        #: channel -> when its lock last refused an acquire: a blocking acquire of a lock
        #: refused lately subscribes before its first try (one refused acquire, not two)
        self.contended: dict[str, float] = {}
        #: the pending cancels, oldest first (a dict as an ordered set: each step is atomic);
        #: read without a lock on the hot path
        self.cancels: dict[PendingCancel, None] = {}
        self._publish: str | None = None
        #: renews the holds that ask for it and runs the background retries
        self.lane = Lane(self.follow_master)
        self.hub = WakeHub(client, self.lane, self._sharded)
        pool = getattr(client, "connection_pool", None)
        sentinel = isinstance(pool, SentinelConnectionPool) and pool.is_master
        #: a Sentinel client's pool, for :meth:`follow_master`
        self._master = pool if sentinel else None
        self._master_checked_at = -math.inf
        self.finalizer = weakref.finalize(client, self.close)
        self.finalizer.atexit = False

    @classmethod
    def of(cls, client: Any) -> LockRuntime:
        """The runtime of ``client`` in this process, made at its first use."""
        global _last
        last = _last  # one read: another thread may replace it meanwhile
        if last is not None and last[0]() is client:
            return last[1]
        runtime = _runtimes.get(client)
        if runtime is None:
            with _registry_lock:
                runtime = _runtimes.get(client)
                if runtime is None:
                    runtime = _runtimes[client] = cls(client)
        _last = (weakref.ref(client), runtime)
        return runtime

    def publish_command(self, prefix: str) -> str:
        """``"spublish"`` on a Redis Cluster with sharded pub/sub, else ``"publish"``: probed
        once; while the probe gets no answer, ``"publish"``, and the next use probes again."""
        try:
            return self._probed(prefix)
        except Exception:
            return "publish"

    def _probed(self, prefix: str) -> str:
        if self._publish is None:
            self._publish = probe_publish_command(self._client(), prefix)
        return self._publish

    def _sharded(self, channel: str) -> bool:
        # a wake-up channel is ``prefix:{name}:wake``, and a prefix has no '{'
        return self._probed(channel.partition(":{")[0]) == "spublish"

    def wait_for(
        self,
        channel: str,
        deadline: float | None,
        attempt: Callable[[bool], AcquireReply],
        quiet: bool = False,
    ) -> AcquireReply:
        """Call ``attempt`` until it acquires or ``deadline`` (monotonic) passes, waiting in
        between for a release on ``channel``, never longer than the holder's lease left."""
        sub = None
        # woken: a release woke this thread and it has not tried since (leaving passes it on)
        woken = again = False
        started = time.monotonic()
        recent = started - self.contended.get(channel, -math.inf) < CONTENDED_FOR
        if recent and (deadline is None or deadline > started):
            # Refused a moment ago: subscribe before the first try (one refusal, not two).
            sub = self.hub.join(channel)
        try:
            while True:
                reply = attempt(again)
                again, woken = True, False
                left = None if deadline is None else deadline - time.monotonic()
                if reply.acquired or (left is not None and left <= 0):
                    if observe.observer is not None:
                        if not reply.acquired and not quiet:
                            observe.observer.refused()
                        if sub is not None and (reply.acquired or not quiet):
                            observe.observer.waited(time.monotonic() - started)
                    return reply
                if sub is None:
                    # Subscribe, then look again: a release in between is not missed.
                    if len(self.contended) >= 4096:  # bounded: forget them all, not by age
                        self.contended.clear()
                    self.contended[channel] = time.monotonic()
                    sub = self.hub.join(channel)
                    continue
                pause = reply.lease_left if reply.lease_left > 0 else 0.001
                woken = sub.wait(pause if left is None else min(pause, left))
        finally:
            if sub is not None:
                sub.hub.leave(sub, woken=woken)

    def follow_master(self, max_age: float = 0.0) -> None:
        """Ask Sentinel for the master (unless asked within ``max_age`` s): redis-py asks only
        when it connects, and until the old master is demoted a holder renewing there keeps a
        lease that no longer counts. When it moved, redis-py closes the idle connections and
        the next command goes to the new one. A Sentinel that cannot answer is logged only."""
        pool = self._master
        if pool is None:
            return
        now = time.monotonic()
        with self._mutex:
            if max_age and now - self._master_checked_at < max_age:
                return
            self._master_checked_at = now
        before = pool.master_address
        try:
            after = pool.get_master_address()
        except RedisError as exc:
            log.warning("could not ask Sentinel for the master of %s: %s", pool.service_name, exc)
            return
        if before is not None and after != before:
            log.warning(
                "Sentinel master of %s moved from %s to %s: the lock's connections follow it",
                pool.service_name,
                before,
                after,
            )

    def close(self) -> None:
        global _last
        if _last is not None and _last[1] is self:
            _last = None  # nothing keeps a runtime after its client
        self.lane.stop()
        self.hub.close()


#: client -> its runtime (weakly: a runtime never keeps its client alive)
_runtimes: weakref.WeakKeyDictionary[Any, LockRuntime] = weakref.WeakKeyDictionary()
#: the client asked for last (weakly) and its runtime: a WeakKeyDictionary lookup makes a
#: weakref each time, and a job asks several times
_last: tuple[weakref.ref[Any], LockRuntime] | None = None
_registry_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # The parent's runtimes are never closed from here: their threads and connections are its.
    global _runtimes, _registry_lock, _last
    _last = None
    for runtime in list(_runtimes.values()):
        runtime.finalizer.detach()
    _runtimes = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()
    _hold.after_fork_in_child()
    _owner.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
