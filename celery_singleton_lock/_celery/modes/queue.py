"""``lock_at="queue"``: one copy of a job queued (its publish holds the *queued* lock, the job's
name + :data:`QUEUED`) and one running (the job's lock). A run takes the job's lock first, then
frees the queued lock for the next copy. A queued copy that finds the job running waits beside
its lock, with no pool process, until the run's end wakes it (:mod:`.wake`).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from celery.exceptions import Ignore

from ..._errors import LockBackendError
from ..._lock import AcquireReply, NamedLock, RateLimiter, ReentrantLock, Semaphore
from ..hold import holder_info, report_duplicate, store_skipped
from ..lifecycle import AT_COMEBACK, AT_PUBLISH
from ..rate import Waited
from ..run import TaskRun
from .base import Attempt
from .publish import PublishMode
from .wake import claim_wait, replace_waiter, request_wait, wait_for_run, wake_waiting

log = logging.getLogger("celery_singleton_lock.run")

#: the queued lock of a job is its lock's name with this after it
QUEUED = ":queued"


class QueueMode(PublishMode):
    """``lock_at="queue"``: one copy queued and one running."""

    suffix = QUEUED

    def take(self, at: Attempt) -> TaskRun:
        """Make sure this message is the job's one queued copy: re-enter its queued lock (or
        take it, its hold gone), then take the job's lock. Held by another task, this message
        is skipped: a later call replaced it (``lock_debounce``), or it duplicates a copy
        published by name."""
        task, request, bound, message = at
        self.check_rate(task, message, request.args, request.kwargs)
        queued, wait = bound.space.named(message), request_wait(request)
        key, lease = queued.keys[0].lock, task.locking.queue_ttl(task.app)
        info = holder_info(task.name, request.id)
        if wait is None:
            # (a replaced copy's wake or fallback learns it from its wait record instead)
            self.skip_if_replaced(at)
        # a wake or a fallback: only the first of them runs the copy (again: it had claimed it)
        elif (
            not claim_wait(task, request, self.job_of(at), key, wait) and self.debounce is not None
        ):
            # A copy that waited: its queued lock is still its own, or a later call replaced it
            # (and may have run already, leaving it free: the note says so), or it ran out.
            if queued.park(request.id, lease, info=info, state=AT_PUBLISH):
                return self.take_run(at)
            self.skip_if_replaced(at)
        reply = queued.take(request.id, lease, info=info, state=AT_PUBLISH)
        if reply.acquired or (wait is None and self.has_place(at)):
            return self.take_run(at)
        if wait is not None:
            wake_waiting(task, self.job_of(at), request.id, wait, 0.0, wake=False)
        # replaced by a later call since it looked; else a duplicate of the queued copy
        self.skip_if_replaced(at)
        log.info(
            "skipped %s[%s]: task %s is this job's queued copy (lock %s)",
            task.name,
            request.id,
            reply.holder,
            key,
        )
        report_duplicate(task, "skipped")
        store_skipped(task, request, {"holder": reply.holder, "lock": key, "reason": "queued"})
        raise Ignore()

    def has_place(self, at: Attempt) -> bool:
        """Refused the queued lock: is this the message of a run that started, coming back to
        its place (a retry, a comeback, a redelivery)? Its job's lock parked for its task id is
        its place; that hold gone, it still takes the job's lock if nothing holds it, rather
        than be lost. A new call's message never does."""
        request, holds = at.request, self.job_of(at).inspect()
        if any(request.id in s.owners for s in holds):
            return True
        if any(s.held for s in holds):
            return False
        if getattr(request, "retries", 0) or Waited.of(request).comebacks:
            return True
        return bool((getattr(request, "delivery_info", None) or {}).get("redelivered"))

    def started(
        self, at: Attempt, lock: ReentrantLock | Semaphore, limiter: RateLimiter | None
    ) -> TaskRun:
        """The run has the job's lock (and its turn): free the queued lock for the next copy;
        the run's end wakes the copy that waits for it."""
        run = super().started(at, lock, limiter)
        task, request, bound, message = at
        task_id = request.id
        try:
            self.release_queued(task, bound, message, task_id)
        except LockBackendError as exc:
            log.error(
                "%s[%s] runs, but its queued lock %s could not be freed yet (%s): a publish of "
                "this job gets this task back until it is (retried in the background)",
                task.name,
                task_id,
                bound.space.keys(message).lock,
                exc,
            )
        job, wait = self.job_of(at), request_wait(request)
        # After the release (or the cooldown's park): a copy that checked the lock before saw it
        # held, and so wrote its wait record before this read.
        run.after_end = partial(wake_waiting, task, job, task_id, wait)
        # A woken copy that retries: its retry waits for nothing, so its claim ends as it parks.
        if wait is not None:
            run.after_park = partial(wake_waiting, task, job, task_id, wait, 0.0, wake=False)
        return run

    def park_place(self, at: Attempt, held: ReentrantLock, lease: float) -> None:
        """The copy stays the job's queued copy (its queued lock kept, as for a retry: never
        replaced meanwhile); the job's lock is let go."""
        held.release_all()
        info = holder_info(at.task.name, at.request.id)
        at.bound.space.named(at.message).park(at.request.id, lease, info=info, state=AT_COMEBACK)

    def refused(self, at: Attempt, lock: ReentrantLock | Semaphore, reply: AcquireReply) -> TaskRun:
        """The job runs: wait beside its lock for the run to end (never dropped). An eager call
        cannot wait in a queue: it ends as an eager duplicate does in the other modes."""
        task, request, bound, message = at
        if request.is_eager:
            # its queued lock goes first: nothing of the call is left to wait
            self.release_queued(task, bound, message, request.id)
            return super().refused(at, lock, reply)
        wait_for_run(task, request, self.job_of(at), lock, reply)  # raises, or a slot came free
        return self.started(at, lock, self.limiter_of(at))

    def replaced(self, task: Any, job: NamedLock, holder: str, by: str) -> None:
        """A copy that waits beside the running job learns it was replaced from its record."""
        bound = task.locking.bound(task.app)
        try:
            replace_waiter(bound.space.named(self.run_lock(job.name), self.limit), holder, by)
        except LockBackendError as exc:  # its message finds its queued lock gone instead
            log.warning("could not mark task %s as replaced by %s: %s", holder, by, exc)

    def released(
        self, task: Any, job: NamedLock, task_id: str, freed: bool, wait: Any, cooldown: float = 0.0
    ) -> None:
        if freed or wait is not None:
            wake_waiting(task, job, task_id, wait, cooldown, wake=freed)
