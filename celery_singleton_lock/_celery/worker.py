"""The worker's main-process side: a task's lock freed when its pool process cannot free it (a
pool process killed, a hard time limit, a revoke, a message dropped unrun): released at once,
or parked for what comes next (a redelivery, a cooldown), instead of waiting for its lease.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.app.task import Context
from celery.worker.request import Request
from kombu.utils.imports import symbol_by_name

from .config import LockConfig
from .hold import MessageLock
from .lifecycle import AT_RETRY, DROPPABLE
from .modes.queue import QUEUED
from .modes.wake import request_wait

log = logging.getLogger("celery_singleton_lock.release")

_CHILD_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


def release_for_request(task: Any, request: Any, why: str, **how: Any) -> None:
    """Release the holds of ``request`` (the task's request Context) on its job's lock (the
    mode's ``release_for``, ``how`` its options). Never raises: a lock not released ends with its
    lease."""
    mode = getattr(getattr(task, "locking", None), "mode", None)
    if mode is None:
        return  # not a locked task
    try:
        message = mode.message_lock_of(task, request, request.args, request.kwargs)
        # a queued copy's wake or fallback: the copy will not run, its wait ends
        mode.release_for(task, request.id, message, why, wait=request_wait(request), **how)
    except Exception as exc:
        log.error(
            "could not release the lock of %s[%s] after %s: %s; it frees itself when its "
            "lease ends (a release that Redis failed is sent again in the background meanwhile)",
            getattr(task, "name", task),
            request.id,
            why,
            exc,
        )


def on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """``task_revoked``: a task revoked while it runs, or when a worker reaches its message."""
    if request is not None:
        why = "revoke" + (" (terminated)" if kwargs.get("terminated") else "")
        release_for_request(sender, request, why)


def _release_dropped(consumer: Any, message: Any, why: str) -> None:
    """A message the worker drops unrun: free the lock its publisher took for it, where its
    headers say (the task may be unknown here), only while its task id holds it for a message
    that waits, checked in Redis."""
    headers = getattr(message, "headers", None) or {}
    lock, task_id = MessageLock.of(headers), headers.get("id")
    app = getattr(consumer, "app", None)
    if lock is None or app is None or not (isinstance(task_id, str) and task_id):
        return
    try:
        space = LockConfig.of(app).space(lock.prefix)
        job = space.named(lock.name, lock.permits)
        freed = job.force_release(holder=task_id, states=DROPPABLE)
        if lock.name.endswith(QUEUED):
            # lock_at="queue": a retry (comeback, redelivery) whose run parked its hold on the
            # job's lock for it: nothing else will ever free it.
            task = getattr(app, "tasks", {}).get(headers.get("task"))
            mode = getattr(getattr(task, "locking", None), "mode", None)
            run = space.named(lock.name.removesuffix(QUEUED), getattr(mode, "limit", 1))
            if run.force_release(holder=task_id, states=(AT_RETRY,)):
                freed, job = True, run
                if task is not None and mode is not None:  # its waiting copy comes now
                    job_space = task.locking.space(app)
                    mode.released(task, job_space.named(run.name, mode.limit), task_id, True, None)
    except Exception as exc:
        log.error(
            "could not release the lock of dropped task %s (%s): %s; it frees itself when its "
            "lease ends",
            task_id,
            why,
            exc,
        )
        return
    if freed:
        log.warning(
            "released %s: the worker dropped the message of task %s (%s)",
            job.keys[0].lock,
            task_id,
            why,
        )


def on_task_unknown(sender: Any = None, message: Any = None, name: str = "", **_: Any) -> None:
    _release_dropped(sender, message, f"task {name!r} is not registered in this worker")


def on_task_rejected(sender: Any = None, message: Any = None, exc: Any = None, **_: Any) -> None:
    _release_dropped(sender, message, f"message rejected: {exc!r}" if exc else "message rejected")


class LockedRequest(Request):  # type: ignore[misc]  # celery ships no type information
    """The request class of :class:`~._celery.task.LockedTask` in the worker's main process."""

    def _release(self, why: str, requeued: bool = False) -> None:
        release_for_request(self.task, Context(self.request_dict), why, requeued=requeued, ran=True)

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
    is_class = isinstance(request_cls, type)
    if is_class and issubclass(request_cls, LockedRequest):
        return request_cls  # type: ignore[no-any-return]
    if not (is_class and issubclass(request_cls, Request)):
        raise TypeError(
            f"{task}.Request must be a subclass of celery.worker.request.Request (or its "
            f"'module:Class' path), got {own!r}"
        )
    # LockedRequest's hooks call super(): the task's own Request runs after them, unchanged.
    composed: type[Request] = type(
        request_cls.__name__,
        (LockedRequest, request_cls),
        {
            "__module__": request_cls.__module__,
            "__qualname__": request_cls.__qualname__,
            "composes_locked_request": True,
        },
    )
    return composed


class _LockedRequestOf:
    """``Request`` of a locked task class that names its own by path: composed the first time
    the worker asks (the module may not be importable yet when the task class is made)."""

    composes_locked_request = True

    def __init__(self, own: str, task: str) -> None:
        self.composed = functools.cache(functools.partial(_composed, own, task))

    def __get__(self, instance: Any, owner: Any = None) -> type[Request]:
        return self.composed()


def with_locked_request(own: Any, task: str) -> Any:
    """The ``Request`` of a locked task class (named ``task`` in errors) that defines ``own``:
    :class:`LockedRequest` put in front of it."""
    return _LockedRequestOf(own, task) if isinstance(own, str) else _composed(own, task)
