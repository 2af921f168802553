"""``lock_at="queue"``: a refused queued copy writes a *wait record* beside the job's lock while it
is held (checked in the same step) and its message ends; the run that ends releases first, reads
the records after, and sends each copy's message again (its *wake*). A *fallback* retry, due
when the lease would free, covers a holder that dies without a word; the first of the two to
start claims the wait (:data:`WAIT_HEADER`) and runs the copy.
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
from ..._lock import (
    AcquireReply,
    NamedLock,
    ReentrantLock,
    Script,
    Semaphore,
    check_lease_ms,
    lease_seconds,
    text,
)
from ..hold import HEADER, store_retry
from ..parts import skip_replaced

log = logging.getLogger("celery_singleton_lock.run")

#: the message header of a queued copy's wake and fallback: ``token.mark.retries``
WAIT_HEADER = "singleton_lock_wait"

#: seconds after the lease would run out that a fallback comes back (to find it gone)
FALLBACK_MARGIN = 0.1

#: a copy that finds a slot free and loses it this many times waits anyway, woken at once
PARK_TRIES = 3


# -- the wait records: a hash beside permit 1 (``<lock key>:wait``, in the lock's hash tag),
# each call one script (lua/wait_*.lua) run in NamedLock.operation

#: :func:`claim_waiter`'s answers: claimed; waits no more; claimed by another; replaced
CLAIMED, WAIT_OVER, CLAIMED_ELSEWHERE, WAIT_REPLACED = 1, 0, 2, 3
#: the kind of records (:meth:`LockKeys.records`) a lock's waiters keep beside it
WAITERS = "wait"

# Each safe to resend: a second run changes nothing.
WAIT_PARK = Script("wait_park.lua")
WAIT_CLAIM = Script("wait_claim.lua")
WAIT_END = Script("wait_end.lua")
WAIT_MARK = Script("wait_mark.lua")


class WaitReply(NamedTuple):
    """What :func:`add_waiter` did."""

    #: the record was written: every permit was held (or the write was forced)
    waiting: bool
    #: seconds left on the lease that frees first (0.0: a permit is free, -1.0: no lease)
    lease_left: float = 0.0

    def __bool__(self) -> bool:
        return self.waiting


def _run(job: NamedLock, script: Script, what: str, keys: tuple[str, ...], *args: Any) -> Any:
    with job.operation(what) as client:
        return script(client, (job.keys[0].records(WAITERS), *keys), args)


def add_waiter(
    job: NamedLock, waiter: str, record: str, keep: float, *, force: bool = False
) -> WaitReply:
    """Write ``waiter``'s ``record`` beside ``job``'s lock while every permit is held (``force``:
    even when one is free), kept at least ``keep`` seconds. A holder that ends releases first
    and reads after: either this finds a permit free or that read finds the record."""
    keep_ms = check_lease_ms(keep)
    locks = tuple(keys.lock for keys in job.keys)
    flag = "1" if force else ""
    code, pttl = _run(job, WAIT_PARK, "write a waiter beside", locks, waiter, record, keep_ms, flag)
    return WaitReply(int(code) == 1, lease_seconds(pttl))


def claim_waiter(job: NamedLock, waiter: str, token: str, mark: str) -> tuple[int, str]:
    """Claim the wait ``token`` of ``waiter`` for ``mark``: :data:`CLAIMED` (``"again"`` when
    this mark claimed it before), or another answer (and who replaced the waiter)."""
    code, by = _run(job, WAIT_CLAIM, "claim a wait beside", (), waiter, token, mark)
    return int(code), text(by)


def replace_waiter(job: NamedLock, waiter: str, by: str) -> bool:
    """Mark ``waiter`` replaced by ``by`` (``False``: it had no record)."""
    return bool(int(_run(job, WAIT_MARK, "mark a waiter beside", (), waiter, by)))


def waiters(
    job: NamedLock, *, drop: str = "", token: str = "", claim: str = "", listing: bool = True
) -> dict[str, str]:
    """The records of the unclaimed waiters (with ``listing``), after dropping the record of
    ``drop`` if it is still the wait ``token`` or its ``claim``."""
    flag = "1" if listing else ""
    reply = _run(job, WAIT_END, "read the waiters beside", (), drop, token, claim, flag)
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


class Wait(NamedTuple):
    """The wait a queued copy's message carries: the wait's token and the message's mark."""

    token: str
    mark: str

    @property
    def claim(self) -> str:
        """The record once this message claimed the wait (lua/wait_claim.lua)."""
        return f"!{self.token} {self.mark}"


def _header(token: str, mark: str, retries: Any) -> str:
    return f"{token}.{mark}.{int(retries or 0)}"


def wait_of(value: Any, retries: Any) -> Wait | None:
    """The wait a message's :data:`WAIT_HEADER` names, if sent with the retry count it has (a
    retry of the copy's own run copies the header along, and waits for nothing)."""
    if not isinstance(value, str):
        return None
    token, _, rest = value.partition(".")
    mark, _, sent_with = rest.partition(".")
    if not token or not mark or sent_with != str(int(retries or 0)):
        return None
    return Wait(token, mark)


def request_wait(request: Any) -> Wait | None:
    """The wait the message of ``request`` (a task's request Context) carries."""
    return wait_of(request.get(WAIT_HEADER), getattr(request, "retries", 0))


