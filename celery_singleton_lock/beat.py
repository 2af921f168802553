"""Beat that cannot run twice:
``celery -A proj beat -S celery_singleton_lock.beat:LeaderScheduler``.

Every ``celery beat`` started with this scheduler competes for one renewed leader lock
(``beat:<app main name>`` under ``singleton_lock_prefix``, lease ``singleton_lock_ttl``). The one
that holds it runs the scheduler named by ``singleton_lock_beat_scheduler`` (Celery's
``PersistentScheduler`` by default; django-celery-beat's ``DatabaseScheduler`` works too); the
others stand by, trying again about every second, and the first to get the lock takes over when
the leader stops (at once: it releases on shutdown) or dies (within one lease).

No tick is sent twice across a takeover: the leader records each entry's last run in Redis (a
hash beside the leader lock) as it sends it, and a new leader starts from those records rather
than from its own stale schedule state. A leader checks its lease before every send, with no
round trip (``ensure_held``): one paused past its lease (SIGSTOP, a long GC) sends nothing when it
wakes, and stands by again.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime
from typing import Any

from celery.beat import Scheduler
from kombu.utils.imports import symbol_by_name
from redis.exceptions import RedisError

from ._celery.client import get_client
from ._celery.settings import setting
from ._errors import LockError
from ._lock import LockSpace, ReentrantLock

__all__ = ["LeaderScheduler"]

log = logging.getLogger("celery_singleton_lock.beat")

#: how long the last-run records outlive the last leader's last send
RECORDS_TTL_MS = 7 * 24 * 3600 * 1000


class LeaderScheduler(Scheduler):  # type: ignore[misc]  # celery ships no type information
    """A beat scheduler that only the holder of the leader lock runs (see the module's doc).

    Instantiating it gives an instance of a class made of this one and the scheduler named by
    ``singleton_lock_beat_scheduler``, so every method of that scheduler is the real one.
    """

    def __new__(cls, app: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is not LeaderScheduler:
            return super().__new__(cls)
        inner = setting(app, "singleton_lock_beat_scheduler")
        inner_cls = symbol_by_name(inner) if isinstance(inner, str) else inner  # type: ignore[no-untyped-call]  # kombu: unannotated
        if not (isinstance(inner_cls, type) and issubclass(inner_cls, Scheduler)):
            raise TypeError(
                f"singleton_lock_beat_scheduler must name a celery.beat.Scheduler subclass, "
                f"got {inner!r}"
            )
        if issubclass(inner_cls, LeaderScheduler):
            raise TypeError("singleton_lock_beat_scheduler must not be LeaderScheduler itself")
        combined = type(f"Leader{inner_cls.__name__}", (LeaderScheduler, inner_cls), {})
        return combined(app, *args, **kwargs)

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._leader: ReentrantLock | None = None
        name = f"beat:{app.main or 'celery'}"
        prefix: str = setting(app, "singleton_lock_prefix")
        self._space = LockSpace(get_client(app), prefix)
        self._lock_name = name
        #: entry name -> ISO time of its last send, as the leader recorded it
        self._records_key = self._space.keys(name).lock + ":last_run"
        self._ttl: float = setting(app, "singleton_lock_ttl")
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        super().__init__(app, *args, **kwargs)

    # -- leadership ----------------------------------------------------------------------------

    def _leads(self) -> bool:
        """Whether this beat leads now: keeps, takes or gives up the leader lock."""
        if self._leader is not None:
            try:
                self._leader.ensure_held()
                return True
            except LockError as exc:
                log.warning("beat %s is no longer the leader: %s", self._owner, exc)
                self._leader = None
                return False
        lock = ReentrantLock(
            self._space.client,
            self._lock_name,
            ttl=self._ttl,
            owner=self._owner,
            prefix=self._space.prefix,
        )
        try:
            if not lock.acquire(blocking=False):
                return False
        except LockError as exc:
            log.error("beat %s could not try the leader lock: %s", self._owner, exc)
            return False
        self._leader = lock
        log.info("beat %s leads (lock %s, fence %s)", self._owner, lock.key, lock.fence)
        self._resume_from_records()
        return True

    def _resume_from_records(self) -> None:
        """Start from the last sends the previous leaders recorded, not from this beat's own
        (stale) schedule state, so no tick is sent twice across a takeover."""
        records = self._space.client.hgetall(self._records_key)
        for raw_name, raw_when in records.items():
            name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
            when = raw_when.decode() if isinstance(raw_when, bytes) else raw_when
            entry = self.schedule.get(name)
            if entry is None:
                continue
            recorded = datetime.fromisoformat(when)
            last = entry.last_run_at
            comparable = last is not None and (last.tzinfo is None) == (recorded.tzinfo is None)
            if not comparable or recorded > last:
                entry.last_run_at = recorded
        self._heap = None  # rebuilt from the entries as they are now

    def _standby_interval(self) -> float:
        return max(0.1, min(1.0, self._ttl / 10))

    # -- the scheduler's hooks -----------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._leads():
            return self._standby_interval()
        interval: float = super().tick(*args, **kwargs)
        return min(interval, self._ttl / 3)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        # The last check before a send: a leader paused past its lease sends nothing.
        if self._leader is None:
            return
        try:
            self._leader.ensure_held()
            # Recorded before the send (tick() has already advanced the entry): a leader that
            # dies in between costs that one tick, never a second send of it by its successor.
            next_run = self.schedule[entry.name].last_run_at
            client = self._space.client
            client.hset(self._records_key, entry.name, next_run.isoformat())
            client.pexpire(self._records_key, RECORDS_TTL_MS)
        except (LockError, RedisError) as exc:
            log.warning("beat %s did not send %s: %s", self._owner, entry.name, exc)
            if isinstance(exc, LockError):
                self._leader = None
            return
        super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        try:
            super().close()
        finally:
            leader, self._leader = self._leader, None
            if leader is not None:
                try:
                    leader.release()
                except LockError as exc:
                    log.warning("beat %s could not hand over the leader lock: %s", self._owner, exc)
