"""Canvas members (group, chord header, chain): what a deduplicated member does so that the
canvas around it ends instead of waiting for a message that was never sent.

Celery's canvas gives every member its task id before it sends anything (the group's, chord's
and chain's results are made of those ids) and drops what the member's ``apply_async``
returns. A publish-time duplicate sends nothing, so its id would stay PENDING forever, and
with it the GroupResult, the chain's result or the chord's callback. So a duplicate that is a
canvas member either

* raises at publish, when it is a chord header member sent by the caller
  (:func:`refuse_chord_member`): the chord cannot complete without it, whatever
  ``lock_on_duplicate`` says; the members this thread already sent to that header are revoked
  and their publish locks freed, so the chord is refused as a whole and can be sent again once
  deduplicated; or
* records its own id as failed with :class:`AlreadyQueuedError` (:func:`fail_member`), through
  the result backend's own failure path: the rest of its chain is marked failed, a chord it
  belongs to counts it as a failed part (its callback ends with ``ChordError``), and its slot in
  a GroupResult is ready. That is for group members, chain members and members sent by a
  worker (a chain's next step, a chord inside a chain), where no caller could catch a raise.

A run-time duplicate inside a chord header is the worker's side of the same problem: see
:func:`chord_member_of` and ``run._locked_out``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NoReturn

from celery import signals
from celery.app.task import Context

from .._errors import AlreadyQueuedError, ChordDuplicateError
from .client import lock_space
from .info import HoldState
from .locking import MessageLock

__all__ = [
    "CANVAS_OPTIONS",
    "ChordDuplicateError",
    "canvas_member",
    "chord_member_of",
    "fail_member",
    "refuse_chord_member",
    "sent_by_worker",
]

log = logging.getLogger("celery_singleton_lock.publish")

#: ``apply_async`` options that only Celery's canvas passes: the member's id was given to it
#: (frozen) before it was sent, and the canvas's result waits for that id
CANVAS_OPTIONS = ("group_id", "chord", "chain")

#: how many chord headers per thread keep the list of members sent to them (a header is sent
#: by one thread, member after member; a few allow for headers nested in headers)
_HEADERS_KEPT = 4


def canvas_member(options: Mapping[str, Any]) -> bool:
    """Whether these ``apply_async`` options are those of a canvas member (group, chord
    header, chain), whose id the canvas's result is already waiting for. An empty ``chain``
    counts: the last step of a chain is sent with one."""
    return any(options.get(name) is not None for name in CANVAS_OPTIONS)


def chord_member_of(options_or_request: Any) -> bool:
    """Whether a member belongs to a chord header: the header's counter counts it, so it
    must report (succeed or fail), never just vanish. Takes ``apply_async`` options or a
    worker request (both carry ``chord``, the callback's signature)."""
    getter = getattr(options_or_request, "get", None)
    return getter is not None and getter("chord") is not None


def sent_by_worker(app: Any, options: Mapping[str, Any]) -> bool:
    """Whether Celery's tracer is sending this member as the next step of the task running
    in this worker (a chain step or callback: it passes ``parent_id``). An exception there
    reaches no caller: Celery records it as the failure of that task, whose body succeeded."""
    parent_id = options.get("parent_id")
    if not parent_id:
        return False
    current = app.current_worker_task
    return current is not None and current.request.id == parent_id


def fail_member(
    task: Any, task_id: str, options: Mapping[str, Any], error: AlreadyQueuedError
) -> None:
    """Record the unsent member ``task_id`` as failed with ``error``, through the backend's
    ``mark_as_failure``, so Celery ends the canvas around it as for a member that failed:
    the rest of its chain fails too, a chord counts it as a failed part. On a backend error
    the duplicate is still not sent (the canvas then waits, as it would without this)."""
    request = Context(
        id=task_id,
        task=task.name,
        chain=options.get("chain"),
        chord=options.get("chord"),
        group=options.get("group_id"),
        group_index=options.get("group_index"),
        root_id=options.get("root_id"),
        parent_id=options.get("parent_id"),
        errbacks=None,
    )
    try:
        task.backend.mark_as_failure(task_id, error, request=request, call_errbacks=False)
    except NotImplementedError:  # no result backend: nothing waits on results anyway
        return
    except Exception as exc:
        log.error(
            "could not record %s[%s], a duplicate of task %s, as failed: %r; its canvas "
            "(group, chain or chord) will wait for it",
            task.name,
            task_id,
            error.task_id,
            exc,
        )


# -- the members a thread has sent to a chord header -----------------------------------------

_local = threading.local()


def _sent_headers() -> OrderedDict[str, list[tuple[str, MessageLock]]]:
    headers: OrderedDict[str, list[tuple[str, MessageLock]]] | None = getattr(
        _local, "headers", None
    )
    if headers is None:
        headers = _local.headers = OrderedDict()
    return headers


def _after_publish(
    sender: Any = None,
    body: Any = None,
    headers: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    """Note each publish-locked chord header member this thread sends (its task id and
    lock), so a duplicate met later in the same header can revoke them."""
    lock = MessageLock.of(headers)
    if lock is None or headers is None:
        return
    group_id, task_id = headers.get("group"), headers.get("id")
    if not (isinstance(group_id, str) and isinstance(task_id, str)):
        return
    try:
        embed = body[2]
    except (TypeError, IndexError, KeyError):
        return
    if not isinstance(embed, Mapping) or embed.get("chord") is None:
        return
    sent = _sent_headers()
    if group_id in sent:
        sent.move_to_end(group_id)
    else:
        sent[group_id] = []
        while len(sent) > _HEADERS_KEPT:
            sent.popitem(last=False)
    sent[group_id].append((task_id, lock))


signals.after_task_publish.connect(
    _after_publish, weak=False, dispatch_uid="celery_singleton_lock.canvas"
)


def refuse_chord_member(
    task: Any, options: Mapping[str, Any], holder: str, ttl: float, key: str
) -> NoReturn:
    """A publish-time duplicate in a chord header, sent by the caller: revoke the members
    this thread already sent to that header (and free their publish locks, unless their run
    has started), then raise :class:`ChordDuplicateError`."""
    group_id = options.get("group_id")
    sent = _sent_headers().pop(group_id, []) if isinstance(group_id, str) else []
    revoked: list[str] = []
    if sent:
        app = task.app
        ids = [task_id for task_id, _ in sent]
        try:
            app.control.revoke(ids)
            revoked = ids
        except Exception as exc:
            log.error("could not revoke the members already sent to chord %s: %r", group_id, exc)
        for task_id, lock in sent:
            try:
                # Each member's own lock space: the members may be tasks of other classes.
                space = lock_space(app, lock.prefix)
                space.named(lock.name, lock.permits).force_release(
                    holder=task_id, states=(HoldState.QUEUED,)
                )
            except Exception as exc:  # the lock frees itself when its queue lease ends
                log.error("could not free %s of revoked task %s: %r", lock.name, task_id, exc)
    in_header = any(task_id == holder for task_id, _ in sent)
    log.warning(
        "chord %s not sent: %s is a duplicate of task %s in its header (%d member(s) sent "
        "before it revoked)",
        group_id,
        task.name,
        holder,
        len(revoked),
    )
    raise ChordDuplicateError(holder, ttl, key, tuple(revoked), in_header)
