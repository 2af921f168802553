"""A job's life as one table: the state of its hold, each event that meets it, and what follows
(the next state, what Redis does, the answer), each mode's and option's difference as a row's
condition. The code takes the states it writes from :func:`written` (once, at import);
``tests/test_job_model.py`` drives every event through the real code on a real Redis, and
``docs/lifecycle.md`` shows :func:`lifecycle_table`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class HoldState(StrEnum):
    """The state of a task's hold (the label Redis keeps; ``locks list`` shows it)."""

    #: a message waits in a queue (its publish took the hold); no run of it has started
    QUEUED = "queued"
    #: a run holds it
    RUNNING = "running"
    #: a run started and its message waits again (a retry, a rate comeback, a redelivery):
    #: never replaced by a debounce nor purged as queued; only its own message re-enters it
    REQUEUED = "requeued"
    #: the job ended, and its key stays taken for ``lock_cooldown``
    COOLDOWN = "cooldown"


#: the table's state of a job that nobody holds (nothing in Redis)
FREE = "free"
#: every state of the table
STATES: tuple[str, ...] = (*HoldState, FREE)


class Event(StrEnum):
    """What can happen to a job."""

    PUBLISH = "publish"
    DUPLICATE_PUBLISH = "duplicate publish"
    PUBLISH_BY_NAME = "publish by name"
    DEBOUNCE_REPLACE = "debounce replace"
    RUN_START = "run start"
    DUPLICATE_RUN = "run start of a duplicate"
    REDELIVERY = "redelivery"
    BODY_SUCCESS = "body ends: success"
    BODY_FAILURE = "body ends: failure"
    RETRY = "retry"
    RATE_REFUSAL = "rate refusal"
    RATE_PAUSE = "RateLimited pause"
    WORKER_LOST = "worker lost (pool child killed)"
    WORKER_KILLED = "whole worker killed"
    REVOKE = "revoke"
    MESSAGE_DROPPED = "message dropped"
    EAGER_CALL = "eager call"
    OPERATOR_RELEASE = "operator release"
    OPERATOR_PURGE = "operator purge --queued"
    LEASE_EXPIRY = "lease expiry"


@dataclass(frozen=True)
class Step:
    """One row: ``event`` meets a hold in one of ``before`` (under ``when``; ``""``: always) and
    leaves it in ``after``; ``redis``: what is written; ``answer``: what the call gets."""

    event: Event
    before: tuple[str, ...]
    when: str
    after: str
    redis: str
    answer: str


_Q, _RN, _RQ, _CD = HoldState
_HELD = (_Q, _RN, _RQ, _CD)

