"""Run and retry: the worker takes the job's lock before the body and lets it go as the body
returns, *before* the worker stores the result (a caller who has seen the result and publishes
the same job again gets a new run).

The lock's owner is the task id, so a publish-time hold is re-entered by its own run, and each
delivery carries a run token of its own, so a message redelivered while its first run lives is
refused. A retry *parks* the hold (kept in Redis, not renewed, lease long enough for the
countdown) before the retry message is sent, so the retry re-enters it and no duplicate slips
in meanwhile. Per-run state lives with the run's request Context, never on the task instance,
which serves every run in a process.
"""

from __future__ import annotations

import logging
import random
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

from celery.exceptions import Ignore, MaxRetriesExceededError, Reject, Retry

from .._errors import LockBackendError, TaskLockedError
from .._lock import AcquireReply, LockSpace, ReentrantLock, Semaphore
from .canvas import chord_member_of
from .cooldown import cooldown_after, refusal_reason, start_cooldown
from .debounce import skip_replaced
from .info import HoldState, holder_info
from .locking import HEADER, SKIPPED, TaskLocking, proceed_without_lock, store_skipped
from .observer import get_observer
from .options import LockOptions
from .publish import seconds_until
from .queued import held_lock, leave_queue, run_lock, still_queued
from .revoked import free_revoked_holder
from .settings import DEFAULTS
from .wake import (
    Wait,
    claim_wait,
    end_claim,
    request_wait,
    retry_in_queue,
    wait_for_run,
    wake_waiting,
)

__all__ = [
    "SKIPPED",
    "TaskRun",
    "current_run",
    "lock_retry_delay",
    "retry_keeping_lock",
    "run_locked",
]

log_run = logging.getLogger("celery_singleton_lock.run")
log_release = logging.getLogger("celery_singleton_lock.release")

#: a ``lock_on_locked="retry"`` duplicate's first retry comes back after about this long
#: (seconds); each later one waits twice as long, up to the holder's remaining lease
RETRY_FIRST_DELAY = 1.0
#: no lock retry is sooner than this (seconds): a holder that is about to expire still costs
#: the broker a message per retry
RETRY_MIN_DELAY = 0.1


def lock_retry_delay(retries: int, holder_lease: float) -> float:
    """The default countdown of a ``lock_on_locked="retry"`` duplicate.

    A growing backoff (``RETRY_FIRST_DELAY * 2**retries``) capped by the holder's remaining
    lease ``holder_lease`` (seconds), with equal jitter (a uniform draw from the upper half), so
    the duplicate comes back soon after a short holder ends, never later than the holder's lease
    could run out, and duplicates refused together do not come back together. ``retries`` is
    the request's retry count, so a task's own retries also grow it.
    """
    backoff = RETRY_FIRST_DELAY * 2.0 ** min(max(retries, 0), 30)
    ceiling = min(backoff, max(holder_lease, RETRY_MIN_DELAY))
    return max(RETRY_MIN_DELAY, ceiling * random.uniform(0.5, 1.0))


#: per-run state, by the run's request Context (not an attribute of it: Celery copies a
#: Context's attributes into the retry message)
_runs: weakref.WeakKeyDictionary[Any, TaskRun] = weakref.WeakKeyDictionary()


class QueuedJob(NamedTuple):
    """The job of a ``lock_at="queue"`` run: its lock space and name, whose waiting copy the
    run's end wakes, and the wait this run claimed (it was that copy), which ends with it."""

    space: LockSpace
    name: str
    wait: Wait | None


