"""``lock_at="queue"``: a queued copy that finds its job running waits beside the job's lock,
and the run wakes it as it ends.

A refused copy writes a *wait record* beside the lock (``<job lock key>:wait``, a hash in the
lock's hash tag: task id -> wait token and the copy's message), only while the lock is still
held, checked in the same step (lua/wait_park.lua), and its message ends: it occupies no pool
process while it waits. A run of the job that ends releases its lock (or slot) first and
reads the records after (one round trip, lua/wait_end.lua), then sends each waiting copy's
message again at once: its *wake*. Either the copy's check saw the lock free (it tries again
at once) or the run's read saw the record: no end goes unseen.

The copy also sends itself a *fallback*: the retry it always sent, delayed until about when
the lease that frees first would run out (never more than a lease), for a holder that dies
without a word (its whole worker killed). Both carry the wait token in :data:`WAIT_HEADER`,
each with a mark of its own; the first to start claims the wait (lua/wait_claim.lua) and runs
the copy, any other ends without a trace (no state stored: the copy's result stays the
copy's). The claim stays in the record until that run ends, so a redelivery of the message
that claimed it (``acks_late``) claims it again.
"""

from __future__ import annotations

import base64
import logging
import uuid
from typing import Any, NamedTuple

from celery import Task
from celery.canvas import Signature
from celery.exceptions import Ignore, Reject
from kombu.serialization import dumps, loads, prepare_accept_content

from ..._errors import LockBackendError
from ..._lock import AcquireReply, NamedLock, ReentrantLock, Semaphore
from ..hold import HEADER, store_retry
from ..parts import skip_replaced
from .waiters import CLAIMED, WAIT_OVER, WAIT_REPLACED, add_waiter, claim_waiter, waiters

__all__ = [
    "WAIT_HEADER",
    "Wait",
    "claim_wait",
    "end_claim",
    "request_wait",
    "wait_for_run",
    "wait_of",
    "wake_waiting",
]

log = logging.getLogger("celery_singleton_lock.run")

#: the message header of a queued copy's wake and fallback: ``token.mark.retries``
WAIT_HEADER = "singleton_lock_wait"

#: the fallback comes back this long (seconds) after the lease it waits for would run out, so
#: it finds that lease gone rather than about to go
FALLBACK_MARGIN = 0.1

#: a copy that finds a slot free, and then loses it again, this many times in a row waits
#: anyway, woken at once: a bound, not a busy loop
PARK_TRIES = 3


class Wait(NamedTuple):
    """The wait a message of a queued copy carries: the wait's token and the message's mark."""

    token: str
    mark: str

    @property
    def claim(self) -> str:
        """The record once this message claimed the wait (see lua/wait_claim.lua)."""
        return f"!{self.token} {self.mark}"


def _new_id() -> str:
    return uuid.uuid4().hex


def _header(token: str, mark: str, retries: Any) -> str:
    return f"{token}.{mark}.{int(retries or 0)}"


def wait_of(value: Any, retries: Any) -> Wait | None:
    """The wait a message's :data:`WAIT_HEADER` names, if it is one of the copy's own
    messages: sent with the retry count it has (a retry of the copy's own run, which copies
    the message's headers along, has another, and waits for nothing)."""
    if not isinstance(value, str):
        return None
    token, _, rest = value.partition(".")
    mark, _, sent_with = rest.partition(".")
    if not token or not mark or sent_with != str(int(retries or 0)):
        return None
    return Wait(token, mark)


def request_wait(request: Any) -> Wait | None:
    """The wait the message of ``request`` (a task's request Context) carries."""
    get = getattr(request, "get", None)
    if get is None:
        return None
    return wait_of(get(WAIT_HEADER), getattr(request, "retries", 0))


def claim_wait(task: Any, request: Any, job: NamedLock, queued_key: str, wait: Wait) -> bool:
    """Go on only if this message claims the copy's wait (``True``: it had claimed it before,
    and is delivered again); else end it: as replaced (SKIPPED) when a later call replaced the
    copy while it waited (``lock_debounce``), else without a trace (its other message runs
    the copy, or ran it, or the copy's wait was dropped)."""
    code, again = claim_waiter(job, request.id, wait.token, wait.mark)
    if code == CLAIMED:
        return again == "again"
    by = again
    if code == WAIT_REPLACED:
        skip_replaced(task, request, queued_key, by)
    log.info(
        "%s[%s]: this message of the queued copy ends unrun: %s",
        task.name,
        request.id,
        "the copy waits no more" if code == WAIT_OVER else "its other message runs the copy",
    )
    raise Ignore()


def end_claim(job: NamedLock, task_id: str, wait: Wait) -> None:
    """The copy whose wait this message claimed (or was woken for) will not run: drop its
    record. Best effort: a record left behind ends with the records' lifetime."""
    try:
        waiters(job, drop=task_id, token=wait.token, claim=wait.claim, listing=False)
    except LockBackendError as exc:
        log.warning(
            "could not drop the wait record of task %s beside %s: %s", task_id, job.name, exc
        )


def _payload(task: Any, request: Any, retries: int, headers: dict[str, Any]) -> str:
    """The copy's message as a wake sends it again: the signature of its retry (same task id,
    arguments and options), serialized with the task's serializer, base64 (any client
    decodes it, a pickled one too)."""
    sig = task.signature_from_request(request, retries=retries, headers=headers)
    content_type, encoding, body = dumps(dict(sig), serializer=task.serializer)  # type: ignore[no-untyped-call]  # kombu: unannotated
    raw = body.encode(encoding) if isinstance(body, str) else body
    return f"{content_type}\n{encoding}\n{base64.b64encode(raw).decode('ascii')}"


