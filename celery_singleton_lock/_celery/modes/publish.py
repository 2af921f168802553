"""``lock_at="publish"``: a job's lock taken by its publish, for its task id, and held through
the end of its run; a duplicate publish sends nothing and returns (or raises for) the job.

:meth:`PublishMode.publish` is ``LockedTask.apply_async`` (it can veto the send);
:meth:`PublishMode.take_for_message` is ``install()``'s receiver for messages sent by name (it
cannot: Celery swallows a receiver's error, so the worker's check handles such a duplicate).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..._errors import AlreadyQueuedError, LockBackendError, MisconfiguredError
from ..._lock import MAX_LEASE_SECONDS, AcquireReply, NamedLock
from ..canvas import (
    canvas_member,
    chord_member_of,
    fail_member,
    refuse_chord_member,
    sent_by_worker,
)
from ..config import Bound
from ..hold import MessageLock, holder_info, report_duplicate
from ..lifecycle import AT_PUBLISH, AT_RETRY
from ..parts import refusal_reason, skip_replaced
from ..run import TaskRun, seconds_until
from .base import Attempt, RunMode, free_revoked_holder, proceed_without_lock
from .wake import WAIT_HEADER, wait_of

log = logging.getLogger("celery_singleton_lock.publish")


def queue_lease(queue_ttl: float, when: Mapping[str, Any]) -> float:
    """How long a message's lock is held while it waits: until it ``expires`` (at least 1 s),
    or its delay (``eta``, ``countdown``) plus ``queue_ttl``; at most the longest lease."""
    expires, eta, countdown = when.get("expires"), when.get("eta"), when.get("countdown")
    if expires is None and eta is None and countdown is None:  # most calls: the TTL alone
        return min(0.0 + queue_ttl, MAX_LEASE_SECONDS)
    until_expiry = seconds_until(expires)
    if until_expiry is not None:
        return min(max(until_expiry, 1.0), MAX_LEASE_SECONDS)
    delay = seconds_until(eta) or countdown or 0.0
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise TypeError(f"countdown must be a number of seconds, got {countdown!r}")
    if math.isnan(delay):
        raise ValueError(f"countdown must be a number of seconds, got {countdown!r}")
    return min(max(float(delay), 0.0) + queue_ttl, MAX_LEASE_SECONDS)


class PublishMode(RunMode):
    """``lock_at="publish"``: taken at publish, held through the end of the run."""

    at_publish = True

    def publish(
        self,
        task: Any,
        send: Callable[[str, dict[str, Any]], Any],
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        task_id: str | None,
        options: dict[str, Any],
        has_callbacks: bool,
    ) -> Any:
        """``apply_async``: take the job's lock for the new task id and send, or send nothing
        and return (or raise) the holder's. ``send(task_id, options)``: the plain
        ``Task.apply_async`` with the other arguments bound."""
        locking, app = task.locking, task.app
        # A retry sends its run's id (reading the current request costs more than this test).
        retry = bool(task_id) and task_id == task.request.id
        task_id = task_id or str(uuid.uuid4())
        name = self.message_lock(locking.lock_name(task.name, args, kwargs))
        self.check_rate(task, name, args, kwargs)
        if self.debounce is not None:
            self.debounce.delay(task, task_id, options)
        lease = queue_lease(locking.queue_ttl(app), options)
        info = holder_info(task.name, task_id, self.message_permits)
        # A retry's hold is ``requeued`` (what acts on waiting messages by state must see it),
        # but a queued copy's fallback re-enters the queued lock of a copy that never ran: it
        # stays ``queued`` (a debounced call may still replace it).
        headers = options.get("headers") or {}
        fallback = wait_of(headers.get(WAIT_HEADER), options.get("retries")) is not None
        state = AT_RETRY if retry and not fallback else AT_PUBLISH
        bound = locking.bound(app)
        job = bound.space.named(name, self.message_permits)
        try:
            reply = job.take(task_id, lease, info=info, state=state)
            if not reply.acquired and (
                free_revoked_holder(task, job, reply.holder)
                or (
                    self.debounce is not None
                    and not retry
                    and self.debounce.replace(task, job, reply.holder, by=task_id)
                )
            ):
                reply = job.take(task_id, lease, info=info, state=state)
        except LockBackendError as exc:
            proceed_without_lock(log, task, "publishing", exc)
            # the header marks the message as handled (install()'s receiver must not try again)
            return send(task_id, _with_lock(options, MessageLock(name)))
        if not reply.acquired and retry:
            # a retry of a run that holds no lock (a duplicate retrying): sent, or the job is lost
            return send(task_id, options)
        if not reply.acquired:
            return self.duplicate_publish(task, job, task_id, options, reply, has_callbacks)
        lock = MessageLock(name, _sent_prefix(bound), self.message_permits)
        try:
            return send(task_id, _with_lock(options, lock))
        except BaseException:
            # Nothing was sent: no lock for a message that does not exist (resent while Redis
            # fails, for as long as that lock could live).
            try:
                job.release(task_id, holds=1, retry_for=lease)
            except LockBackendError as exc:
                log.error(
                    "could not undo the publish lock %s yet (%s); retrying in the background",
                    job.keys[0].lock,
                    exc,
                )
            raise

    def duplicate_publish(
        self,
        task: Any,
        job: NamedLock,
        task_id: str,
        options: dict[str, Any],
        reply: AcquireReply,
        has_callbacks: bool,
    ) -> Any:
        """A duplicate publish: return the holder's result, or raise; a canvas member records
        its own id as failed (its canvas must end, never wait for a message never sent)."""
        ttl = max(reply.lease_left, 0.0)
        key = job.keys[0].lock
        cooldown = refusal_reason(task, self.cooldown, job, reply.holder) == "cooldown"
        log.info(
            "not publishing %s: a duplicate of task %s, which holds %s (%.1f s left%s)",
            task.name,
            reply.holder,
            key,
            ttl,
            " of its cooldown" if cooldown else "",
        )
        in_canvas = canvas_member(options)
        by_worker = in_canvas and sent_by_worker(task.app, options)
        if in_canvas and not by_worker and chord_member_of(options):
            report_duplicate(task, "raised")
            refuse_chord_member(task, options, reply.holder, ttl, key)
        # Raised inside a worker's chain step, it would fail the task before it instead.
        raising = self.options.lock_on_duplicate == "raise" and not by_worker
        report_duplicate(task, "raised" if raising else "returned")
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

    def take_for_message(
        self, task: Any, task_id: str, args: Any, kwargs: Any, headers: dict[str, Any]
    ) -> None:
        """The lock of a message sent by name (``before_task_publish``): taken when free and
        named in its headers; a duplicate is only logged (the worker's check skips it)."""
        locking, app = task.locking, task.app
        try:
            name = self.message_lock(locking.lock_name(task.name, args, kwargs))
            self.check_rate(task, name, args, kwargs)
            lease = queue_lease(locking.queue_ttl(app), headers)
            bound = locking.bound(app)
            job = bound.space.named(name, self.message_permits)
            info = holder_info(task.name, task_id, self.message_permits)
            reply = job.take(task_id, lease, info=info, state=AT_PUBLISH)
        except (LockBackendError, MisconfiguredError, TypeError, ValueError) as exc:
            log.error("could not take the publish lock of %s[%s]: %s", task.name, task_id, exc)
            return
        # The lock goes with the message either way: the worker checks that same lock.
        MessageLock(name, _sent_prefix(bound), self.message_permits).put_in(headers)
        if not reply.acquired:
            log.warning(
                "%s[%s] was published by name (send_task or beat) while task %s holds %s; it "
                "cannot be stopped at publish: the worker skips it if that job still holds the "
                "lock when it arrives",
                task.name,
                task_id,
                reply.holder,
                job.keys[0].lock,
            )

    def take(self, at: Attempt) -> TaskRun:
        self.skip_if_replaced(at)
        return self.take_run(at)

    def take_run(self, at: Attempt) -> TaskRun:
        """The run takes the job's lock (or, with ``lock_release_on_start``, lets its publish's
        hold go), once its message is known to be the job's."""
        if not self.options.lock_release_on_start:
            return super().take(at)
        job = self.job_of(at)
        if not job.release(at.request.id).owned and self.debounce is not None:
            holder = job.holder()
            if holder and holder != at.request.id:
                skip_replaced(at.task, at.request, job.keys[0].lock, holder)
        return TaskRun(at.task, None)


def _sent_prefix(bound: Bound) -> str | None:
    """The prefix a message's headers name: none when it is the app's own (a drop-in's is sent)."""
    prefix = bound.space.prefix
    return None if prefix == bound.config.prefix else prefix


def _with_lock(options: dict[str, Any], lock: MessageLock) -> dict[str, Any]:
    headers = dict(options.get("headers") or {})
    lock.put_in(headers)
    options["headers"] = headers
    return options