class TaskRun:
    """One run of a locked task, from its lock's check to its end; ``lock`` is its hold on its
    job's lock (``None`` when the run holds none: released on start, or going on without
    Redis); ``queued``: with ``lock_at="queue"``, its job (see :class:`QueuedJob`)."""

    __slots__ = ("body_started", "finished", "lock", "parked", "queued", "task")

    def __init__(
        self, lock: ReentrantLock | None, task: Any, queued: QueuedJob | None = None
    ) -> None:
        self.lock = lock
        self.task = task
        self.queued = queued
        self.finished = False
        self.parked = False
        #: the task class's __call__ chain has reached the body: a call of the task from now
        #: on is a nested call inside its own run (see ``LockedTask.__call__``)
        self.body_started = False

    @property
    def held_lock(self) -> ReentrantLock | None:
        """The lock while this run holds it."""
        return None if self.finished or self.parked else self.lock

    def finish(self, why: str, failed: bool) -> None:
        """Release every hold of the task id (its run's and its publish's), or keep them for
        the task's ``lock_cooldown``; ``failed``: the run raised. With ``lock_at="queue"``,
        then wake the copy that waits for this end. Idempotent."""
        if self.finished or self.parked or self.lock is None:
            return
        self.finished = True
        cooldown = cooldown_after(self.task, failed)
        try:
            if cooldown is not None and start_cooldown(self.task, self.lock, cooldown):
                return
            reply = self.lock.release_all()
        except LockBackendError as exc:
            log_release.error(
                "could not release %s after %s (%s); the release is sent again in the "
                "background, and the lock frees itself when its lease ends at the latest",
                self.lock.key,
                why,
                exc,
            )
            return
        if not reply.owned:
            log_release.warning(
                "the lock %s of task %s was lost during its run (lease expired or force-released)",
                self.lock.key,
                self.lock.owner,
            )
        queued = self.queued
        if queued is not None:
            # After the release: a copy that checked the lock before it saw it held, and so
            # wrote its wait record before this read.
            wake_waiting(self.task, queued.space, queued.name, self.lock.owner, queued.wait)

    def park(self, delay: float) -> None:
        """Keep the hold, unrenewed, for a retry due in ``delay`` seconds."""
        if self.lock is None:
            return
        task = self.task
        # read here, not at every run's start: most runs never park
        lease = max(delay, 0.0) + task.locking.queue_ttl(task.app)
        try:
            info = holder_info(task.name, self.lock.owner)
            kept = self.lock.park(lease, info, HoldState.REQUEUED)
        except LockBackendError as exc:
            log_release.error("could not keep %s for the retry: %s", self.lock.key, exc)
            kept = False
        self.parked = True
        queued = self.queued
        if queued is not None and queued.wait is not None:
            # A woken copy that retries: its retry waits for nothing (it carries no wait of
            # its own), so the claim of the wait it was woken for ends here.
            end_claim(queued.space, queued.name, self.lock.owner, queued.wait)
        if not kept:
            log_release.warning(
                "the lock %s was lost before the retry of task %s was queued",
                self.lock.key,
                self.lock.owner,
            )

    def unpark(self) -> None:
        """The retry was not sent after all: take the hold back for the rest of the run."""
        if not self.parked or self.lock is None:
            return
        self.parked = False
        try:
            self.lock.acquire(blocking=False)
        except Exception as exc:  # the run goes on; its finish releases what is held
            log_release.warning("could not take %s back: %s", self.lock.key, exc)


def current_run(request: Any) -> TaskRun | None:
    """The run whose request Context this is, once its lock was checked."""
    return _runs.get(request)


#: what a run raises before its body on purpose: a refused duplicate, a redelivery of a run
#: still alive (whose holds are that run's), a retry; anything else is a run that failed
_NOT_A_FAILURE = (Ignore, Retry, Reject, TaskLockedError)


def run_locked(
    task: Any,
    request: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    body: Callable[..., Any],
) -> Any:
    """Call ``body(*args, **kwargs)`` (the rest of the task class's ``__call__`` chain, which
    ends in ``task.run``) under the job's lock: ``LockedTask.__call__``."""
    try:
        run = _enter(task, request, args, kwargs)
    except _NOT_A_FAILURE:
        raise
    except BaseException as exc:
        _free_message_hold(task, request, args, kwargs, exc)
        raise
    if run.lock is None:
        return body(*args, **kwargs)
    try:
        result = body(*args, **kwargs)
    except Retry:
        if not run.parked:  # a Retry raised by hand, without self.retry()
            run.park(0.0)
        raise
    except BaseException as exc:
        run.finish(type(exc).__name__, failed=True)
        raise
    # Released here, before the worker stores the result.
    run.finish("success", failed=False)
    return result


