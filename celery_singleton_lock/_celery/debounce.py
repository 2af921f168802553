"""Debounce (``lock_debounce``): a call runs some seconds after the last call of its job.

Each publish is sent with that delay as its countdown and holds its job's message lock (the
job's lock with ``lock_at="publish"``, its queued lock with ``"queue"``) as any publish does.
A publish that finds that lock held by a message still waiting *replaces* it: the waiting
message's hold is force-released (only while it is still a queued hold, checked again in
Redis) and the new call takes the lock and is sent. The replaced message still arrives; its
run finds that it no longer holds its message lock and is skipped (state ``SKIPPED``, reason
``"replaced"``, and the id of the task that replaced it).

A job already running is not replaced: with ``"publish"`` the call gets the running job back
(the call came too late for it); with ``"queue"`` the call waits as the one queued copy and
runs after it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import Ignore

from .._errors import LockBackendError
from .._lock import LockSpace
from .info import HoldState, release_if_in
from .locking import store_skipped
from .observer import get_observer

__all__ = ["REPLACED", "replace_waiting", "skip_replaced"]

log = logging.getLogger("celery_singleton_lock.debounce")

#: the ``reason`` a replaced message's run records with its SKIPPED state
REPLACED = "replaced"


def replace_waiting(task: Any, space: LockSpace, name: str, holder: str, by: str) -> bool:
    """Free ``name`` from ``holder`` if that hold is a message still waiting (not a run, not a
    cooldown), so the call ``by`` can take it; returns whether it was freed."""
    if not release_if_in(space, name, holder, (HoldState.QUEUED,)):
        return False  # a run holds it (or its cooldown): nothing waits to be replaced
    locking = task.locking
    if locking.options.lock_at == "queue":
        # A copy that waits beside the running job (see .wake) learns it was replaced from
        # its record, when its wake or fallback starts, and no run's end wakes it again.
        try:
            space.named(locking.run_lock(name)).replace_waiter(holder, by)
        except LockBackendError as exc:  # its message finds its queued lock gone instead
            log.warning("could not mark task %s as replaced by %s: %s", holder, by, exc)
    log.info(
        "%s: task %s replaces task %s, which was still waiting (lock_debounce)",
        task.name,
        by,
        holder,
    )
    observer = get_observer()
    if observer is not None:
        observer.duplicate(task.name, "replaced")
    return True


def skip_replaced(task: Any, request: Any, key: str, by: str) -> None:
    """End the run of a message whose call was replaced by a later one (task ``by``)."""
    log.info(
        "skipped %s[%s]: replaced by task %s, a later call within lock_debounce (lock %s)",
        task.name,
        request.id,
        by,
        key,
    )
    store_skipped(task, request, {"replaced_by": by, "lock": key, "reason": REPLACED})
    raise Ignore()
