"""One runtime per Redis client and process: everything the lock keeps about a client.

As Redisson's renewal scheduler and pub/sub service belong to a client, a client's
:class:`LockRuntime` owns the holds taken through it in this process, its renewal lane (one
thread, started with the first renewed hold or background call and ended when idle), its wake-up
subscriptions and the memory of its contended locks, its publish command and, for a Sentinel
client, when the master was last asked for. Every lock object and lock space of a client finds
the same runtime with :meth:`LockRuntime.of`.

The runtime holds its client weakly, so it never keeps alive a client its user dropped (a held
lock does, through its hold: rightly). When the client goes, so does its runtime: its idle
pub/sub connections are closed and its lane ends.

A fork is handled here, in one place: the child starts with no runtimes (and new owner tokens),
so it never renews, releases or waits through what its parent had; the parent's runtimes are
left alone, their connections never touched from the child.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import hold as _hold
from . import owner as _owner
from .hold import Hold, HoldRegistry
from .hub import WakeHub
from .renewal import Lane
from .sentinel import MasterFollower, master_pool
from .wakeup import KEEP_IDLE, Contended, probe_publish_command

__all__ = ["LockRuntime", "all_runtimes", "closed_totals", "publish_command"]


class LockRuntime:
    """The lock's state and threads for one Redis client in this process."""

    __slots__ = (
        "__weakref__",
        "_client",
        "_finalizer",
        "_hub",
        "_lane",
        "_master",
        "_mutex",
        "_publish",
        "_retired",
        "contended",
        "holds",
    )

    def __init__(self, client: Any) -> None:
        self._client = weakref.ref(client)
        # Lock order: this mutex, then the lane's ``cond``. Reentrant: close() may run from
        # the garbage collector on a thread that holds it.
        self._mutex = threading.RLock()
        #: the holds taken through the client (see :class:`~.hold.HoldRegistry`)
        self.holds = HoldRegistry()
        #: the locks this process was refused lately (see :class:`~.wakeup.Contended`)
        self.contended = Contended()
        self._lane: Lane | None = None
        self._hub: WakeHub | None = None
        self._publish: str | None = None
        pool = master_pool(client)
        self._master = None if pool is None else MasterFollower(pool)
        #: round trips and renewals of the lanes that ended
        self._retired = [0, 0]
        # When the client goes: its connections close, its lane ends (not at interpreter exit)
        self._finalizer = weakref.finalize(client, self.close)
        self._finalizer.atexit = False

    @classmethod
    def of(cls, client: Any) -> LockRuntime:
        """The runtime of ``client`` in this process, made at its first use."""
        runtime = _runtimes.get(client)
        if runtime is None:
            with _registry_lock:
                runtime = _runtimes.get(client)
                if runtime is None:
                    runtime = _runtimes[client] = cls(client)
        return runtime

    @property
    def client(self) -> Any:
        """The client, or ``None`` once its user dropped it."""
        return self._client()

    def _started_lane(self) -> Lane:
        """The lane, started now if it has none (call with ``_mutex`` held)."""
        lane = self._lane
        if lane is None:
            lane = self._lane = Lane(self._retire, self.follow_master)
            lane.thread.start()
        return lane

    def renew(self, hold: Hold) -> None:
        """Renew ``hold`` from now on, about every lease/3."""
        with self._mutex:
            self._started_lane().add(hold)

    def stop_renewing(self, hold: Hold) -> None:
        """Stop renewing ``hold`` (a renewal already on its way is not counted as a loss)."""
        lane = self._lane
        if lane is not None:
            lane.remove(hold)

    def retry(
        self,
        call: Callable[[], None],
        what: str,
        give_up_after: float,
        *,
        budget: float | None = None,
        while_stalled: bool = False,
    ) -> None:
        """Call ``call`` from the client's lane until it succeeds, for at most ``give_up_after``
        seconds (see :meth:`~.renewal.Lane.retry`)."""
        with self._mutex:
            self._started_lane().retry(
                call, what, give_up_after, budget=budget, while_stalled=while_stalled
            )

    def _retire(self, lane: Lane) -> bool:
        with self._mutex, lane.cond:
            if not lane.idle:
                return False
            if self._lane is lane:
                self._lane = None
            self._retired[0] += lane.round_trips
            self._retired[1] += lane.renewed
            return True

    def held(self) -> list[Hold]:
        """Every hold being renewed now."""
        lane = self._lane
        if lane is None:
            return []
        with lane.cond:
            return list(lane.holds.values())

    @property
    def has_lane(self) -> bool:
        """Whether the client's lane (a thread) runs now."""
        return self._lane is not None

    @property
    def round_trips(self) -> int:
        """Renewal pipelines sent through the client so far."""
        lane = self._lane
        return self._retired[0] + (0 if lane is None else lane.round_trips)

    @property
    def renewed(self) -> int:
        """Leases renewed through the client so far."""
        lane = self._lane
        return self._retired[1] + (0 if lane is None else lane.renewed)

    def publish_command(self, prefix: str) -> str:
        """The command a release wakes waiters with (``"spublish"`` on a Redis Cluster with
        sharded pub/sub, else ``"publish"``), found by a probe at its first use, on a channel
        under ``prefix`` (see :func:`~.wakeup.probe_publish_command`). While the probe gets no
        answer (the server is unreachable), ``"publish"``, which every server has; the next
        use probes again."""
        try:
            return self._probed_command(prefix)
        except Exception:
            return "publish"

    def _probed_command(self, prefix: str) -> str:
        """:meth:`publish_command`, or the probe's error when it got no answer."""
        command = self._publish
        if command is None:
            command = self._publish = probe_publish_command(self._client(), prefix)
        return command

    def _sharded(self, channel: str) -> bool:
        """Whether waiters subscribe with ``SSUBSCRIBE`` (the hub asks at its first
        subscription; an error leaves that one unsubscribed, and the next asks again)."""
        # A wake-up channel is ``prefix:{name}:wake``, and a prefix has no '{'.
        return self._probed_command(channel.partition(":{")[0]) == "spublish"

    @property
    def hub(self) -> WakeHub:
        """The client's wake-up subscriptions, made at the first blocked wait."""
        hub = self._hub
        if hub is None:
            with self._mutex:
                hub = self._hub
                if hub is None:
                    cluster = hasattr(self._client(), "get_nodes")
                    hub = self._hub = WakeHub(
                        self._client,
                        sharded=self._sharded,
                        # a cluster's pub/sub objects hold their client: none kept idle
                        keep_idle=0 if cluster else KEEP_IDLE,
                        background=self.retry,
                    )
        return hub

    def follow_master(self, max_age: float = 0.0) -> None:
        """For a Sentinel client: follow the master if it moved (see :mod:`.sentinel`)."""
        if self._master is not None:
            self._master.follow(max_age)

    def abandon(self) -> None:
        """In a forked child: never close this (the parent's) runtime from here."""
        self._finalizer.detach()

    def close(self) -> None:
        """The client is gone: close the idle wake-up connections and end the lane."""
        with self._mutex:
            hub, self._hub = self._hub, None
            lane = self._lane
            _closed[0] += self.round_trips
            _closed[1] += self.renewed
            self._retired = [0, 0]
            if lane is not None:
                lane.stop()
        if hub is not None:
            hub.close()


#: client -> its runtime (weakly: a runtime never keeps its client alive)
_runtimes: weakref.WeakKeyDictionary[Any, LockRuntime] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()
#: round trips and renewals of the runtimes whose client went
_closed = [0, 0]


def publish_command(client: Any, prefix: str) -> str:
    """:meth:`LockRuntime.publish_command` of ``client``'s runtime."""
    return LockRuntime.of(client).publish_command(prefix)


def all_runtimes() -> list[LockRuntime]:
    """The runtimes of this process's live clients."""
    with _registry_lock:
        return list(_runtimes.values())


def closed_totals() -> tuple[int, int]:
    """(round trips, renewals) of the runtimes whose client went."""
    return _closed[0], _closed[1]


def _after_fork_in_child() -> None:
    # The parent's runtimes stay behind: their lanes are threads of the parent, their holds
    # the parent's, their connections the parent's sockets (never closed from here).
    global _runtimes, _registry_lock, _closed
    for runtime in list(_runtimes.values()):
        runtime.abandon()
    _runtimes = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()
    _closed = [0, 0]
    _hold.after_fork_in_child()
    _owner.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