def claim_wait(task: Any, request: Any, job: NamedLock, queued_key: str, wait: Wait) -> bool:
    """Go on only if this message claims the copy's wait (``True``: it had claimed it before);
    else end it: as replaced (SKIPPED) when a later call replaced the copy, else unrun."""
    code, by = claim_waiter(job, request.id, wait.token, wait.mark)
    if code == CLAIMED:
        return by == "again"
    if code == WAIT_REPLACED:
        skip_replaced(task, request, queued_key, by)
    log.info(
        "%s[%s]: this message of the queued copy ends unrun: %s",
        task.name,
        request.id,
        "the copy waits no more" if code == WAIT_OVER else "its other message runs the copy",
    )
    raise Ignore()


def _payload(task: Any, request: Any, retries: int, headers: dict[str, Any]) -> str:
    """The copy's message as a wake sends it again: its retry's signature, serialized with the
    task's serializer, base64."""
    sig = task.signature_from_request(request, retries=retries, headers=headers)
    content_type, encoding, body = dumps(dict(sig), serializer=task.serializer)  # type: ignore[no-untyped-call]  # kombu: unannotated
    raw = body.encode(encoding) if isinstance(body, str) else body
    return f"{content_type}\n{encoding}\n{base64.b64encode(raw).decode('ascii')}"


def wait_for_run(
    task: Any, request: Any, job: NamedLock, lock: ReentrantLock | Semaphore, refusal: AcquireReply
) -> None:
    """The job runs: wait beside its lock for the run to end, as the job's one queued copy:
    store ``RETRY``, send the fallback, write the wait record and end the message (``Ignore``).
    Returns instead when a slot was found free meanwhile and taken."""
    locking, app, retries = task.locking, task.app, request.retries + 1
    headers = {k: v for k, v in (request.headers or {}).items() if k != WAIT_HEADER}
    token = uuid.uuid4().hex
    record = f"{token}\n{_payload(task, request, retries, headers)}"
    countdown = locking.options.lock_retry_countdown
    if not countdown:
        lease, left = locking.bound(app).ttl, refusal.lease_left
        countdown = (lease if left < 0 else min(left, lease)) + FALLBACK_MARGIN
    headers[WAIT_HEADER] = _header(token, uuid.uuid4().hex, retries)
    # RETRY first: a wake may run the copy elsewhere at once, and its SUCCESS must be last.
    store_retry(task, request)
    # The fallback before the record: its publish re-enters the queued lock, which must happen
    # before any wake can run the copy (and let that lock go).
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
    keep = countdown + locking.queue_ttl(app)
    for attempt in range(PARK_TRIES):
        parked = add_waiter(job, request.id, record, keep, force=attempt == PARK_TRIES - 1)
        if parked:
            if parked.lease_left == 0:
                # written although a slot is free: woken now, to try again from the queue
                _send_wake(task, job.name, record)
            break
        if lock.try_acquire().acquired:  # the run ended just now: try again at once
            return
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
    task: Any, job: NamedLock, task_id: str, wait: Wait | None, countdown: float, wake: bool = True
) -> None:
    """A run of ``job`` let its lock (or slot) go just before: send every waiting copy's message
    again (``wake``), in ``countdown`` seconds (a cooldown), and drop ``task_id``'s own record
    of ``wait`` (alone, without ``wake``: the copy whose wait it claimed will not run). Never
    raises: a copy not woken comes back by its fallback."""
    drop, token, claim = ("", "", "") if wait is None else (task_id, wait.token, wait.claim)
    try:
        waiting = waiters(job, drop=drop, token=token, claim=claim, listing=wake)
    except LockBackendError as exc:
        if wake:
            log.warning(
                "could not read the copies waiting for %s (%s); they come back by their "
                "fallback, within a lease",
                job.keys[0].lock,
                exc,
            )
        else:
            log.warning(
                "could not drop the wait record of task %s beside %s: %s", task_id, job.name, exc
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
    """Send the copy that ``record`` describes again, now or in ``countdown`` seconds."""
    app = task.app
    token, content_type, encoding, body = record.split("\n", 3)
    raw = base64.b64decode(body)
    # only a serializer the app accepts from its broker is read back
    accept = prepare_accept_content(app.conf.accept_content)  # type: ignore[no-untyped-call]  # kombu: unannotated
    text = raw if encoding == "binary" else raw.decode(encoding)
    data = loads(text, content_type, encoding, accept=accept)  # type: ignore[no-untyped-call]  # kombu: unannotated
    sig = Signature(data, app=app)
    target = task if sig.task == task.name else app.tasks[sig.task]
    options = dict(sig.options)
    headers = dict(options.get("headers") or {})
    headers[HEADER] = target.locking.mode.message_lock(name)
    headers[WAIT_HEADER] = _header(token, uuid.uuid4().hex, options.get("retries"))
    options["headers"] = headers
    if countdown > 0:
        options["countdown"] = countdown + FALLBACK_MARGIN
    # Celery's own apply_async: the copy's queued lock is its already
    Task.apply_async(target, sig.args, sig.kwargs, **options)
    log.info("woke %s[%s]: the run it waited for ended", sig.task, options.get("task_id"))
