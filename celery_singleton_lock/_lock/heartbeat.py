"""The heartbeat: this process's renewal lanes, one per Redis client (see renewal.py).

A lane and its thread start with the first renewed hold (or background retry) of a client and
end after a while with nothing to do; a forked child gets its own heartbeat, never its parent's
holds. One lane per client, not one thread for all: a call to a Redis that stalls must not keep
the locks on another Redis from being renewed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from .hold import Hold
from .renewal import BATCH, Lane

__all__ = ["BATCH", "Heartbeat", "get_heartbeat"]


class Heartbeat:
    """The lanes of this process, by client."""

    def __init__(self) -> None:
        # Lock order: this lock, then a lane's ``cond``.
        self._lock = threading.Lock()
        #: id(client) -> its lane; a lane keeps its client alive, so the id is not reused
        self._lanes: dict[int, Lane] = {}
        self._retired_round_trips = 0
        self._retired_renewed = 0
        self.pid = os.getpid()

    def _lane(self, client: Any) -> Lane:
        """The client's lane, started now if it has none (call with ``_lock`` held)."""
        lane = self._lanes.get(id(client))
        if lane is None:
            lane = self._lanes[id(client)] = Lane(client, self._retire)
            lane.thread.start()
        return lane

    def add(self, hold: Hold) -> None:
        """Renew ``hold`` from now on, about every lease/3."""
        with self._lock:
            self._lane(hold.client).add(hold)

    def remove(self, hold: Hold) -> None:
        """Stop renewing ``hold`` (a renewal already on its way is not counted as a loss)."""
        lane = self._lanes.get(id(hold.client))
        if lane is not None and lane.client is hold.client:
            lane.remove(hold)

    def retry(
        self,
        client: Any,
        call: Callable[[], None],
        what: str,
        give_up_after: float,
        *,
        budget: float | None = None,
        while_stalled: bool = False,
    ) -> None:
        """Call ``call`` from ``client``'s lane until it succeeds, for at most ``give_up_after``
        seconds (used for calls whose failure must not stay unsettled, such as cancelling an
        acquire whose reply was lost). ``budget``: the seconds each attempt may take;
        ``while_stalled``: the ``give_up_after`` seconds count again from each attempt that
        timed out (a server that does not answer may still run a command sent to it earlier)."""
        with self._lock:
            self._lane(client).retry(
                call, what, give_up_after, budget=budget, while_stalled=while_stalled
            )

    def _retire(self, lane: Lane) -> bool:
        with self._lock, lane.cond:
            if not lane.idle:
                return False
            if self._lanes.get(id(lane.client)) is lane:
                del self._lanes[id(lane.client)]
            self._retired_round_trips += lane.round_trips
            self._retired_renewed += lane.renewed
            return True

    def held(self) -> list[Hold]:
        """Every hold being renewed now."""
        with self._lock:
            lanes = list(self._lanes.values())
        holds: list[Hold] = []
        for lane in lanes:
            with lane.cond:
                holds += lane.holds.values()
        return holds

    @property
    def lanes(self) -> int:
        """How many clients have a lane (and a thread) now."""
        return len(self._lanes)

    @property
    def round_trips(self) -> int:
        """Renewal pipelines sent by this process so far."""
        with self._lock:
            return self._retired_round_trips + sum(x.round_trips for x in self._lanes.values())

    @property
    def renewed(self) -> int:
        """Leases renewed by this process so far."""
        with self._lock:
            return self._retired_renewed + sum(x.renewed for x in self._lanes.values())


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
