"""Publish: a job's lock taken for its message (``lock_at="publish"``), owned by the task id.

Two ways in, one set of rules: :func:`publish_once` is ``LockedTask.apply_async`` (it can veto
the send: a duplicate sends nothing), :func:`take_for_message` is the ``before_task_publish``
receiver of ``install()`` for messages sent by name (``send_task``, beat), which cannot veto
(Celery swallows receiver errors), so a duplicate is sent, and left to the worker's run-time
check: skipped while the job it duplicates still holds the lock (queued or running), run again
when it reaches a worker after that job ended.
Both hold the lock for the time the message may wait (:func:`queue_lease`) and name it in the
message's :data:`HEADER`, so the worker never computes the key again.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .._errors import AlreadyQueuedError, LockBackendError, MisconfiguredError
from .._lock import MAX_LEASE_SECONDS
from .canvas import (
    canvas_member,
    chord_member_of,
    fail_member,
    refuse_chord_member,
    sent_by_worker,
)
from .cooldown import refusal_reason
from .debounce import replace_waiting
from .info import HoldState, holder_info
from .locking import HEADER, MessageLock, TaskLocking, proceed_without_lock
from .observer import get_observer
from .revoked import free_revoked_holder

__all__ = ["HEADER", "publish_once", "queue_lease", "seconds_until", "take_for_message"]

log = logging.getLogger("celery_singleton_lock.publish")
log_debounce = logging.getLogger("celery_singleton_lock.debounce")

#: ``send(task_id, options)``: the plain ``Task.apply_async`` with the other arguments bound
Send = Callable[[str, dict[str, Any]], Any]


def seconds_until(value: Any) -> float | None:
    """Seconds from now until ``value`` (seconds, a datetime or an ISO 8601 string)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        now = datetime.now(value.tzinfo or UTC)
        if value.tzinfo is None:
            now = now.replace(tzinfo=None)
        return (value - now).total_seconds()
    if isinstance(value, str):
        try:
            return seconds_until(datetime.fromisoformat(value))
        except ValueError:
            return None
    return None


def queue_lease(
    queue_ttl: float, expires: Any = None, eta: Any = None, countdown: Any = None
) -> float:
    """How long a message's lock is held while it waits: until it expires (at least 1 s), or
    its delay (``eta`` / ``countdown``) plus ``queue_ttl``; at most the longest lease the lock
    takes (a message due in more than ten years is not kept out of duplicates that long)."""
    until_expiry = seconds_until(expires)
    if until_expiry is not None:
        return min(max(until_expiry, 1.0), MAX_LEASE_SECONDS)
    delay = seconds_until(eta) or countdown or 0.0
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise TypeError(f"countdown must be a number of seconds, got {countdown!r}")
    if math.isnan(delay):
        raise ValueError(f"countdown must be a number of seconds, got {countdown!r}")
    return min(max(float(delay), 0.0) + queue_ttl, MAX_LEASE_SECONDS)


def _with_header(options: dict[str, Any], lock: MessageLock) -> dict[str, Any]:
    headers = dict(options.get("headers") or {})
    lock.put_in(headers)
    options["headers"] = headers
    return options


