"""A run of a locked task: the lock taken before the body, let go as the body returns and
*before* the worker stores the result (a caller who saw the result and publishes again gets a
new run), or *parked* (kept in Redis, unrenewed) for a retry or a cooldown. Per-run state lives
with the run's request Context, never on the task instance, which serves every run in a process.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore, Reject, Retry

from .._errors import LockBackendError, TaskLockedError
from .._lock import ReentrantLock
from .counts import LOST, count
from .hold import holder_info
from .lifecycle import AT_RETRY

if TYPE_CHECKING:
    from .rate import Turn


log = logging.getLogger("celery_singleton_lock.release")

#: per-run state, by the run's request Context (not an attribute of it: Celery copies a
#: Context's attributes into the retry message)
_runs: weakref.WeakKeyDictionary[Any, TaskRun] = weakref.WeakKeyDictionary()


@dataclass(eq=False, slots=True)
class TaskRun:
    """One run, from its lock's check to its end. ``lock``: its hold on its job's lock (``None``:
    it holds none); ``after_end(seconds)`` and ``after_park()``: what its mode does once the hold
    is let go (or parked for a cooldown of ``seconds``), or parked for a retry."""

    task: Any
    lock: ReentrantLock | None
    after_end: Callable[[float], None] | None = None
    after_park: Callable[[], None] | None = None
    finished: bool = False
    parked: bool = False
    #: the body was reached: a call of the task from now on is a nested call inside its run
    body_started: bool = False
    #: its ``lock_rate`` turn
    turn: Turn | None = None

    @property
    def held_lock(self) -> ReentrantLock | None:
        return None if self.finished or self.parked else self.lock

    def finish(self, why: str, failed: bool, cooldown: bool = True) -> None:
        """Release every hold of the task id, or park it for the task's cooldown (not with
        ``cooldown=False``); ``failed``: the run raised. Idempotent."""
        lock = self.held_lock
        if lock is None:
            return
        self.finished = True
        task = self.task
        cooling = task.locking.mode.cooldown if cooldown else None
        seconds = None if cooling is None else cooling.after(failed)
        try:
            # a copy that waits (queue mode) comes back as the cooldown ends
            if seconds is None or cooling is None or not cooling.start(task.name, lock, seconds):
                seconds = 0.0
                if not lock.release_all().owned:
                    log.warning(
                        "the lock %s of task %s was lost during its run (lease expired or "
                        "force-released)",
                        lock.key,
                        lock.owner,
                    )
                    count(task, LOST)
        except LockBackendError as exc:
            log.error(
                "could not release %s after %s (%s); the release is sent again in the "
                "background, and the lock frees itself when its lease ends at the latest",
                lock.key,
                why,
                exc,
            )
            return
        if self.after_end is not None:
            self.after_end(seconds)

    def park(self, delay: float) -> None:
        """Keep the hold, unrenewed, for a retry due in ``delay`` seconds."""
        lock = self.lock
        if lock is None:
            return
        task = self.task
        lease = max(delay, 0.0) + task.locking.queue_ttl(task.app)
        try:
            kept = lock.park(lease, holder_info(task.name, lock.owner), AT_RETRY)
            if not kept:  # Redis said it was not held (not: Redis did not answer)
                count(task, LOST)
        except LockBackendError as exc:
            log.error("could not keep %s for the retry: %s", lock.key, exc)
            kept = False
        self.parked = True
        if self.after_park is not None:
            self.after_park()
        if not kept:
            log.warning(
                "the lock %s was lost before the retry of task %s was queued", lock.key, lock.owner
            )

    def unpark(self) -> None:
        """The retry was not sent after all: take the hold back for the rest of the run."""
        if not self.parked or self.lock is None:
            return
        self.parked = False
        try:
            self.lock.acquire(blocking=False)
        except Exception as exc:  # the run goes on; its finish releases what is held
            log.warning("could not take %s back: %s", self.lock.key, exc)


def seconds_until(value: Any) -> float | None:
    """Seconds from now until ``value`` (seconds, a datetime or an ISO 8601 string)."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        now = datetime.now(value.tzinfo or UTC)
        if value.tzinfo is None:
            now = now.replace(tzinfo=None)
        return (value - now).total_seconds()
    return None


def current_run(request: Any) -> TaskRun | None:
    """The run whose request Context this is, once its lock was checked."""
    return _runs.get(request)


def run_locked(
    task: Any,
    request: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    body: Callable[..., Any],
    *,
    body_is_run: bool = False,
) -> Any:
    """``LockedTask.__call__``: ``body(*args, **kwargs)`` (the rest of the ``__call__`` chain)
    under the job's lock. ``body_is_run``: ``body`` is the task's body itself."""
    mode = task.locking.mode
    try:
        run = _runs[request] = mode.enter(task, request, args, kwargs)
    except (Ignore, Retry, Reject, TaskLockedError):  # on purpose: not a run that failed
        raise
    except BaseException as exc:
        mode.failed_before_body(task, request, args, kwargs, exc)
        raise
    if body_is_run:
        run.body_started = True
    if run.lock is None and run.turn is None:
        return body(*args, **kwargs)
    try:
        result = body(*args, **kwargs)
    except Retry:
        if not run.parked:  # a Retry raised by hand, without self.retry()
            run.park(0.0)
        raise
    except BaseException as exc:
        if run.turn is not None:
            pause = task.rate_limit_pause(exc)
            if pause is not None:
                mode.rate_paused(task, request, run, pause)  # raises its comeback
        run.finish(type(exc).__name__, failed=True)
        raise
    run.finish("success", failed=False)  # before the worker stores the result
    return result


def retry_keeping_lock(
    task: Any,
    send_retry: Callable[[], Any],
    eta: Any,
    countdown: float | None,
    max_retries: int | None,
) -> Any:
    """``LockedTask.retry``: park the run's hold before the retry message exists (a fast worker
    may start it at once), and take it back if the retry is not sent."""
    request = task.request
    run = _runs.get(request)
    limit = task.max_retries if max_retries is None else max_retries
    exhausted = limit is not None and request.retries + 1 > limit
    if run is None or run.held_lock is None or exhausted:
        return send_retry()
    if eta is not None:
        countdown = seconds_until(eta)
    elif countdown is None:
        countdown = task.default_retry_delay
    run.park(float(countdown or 0.0))
    try:
        return send_retry()
    except Retry:
        raise
    except BaseException:
        run.unpark()
        raise