def _message_lock_name(
    task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str:
    """The lock this run's message holds or would hold: the one its message names (its
    publish took it), else the one its arguments make. The run takes
    ``task.locking.run_lock()`` of it (the same lock, but with ``lock_at="queue"``)."""
    header = request.get(HEADER) if hasattr(request, "get") else None
    if isinstance(header, str) and header:
        return header
    locking: TaskLocking = task.locking
    return locking.message_lock(locking.lock_name(task.name, args, kwargs))


def _free_message_hold(
    task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any], exc: BaseException
) -> None:
    """A run that failed before its body (a setting Redis or the lock cannot use, Redis
    failing) ends its job: free the hold its publish took, or a new publish of the job would
    get this failed one back for the rest of the queue lease."""
    if request.is_eager or not task.locking.at_publish:
        return
    try:
        name = _message_lock_name(task, request, args, kwargs)
        space = task.locking.space(task.app)
        try:
            lease = task.locking.queue_ttl(task.app)
        except (TypeError, ValueError):  # that setting may be what failed
            lease = DEFAULTS["singleton_lock_queue_ttl"]
        # Redis may be what failed: keep trying in the background for as long as the hold
        # could live.
        space.named(name, task.locking.message_permits).release(request.id, retry_for=lease)
    except Exception as release_exc:
        log_release.error(
            "%s[%s] failed before its body (%s: %s) and its publish lock could not be freed "
            "(%s); a new publish of this job returns this task until the lock's lease ends",
            task.name,
            request.id,
            type(exc).__name__,
            exc,
            release_exc,
        )


