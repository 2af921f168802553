"""The lock a run takes, and the queued copy of ``lock_at="queue"``.

A run takes its job's lock, or with ``lock_limit`` above 1 one of the job's leased slots
(a :class:`~celery_singleton_lock.Semaphore`); either way it holds one
:class:`ReentrantLock`, renewed while it runs.

With ``lock_at="queue"`` a job has two locks: its *queued* lock (the job's lock name with
:data:`~.locking.QUEUED` after it), held by the one message that waits, taken at publish; and
its lock itself, held by the one run. A run takes the job's lock first and only then lets the
queued lock go, so a publish that comes meanwhile is still handed the message that is about
to start, and a new copy can be queued the moment it has. A queued copy that finds the job
running is never dropped: it waits beside the job's lock for the run to end, without a pool
process, and starts when it does (:mod:`.wake`); with ``lock_on_locked="wait"`` it blocks for
``lock_wait_timeout`` first. Its lock retries keep its queued lock, whatever
``lock_on_locked`` says, and do not count against ``max_retries``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import Ignore

from .._errors import LockBackendError
from .._lock import (
    AcquireReply,
    LockSpace,
    ReentrantLock,
    Semaphore,
    new_run_token,
)
from .debounce import skip_replaced
from .info import HoldState, holder_info
from .locking import store_skipped
from .observer import get_observer
from .wake import Wait, end_claim

__all__ = ["held_lock", "leave_queue", "run_lock", "still_queued"]

log = logging.getLogger("celery_singleton_lock.run")


def run_lock(task: Any, space: LockSpace, name: str, task_id: str) -> ReentrantLock | Semaphore:
    """The lock (or, with ``lock_limit`` above 1, the slots) a run of ``task`` takes."""
    locking = task.locking
    app = task.app
    info = holder_info(task.name, task_id, locking.options.lock_limit)
    running = HoldState.RUNNING
    if locking.options.lock_limit > 1:
        return space.semaphore(
            name,
            locking.options.lock_limit,
            ttl=locking.ttl(app),
            owner=task_id,
            info=info,
            run_token=new_run_token(),
            state=running,
        )
    return space.lock(
        name,
        ttl=locking.ttl(app),
        owner=task_id,
        info=info,
        run_token=new_run_token(),
        state=running,
    )


def held_lock(lock: ReentrantLock | Semaphore) -> ReentrantLock:
    """The one lock a run holds once ``lock`` was acquired: the lock, or the slot taken."""
    if isinstance(lock, Semaphore):
        held = lock.held
        assert held is not None, "a semaphore that was just acquired holds a slot"
        return held
    return lock


def still_queued(
    task: Any,
    request: Any,
    space: LockSpace,
    queued: str,
    wait: Wait | None = None,
    again: bool = False,
) -> None:
    """Make sure this message is the job's one queued copy: re-enter its queued lock (or take
    it, when its hold ran out while the message waited). Held by another task, this message
    is not that copy: a later call replaced it (``lock_debounce``), or it is a duplicate that a
    publish by name (``send_task``, beat) could not stop; either way it is skipped. ``wait``:
    the wait this message claimed, which ends with it then (``again``: it had claimed it
    before, and is delivered again after its run began)."""
    lease = task.locking.queue_ttl(task.app)
    info = holder_info(task.name, request.id)
    debounced = task.locking.options.lock_debounce is not None
    if wait is not None and debounced and not again:
        # A copy that waited: its queued lock is still its own, or a later call replaced it
        # meanwhile (and may have run already, leaving that lock free): only kept, not taken.
        if space.named(queued).park(request.id, lease, info=info, state=HoldState.QUEUED):
            return
        reply = AcquireReply(False, holder=space.inspect(queued).holder or "")
    else:
        reply = space.named(queued).take(request.id, lease, info=info, state=HoldState.QUEUED)
    if reply.acquired:
        return
    key = space.keys(queued).lock
    if wait is not None:
        end_claim(space, task.locking.run_lock(queued), request.id, wait)
    if debounced:
        skip_replaced(task, request, key, reply.holder)
    log.info(
        "skipped %s[%s]: task %s is this job's queued copy (lock %s)",
        task.name,
        request.id,
        reply.holder,
        key,
    )
    observer = get_observer()
    if observer is not None:
        observer.duplicate(task.name, "skipped")
    store_skipped(task, request, {"holder": reply.holder, "lock": key, "reason": "queued"})
    raise Ignore()


def leave_queue(task: Any, space: LockSpace, queued: str, task_id: str) -> None:
    """The run has the job's lock: free the queued lock for the next copy."""
    try:
        space.named(queued).release(task_id, retry_for=task.locking.queue_ttl(task.app))
    except LockBackendError as exc:
        log.error(
            "%s[%s] runs, but its queued lock %s could not be freed yet (%s): a publish of "
            "this job gets this task back until it is (retried in the background)",
            task.name,
            task_id,
            space.keys(queued).lock,
            exc,
        )
