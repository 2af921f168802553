"""What a task's hold says about itself: its state (typed) and its operator info (display).

A hold's :class:`HoldState` is a field of its own in Redis (the lock layer's ``state``): the
commands that act on some holds only (``celery locks purge --queued``, a debounce replacing a
waiting call, the revoked-holder check, a dropped message's release) ask Redis to release a
hold only while it is in the states they name, checked in the same step as the release. The
operator info (which task, which id, where) is display text for ``celery locks list``; nothing
reads it to decide anything.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Collection
from enum import StrEnum
from json.encoder import encode_basestring_ascii as _json_str

from .._lock import LockSpace

__all__ = ["HOST", "HoldState", "holder_info", "release_if_in"]

HOST = socket.gethostname()
_HOST_JSON = _json_str(HOST)


class HoldState(StrEnum):
    """The state of a task's hold on its job's lock, as Redis keeps it (its value is the label
    written; ``celery locks list`` shows it)."""

    #: a message waits in the queue (taken by its publish); no run of it has started
    QUEUED = "queued"
    #: a run holds it
    RUNNING = "running"
    #: a run started and its message waits again: a retry's countdown, or a redelivery after
    #: its worker was lost (``reject_on_worker_lost``); never replaced, never purged as queued
    REQUEUED = "requeued"
    #: the job ended and its key stays taken for ``lock_cooldown``
    COOLDOWN = "cooldown"


def holder_info(task_name: str, task_id: str, limit: int = 1) -> str:
    """``json.dumps({"task", "id", "host", "pid"}, separators=(",", ":"))``, spelled out
    (every publish and run writes one; this is about five times cheaper than building a JSON
    encoder for it), with ``"limit"`` after them when the job has more than one slot."""
    slots = f',"limit":{int(limit)}' if limit != 1 else ""
    if not (type(task_name) is str and type(task_id) is str):
        info: dict[str, object] = {
            "task": task_name,
            "id": task_id,
            "host": HOST,
            "pid": os.getpid(),
        }
        if limit != 1:
            info["limit"] = int(limit)
        return json.dumps(info, separators=(",", ":"))
    return (
        f'{{"task":{_json_str(task_name)},"id":{_json_str(task_id)},'
        f'"host":{_HOST_JSON},"pid":{os.getpid()}{slots}}}'
    )


def release_if_in(
    space: LockSpace,
    name: str,
    holder: str,
    states: Collection[HoldState],
    also: Callable[[], bool] | None = None,
) -> bool:
    """Force-release ``name`` from ``holder`` only while ``holder``'s hold is in one of
    ``states`` (and no run has entered it) and ``also()`` agrees; returns whether it was
    released. The force release checks the holder, the state and the run token again in
    Redis, in one step, so a run that enters meanwhile keeps its lock."""
    if not holder:
        return False
    state = space.inspect(name)
    if state.holder != holder or state.run_token or state.state not in states:
        return False
    if also is not None and not also():
        return False
    return space.force_release(name, holder=holder, states=states)
