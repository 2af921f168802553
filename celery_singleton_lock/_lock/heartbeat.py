"""The heartbeat: this process's renewal, seen as a whole, for tests, benchmarks and operators.

Renewal itself belongs to each client's :class:`~.runtime.LockRuntime`: one lane (a thread,
see :mod:`.renewal`) per client, so a Redis that stalls holds up only the locks on that Redis.
:func:`get_heartbeat` adds up what every runtime of the process did; a forked child sees only
its own.
"""

from __future__ import annotations

from .hold import Hold
from .renewal import BATCH
from .runtime import all_runtimes, closed_totals

__all__ = ["BATCH", "Heartbeat", "get_heartbeat"]


class Heartbeat:
    """What the renewal lanes of this process do, added up over its clients."""

    __slots__ = ()

    def held(self) -> list[Hold]:
        """Every hold being renewed now."""
        return [hold for runtime in all_runtimes() for hold in runtime.held()]

    @property
    def lanes(self) -> int:
        """How many clients have a lane (and a thread) now."""
        return sum(runtime.has_lane for runtime in all_runtimes())

    @property
    def round_trips(self) -> int:
        """Renewal pipelines sent by this process so far."""
        return closed_totals()[0] + sum(runtime.round_trips for runtime in all_runtimes())

    @property
    def renewed(self) -> int:
        """Leases renewed by this process so far."""
        return closed_totals()[1] + sum(runtime.renewed for runtime in all_runtimes())


_heartbeat = Heartbeat()


def get_heartbeat() -> Heartbeat:
    """This process's heartbeat (a view: it holds nothing, so a forked child's sees only the
    child's runtimes)."""
    return _heartbeat
