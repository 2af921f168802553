"""RedBeat (celery-redbeat 2.x, ``redbeat.RedBeatScheduler``) wrapped by the leader scheduler.

RedBeat has ways of its own that would stand between the leader lock and a send:

* its own lock (``redbeat_lock_key``, on by default): every beat takes it at start and waits
  for it for up to its timeout (five times the beat's max interval: 25 minutes by default),
  so a standby would block inside it instead of taking over, and a leader that lost it
  during a pause would fail its extend at every tick. Under the leader scheduler the leader
  lock decides which beat sends: RedBeat's lock is turned off (the scheduler's ``lock_key``,
  which RedBeat's ``beat_init`` handler and its tick read, set to ``None``).
* its tick publishes by itself (``maybe_due`` calls ``apply_async``) and logs every error of a
  send as "Message Error" with a traceback. Here a due entry is recorded first (``reserve``:
  the leader scheduler's record with Redis's word, then RedBeat's own last run), and a refusal
  reaches the leader scheduler's tick, which logs it as its own and tries again; the send goes
  out through ``apply_entry``, after the last check of the lease. (A subclass with a
  ``maybe_due`` of its own keeps it: its ``apply_async`` calls still record the send first and
  pass the last check, which raises a refusal to its code.)

RedBeat keeps each entry's last run in Redis itself, written before the send, so a new leader
reads what the old one sent from there.

Nothing here imports RedBeat: a wrapped scheduler is RedBeat's only if the class that
``singleton_lock_beat_scheduler`` names (already imported) derives from it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery.beat import Scheduler

log = logging.getLogger("celery_singleton_lock.beat")

#: where RedBeat's scheduler lives (its package re-exports it as ``redbeat.RedBeatScheduler``)
REDBEAT_MODULE = "redbeat.schedulers"


def _redbeat() -> type | None:
    redbeat = getattr(sys.modules.get(REDBEAT_MODULE), "RedBeatScheduler", None)
    return redbeat if isinstance(redbeat, type) else None


def seams_for(scheduler: type) -> tuple[type, ...]:
    """The classes that go between the leader scheduler and the wrapped ``scheduler``: for
    RedBeat's (or a subclass), its lock off, and its sends through the leader scheduler's
    unless the subclass sends its own way (its publishes still pass the last check)."""
    redbeat = _redbeat()
    if redbeat is None or not issubclass(scheduler, redbeat):
        return ()
    own_sends = getattr(scheduler, "maybe_due", None) is not getattr(redbeat, "maybe_due", None)
    return (RedBeatLockOff,) if own_sends else (RedBeatSends,)


class RedBeatLockOff(Scheduler):  # type: ignore[misc]  # celery ships no type information
    """RedBeat's scheduler with its own lock off (see the module)."""

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(app, *args, **kwargs)
        # Read by RedBeat's beat_init handler (which takes the lock, blocking) and by its
        # tick (which extends it): with no key, neither touches a lock.
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
    """RedBeat's scheduler with its own lock off and its sends fitted to the leader scheduler
    (see the module)."""

    def maybe_due(self, entry: Any, **kwargs: Any) -> Any:
        # RedBeat's own sends with apply_async() and logs any error of it as "Message Error":
        # recorded here first, a send the leader lock refuses raises out of RedBeat's tick
        # into the leader scheduler's, and the entry stays due for the next try.
        is_due, next_time_to_run = entry.is_due()
        if is_due:
            self.reserve(entry)
            self.apply_entry(entry, producer=kwargs.get("producer"))
        return next_time_to_run
