"""A deduplicated canvas member (group, chord header, chain) ends its canvas instead of leaving
it PENDING for ever (Celery gives members their ids before sending and drops what
``apply_async`` returns). A chord header member sent by the caller raises
(:func:`refuse_chord_member`, the members already sent revoked); any other records its id as
failed (:func:`fail_member`). A run-time duplicate in a chord header fails too (:mod:`.conflict`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NoReturn

from celery.app.task import Context

from .._errors import AlreadyQueuedError, ChordDuplicateError
from .config import LockConfig
from .hold import MessageLock
from .lifecycle import HoldState

log = logging.getLogger("celery_singleton_lock.publish")

#: chord headers per thread whose sent members are kept (a few: headers nested in headers)
_HEADERS_KEPT = 4


def canvas_member(options: Mapping[str, Any]) -> bool:
    """Whether ``apply_async`` options are a canvas member's (an empty ``chain`` counts): options
    only Celery's canvas passes (its result waits for the member's id)."""
    return any(options.get(name) is not None for name in ("group_id", "chord", "chain"))


def chord_member_of(options_or_request: Any) -> bool:
    """Whether ``apply_async`` options or a worker request are a chord header member's."""
    getter = getattr(options_or_request, "get", None)
    return getter is not None and getter("chord") is not None


def sent_by_worker(app: Any, options: Mapping[str, Any]) -> bool:
    """Whether the tracer sends this member as the next step of the task running here (an
    exception there would fail that task, whose body succeeded)."""
    parent_id = options.get("parent_id")
    if not parent_id:
        return False
    current = app.current_worker_task
    return current is not None and current.request.id == parent_id


def fail_member(
    task: Any, task_id: str, options: Mapping[str, Any], error: AlreadyQueuedError
) -> None:
    """Record the unsent member ``task_id`` as failed with ``error``: its canvas ends."""
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


#: ``.headers``: this thread's chord headers -> the (task id, lock) of the members it sent
_sent = threading.local()


def note_chord_member(
    sender: Any = None,
    body: Any = None,
    headers: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    """``after_task_publish``: note the locked chord header members this thread sends, for
    :func:`refuse_chord_member` to revoke."""
    if headers is None:
        return
    # Cheapest test first: every publish comes here, few in a group.
    group_id, task_id = headers.get("group"), headers.get("id")
    if not (isinstance(group_id, str) and isinstance(task_id, str)):
        return
    lock = MessageLock.of(headers)
    if lock is None:
        return
    try:
        embed = body[2]
    except (TypeError, IndexError, KeyError):
        return
    if not isinstance(embed, Mapping) or embed.get("chord") is None:
        return
    sent: OrderedDict[str, list[tuple[str, MessageLock]]]
    sent = vars(_sent).setdefault("headers", OrderedDict())
    sent.setdefault(group_id, []).append((task_id, lock))
    sent.move_to_end(group_id)
    while len(sent) > _HEADERS_KEPT:
        sent.popitem(last=False)


def refuse_chord_member(
    task: Any, options: Mapping[str, Any], holder: str, ttl: float, key: str
) -> NoReturn:
    """A publish-time duplicate in a chord header: revoke the members this thread sent to it
    (their locks freed), then raise :class:`ChordDuplicateError`."""
    group_id = options.get("group_id")
    sent = vars(_sent).get("headers", {}).pop(group_id, []) if isinstance(group_id, str) else []
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
                # Each member's own lock space (they may be tasks of other classes).
                job = LockConfig.of(app).space(lock.prefix).named(lock.name, lock.permits)
                job.force_release(holder=task_id, states=(HoldState.QUEUED,))
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
