"""Revoked tasks: their holds are freed at once, not when their lease runs out.

A task revoked while it runs or when a worker reaches its message is released by the worker's
main process (the ``task_revoked`` receiver below). A task revoked while its message waits is
marked REVOKED at once, but no worker may reach its message for a long time, or ever: a
duplicate that finds such a holder frees it (:func:`free_revoked_holder`).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals, states

from .._lock import LockSpace
from .info import HoldState, release_if_in
from .locking import HEADER
from .wake import request_wait
from .worker import release_for_request

__all__ = ["connect_revoke_receiver", "free_revoked_holder"]

log = logging.getLogger("celery_singleton_lock.release")


def free_revoked_holder(task: Any, space: LockSpace, name: str, holder: str) -> bool:
    """Free the queue hold of ``holder`` on ``name`` if that task was revoked while its
    message waited; returns whether it was freed.

    Until then a caller who has seen REVOKED and publishes the job again would be handed the
    revoked task's result, and a run-time duplicate would be skipped for a holder that will not
    run. Only a hold that no run has entered (queued, or requeued for a retry), only when the
    holder's state is REVOKED, and atomically (the force release checks the holder and the run
    token again in Redis), so a run that starts meanwhile keeps its lock. One extra read on a
    refused acquire; on any error the duplicate is handled as if the holder were alive."""
    try:
        freed = release_if_in(
            space,
            name,
            holder,
            (HoldState.QUEUED, HoldState.REQUEUED),
            lambda: task.backend.get_state(holder) == states.REVOKED,
        )
    except Exception as exc:
        log.debug("not freeing %s of revoked task %s: %r", name, holder, exc)
        return False
    if freed:
        log.info(
            "released %s: its holder, task %s, was revoked while queued",
            space.keys(name).lock,
            holder,
        )
    return freed


def _on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    if request is None:
        return
    release_for_request(
        sender,
        request.id,
        request.args,
        request.kwargs,
        request.get(HEADER) if hasattr(request, "get") else None,
        "revoke" + (" (terminated)" if kwargs.get("terminated") else ""),
        # a queued copy's wake or fallback: the copy will not run, its wait ends
        wait=request_wait(request),
    )


def connect_revoke_receiver() -> None:
    """Connect the worker's ``task_revoked`` receiver (idempotent)."""
    signals.task_revoked.connect(
        _on_task_revoked, weak=False, dispatch_uid="celery_singleton_lock.revoked"
    )