def _enter(task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskRun:
    locking: TaskLocking = task.locking
    options = locking.options
    app = task.app
    message_lock = _message_lock_name(task, request, args, kwargs)
    name = locking.run_lock(message_lock)
    task_id = request.id
    queued = options.lock_at == "queue"
    wait = request_wait(request) if queued else None
    try:
        space = locking.space(app)
        if options.lock_at == "publish" and options.lock_release_on_start:
            released = space.named(name, options.lock_limit).release(task_id)
            if not released.owned and options.lock_debounce is not None:
                holder = space.inspect(name).holder
                if holder and holder != task_id:
                    skip_replaced(task, request, space.keys(name).lock, holder)
            run = _runs[request] = TaskRun(None, task)
            return run
        if queued:
            # a wake or a fallback: only the first of them runs the copy
            again = wait is not None and claim_wait(task, request, space, name, message_lock, wait)
            still_queued(task, request, space, message_lock, wait, again)
        lock = run_lock(task, space, name, task_id)
        reply = lock.try_acquire()
        # A holder revoked while queued will never let go by itself: free it.
        if (
            not reply.acquired
            and not reply.other_run
            and options.lock_limit == 1
            and free_revoked_holder(task, space, name, reply.holder)
        ):
            reply = lock.try_acquire()
        if not reply.acquired and options.lock_on_locked == "wait":
            reply = lock.try_acquire(options.lock_wait_timeout)
    except LockBackendError as exc:
        if proceed_without_lock(app, task.name, "run", exc):
            run = _runs[request] = TaskRun(None, task)
            return run
        raise
    if reply.acquired:
        return _entered(task, request, space, lock, message_lock, wait)
    if reply.other_run:
        log_run.warning(
            "not running %s[%s]: this message was delivered again while its first run is "
            "still alive (it holds %s); dropping this delivery",
            task.name,
            task_id,
            lock.key,
        )
        raise Ignore()
    if options.lock_debounce is not None and options.lock_at == "publish":
        # its own publish hold was taken over by a later call (or ran out)
        skip_replaced(task, request, lock.key, reply.holder)
    reason = refusal_reason(task, space, name, reply.holder, options.lock_limit)
    if queued:
        if request.is_eager:
            retry_in_queue(task, request, reply, _retry_countdown(options, request, reply))
        try:
            wait_for_run(task, request, space, name, lock, reply)  # raises its retry, or:
        except LockBackendError as exc:
            if proceed_without_lock(app, task.name, "run", exc):
                run = _runs[request] = TaskRun(None, task)
                return run
            raise
        return _entered(task, request, space, lock, message_lock, wait)  # a slot came free
    _locked_out(task, request, lock.key, reply, reason)


def _entered(
    task: Any,
    request: Any,
    space: LockSpace,
    lock: ReentrantLock | Semaphore,
    message_lock: str,
    wait: Wait | None,
) -> TaskRun:
    """The run took its job's lock: with ``lock_at="queue"`` it lets the queued lock go, and
    its end wakes the copy queued next."""
    locking: TaskLocking = task.locking
    queued = None
    if locking.options.lock_at == "queue":
        leave_queue(task, space, message_lock, request.id)
        queued = QueuedJob(space, locking.run_lock(message_lock), wait)
    run = _runs[request] = TaskRun(held_lock(lock), task, queued)
    return run


def _retry_countdown(options: LockOptions, request: Any, refusal: AcquireReply) -> float:
    """The countdown of a lock retry: ``lock_retry_countdown``, else the growing backoff."""
    fixed = options.lock_retry_countdown
    return fixed or lock_retry_delay(request.retries, refusal.lease_left)


def _locked_out(
    task: Any, request: Any, key: str, refusal: AcquireReply, reason: str = "locked"
) -> NoReturn:
    """A run-time duplicate: raise, retry or skip, as ``lock_on_locked`` says; a chord
    header member that would be skipped fails instead (a skip never reaches its chord).
    ``reason``: see :func:`~.cooldown.refusal_reason` (a skip records it)."""
    options = task.locking.options
    observer = get_observer()
    if options.lock_on_locked == "raise":
        if observer is not None:
            observer.duplicate(task.name, "raised")
        raise TaskLockedError(refusal.holder, key)
    if options.lock_on_locked == "retry":
        if observer is not None:
            observer.duplicate(task.name, "retried")
        try:
            raise task.retry(countdown=_retry_countdown(options, request, refusal))
        except MaxRetriesExceededError:
            log_run.info(
                "%s[%s] ran out of retries waiting for lock %s", task.name, request.id, key
            )
    if chord_member_of(request):
        # A chord header member: its chord's counter waits for it to end, and a skip (Ignore)
        # never reports to it, so the chord would hang. A failure does: the callback's result
        # ends with ChordError naming this task.
        log_run.warning(
            "%s[%s] is a chord header member and lock %s is held by task %s: failing it "
            "(TaskLockedError), so its chord ends with ChordError instead of waiting",
            task.name,
            request.id,
            key,
            refusal.holder,
        )
        if observer is not None:
            observer.duplicate(task.name, "raised")
        raise TaskLockedError(refusal.holder, key)
    if reason == "cooldown":
        log_run.info(
            "skipped %s[%s]: lock %s cools down after task %s (%.1f s left)",
            task.name,
            request.id,
            key,
            refusal.holder,
            max(refusal.lease_left, 0.0),
        )
    else:
        log_run.info(
            "skipped %s[%s]: lock %s is held by task %s",
            task.name,
            request.id,
            key,
            refusal.holder,
        )
    if observer is not None:
        observer.duplicate(task.name, "skipped")
    store_skipped(task, request, {"holder": refusal.holder, "lock": key, "reason": reason})
    raise Ignore()


def retry_keeping_lock(
    task: Any,
    send_retry: Callable[[], Any],
    eta: Any,
    countdown: float | None,
    max_retries: int | None,
) -> Any:
    """``LockedTask.retry``: park the run's hold before the retry message exists (a fast
    worker may start the retry at once), and take it back if the retry is not sent."""
    request = task.request
    run = _runs.get(request)
    limit = task.max_retries if max_retries is None else max_retries
    exhausted = limit is not None and request.retries + 1 > limit
    if run is None or run.lock is None or run.finished or run.parked or exhausted:
        return send_retry()
    if eta is not None:
        delay = seconds_until(eta) or 0.0
    else:
        delay = task.default_retry_delay if countdown is None else countdown
    run.park(float(delay or 0.0))
    try:
        return send_retry()
    except Retry:
        raise
    except BaseException:
        run.unpark()
        raise
