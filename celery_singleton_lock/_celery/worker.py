"""The worker's main-process side: release a task's lock when its pool child cannot.

Only the main process hears of a pool child killed (SIGKILL, OOM), a hard time limit or a
terminating revoke; Celery then calls the request's ``on_failure`` / ``on_timeout`` there (and
sends ``task_revoked``, see :mod:`.revoked`). It releases the lock at once, or keeps it for what
comes next: for the task's ``lock_cooldown`` (a run that died counts as failed), or, when the
message goes back to the queue (``acks_late`` with ``reject_on_worker_lost``), parked for its
redelivery, which re-enters it at once with no gap for a duplicate. A whole worker killed runs
none of this: its locks end with their leases.
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request
from kombu.utils.imports import symbol_by_name

from .cooldown import cooldown_after
from .info import HoldState, holder_info
from .locking import HEADER, TaskLocking
from .wake import WAIT_HEADER, Wait, wait_of, wake_waiting

__all__ = ["LOCKED_REQUEST", "LockedRequest", "release_for_request", "with_locked_request"]

log = logging.getLogger("celery_singleton_lock.release")

_CHILD_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


def release_for_request(
    task: Any,
    task_id: str,
    args: Any,
    kwargs: Any,
    header: Any,
    why: str,
    requeued: bool = False,
    ran: bool = False,
    wait: Wait | None = None,
) -> None:
    """Release every hold of ``task_id`` on its job's lock, from the worker's main process
    (its pool child died, hit the hard time limit, or the task was revoked). With
    ``lock_at="queue"``, a run freed this way wakes the copy that waits for its end, as a run
    that returns does; ``wait``: the wait the message carried (a queued copy's wake or
    fallback), which ends with it.

    ``requeued``: the message goes back to the queue (``reject_on_worker_lost``): the hold is
    parked for its redelivery instead (kept, not renewed, run token cleared), so the
    redelivered run re-enters it at once and no duplicate gets in meanwhile. ``ran``: the run
    had started and ended as a failure (its process died): the task's ``lock_cooldown``, if it
    starts after a failure, keeps the hold for that long instead."""
    locking = getattr(task, "locking", None)
    if not isinstance(locking, TaskLocking):
        return  # not a locked task
    try:
        message = header if isinstance(header, str) and header else None
        message = message or locking.message_lock(locking.lock_name(task.name, args, kwargs))
        name = locking.run_lock(message)
        permits = locking.options.lock_limit
        app = task.app
        space = locking.space(app)
        key = space.keys(name).lock
        info = holder_info(task.name, task_id)
        if requeued:
            lease = locking.queue_ttl(app)
            state = HoldState.REQUEUED
            if space.named(name, permits).park(task_id, lease, info=info, state=state):
                log.info(
                    "kept %s of %s[%s] for its redelivery after %s", key, task.name, task_id, why
                )
            return
        if message != name:
            # lock_at="queue": a run killed while its copy still waited frees the queue too
            space.named(message).release(task_id, retry_for=locking.queue_ttl(app))
        cooldown = cooldown_after(task, failed=True) if ran else None
        if cooldown is not None:
            state = HoldState.COOLDOWN
            if space.named(name, permits).park(task_id, cooldown, info=info, state=state):
                log.info("%s cools down for %.1f s after %s[%s]", key, cooldown, task.name, why)
                return
        # Resent from the background when Redis fails (a transient Cluster state, a dropped
        # connection), for as long as the run's lease could keep the hold.
        reply = space.named(name, permits).release(task_id, retry_for=locking.ttl(app))
        if message != name and (reply.freed or wait is not None):
            wake_waiting(task, space, name, task_id, wait, wake=reply.freed)
    except Exception as exc:
        log.error(
            "could not release the lock of %s[%s] after %s: %s; it frees itself when its "
            "lease ends (a release that Redis failed is sent again in the background meanwhile)",
            getattr(task, "name", task),
            task_id,
            why,
            exc,
        )
        return
    if reply.freed:
        log.info("released %s of %s[%s] after %s", key, task.name, task_id, why)


class LockedRequest(Request):  # type: ignore[misc]  # celery ships no type information
    """The request class of :class:`~._celery.task.LockedTask` in the worker's main process."""

    def _release(self, why: str, requeued: bool = False) -> None:
        message = self.request_dict
        release_for_request(
            self.task,
            self.id,
            self.args,
            self.kwargs,
            message.get(HEADER),
            why,
            requeued,
            ran=True,
            wait=wait_of(message.get(WAIT_HEADER), message.get("retries")),
        )

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft:
            self._release(f"hard time limit ({timeout} s)")

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # unwrap ExceptionWithTraceback
        if isinstance(exc, _CHILD_GONE):
            task = self.task
            # Celery requeues the message in this case (see Request.on_failure): keep the hold
            # for the redelivery rather than let a duplicate in between.
            requeued = (
                isinstance(exc, (WorkerLostError, SystemExit, KeyboardInterrupt))
                and task.acks_late
                and task.reject_on_worker_lost
                and not getattr(task, "retry_on_worker_lost", False)
            )
            self._release(f"its pool process ended ({type(exc).__name__})", requeued)
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )


#: ``LockedTask.Request``: the path Celery's worker resolves
LOCKED_REQUEST = f"{__name__}:LockedRequest"


def _composed(own: Any, task: str) -> type[Request]:
    request_cls = symbol_by_name(own) if isinstance(own, str) else own  # type: ignore[no-untyped-call]  # kombu: unannotated
    if not (isinstance(request_cls, type) and issubclass(request_cls, Request)):
        raise TypeError(
            f"{task}.Request must be a subclass of celery.worker.request.Request (or its "
            f"'module:Class' path), got {own!r}"
        )
    if issubclass(request_cls, LockedRequest):
        return request_cls
    # LockedRequest's hooks call super(): the task's own Request runs after them, unchanged.
    composed: type[Request] = type(
        request_cls.__name__,
        (LockedRequest, request_cls),
        {"__module__": request_cls.__module__, "__qualname__": request_cls.__qualname__},
    )
    return composed


class _LockedRequestOf:
    """``Request`` of a locked task class that brings its own: that class with
    :class:`LockedRequest` put in front, made the first time the worker asks (a
    ``'module:Class'`` path may name a module that is not importable yet when the task class
    is made)."""

    composes_locked_request = True

    def __init__(self, own: Any, task: str) -> None:
        self.own = own
        self.task = task
        self.composed: type[Request] | None = None

    def __get__(self, instance: Any, owner: Any = None) -> type[Request]:
        if self.composed is None:
            self.composed = _composed(self.own, self.task)
        return self.composed


def with_locked_request(own: Any, task: str) -> Any:
    """The ``Request`` of a locked task class (named ``task`` in errors) whose MRO defines
    ``own``: a class is composed now (a wrong one fails when the task class is made), a path
    when the worker first resolves it."""
    if isinstance(own, str):
        return _LockedRequestOf(own, task)
    composed = _composed(own, task)
    if composed is not own:
        composed.composes_locked_request = True
    return composed
