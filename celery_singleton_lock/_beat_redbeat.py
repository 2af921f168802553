"""RedBeat (celery-redbeat 2.x) wrapped by the leader scheduler.

RedBeat's own lock is turned off (``lock_key = None``): a standby would block in it for up to
25 minutes instead of taking over; the leader lock decides. Its tick's own sends
(``maybe_due``) record first and pass the last check, so a refusal reaches the leader
scheduler's tick instead of a "Message Error". Nothing here imports RedBeat.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery.beat import Scheduler

log = logging.getLogger("celery_singleton_lock.beat")

#: where RedBeat's scheduler lives (re-exported as ``redbeat.RedBeatScheduler``)
REDBEAT_MODULE = "redbeat.schedulers"


def seams_for(scheduler: type) -> tuple[type, ...]:
    """The classes between the leader scheduler and the wrapped ``scheduler``: for RedBeat's,
    its lock off, and its sends fitted unless a subclass has its own ``maybe_due``."""
    redbeat = getattr(sys.modules.get(REDBEAT_MODULE), "RedBeatScheduler", None)
    if not isinstance(redbeat, type) or not issubclass(scheduler, redbeat):
        return ()
    own_sends = getattr(scheduler, "maybe_due", None) is not getattr(redbeat, "maybe_due", None)
    return (RedBeatLockOff,) if own_sends else (RedBeatSends,)


class RedBeatLockOff(Scheduler):  # type: ignore[misc]  # celery ships no type information
    """RedBeat's scheduler with its own lock off (see the module)."""

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(app, *args, **kwargs)
        # Read by RedBeat's beat_init handler (takes the lock) and its tick (extends it).
        own_lock = getattr(self, "lock_key", None)
        self.lock_key = None
        if own_lock:
            log.info(
                "beat %s turned RedBeat's own lock (%s) off: the leader lock decides which "
                "beat sends (redbeat_lock_key has no effect under the leader scheduler)",
                getattr(self, "_me", "?"),
                own_lock,
            )


class RedBeatSends(RedBeatLockOff):
    """RedBeat's scheduler with its lock off and its sends fitted (see the module)."""

    def maybe_due(self, entry: Any, **kwargs: Any) -> Any:
        # RedBeat's own would log a refusal as "Message Error": here it raises into the
        # leader scheduler's tick, and the entry stays due.
        is_due, next_time_to_run = entry.is_due()
        if is_due:
            self.reserve(entry)
            self.apply_entry(entry, producer=kwargs.get("producer"))
        return next_time_to_run
