"""Cooldown (``lock_cooldown``): after a run ends, its job's key stays taken for a while.

The run's hold is not released but *parked* for the cooldown: kept in Redis under the same
owner (the task id), not renewed, its run token cleared and its info saying "cooldown". Until
it runs out, a duplicate is refused as if that run were still going (``lock_on_locked`` at
run time; at publish the last job is returned), and the refusal's remaining lease is the
cooldown left. Nothing runs in the background: the lease ending is the end of the cooldown.
"""

from __future__ import annotations

import logging
from typing import Any

from .._errors import LockBackendError
from .._lock import LockSpace, ReentrantLock
from .info import HoldState, holder_info
from .observer import get_observer

__all__ = [
    "cooldown_after",
    "cooling_down",
    "refusal_reason",
    "start_cooldown",
]

log = logging.getLogger("celery_singleton_lock.cooldown")


def cooldown_after(task: Any, failed: bool) -> float | None:
    """The cooldown a run of ``task`` that ended (``failed``: raised, or its process died)
    starts, in seconds; ``None`` when none."""
    options = task.locking.options
    if options.lock_cooldown is None or (failed and not options.lock_cooldown_on_failure):
        return None
    seconds: float = options.lock_cooldown
    return seconds


def start_cooldown(task: Any, lock: ReentrantLock, seconds: float) -> bool:
    """Keep the run's hold on its job's lock for ``seconds`` more instead of releasing it;
    ``False`` when the hold was lost before (there is nothing to keep, or to release)."""
    try:
        kept = lock.park(seconds, holder_info(task.name, lock.owner), HoldState.COOLDOWN)
    except LockBackendError as exc:
        # The hold is no longer renewed either way: it ends with the cooldown if the park
        # ran, else with the rest of the run's lease. Neither leaves it for longer.
        log.error(
            "could not start the cooldown of %s after task %s (%s); the lock ends when its "
            "lease does (at most %.0f s from now)",
            lock.key,
            lock.owner,
            exc,
            max(seconds, lock.ttl),
        )
        return True
    if kept:
        log.info("%s cools down for %.1f s after task %s", lock.key, seconds, lock.owner)
    return kept


def cooling_down(space: LockSpace, name: str, holder: str, permits: int = 1) -> bool:
    """Whether ``holder`` holds ``name`` (one of its ``permits`` slots) for a cooldown, not
    for a queued or running job: one read, made only for a refusal of a task with a cooldown
    (to say so and count it)."""
    try:
        states = space.named(name, permits).inspect()
        for state in states:
            if state.holder == holder:
                return state.state == HoldState.COOLDOWN
    except Exception:  # a refusal is handled the same either way: do not fail it for this
        return False
    return False


def refusal_reason(task: Any, space: LockSpace, name: str, holder: str, permits: int) -> str:
    """Why a duplicate of ``task`` was refused the lock ``name`` (one of ``permits`` slots),
    held by ``holder``: ``"cooldown"`` (its last run ended less than ``lock_cooldown`` ago),
    ``"limit"`` (every one of its slots is taken) or ``"locked"``. The first two are counted
    in the metrics (``refusals_total{reason}``)."""
    if task.locking.options.lock_cooldown is not None and cooling_down(
        space, name, holder, permits
    ):
        reason = "cooldown"
    elif permits > 1:
        reason = "limit"
    else:
        return "locked"
    observer = get_observer()
    if observer is not None:
        observer.refused_by(task.name, reason)
    return reason
