"""The worker's main-process side: release a task's lock when its pool child cannot.

Only the main process hears of a pool child killed (SIGKILL, OOM), a hard time limit or a
terminating revoke; Celery then calls the request's ``on_failure`` / ``on_timeout`` there.
Releasing at once lets a redelivered message (``reject_on_worker_lost``) take over without
waiting for a whole lease.
"""

from __future__ import annotations

from typing import Any

from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery.worker.request import Request

from ._task import HEADER, release_for_request

__all__ = ["LockedRequest"]

_CHILD_GONE = (WorkerLostError, Terminated, TimeLimitExceeded, SystemExit, KeyboardInterrupt)


class LockedRequest(Request):  # type: ignore[misc]  # celery ships no type information
    def _release(self, why: str, requeued: bool = False) -> None:
        release_for_request(
            self.task,
            self.id,
            self._args,
            self._kwargs,
            self._request_dict.get(HEADER),
            why,
            requeued,
        )

    def on_timeout(self, soft: bool, timeout: float) -> None:
        super().on_timeout(soft, timeout)
        if not soft:
            self._release(f"hard time limit ({timeout} s)")

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # unwrap ExceptionWithTraceback
        if isinstance(exc, _CHILD_GONE):
            task = self.task
            # Celery requeues the message in this case (see Request.on_failure): keep the hold
            # for the redelivery rather than let a duplicate in between.
            requeued = (
                isinstance(exc, (WorkerLostError, SystemExit, KeyboardInterrupt))
                and task.acks_late
                and task.reject_on_worker_lost
                and not getattr(task, "retry_on_worker_lost", False)
            )
            self._release(f"its pool process ended ({type(exc).__name__})", requeued)
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )
