"""Beat that cannot run twice:
``celery -A proj beat -S celery_singleton_lock.beat:LeaderScheduler``.

Every ``celery beat`` started with this scheduler competes for one renewed leader lock
(``beat:<app main name>`` under ``singleton_lock_prefix``, lease ``singleton_lock_ttl``). The one
that holds it runs the scheduler named by ``singleton_lock_beat_scheduler`` (Celery's
``PersistentScheduler`` by default; django-celery-beat's ``DatabaseScheduler`` works too); the
others stand by, trying again about every second (a tenth of the lease when that is shorter),
and the first to get the lock takes over when the leader stops (at once: it releases on
shutdown) or dies (within one lease).

A send needs Redis's word that this beat still leads. Before an entry is advanced and sent, one
script checks in Redis that this beat's hold of the leader lock is there with at least a quarter
of the lease left, and in the same step records the send in the last-run records (a hash beside
the lock: entry name -> time). Refused for lack of lease, the tick waits and is tried again;
refused because the hold is gone, the beat stops leading. Right before publishing, the lease is
checked once more on the local clock (no round trip), so a leader paused in between (SIGSTOP, a
long GC) sends nothing when it wakes: its successor counts that tick as sent, and it is lost
rather than sent twice.

A new leader starts from the records, not from its own stale schedule state, and merges them
again whenever the wrapped scheduler reloads its entries (django-celery-beat reloads from its
database, whose ``last_run_at`` it writes only now and then). When the records are gone too
(Redis lost its data) and another beat led since this one last did, a new leader cannot know
what was sent: it counts each entry as sent at the takeover, so an entry waits one period
rather than going out twice.

A lost lease (Redis restarted, stalled or failed over; the beat paused) is dropped at once and
the beat competes again; no Redis error ends the beat: it logs and tries again on the next tick.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from celery.beat import Scheduler
from kombu.utils.imports import symbol_by_name
from redis.exceptions import RedisError

from ._celery.config import LockConfig
from ._errors import LockError, LockLostError
from ._lock import ReentrantLock

__all__ = ["LeaderScheduler"]

log = logging.getLogger("celery_singleton_lock.beat")

#: how long the last-run records outlive the last leader's last send (seconds)
RECORDS_TTL = 7 * 24 * 3600.0

#: the kind of records kept beside the leader lock: entry name -> ISO time of its last send
RECORDS = "last_run"


class _NotNow(Exception):
    """The lease left is too short to send on: the tick is tried again a moment later."""


#: (the leader scheduler class, the wrapped scheduler class) -> the class made of both
_combined: dict[tuple[type, type], type] = {}


class LeaderScheduler(Scheduler):  # type: ignore[misc]  # celery ships no type information
    """A beat scheduler that only the holder of the leader lock runs (see the module's doc).

    Instantiating it (or a subclass) gives an instance of a class made of it and the scheduler
    named by ``singleton_lock_beat_scheduler``, so every method of that scheduler is the real
    one. A subclass may tune :attr:`standby_log_every`.
    """

    #: seconds between the INFO lines of a beat that keeps standing by (and between the
    #: WARNING lines of one that keeps failing to reach Redis)
    standby_log_every: float = 60.0

    def __new__(cls, app: Any, *args: Any, **kwargs: Any) -> Any:
        target: type = cls
        if "_leader_wraps" not in cls.__dict__:
            target = _combine(cls, LockConfig.of(app).beat_scheduler)
        # An instance of the combined class, which Python then initializes (once: it is an
        # instance of cls).
        return super().__new__(target)

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._leader: ReentrantLock | None = None
        name = f"beat:{app.main or 'celery'}"
        # the app's lock space: its client, prefix and backend deadline
        config = LockConfig.of(app)
        self._space = config.space()
        self._lock_name = name
        self._lock_key = self._space.keys(name).lock
        self._ttl: float = config.ttl
        self._me = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        #: a new owner token for every term as leader: a term never re-enters a hold of an
        #: earlier one that Redis still keeps (a release that could not be sent)
        self._term = 1
        #: another beat held the lock since this one last led: this beat's own schedule state
        #: may be behind what was sent
        self._others_led = False
        #: the moment of the takeover, until the first merge of the records after it
        self._took_over_at: datetime | None = None
        self._standby_since: float | None = None
        self._standby_logged_at = 0.0
        self._seen_leader = ""
        self._failing_since: float | None = None
        self._failure_logged_at = 0.0
        super().__init__(app, *args, **kwargs)

    # -- leadership ----------------------------------------------------------------------------

    @property
    def _owner(self) -> str:
        return f"{self._me}:{self._term}"

    def _leads(self) -> bool:
        """Whether this beat leads now: keeps, takes or gives up the leader lock."""
        leader = self._leader
        if leader is not None:
            try:
                leader.ensure_held()
                return True
            except LockError as exc:
                self._step_down(leader, exc)
        return self._try_to_lead()

    def _step_down(self, leader: ReentrantLock, why: Exception) -> None:
        """Stop leading, and drop the hold so that a fresh acquire can happen."""
        log.warning(
            "beat %s is no longer the leader (%s); it sends nothing until it leads again",
            self._me,
            why,
        )
        self._leader = None
        self._term += 1
        try:
            # Forgets the hold here first, then tells Redis (its lease ends anyway if that fails).
            leader.release_all()
        except LockError as exc:
            log.debug("beat %s could not give the lost leader lock back: %s", self._me, exc)

    def _try_to_lead(self) -> bool:
        lock = self._space.lock(
            self._lock_name, ttl=self._ttl, owner=self._owner, info=f"celery beat {self._me}"
        )
        try:
            reply = lock.try_acquire(0)
        except (LockError, RedisError) as exc:
            self._failed("could not try the leader lock", exc)
            return False
        self._reached_redis()
        if not reply.acquired:
            self._stand_by(reply.holder, reply.lease_left)
            return False
        self._leader = lock
        self._took_over_at = datetime.now(UTC)
        self._heap = None  # rebuilt, from the records, at the first tick as leader
        waited = (
            ""
            if self._standby_since is None
            else (f" after standing by for {time.monotonic() - self._standby_since:.1f} s")
        )
        self._standby_since = None
        self._seen_leader = ""
        log.info(
            "beat %s leads now%s (lock %s, owner %s, fence %s)",
            self._me,
            waited,
            lock.key,
            lock.owner,
            lock.fence,
        )
        return True

    def _stand_by(self, holder: str, lease_left: float) -> None:
        now = time.monotonic()
        if holder and not holder.startswith(self._me + ":"):
            self._others_led = True
        if self._standby_since is None or (holder and holder != self._seen_leader):
            self._standby_since = self._standby_since or now
            self._standby_logged_at = now
            self._seen_leader = holder
            log.info(
                "beat %s stands by: %s leads (%.1f s left on its lease); this beat takes over "
                "when it stops",
                self._me,
                holder or "(the lock is being freed)",
                max(lease_left, 0.0),
            )
        elif now - self._standby_logged_at >= self.standby_log_every:
            self._standby_logged_at = now
            log.info(
                "beat %s still stands by (for %.0f s): %s leads",
                self._me,
                now - self._standby_since,
                holder or self._seen_leader,
            )

    def _failed(self, what: str, exc: Exception) -> None:
        """Log a Redis failure: once when they start, then now and then while they go on."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = self._failure_logged_at = now
            log.warning("beat %s %s: %s; trying again", self._me, what, exc)
        elif now - self._failure_logged_at >= self.standby_log_every:
            self._failure_logged_at = now
            log.warning(
                "beat %s %s (failing for %.0f s): %s; trying again",
                self._me,
                what,
                now - self._failing_since,
                exc,
            )
        else:
            log.debug("beat %s %s: %s", self._me, what, exc)

    def _reached_redis(self) -> None:
        if self._failing_since is not None:
            log.info(
                "beat %s reaches Redis again after %.1f s",
                self._me,
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None

    def _retry_interval(self) -> float:
        return max(0.1, min(1.0, self._ttl / 10))

    # -- the last-run records ------------------------------------------------------------------

    def _read_records(self) -> dict[str, datetime]:
        records: dict[str, datetime] = {}
        for name, when in self._space.records(self._lock_name, RECORDS).items():
            try:
                recorded = datetime.fromisoformat(when)
            except ValueError:
                continue
            records[name] = recorded if recorded.tzinfo else recorded.replace(tzinfo=UTC)
        return records

    def _merge_records(self) -> None:
        """Move every entry's last run forward to what the leaders recorded (never back)."""
        records = self._read_records()
        floor = None
        if self._took_over_at is not None and not records and self._others_led:
            # The records are gone (Redis lost its data) and another beat led since this one:
            # what it sent is unknown. Counted as sent now, an entry waits one period.
            floor = self._took_over_at
            log.warning(
                "beat %s found no last-run records after another beat led: it counts every "
                "entry as sent at the takeover (none is sent twice; an entry due now waits "
                "one period)",
                self._me,
            )
        dirty = getattr(self, "_dirty", None)  # django-celery-beat's entries to write back
        for name, entry in list(self.schedule.items()):
            when = records.get(name, floor)
            if when is None:
                continue
            last = entry.last_run_at
            if last is not None and last.tzinfo is None:
                when = when.astimezone(UTC).replace(tzinfo=None)  # naive means UTC to Celery
            elif last is not None:
                when = when.astimezone(last.tzinfo)
            if last is not None and when <= last:
                continue
            entry.last_run_at = when
            model = getattr(entry, "model", None)
            if model is not None and hasattr(model, "last_run_at"):
                # django-celery-beat: its next reload from the database must not go back.
                model.last_run_at = when
                if isinstance(dirty, set):
                    dirty.add(name)
        self._took_over_at = None
        self._others_led = False

    # -- the scheduler's hooks -----------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._leads():
            return self._retry_interval()
        leader = self._leader
        try:
            interval: float = super().tick(*args, **kwargs)
        except _NotNow as exc:
            self._heap = None  # the entry that was popped goes back in
            log.info("beat %s holds a send back: %s", self._me, exc)
            return self._retry_interval()
        except (LockError, RedisError) as exc:
            self._heap = None
            if isinstance(exc, LockLostError) and leader is not None:
                self._step_down(leader, exc)
            else:
                self._failed("could not send", exc)
            return self._retry_interval()
        self._reached_redis()
        return min(interval, self._ttl / 3)

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        # The heap is built at the first tick of a term and again whenever the wrapped
        # scheduler's entries change (django-celery-beat reloads them from its database).
        if self._leader is not None:
            self._merge_records()
        super().populate_heap(*args, **kwargs)

    def reserve(self, entry: Any) -> Any:
        # Recorded before the entry advances, in one step with Redis's word that this beat
        # still leads with lease to spare: a send is never left out of the records, and a
        # refusal leaves the entry as it was, due, for the next try.
        leader = self._leader
        if leader is None:
            raise LockLostError(f"beat {self._me} does not lead")
        reply = self._space.record_if_held(
            self._lock_name,
            leader.owner,
            RECORDS,
            entry.name,
            datetime.now(UTC).isoformat(),
            min_lease=self._ttl / 4,
            keep=RECORDS_TTL,
        )
        if not reply.held:
            raise LockLostError(f"the leader lock {self._lock_key!r} is no longer held by it")
        if not reply.recorded:
            raise _NotNow(
                f"{entry.name}: only {round(reply.lease_left * 1000)} ms left on the lease; "
                "sending once it is renewed"
            )
        return super().reserve(entry)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        # The last check before a send, on the local clock: a leader paused since the record
        # sends nothing (its successor counts that tick as sent).
        leader = self._leader
        try:
            if leader is None:
                raise LockLostError(f"beat {self._me} does not lead")
            leader.ensure_held()
        except LockError as exc:
            log.warning("beat %s did not send %s: %s", self._me, entry.name, exc)
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
                    log.info("beat %s handed the leader lock over", self._me)
                except LockError as exc:
                    log.warning("beat %s could not hand over the leader lock: %s", self._me, exc)


def _combine(cls: type, inner: Any) -> type:
    """The class made of the leader scheduler ``cls`` and the scheduler ``inner`` names."""
    inner_cls = symbol_by_name(inner) if isinstance(inner, str) else inner  # type: ignore[no-untyped-call]  # kombu: unannotated
    if not (isinstance(inner_cls, type) and issubclass(inner_cls, Scheduler)):
        raise TypeError(
            f"singleton_lock_beat_scheduler must name a celery.beat.Scheduler subclass, "
            f"got {inner!r}"
        )
    if issubclass(inner_cls, LeaderScheduler):
        raise TypeError("singleton_lock_beat_scheduler must not be LeaderScheduler itself")
    combined = _combined.get((cls, inner_cls))
    if combined is None:
        name = f"Leader{inner_cls.__name__}" if cls is LeaderScheduler else cls.__name__
        combined = _combined[(cls, inner_cls)] = type(
            name, (cls, inner_cls), {"_leader_wraps": inner_cls}
        )
    return combined
