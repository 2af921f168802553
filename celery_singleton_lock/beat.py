"""Beat that cannot run twice: ``celery beat -S celery_singleton_lock.beat:LeaderScheduler``.

Every beat competes for one renewed leader lock (``beat:<app main name>``); the holder runs the
scheduler ``singleton_lock_beat_scheduler`` names, the others stand by and take over within one
lease. Each send is first recorded beside the lock in one step with Redis's word that this beat
leads with lease to spare, then checked on the local clock: a paused leader loses a tick, never
sends it twice. A new leader starts from the records. No Redis error ends the beat.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple

from celery.beat import Scheduler
from kombu.utils.imports import symbol_by_name
from redis.exceptions import RedisError

from ._beat_redbeat import seams_for
from ._celery.config import LockConfig
from ._errors import LockError, LockLostError
from ._lock import LockSpace, ReentrantLock, Script, check_lease_ms, lease_seconds, text

__all__ = ["LeaderScheduler"]

log = logging.getLogger("celery_singleton_lock.beat")
DEBUG, INFO, WARNING = logging.DEBUG, logging.INFO, logging.WARNING

#: how long the last-run records outlive the last send (seconds), and their kind
RECORDS_TTL = 7 * 24 * 3600.0
RECORDS = "last_run"


# Safe to resend: a second run writes the same field again.
RECORD_IF_HELD = Script("record_if_held.lua")


class RecordReply(NamedTuple):
    """What :func:`record_if_held` did: ``recorded`` (held with enough lease), ``held``, and
    the seconds left on the lease (-1.0: no lease)."""

    recorded: bool
    held: bool
    lease_left: float = 0.0


def record_if_held(
    space: LockSpace,
    name: str,
    owner: str,
    kind: str,
    field: str,
    value: str,
    *,
    min_lease: float,
    keep: float,
) -> RecordReply:
    """Write ``field = value`` into the ``kind`` records beside lock ``name`` only while ``owner``
    holds it with ``min_lease`` seconds left (one step); the records live ``keep`` seconds."""
    keys, keep_ms = space.keys(name), check_lease_ms(keep)
    args = (owner, field, value, round(max(min_lease, 0.0) * 1000), keep_ms)
    with space.named(name).operation("record") as client:
        code, pttl = RECORD_IF_HELD(client, (keys.lock, keys.records(kind)), args)
    return RecordReply(int(code) == 1, int(code) != 0, lease_seconds(pttl))


def records(space: LockSpace, name: str, kind: str) -> dict[str, str]:
    """The ``kind`` records beside lock ``name`` of ``space``."""
    with space.named(name).operation("read the records of") as client:
        raw = client.hgetall(space.keys(name).records(kind))
    return {text(field): text(value) for field, value in raw.items()}


class _NotNow(Exception):
    """Too little lease left to send on: the tick is tried again a moment later."""


class LeaderScheduler(Scheduler):  # type: ignore[misc]  # celery ships no type information
    """A beat scheduler that only the holder of the leader lock runs (see the module).

    An instance is of a class made of this one and the scheduler that
    ``singleton_lock_beat_scheduler`` names, whose methods are the real ones.
    """

    #: seconds between repeated standby INFO lines (and Redis-failure WARNING lines)
    standby_log_every: float = 60.0

    def __new__(cls, app: Any, *args: Any, **kwargs: Any) -> Any:
        target: type = cls
        if "_leader_wraps" not in cls.__dict__:
            target = _combine(cls, LockConfig.of(app).beat_scheduler)
        return super().__new__(target)  # Python then initializes it: it is an instance of cls

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        config = LockConfig.of(app)
        self._space = config.space()
        self._lock_name = f"beat:{app.main or 'celery'}"
        self._lock_key = self._space.keys(self._lock_name).lock
        self._ttl: float = config.ttl
        self._leader: ReentrantLock | None = None
        self._me = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        #: the holder info operators see, as a task's
        self._info = json.dumps(
            {"task": "celery beat", "host": socket.gethostname(), "pid": os.getpid()}
        )
        #: a new owner token per term: never re-enter an earlier term's unreleased hold
        self._term = 1
        #: another beat led since this one last did: this one's schedule state may be behind
        self._others_led = False
        #: the takeover's moment, until the first merge of the records
        self._took_over_at: datetime | None = None
        self._standby_since: float | None = None
        self._standby_logged_at = 0.0
        self._seen_leader = ""
        self._failing_since: float | None = None
        self._failure_logged_at = 0.0
        super().__init__(app, *args, **kwargs)

    def _say(self, level: int, message: str, *args: Any) -> None:
        log.log(level, f"beat %s {message}", self._me, *args)

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
        self._say(
            WARNING, "is no longer the leader (%s); it sends nothing until it leads again", why
        )
        self._leader = None
        self._term += 1
        try:
            leader.release_all()  # forgotten here first; its lease ends anyway if this fails
        except LockError as exc:
            self._say(DEBUG, "could not give the lost leader lock back: %s", exc)

    def _try_to_lead(self) -> bool:
        lock = self._space.lock(
            self._lock_name,
            ttl=self._ttl,
            owner=f"{self._me}:{self._term}",
            info=self._info,
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
        since, self._standby_since, self._seen_leader = self._standby_since, None, ""
        waited = "" if since is None else f" after standing by for {time.monotonic() - since:.1f} s"
        self._say(
            INFO,
            "leads now%s (lock %s, owner %s, fence %s)",
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
            self._standby_logged_at, self._seen_leader = now, holder
            self._say(
                INFO,
                "stands by: %s leads (%.1f s left on its lease); this beat takes over when "
                "it stops",
                holder or "(the lock is being freed)",
                max(lease_left, 0.0),
            )
        elif now - self._standby_logged_at >= self.standby_log_every:
            self._standby_logged_at = now
            since, leader = now - self._standby_since, holder or self._seen_leader
            self._say(INFO, "still stands by (for %.0f s): %s leads", since, leader)

    def _failed(self, what: str, exc: Exception) -> None:
        """Log a Redis failure: as they start, then once per ``standby_log_every``."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = self._failure_logged_at = now
            self._say(WARNING, "%s: %s; trying again", what, exc)
        elif now - self._failure_logged_at >= self.standby_log_every:
            self._failure_logged_at = now
            since = now - self._failing_since
            self._say(WARNING, "%s (failing for %.0f s): %s; trying again", what, since, exc)
        else:
            self._say(DEBUG, "%s: %s", what, exc)

    def _reached_redis(self) -> None:
        if self._failing_since is not None:
            since, self._failing_since = self._failing_since, None
            self._say(INFO, "reaches Redis again after %.1f s", time.monotonic() - since)

    def _retry_interval(self) -> float:
        return max(0.1, min(1.0, self._ttl / 10))

    def _merge_records(self) -> None:
        """Move every entry's last run forward to what the leaders recorded (never back)."""
        found: dict[str, datetime] = {}
        for name, value in records(self._space, self._lock_name, RECORDS).items():
            try:
                recorded = datetime.fromisoformat(value)
            except ValueError:
                continue
            found[name] = recorded if recorded.tzinfo else recorded.replace(tzinfo=UTC)
        floor = None
        if self._took_over_at is not None and not found and self._others_led:
            # Records gone after another beat led: counted as sent now, none is sent twice.
            floor = self._took_over_at
            self._say(
                WARNING,
                "found no last-run records after another beat led: it counts every entry as "
                "sent at the takeover (none is sent twice; an entry due now waits one period)",
            )
        dirty = getattr(self, "_dirty", None)  # django-celery-beat's entries to write back
        for name, entry in list(self.schedule.items()):
            when, last = found.get(name, floor), entry.last_run_at
            if when is None:
                continue
            if last is not None:
                when = when.astimezone(last.tzinfo or UTC)
                if not last.tzinfo:  # naive means UTC to Celery
                    when = when.replace(tzinfo=None)
                if when <= last:
                    continue
            entry.last_run_at = when
            model = getattr(entry, "model", None)
            if model is not None and hasattr(model, "last_run_at"):
                model.last_run_at = when  # django-celery-beat's next reload must not go back
                if isinstance(dirty, set):
                    dirty.add(name)
        self._took_over_at = None
        self._others_led = False

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._leads():
            return self._retry_interval()
        leader = self._leader
        try:
            interval: float = super().tick(*args, **kwargs)
        except (_NotNow, LockError, RedisError) as exc:
            self._heap = None  # the entry that was popped goes back in
            if isinstance(exc, _NotNow):
                self._say(INFO, "holds a send back: %s", exc)
            elif isinstance(exc, LockLostError) and leader is not None:
                self._step_down(leader, exc)
            else:
                self._failed("could not send", exc)
            return self._retry_interval()
        self._reached_redis()
        return min(interval, self._ttl / 3)

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        # At a term's first tick and whenever the wrapped scheduler reloads its entries.
        if self._leader is not None:
            self._merge_records()
        super().populate_heap(*args, **kwargs)

    def reserve(self, entry: Any) -> Any:
        # Recorded before the entry advances, with Redis's word that this beat leads: no send
        # escapes the records, and a refusal leaves the entry due.
        leader = self._leader
        if leader is None:
            raise LockLostError(f"beat {self._me} does not lead")
        reply = record_if_held(
            self._space,
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

    def _last_check(self, entry: Any) -> None:
        """Raise (and log) unless the lease still runs on the local clock: a leader paused
        since the record sends nothing."""
        try:
            if self._leader is None:
                raise LockLostError(f"beat {self._me} does not lead")
            self._leader.ensure_held()
        except LockError as exc:
            self._say(WARNING, "did not send %s: %s", entry.name, exc)
            raise

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        # Checked before Celery logs "Sending due task" (or a "Message Error").
        try:
            self._last_check(entry)
        except LockError:
            return
        super().apply_entry(entry, producer=producer)

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        # Every publish passes here, also a wrapped scheduler's own: recorded first when
        # advanced here, always checked last; a refusal raises to the caller.
        if advance:
            entry = self.reserve(entry)
        self._last_check(entry)
        return super().apply_async(entry, producer=producer, advance=False, **kwargs)

    def close(self) -> None:
        try:
            super().close()
        finally:
            leader, self._leader = self._leader, None
            if leader is not None:
                try:
                    leader.release()
                    self._say(INFO, "handed the leader lock over")
                except LockError as exc:
                    self._say(WARNING, "could not hand over the leader lock: %s", exc)


def _combine(cls: type, inner: Any) -> type:
    """The class made of the leader scheduler ``cls`` and the scheduler ``inner`` names."""
    found = symbol_by_name(inner) if isinstance(inner, str) else inner  # type: ignore[no-untyped-call]  # kombu: unannotated
    scheduler = isinstance(found, type) and issubclass(found, Scheduler)
    if not scheduler or issubclass(found, LeaderScheduler):
        raise TypeError(
            "singleton_lock_beat_scheduler must name a celery.beat.Scheduler subclass other "
            f"than LeaderScheduler, got {inner!r}"
        )
    return _combined(cls, found)


@functools.cache
def _combined(cls: type, found: type) -> type:
    name = f"Leader{found.__name__}" if cls is LeaderScheduler else cls.__name__
    # between the two: what fits a scheduler's own ways to the leader lock (RedBeat's)
    return type(name, (cls, *seams_for(found), found), {"_leader_wraps": found})