def wait_for_run(
    task: Any,
    request: Any,
    job: NamedLock,
    lock: ReentrantLock | Semaphore,
    refusal: AcquireReply,
) -> AcquireReply:
    """The job runs (``refusal``: the lock's answer): wait beside its lock for the run to end,
    as the job's one queued copy.

    Stores the copy's ``RETRY`` state, sends its fallback, a retry that keeps the queued lock
    (it does not count against ``max_retries``), then writes its wait record and ends the
    message (``Ignore``: nothing is stored after the record, which a wake may act on at once).
    Returns the lock's reply instead when a slot was found free meanwhile and taken (the
    fallback, sent already, then finds no wait to claim and ends unrun)."""
    locking = task.locking
    options = locking.options
    app = task.app
    lease = locking.bound(app).ttl
    retries = request.retries + 1
    headers = {k: v for k, v in (request.headers or {}).items() if k != WAIT_HEADER}
    token = _new_id()
    record = f"{token}\n{_payload(task, request, retries, headers)}"
    if options.lock_retry_countdown:
        countdown = options.lock_retry_countdown
    else:
        left = lease if refusal.lease_left < 0 else min(refusal.lease_left, lease)
        countdown = left + FALLBACK_MARGIN
    headers[WAIT_HEADER] = _header(token, _new_id(), retries)
    # Its RETRY state first: a wake may run the copy elsewhere as soon as the record is written
    # (or the fallback sent), and its SUCCESS must be the last state stored (see store_retry).
    store_retry(task, request)
    # The fallback goes first: its publish enters the queued lock again, which must happen
    # before any wake can run the copy (and let that lock go), never after.
    ending: Ignore | Reject = Ignore()
    try:
        task.retry(countdown=countdown, max_retries=retries, headers=headers, throw=False)
    except Reject as exc:  # not sent: the wait record alone brings the copy back
        log.warning(
            "%s[%s]: its fallback could not be sent (%s); it comes back when the run ends",
            task.name,
            request.id,
            exc.reason,
        )
        ending = exc
    # The record outlives the fallback's countdown by as long as a queued message's hold does.
    keep = countdown + locking.queue_ttl(app)
    for attempt in range(PARK_TRIES):
        parked = add_waiter(job, request.id, record, keep, force=attempt == PARK_TRIES - 1)
        if parked:
            if parked.lease_left == 0:
                # Written although a slot is free (lost to another taker each time): its wake
                # goes now, so it tries again from the queue, not from this pool process.
                _send_wake(task, job.name, record)
            break
        reply = lock.try_acquire()  # the run ended just now: try again at once
        if reply.acquired:
            return reply
    log.info(
        "%s[%s] waits for the run of its job (lock %s) to end; it comes back then, or in "
        "%.1f s at the latest",
        task.name,
        request.id,
        job.keys[0].lock,
        countdown,
    )
    raise ending


def wake_waiting(
    task: Any,
    job: NamedLock,
    task_id: str = "",
    wait: Wait | None = None,
    *,
    wake: bool = True,
    countdown: float = 0.0,
) -> None:
    """A run of the job ``name`` let go of its lock (or slot) just before: send every waiting
    copy's message again now (``wake``), and drop the record of ``task_id``'s own wait
    ``wait`` (this run was that copy, or that copy ends unrun). ``countdown``: the job stays
    taken that long yet (a cooldown): the copies come back as it ends. One round trip, plus
    one publish per copy woken; never raises (a copy not woken comes back by its fallback)."""
    try:
        waiting = waiters(
            job,
            drop=task_id if wait is not None else "",
            token=wait.token if wait is not None else "",
            claim=wait.claim if wait is not None else "",
            listing=wake,
        )
    except LockBackendError as exc:
        log.warning(
            "could not read the copies waiting for %s (%s); they come back by their fallback, "
            "within a lease",
            job.keys[0].lock,
            exc,
        )
        return
    for waiter, record in waiting.items():
        try:
            _send_wake(task, job.name, record, countdown)
        except Exception as exc:  # the fallback still runs the copy
            log.warning(
                "could not wake task %s, which waits for %s (%s: %s); it comes back by its "
                "fallback, within a lease",
                waiter,
                job.keys[0].lock,
                type(exc).__name__,
                exc,
            )


def _send_wake(task: Any, name: str, record: str, countdown: float = 0.0) -> None:
    """Send the copy that ``record`` describes (see :func:`_payload`) again, now or (a
    cooldown) as the lock frees in ``countdown`` seconds."""
    app = task.app
    token, content_type, encoding, body = record.split("\n", 3)
    raw = base64.b64decode(body)
    # Only a serializer the app accepts from its broker is read back.
    accept = prepare_accept_content(app.conf.accept_content)  # type: ignore[no-untyped-call]  # kombu: unannotated
    text = raw if encoding == "binary" else raw.decode(encoding)
    data = loads(text, content_type, encoding, accept=accept)  # type: ignore[no-untyped-call]  # kombu: unannotated
    sig = Signature(data, app=app)
    target = task if sig.task == task.name else app.tasks[sig.task]
    options = dict(sig.options)
    headers = dict(options.get("headers") or {})
    headers[HEADER] = target.locking.mode.message_lock(name)
    headers[WAIT_HEADER] = _header(token, _new_id(), options.get("retries"))
    options["headers"] = headers
    if countdown > 0:
        # a little after the cooldown's end: the copy finds it over rather than about to be
        options["countdown"] = countdown + FALLBACK_MARGIN
    # Celery's own apply_async: the copy's queued lock is its already (this is no new call).
    Task.apply_async(target, sig.args, sig.kwargs, **options)
    log.info("woke %s[%s]: the run it waited for ended", sig.task, options.get("task_id"))
