"""Leader schedulers that the beat tests run in place of the plain one
(``-S tests.beatproj.schedulers:<class>``). Subclassing is how a project tunes the leader
scheduler's class attributes; the tests also use it to put a fault at an exact point of a
send, which no signal from outside could hit:

* :class:`ChattyLeaderScheduler` says it still stands by every 1.5 s instead of every minute,
  so the test of that reminder takes seconds;
* :class:`ShortLeaseLeaderScheduler` cuts its leader lock's lease in Redis below the send
  margin right before it records its first send (renewals that stalled until then);
* :class:`PausingLeaderScheduler` stops its own process (SIGSTOP) right after it recorded its
  first send, before it publishes it (a leader paused between the two);
* :class:`PauseOnCueLeaderScheduler` does the same at the first send it records once the test
  gave the cue (a file named by ``$CSL_BEATPROJ_PAUSE_CUE`` exists): the beats of a test share
  one cue, and whichever leads then takes it (removes the file) and pauses.

And a scheduler for the leader to wrap (``singleton_lock_beat_scheduler``):

* :class:`SelfPublishingScheduler` publishes by itself, as RedBeat's does: its tick calls
  ``apply_async()`` for each due entry (not ``reserve()`` and ``apply_entry()``, as Celery's
  does), and logs any error of it as its own.

Each fault happens once per process (once per cue), and says so in the log (WARNING,
``test:`` first).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from celery.beat import PersistentScheduler

from celery_singleton_lock.beat import LeaderScheduler

from .env import PAUSE_CUE_ENV

log = logging.getLogger("celery_singleton_lock.tests")

#: the log line of :class:`ShortLeaseLeaderScheduler`'s cut (``%`` args: ms, entry)
CUT = "test: cut the leader lock's lease to %d ms before recording %s"
#: the log line of :class:`PausingLeaderScheduler`'s pause (``%`` arg: entry)
PAUSED = "test: recorded %s; pausing before its send"


class ChattyLeaderScheduler(LeaderScheduler):
    standby_log_every = 1.5


class ShortLeaseLeaderScheduler(LeaderScheduler):
    """Before its first record, leaves its leader lock an eighth of the lease in Redis (half the
    quarter of the lease that a record needs); the hold stays this beat's."""

    _cut = False

    def reserve(self, entry: Any) -> Any:
        if not ShortLeaseLeaderScheduler._cut and self._leader is not None:
            ShortLeaseLeaderScheduler._cut = True
            left = round(self._ttl * 1000 / 8)
            self._space.client.pexpire(self._lock_key, left)
            log.warning(CUT, left, entry.name)
        return super().reserve(entry)


class PausingLeaderScheduler(LeaderScheduler):
    """After its first record (the send is then due: reserve() returned), stops its process
    until the test continues it."""

    _paused = False

    def reserve(self, entry: Any) -> Any:
        reserved = super().reserve(entry)
        if not PausingLeaderScheduler._paused:
            PausingLeaderScheduler._paused = True
            log.warning(PAUSED, entry.name)
            os.kill(os.getpid(), signal.SIGSTOP)
        return reserved


class PauseOnCueLeaderScheduler(LeaderScheduler):
    """After a record made once the cue file exists (the send is then due: reserve() returned),
    removes the file and stops its process until the test continues it."""

    def reserve(self, entry: Any) -> Any:
        reserved = super().reserve(entry)
        cue = os.environ.get(PAUSE_CUE_ENV)
        if cue:
            try:
                os.unlink(cue)  # only one process can remove it: the cue is taken once
            except FileNotFoundError:
                return reserved
            log.warning(PAUSED, entry.name)
            os.kill(os.getpid(), signal.SIGSTOP)
        return reserved


class SelfPublishingScheduler(PersistentScheduler):  # type: ignore[misc]  # celery: no types
    """Celery's scheduler with a tick that publishes every due entry with ``apply_async()``."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        wait = 1.0
        for entry in list(self.schedule.values()):
            is_due, next_time_to_run = entry.is_due()
            if is_due:
                try:
                    self.apply_async(entry, producer=self.producer)
                except Exception as exc:
                    log.error(
                        "test: the self-publishing scheduler did not send %s: %s", entry.name, exc
                    )
            wait = min(wait, next_time_to_run)
        return wait
