"""The optional parts of a job's hold, made once per task class and asked by its mode.

* :class:`Cooldown` (``lock_cooldown``): a run that ends *parks* its hold for the cooldown (state
  ``cooldown``, unrenewed) instead of releasing it; a duplicate meanwhile is refused.
* :class:`Debounce` (``lock_debounce``): each call is sent that much later, and a call that finds
  its job's message still waiting (``queued``) *replaces* it: that hold is force-released and the
  new call takes it. The release writes a note, kept for as long as the replaced message may
  arrive, that ends its run ``SKIPPED`` (reason ``"replaced"``), even after its replacement ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NoReturn

from celery.exceptions import Ignore

from .._errors import LockBackendError
from .._lock import NamedLock, ReentrantLock
from .hold import holder_info, release_if_in, report_duplicate, report_refusal, store_skipped
from .lifecycle import AT_COOLDOWN, REPLACEABLE

log_cooldown = logging.getLogger("celery_singleton_lock.cooldown")
log_debounce = logging.getLogger("celery_singleton_lock.debounce")

#: the ``reason`` a replaced message's run records with its SKIPPED state
REPLACED = "replaced"


@dataclass(frozen=True, slots=True)
class Cooldown:
    """``lock_cooldown`` seconds after a run (a failed one too, unless
    ``lock_cooldown_on_failure=False``)."""

    seconds: float
    on_failure: bool

    def after(self, failed: bool) -> float | None:
        """The cooldown a run that ended starts (``failed``: it raised, or its process died)."""
        return None if failed and not self.on_failure else self.seconds

    def start(self, task_name: str, lock: ReentrantLock, seconds: float) -> bool:
        """Park the run's hold for ``seconds``; ``False`` when the hold was lost before."""
        try:
            kept = lock.park(seconds, holder_info(task_name, lock.owner), AT_COOLDOWN)
        except LockBackendError as exc:
            # unrenewed either way: it ends with the cooldown or the rest of the run's lease
            log_cooldown.error(
                "could not start the cooldown of %s after task %s (%s); the lock ends when its "
                "lease does (at most %.0f s from now)",
                lock.key,
                lock.owner,
                exc,
                max(seconds, lock.ttl),
            )
            return True
        if kept:
            log_cooldown.info(
                "%s cools down for %.1f s after task %s", lock.key, seconds, lock.owner
            )
        return kept


def refusal_reason(task: Any, cooldown: Cooldown | None, job: NamedLock, holder: str) -> str:
    """Why a duplicate was refused ``job`` held by ``holder``: ``"cooldown"``, ``"limit"``
    (every slot taken) or ``"locked"``; the first two are counted (``refusals_total``)."""
    try:
        cooling = cooldown is not None and any(
            s.holder == holder and s.state == AT_COOLDOWN for s in job.inspect()
        )
    except Exception:  # a read that fails says no
        cooling = False
    if cooling:
        reason = "cooldown"
    elif job.permits > 1:
        reason = "limit"
    else:
        return "locked"
    report_refusal(task, reason)
    return reason


@dataclass(frozen=True, slots=True)
class Debounce:
    """``lock_debounce`` seconds: the last call of a job within them runs."""

    seconds: float

    def delay(self, task: Any, task_id: str, options: dict[str, Any]) -> None:
        """Send the call ``seconds`` later, unless the caller gave a countdown or eta."""
        for given in ("countdown", "eta"):
            if options.get(given) is not None:
                if task_id != task.request.id:  # a retry's countdown is not the caller's
                    log_debounce.debug(
                        "%s[%s]: the caller's %s replaces lock_debounce's delay of %.1f s",
                        task.name,
                        task_id,
                        given,
                        self.seconds,
                    )
                return
        options["countdown"] = self.seconds

    def replace(self, task: Any, job: NamedLock, holder: str, by: str) -> bool:
        """Free ``job`` from ``holder`` if its hold is a message still waiting, for ``by``."""
        if not release_if_in(job, holder, REPLACEABLE, note=(REPLACED, by)):
            return False
        task.locking.mode.replaced(task, job, holder, by)
        log_debounce.info(
            "%s: task %s replaces task %s, which was still waiting (lock_debounce)",
            task.name,
            by,
            holder,
        )
        report_duplicate(task, "replaced")
        return True


def skip_replaced(task: Any, request: Any, key: str, by: str) -> NoReturn:
    """End the run of a message whose call was replaced by a later one (task ``by``)."""
    log_debounce.info(
        "skipped %s[%s]: replaced by task %s, a later call within lock_debounce (lock %s)",
        task.name,
        request.id,
        by,
        key,
    )
    store_skipped(task, request, {"replaced_by": by, "lock": key, "reason": REPLACED})
    raise Ignore()
