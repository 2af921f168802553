"""Messages a worker drops without running them: their publish-time locks are freed at once.

A worker that does not know a message's task (``task_unknown``: not registered there) or cannot
take its message (``task_rejected``: a content type it does not accept, an invalid message)
rejects the message without requeueing it: no run will ever enter or release the lock the
publisher took for it, which would otherwise keep the job locked (every later ``.delay()``
handed the dead task's id) for ``singleton_lock_queue_ttl``. The receivers below free that
lock from the worker's main process: the one the message's headers name (its prefix too: the
task may not be known here, and its class may keep its locks under a prefix of its own), only
while the dropped task's id holds it for a message that waits (queued, or requeued for a retry
or a redelivery; never a run's hold nor a cooldown), checked atomically in Redis.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from .client import lock_space
from .info import HoldState
from .locking import MessageLock

__all__ = ["connect_dropped_receivers"]

log = logging.getLogger("celery_singleton_lock.release")


def _release_dropped(consumer: Any, message: Any, why: str) -> None:
    headers = getattr(message, "headers", None) or {}
    lock, task_id = MessageLock.of(headers), headers.get("id")
    if lock is None or not (isinstance(task_id, str) and task_id):
        return  # not a message whose publisher took a lock (protocol 2 headers)
    app = getattr(consumer, "app", None)
    if app is None:
        return
    name = lock.name
    try:
        space = lock_space(app, lock.prefix)
        freed = space.named(name, lock.permits).force_release(
            holder=task_id, states=(HoldState.QUEUED, HoldState.REQUEUED)
        )
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
            space.keys(name).lock,
            task_id,
            why,
        )


def _on_task_unknown(
    sender: Any = None, message: Any = None, name: str = "", **kwargs: Any
) -> None:
    _release_dropped(sender, message, f"task {name!r} is not registered in this worker")


def _on_task_rejected(
    sender: Any = None, message: Any = None, exc: Any = None, **kwargs: Any
) -> None:
    _release_dropped(sender, message, f"message rejected: {exc!r}" if exc else "message rejected")


def connect_dropped_receivers() -> None:
    """Connect the worker's ``task_unknown`` and ``task_rejected`` receivers (idempotent)."""
    signals.task_unknown.connect(
        _on_task_unknown, weak=False, dispatch_uid="celery_singleton_lock.unknown"
    )
    signals.task_rejected.connect(
        _on_task_rejected, weak=False, dispatch_uid="celery_singleton_lock.rejected"
    )