def publish_once(
    task: Any,
    send: Send,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    task_id: str | None,
    options: dict[str, Any],
    has_callbacks: bool,
) -> Any:
    """``apply_async`` of a ``lock_at="publish"`` task: take the job's lock for the new task
    id and send, or send nothing and return (or raise) the holder's."""
    locking: TaskLocking = task.locking
    app = task.app
    task_id = task_id or str(uuid.uuid4())
    name = locking.message_lock(locking.lock_name(task.name, args, kwargs))
    debounce = locking.options.lock_debounce
    if debounce is not None:
        if options.get("eta") is None and options.get("countdown") is None:
            options["countdown"] = debounce
        elif task_id != task.request.id:  # (a retry's countdown is not the caller's choice)
            # The caller's own delay wins, as Celery users expect of countdown= and eta=; the
            # call still replaces a waiting one. Said once per call, at DEBUG: it is no error.
            log_debounce.debug(
                "%s[%s]: the caller's %s replaces lock_debounce (%s s) for this call",
                task.name,
                task_id,
                "eta" if options.get("eta") is not None else "countdown",
                debounce,
            )
    lease = queue_lease(
        locking.queue_ttl(app), options.get("expires"), options.get("eta"), options.get("countdown")
    )
    permits = locking.message_permits
    info = holder_info(task.name, task_id, permits)
    # A retry's publish re-enters the hold its run parked: "" keeps that hold's state
    # (requeued, so that a debounced call never replaces a job whose run has started).
    state = "" if task_id == task.request.id else HoldState.QUEUED
    try:
        space = locking.space(app)
        reply = space.named(name, permits).take(task_id, lease, info=info, state=state)
        if not reply.acquired and (
            free_revoked_holder(task, space, name, reply.holder)
            or (
                debounce is not None
                and task_id != task.request.id  # not a retry of the waiting message itself
                and replace_waiting(task, space, name, reply.holder, by=task_id)
            )
        ):
            reply = space.named(name, permits).take(task_id, lease, info=info, state=state)
    except LockBackendError as exc:
        if proceed_without_lock(app, task.name, "publish", exc):
            # The header marks the message as handled here (the publish receiver of
            # install() must not try, and log, a second time); it names the lock only.
            return send(task_id, _with_header(options, MessageLock(name)))
        raise
    if not reply.acquired and task_id == task.request.id:
        # The retry of a run that holds no lock (a duplicate retrying with
        # lock_on_locked="retry"): it must be sent, or the job would be lost.
        return send(task_id, options)
    if not reply.acquired:
        ttl = max(reply.lease_left, 0.0)
        key = space.keys(name).lock
        cooldown = refusal_reason(task, space, name, reply.holder, permits) == "cooldown"
        log.info(
            "not publishing %s: a duplicate of task %s, which holds %s (%.1f s left%s)",
            task.name,
            reply.holder,
            key,
            ttl,
            " of its cooldown" if cooldown else "",
        )
        observer = get_observer()
        # A canvas member's id is already in the group's, chain's or chord's result, and
        # Celery drops what this returns: it must end (raise or fail), never stay PENDING.
        in_canvas = canvas_member(options)
        by_worker = in_canvas and sent_by_worker(app, options)
        if in_canvas and not by_worker and chord_member_of(options):
            if observer is not None:
                observer.duplicate(task.name, "raised")
            refuse_chord_member(task, options, reply.holder, ttl, key)
        # Raised inside a worker's chain step, it would fail the task before it instead.
        raising = locking.options.lock_on_duplicate == "raise" and not by_worker
        if observer is not None:
            observer.duplicate(task.name, "raised" if raising else "returned")
        error = AlreadyQueuedError(reply.holder, ttl, key, cooldown=cooldown)
        if in_canvas:
            fail_member(task, task_id, options, error)
            log.warning(
                "%s[%s] was not published (a duplicate of task %s): recorded as failed with "
                "AlreadyQueuedError, so its group, chain or chord ends with that error (the "
                "rest of its chain was not sent)",
                task.name,
                task_id,
                reply.holder,
            )
        elif has_callbacks and not raising:
            log.warning(
                "%s was not published (a duplicate of task %s), and with it its callbacks "
                "(link, chain or chord members after it) were not sent either",
                task.name,
                reply.holder,
            )
        if raising:
            raise error
        return task.AsyncResult(reply.holder)
    try:
        return send(task_id, _with_header(options, MessageLock(name, space.prefix, permits)))
    except BaseException:
        # Nothing was sent: do not keep a lock for a message that does not exist (and if
        # Redis fails now, keep trying for as long as that lock could live).
        try:
            space.named(name, permits).release(task_id, holds=1, retry_for=lease)
        except LockBackendError as exc:
            log.error(
                "could not undo the publish lock %s yet (%s); retrying in the background",
                space.keys(name).lock,
                exc,
            )
        raise


def take_for_message(
    task: Any, task_id: str, args: Any, kwargs: Any, headers: dict[str, Any]
) -> None:
    """The publish lock of a message sent by name (``before_task_publish``): taken when free,
    and named in the message's headers; a duplicate is only logged (it cannot be stopped
    here: a worker skips it while the job it duplicates still holds the lock, and runs it
    again once that job has ended)."""
    locking: TaskLocking = task.locking
    app = task.app
    try:
        name = locking.message_lock(locking.lock_name(task.name, args, kwargs))
        lease = queue_lease(locking.queue_ttl(app), headers.get("expires"), headers.get("eta"))
        space = locking.space(app)
        permits = locking.message_permits
        reply = space.named(name, permits).take(
            task_id, lease, info=holder_info(task.name, task_id, permits), state=HoldState.QUEUED
        )
    except (LockBackendError, MisconfiguredError, TypeError, ValueError) as exc:
        log.error("could not take the publish lock of %s[%s]: %s", task.name, task_id, exc)
        return
    # The lock's name goes with the message either way: the worker checks that same lock, even
    # where it would compute the name differently (a publisher that knows only the task's name).
    MessageLock(name, space.prefix, permits).put_in(headers)
    if not reply.acquired:
        log.warning(
            "%s[%s] was published by name (send_task or beat) while task %s holds %s; it "
            "cannot be stopped at publish: a worker skips it while that task holds the lock, "
            "and runs it again if it arrives after that task ended",
            task.name,
            task_id,
            reply.holder,
            space.keys(name).lock,
        )