#: the job's life, in the order it is usually lived (laid out by hand: it reads as a table)
# fmt: off
TABLE: tuple[Step, ...] = (
    Step(Event.PUBLISH, (FREE,), "lock_at='run'", FREE, "nothing", "sent"),
    Step(Event.PUBLISH, (FREE,), "lock_at='publish' or 'queue' (the queued lock)", _Q,
         "take the message lock for the task id, leased for the delay + queue ttl (or until "
         "`expires`)", "sent, its lock named in the message's headers"),
    Step(Event.PUBLISH, (FREE,), "a retry or rate comeback whose hold is gone", _RQ,
         "take it again for the same task id", "sent"),
    Step(Event.DUPLICATE_PUBLISH, _HELD, "lock_at='publish' or 'queue' (the queued lock)",
         "unchanged", "nothing", "nothing sent: the holder's AsyncResult, or "
         "AlreadyQueuedError with `lock_on_duplicate='raise'`"),
    Step(Event.DEBOUNCE_REPLACE, (_Q,), "lock_debounce, the holder's message still waits", _Q,
         "force-release the holder (its state checked in Redis) and take the hold for the new "
         "call; the replaced call is marked replaced for as long as its message may arrive",
         "the new call is sent; the replaced message ends SKIPPED (`replaced`)"),
    Step(Event.PUBLISH_BY_NAME, (FREE,), "install(), lock_at='publish' or 'queue'", _Q,
         "take the message lock when free", "sent either way; a duplicate is met at run time"),
    Step(Event.RUN_START, (_Q, _RQ), "its own hold", _RN,
         "re-enter the hold with a run token of its own, renewed while it runs; queue mode "
         "takes the run lock, then frees the queued lock", "the body runs"),
    Step(Event.RUN_START, (FREE,), "lock_at='run', or a message whose hold is gone", _RN,
         "take the lock (a slot of `lock_limit`)", "the body runs"),
    Step(Event.RUN_START, (_Q,), "lock_release_on_start", FREE, "release the publish hold",
         "the body runs, unlocked"),
    Step(Event.RUN_START, (_RN,), "lock_rate, the turn is now", _RN, "take a turn",
         "the body runs"),
    Step(Event.DUPLICATE_RUN, _HELD, "another task holds every slot", "unchanged", "nothing",
         "`lock_on_locked`: skip SKIPPED (`locked`, `limit`, `cooldown`, `queued`; "
         "`replaced` when a later call took its hold over), retry (Retry), raise "
         "(TaskLockedError), wait (block for the lock)"),
    Step(Event.DUPLICATE_RUN, (_RN, _CD), "lock_at='queue', the job's one queued copy", _Q,
         "keep the queued lock; a wait record beside the run lock and a fallback message",
         "the message ends (Retry); the run's end wakes it, or its fallback within a lease"),
    Step(Event.REDELIVERY, (_RN,), "its first run still alive (another run token)", _RN,
         "nothing", "dropped with a warning (Ignore)"),
    Step(Event.REDELIVERY, (_RQ,), "after its worker was lost", _RN,
         "re-enter the parked hold", "the body runs again"),
    Step(Event.BODY_SUCCESS, (_RN,), "", FREE,
         "release every hold of the task id before the result is stored; queue mode wakes "
         "the copy that waits", "the result"),
    Step(Event.BODY_SUCCESS, (_RN,), "lock_cooldown", _CD,
         "park the hold for lock_cooldown (unrenewed); queue mode wakes the copy that waits",
         "the result"),
    Step(Event.BODY_FAILURE, (_RN,), "", FREE, "as success", "the exception"),
    Step(Event.BODY_FAILURE, (_RN,), "lock_cooldown, lock_cooldown_on_failure", _CD,
         "as success with a cooldown", "the exception"),
    Step(Event.RETRY, (_RN,), "", _RQ,
         "park the hold for countdown + queue ttl before the retry is sent; queue mode parks "
         "the run lock", "Retry; the retry message re-enters the hold"),
    Step(Event.RATE_REFUSAL, (_RN,), "lock_at='publish' or 'queue'", _RQ,
         "park the hold (queue mode: the queued lock) for the turn + queue ttl",
         "the call comes back at its turn (same task id and retries)"),
    Step(Event.RATE_REFUSAL, (_RN,), "lock_at='run'", FREE, "release the run lock",
         "the call comes back at its turn"),
    Step(Event.RATE_REFUSAL, (_RN,), "past lock_rate_max_delay", FREE, "release",
         "`lock_on_locked` applies (reason `rate`)"),
    Step(Event.RATE_PAUSE, (_RN,), "the body raised RateLimited", _RQ,
         "pause the limiter; then as a rate refusal", "the call comes back after the pause"),
    Step(Event.WORKER_LOST, (_RN,), "acks_late and reject_on_worker_lost", _RQ,
         "the worker's main process parks the hold for the queue ttl",
         "the message is redelivered and re-enters it"),
    Step(Event.WORKER_LOST, (_RN,), "otherwise", FREE,
         "the main process releases (queue mode: both locks, and wakes the copy that waits)",
         "WorkerLostError"),
    Step(Event.WORKER_LOST, (_RN,), "lock_cooldown (a lost run failed)", _CD,
         "the main process parks the hold for the cooldown", "WorkerLostError"),
    Step(Event.WORKER_KILLED, (_RN,), "", _RN, "nothing renews it",
         "free within one lease (lease expiry)"),
    Step(Event.REVOKE, (_Q, _RQ), "", FREE,
         "released when a worker reaches the message (task_revoked), or by the next publish "
         "or run of the job that finds its holder REVOKED (checked in Redis)", "REVOKED"),
    Step(Event.MESSAGE_DROPPED, (_Q, _RQ), "rejected, unknown or expired", FREE,
         "the worker's main process force-releases the task id's hold, only in these states",
         "nothing runs"),
    Step(Event.EAGER_CALL, (FREE,), "task.apply()", FREE,
         "take the run lock, release it as the body ends", "the result"),
    Step(Event.EAGER_CALL, _HELD, "task.apply() while the job is held", "unchanged",
         "nothing", "answered at once as `lock_on_locked` says (never waits in a loop)"),
    Step(Event.OPERATOR_RELEASE, _HELD, "release_lock(), `locks release`, the page", FREE,
         "force-release (waiters woken)", "a run inside goes on unlocked"),
    Step(Event.OPERATOR_PURGE, (_Q,), "`locks purge --queued`, the page's purge of queued",
         FREE, "force-release, the state checked in Redis with the release",
         "a message that still arrives runs unlocked"),
    Step(Event.LEASE_EXPIRY, (_Q, _RQ, _CD), "its lease ends (unrenewed)", FREE,
         "Redis expires the keys", "its message, if any, takes the lock again when free"),
)
# fmt: on


def written(event: Event, when: str = "") -> HoldState:
    """The hold state ``event`` writes (the row whose condition contains ``when``)."""
    found = {s.after for s in TABLE if s.event == event and when in s.when} & set(HoldState)
    if len(found) != 1:
        raise LookupError(f"the table writes {sorted(found)} for {event} ({when!r})")
    return HoldState(found.pop())


def _held_before(event: Event) -> tuple[HoldState, ...]:
    """The hold states ``event`` acts on (its one row's)."""
    (step,) = (s for s in TABLE if s.event == event)
    return tuple(HoldState(b) for b in step.before)


#: the states the code writes, from the table
AT_PUBLISH = written(Event.PUBLISH, "lock_at='publish'")
AT_RUN = written(Event.RUN_START, "its own hold")
AT_RETRY = written(Event.RETRY)
AT_COMEBACK = written(Event.RATE_REFUSAL, "lock_at='publish'")
AT_COOLDOWN = written(Event.BODY_SUCCESS, "lock_cooldown")
AT_REDELIVERY = written(Event.WORKER_LOST, "reject_on_worker_lost")
#: the states a debounce replaces, a dropped message frees, a revoke frees, a purge frees
REPLACEABLE = _held_before(Event.DEBOUNCE_REPLACE)
DROPPABLE = _held_before(Event.MESSAGE_DROPPED)
REVOCABLE = _held_before(Event.REVOKE)
PURGEABLE = _held_before(Event.OPERATOR_PURGE)


def lifecycle_table() -> str:
    """The table as Markdown (``docs/lifecycle.md``)."""
    rows = ["| state | event | when | next state | Redis | answer |", "| --- " * 6 + "|"]
    for s in TABLE:
        cells = (
            ", ".join(f"`{b}`" for b in s.before),
            s.event,
            s.when or "always",
            f"`{s.after}`" if s.after in STATES else s.after,
            s.redis,
            s.answer,
        )
        rows.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)
