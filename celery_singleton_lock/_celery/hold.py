"""What a task's hold on its job's lock says about itself (its :class:`HoldState`, its operator
info: display text nothing reads back), how a message names that lock (:class:`MessageLock`),
and what the Celery layer stores and reports about a call."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Collection
from contextlib import suppress
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, NamedTuple, Protocol

from celery.app.task import Context

from .._lock import NamedLock
from .counts import count
from .lifecycle import HoldState

log = logging.getLogger("celery_singleton_lock.run")

#: the state a skipped duplicate records (not a ready state: ``.get()`` on it waits)
SKIPPED = "SKIPPED"


HOST = socket.gethostname()
#: (task name, slots) -> the info's text before and after its task id (the pid is in it: cleared
#: in a forked child)
_info_parts: dict[tuple[str, int], tuple[str, str]] = {}
os.register_at_fork(after_in_child=_info_parts.clear)


def holder_info(task_name: str, task_id: str, limit: int = 1) -> str:
    """The operator info of a hold: ``{"task", "id", "host", "pid"}`` as compact JSON (with
    ``"limit"`` for a job of several slots)."""
    if not (type(task_name) is str and type(task_id) is str and type(limit) is int):
        info: dict[str, object] = {"task": task_name, "id": task_id, "host": HOST}
        info["pid"] = os.getpid()
        if limit != 1:
            info["limit"] = int(limit)
        return json.dumps(info, separators=(",", ":"))
    # Every publish and run writes one: the text around the task id is made once per task
    # name (json.dumps of the dict costs a run about 1 % more instructions).
    parts = _info_parts.get((task_name, limit))
    if parts is None:
        slots = f',"limit":{limit}' if limit != 1 else ""
        parts = _info_parts[(task_name, limit)] = (
            f'{{"task":{_json_str(task_name)},"id":',
            f',"host":{_json_str(HOST)},"pid":{os.getpid()}{slots}}}',
        )
    return parts[0] + _json_str(task_id) + parts[1]


def release_if_in(
    job: NamedLock,
    holder: str,
    states: Collection[HoldState],
    also: Callable[[], bool] | None = None,
    note: tuple[str, str] | None = None,
) -> bool:
    """Force-release ``job`` from ``holder`` only while its hold is in one of ``states`` (no
    run inside it) and ``also()`` agrees; Redis checks all again in the release's own step, so a
    run that enters meanwhile keeps its lock. ``note``: kept about the hold in that step."""
    if not holder:
        return False
    held = next((s for s in job.inspect() if s.holder == holder), None)
    if held is None or held.run_token or held.state not in states:
        return False
    if also is not None and not also():
        return False
    return job.force_release(holder=holder, states=states, note=note)


#: message header that carries the lock's name from the publisher to the worker
HEADER = "singleton_lock"
#: ... the prefix of its keys (a drop-in's ``SINGLETONLOCK_``): a worker that drops the message
#: unrun frees the lock without knowing the task
PREFIX_HEADER = "singleton_lock_prefix"
#: ... how many messages of the job may hold it at once, when more than one
PERMITS_HEADER = "singleton_lock_permits"


class MessageLock(NamedTuple):
    """The lock a message's publish took, as the message's headers carry it."""

    name: str
    #: ``None`` in a message from a version that did not send it (the task's prefix applies)
    prefix: str | None = None
    permits: int = 1

    def put_in(self, headers: dict[str, Any]) -> None:
        headers[HEADER] = self.name
        if self.prefix is not None:
            headers[PREFIX_HEADER] = self.prefix
        if self.permits != 1:
            headers[PERMITS_HEADER] = self.permits

    @classmethod
    def of(cls, headers: Any) -> MessageLock | None:
        """The lock a message's headers name (a mapping, or a worker's request), or ``None``."""
        # A worker's request keeps the headers as attributes (its get() is a getattr each).
        get = vars(headers).get if type(headers) is Context else getattr(headers, "get", None)
        if get is None:
            return None
        name = get(HEADER)
        if not isinstance(name, str) or not name:
            return None
        prefix, permits = get(PREFIX_HEADER), get(PERMITS_HEADER)
        return cls(
            name,
            prefix if isinstance(prefix, str) and prefix else None,
            permits if type(permits) is int and permits > 1 else 1,
        )


def store_retry(task: Any, request: Any) -> None:
    """Record the run of ``request`` as ``RETRY`` as Celery's tracer would, but *before* the
    message that brings the call back is sent: a comeback run at once elsewhere may store its
    ``SUCCESS`` within milliseconds, and the backend's guard against overwriting it is not
    atomic. The run then ends with ``Ignore``. A failed write is logged only."""
    if request.is_eager:
        return
    ignore = vars(request).get("ignore_result")
    if ignore is None:
        ignore = task.ignore_result
    if ignore and not task.store_errors_even_if_ignored:
        return
    try:
        task.backend.mark_as_retry(request.id, None, request=request)
    except NotImplementedError:  # no result backend configured
        return
    except Exception as exc:
        log.warning("could not store the RETRY state of %s[%s]: %r", task.name, request.id, exc)


def store_skipped(task: Any, request: Any, meta: dict[str, Any]) -> None:
    """Record the run of ``request`` as :data:`SKIPPED` with ``meta`` (not in eager mode)."""
    if not request.is_eager:
        with suppress(NotImplementedError):  # no result backend configured
            task.backend.store_result(request.id, meta, SKIPPED, request=request)


class JobObserver(Protocol):
    """What the Celery layer reports, for metrics (:mod:`celery_singleton_lock.metrics`)."""

    def duplicate(self, task: str, action: str) -> None:
        """A duplicate of ``task`` was ``skipped``, ``retried`` or ``raised`` at run time,
        ``returned`` or ``raised`` at publish, or ``replaced`` (``lock_debounce``)."""

    def refused_by(self, task: str, reason: str) -> None:
        """A call of ``task`` was refused for ``reason``: ``limit`` or ``cooldown`` (a
        duplicate), or ``rate`` (a ``lock_rate`` turn)."""


#: the process's observer, or None (read directly by the call sites)
observer: JobObserver | None = None


def set_job_observer(new: JobObserver | None) -> None:
    global observer
    observer = new


def report_duplicate(task: Any, action: str) -> None:
    """Count a duplicate of ``task`` and what was done with it (:class:`JobObserver`)."""
    count(task, "duplicates:" + action)
    if observer is not None:
        observer.duplicate(task.name, action)


def report_refusal(task: Any, reason: str) -> None:
    """Count why a call of ``task`` was refused (:class:`JobObserver`)."""
    count(task, "refusals:" + reason)
    if observer is not None:
        observer.refused_by(task.name, reason)
